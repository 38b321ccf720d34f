//! The `dfx_engine` config extension.
//!
//! The keys:
//! - `dfx_engine.shuffle_dir`: where stage output goes: a local path,
//!   `file://...` or `s3://bucket/prefix` (see [`crate::exchange::store`]).
//!   Empty (the default) means "do not distribute": the planner inserts no
//!   stage.
//! - `dfx_engine.split`: where the planner cuts the plan into stages,
//!   `exchange` (the default: at every exchange) or `aggregate` (the
//!   aggregate split: one stage per topmost partial aggregate).
//! - `dfx_engine.shuffle_compression`: how the segments of map files are
//!   compressed, `auto` (the default: none in a local directory, LZ4 on S3),
//!   `lz4` (LZ4 frames, the codec Ballista measured as paying for itself) or
//!   `none`. Read by the writer when its task runs, so a worker's session
//!   decides; readers detect it per message.
//! - `dfx_engine.s3_endpoint`, `dfx_engine.s3_region`,
//!   `dfx_engine.s3_allow_http`: how an `s3://` location is reached, over
//!   the standard AWS environment variables (credentials come only from the
//!   environment: a config travels inside every encoded stage). Plain http
//!   only when `s3_allow_http` (or `AWS_ALLOW_HTTP`) asks for it.
//! - `dfx_engine.memory_table_limit`: the most bytes (as Arrow IPC) an
//!   in-memory table may carry into a plan (see [`crate::memory_table`]);
//!   64 MiB by default.
//! - `dfx_engine.memory_limit`: the most bytes each map task's operators
//!   may hold when the plugin runs them itself (see
//!   [`crate::exec::sealed_input`]); 0 (the default): no limit. Set from a
//!   session spec's `memory_limit` by both hosts.
//! - `dfx_engine.join_filters`: filters that cross stages (see
//!   [`crate::filters`]): `auto` (the default: a join's probe side is
//!   filtered by its build stage's keys when the build published at most
//!   `join_filter_ratio` times the probe table's rows), `on` (whatever the
//!   sizes) or `off` (none: the plan is cut as without them).
//! - `dfx_engine.join_filter_ratio`: that threshold, `0.5` by default.
//! - `dfx_engine.coalesce`: adaptive coalescing (see [`crate::adapt`]):
//!   `auto` (the default: a ready stage's adjacent small partitions share a
//!   task, each task up to the stage's bytes over the workers, at least
//!   1 MiB, at most `coalesce_task_bytes`), `on` (at least two partitions a
//!   task, whatever their bytes) or `off` (one task per partition).
//! - `dfx_engine.coalesce_task_bytes`: that most, 64 MiB by default.
//! - `dfx_engine.coalesced_partitions`: set by the scheduler, never by a
//!   user: the partitions each task of one coalesced stage reads (see
//!   [`crate::read_settings`]).
//! - `dfx_engine.coalesced_maps`: set by the scheduler, never by a user:
//!   the maps each task of one coalesced stage of slices runs (see
//!   [`crate::read_settings`]).
//! - `dfx_engine.skew_split`: adaptive splitting of a skewed partition (see
//!   [`crate::adapt::skew_split`]): `auto` (the default: a partition whose
//!   probe-side bytes are above `skew_split_factor` times the median and
//!   above `skew_split_bytes` is read by several tasks), `on` (every
//!   partition that can be split is, one task per map it reads) or `off`.
//! - `dfx_engine.skew_split_factor`: that factor, `4.0` by default.
//! - `dfx_engine.skew_split_bytes`: that least, 64 MiB by default.
//! - `dfx_engine.split_read`: set by the scheduler, never by a user: which
//!   part of a split partition one task reads (see
//!   [`crate::adapt::skew_split`]).
//! - `dfx_engine.split_parts`: set by the scheduler, never by a user:
//!   which partition of a task's slice runs as several parts inside it
//!   (see [`crate::read_settings`]).
//! - `dfx_engine.broadcast_switch`: adaptive broadcast switching (see
//!   [`crate::adapt::broadcast_switch`]): `auto` (the default: a partitioned
//!   join runs as a broadcast join when its build stages published at most
//!   `broadcast_switch_bytes`, or when its slowest worker would read fewer
//!   bytes switched, as under a skewed partition), `on` (every join that
//!   can switch does) or `off`.
//! - `dfx_engine.broadcast_switch_bytes`: that most, 1 MiB by default
//!   (DataFusion's own size under which it collects a build side).
//! - `dfx_engine.broadcast_read`: set by the scheduler, never by a user:
//!   which reads of a switched stage are whole or by map (see
//!   [`crate::adapt::broadcast_switch`]).
//! - `dfx_engine.shuffle_ranges`: set by the scheduler, never by a user:
//!   where each bucket of every map of the stages a stage reads lies, from
//!   the maps' reports ([`dfx_abi::StageLayouts`]), so its readers read
//!   byte ranges without first reading each map's marker.
//! - `dfx_engine.read_bytes_in_flight`: the most bytes one reader partition
//!   has requested from an S3 location and not yet decoded, 64 MiB by
//!   default: its ranges are fetched concurrently up to it.
//!
//! A host that loaded the plugin registers the options as an
//! `FFI_ExtensionOptions`, so on the plugin's side of the boundary they arrive
//! as plain key/value entries, and a host may show the key as
//! `datafusion_ffi.dfx_engine.shuffle_dir`. Both spellings are read here.

use std::ops::Range;
use std::path::PathBuf;

use dfx_abi::StageLayouts;

use datafusion::common::config::{ConfigExtension, ConfigOptions, ExtensionOptions};
use datafusion::common::{DataFusionError, Result, extensions_options};
use datafusion::config::DATAFUSION_FFI_CONFIG_NAMESPACE;
use datafusion_ffi::config::extension_options::FFI_ExtensionOptions;

pub use crate::read_settings::{
    BROADCAST_READ, COALESCED_MAPS, COALESCED_PARTITIONS, SPLIT_PARTS, SPLIT_READ,
};
use crate::read_settings::{BroadcastRead, PartitionGroups, SplitParts, SplitRead};
pub use choices::{
    BroadcastSwitch, Coalesce, CollapseStages, JoinFilters, ShuffleCompression, ShuffleDurability,
    SkewSplit, SplitMode,
};
use choices::{at_least, choose};
pub use keys::{
    BROADCAST_SWITCH_KEY, COALESCE_KEY, COALESCE_TASK_BYTES_KEY, COLLAPSE_STAGES_KEY,
    CONFIG_PREFIX, JOIN_FILTER_RATIO_KEY, JOIN_FILTERS_KEY, MEMORY_LIMIT_KEY,
    MEMORY_TABLE_LIMIT_KEY, S3_ALLOW_HTTP_KEY, S3_ENDPOINT_KEY, S3_REGION_KEY,
    SHUFFLE_COMPRESSION_KEY, SHUFFLE_DIR_KEY, SKEW_SPLIT_BYTES_KEY, SKEW_SPLIT_FACTOR_KEY,
    SKEW_SPLIT_KEY, SPLIT_KEY,
};

mod choices;
mod keys;

/// [`MEMORY_TABLE_LIMIT_KEY`]'s default: 64 MiB. Such a table crosses the
/// boundary inside the plan and sits in the driver's memory twice while it
/// is planned; data larger than this belongs in files.
pub const DEFAULT_MEMORY_TABLE_LIMIT: u64 = 64 * 1024 * 1024;

extensions_options! {
    /// dfx's session options.
    pub struct DfxConfig {
        /// Directory that receives stage output; empty disables distribution.
        pub shuffle_dir: String, default = String::new()
        /// Where the plan is cut into stages: `exchange` or `aggregate`.
        pub split: String, default = "exchange".to_string()
        /// Partitions of a stage each task runs, at once, publishing one map
        /// file for them all; 0 or 1: one partition per task.
        pub partitions_per_task: u64, default = 1
        /// How the segments of map files are compressed: `auto`, `lz4` or `none`.
        pub shuffle_compression: String, default = "auto".to_string()
        /// S3 endpoint URL for an `s3://` shuffle location; empty: `AWS_ENDPOINT_URL`.
        pub s3_endpoint: String, default = String::new()
        /// S3 region; empty: `AWS_REGION`.
        pub s3_region: String, default = String::new()
        /// Allow plain http to the S3 endpoint (local endpoints only).
        pub s3_allow_http: bool, default = false
        /// The most bytes (Arrow IPC) an in-memory table may carry into a plan.
        pub memory_table_limit: u64, default = DEFAULT_MEMORY_TABLE_LIMIT
        /// The most bytes a map task's operators may hold when the plugin runs them; 0: no limit.
        pub memory_limit: u64, default = 0
        /// Filters that cross stages: `auto`, `on` or `off`.
        pub join_filters: String, default = "auto".to_string()
        /// `auto` filters when build rows are at most this times the probe table's.
        pub join_filter_ratio: f64, default = 0.5
        /// Adaptive coalescing of a ready stage's partitions: `auto`, `on` or `off`.
        pub coalesce: String, default = "auto".to_string()
        /// The most bytes a coalesced task reads.
        pub coalesce_task_bytes: u64, default = 64 * 1024 * 1024
        /// Set by the scheduler: the partitions each task of a coalesced stage reads.
        pub coalesced_partitions: String, default = String::new()
        /// Set by the scheduler: the maps each task of a coalesced stage of slices runs.
        pub coalesced_maps: String, default = String::new()
        /// Adaptive splitting of a skewed partition: `auto`, `on` or `off`.
        pub skew_split: String, default = "auto".to_string()
        /// `auto` splits a partition past this times the median partition.
        pub skew_split_factor: f64, default = 4.0
        /// `auto` splits a partition of at least this many bytes.
        pub skew_split_bytes: u64, default = 64 * 1024 * 1024
        /// Set by the scheduler: which part of a split partition a task reads.
        pub split_read: String, default = String::new()
        /// Set by the scheduler: which partition of a task's slice runs as several parts.
        pub split_parts: String, default = String::new()
        /// Adaptive broadcast switching of a partitioned join: `auto`, `on` or `off`.
        pub broadcast_switch: String, default = "auto".to_string()
        /// `auto` switches when the build side published at most this many bytes.
        pub broadcast_switch_bytes: u64, default = 1024 * 1024
        /// Set by the scheduler: how the tasks of a switched stage read.
        pub broadcast_read: String, default = String::new()
        /// Set by the scheduler: where each bucket of each map read lies.
        pub shuffle_ranges: String, default = String::new()
        /// Set by a writer running a slice: its partitions, `first-last`.
        pub task_partitions: String, default = String::new()
        /// The most bytes a reader has requested and not yet decoded.
        pub read_bytes_in_flight: u64, default = 64 * 1024 * 1024
        /// Set by a worker serving its map files: its own map server's address.
        pub map_server: String, default = String::new()
        /// Set by a worker keeping copies to serve: where its writers put them.
        pub map_copy_dir: String, default = String::new()
        /// A plan whose every stage would be one task runs uncut in the
        /// driver or as one stage: `auto`, `task` or `off`.
        pub collapse_stages: String, default = "auto".to_string()
        /// Where map files live between stages: `object_store`, `local` or `both`.
        pub shuffle_durability: String, default = "object_store".to_string()
    }
}

/// Why `dfx_engine.{inner}` could not be set to `value`: a key dfx does
/// not declare is named with every key it does (read off the declaration
/// itself, so none is left out); a value its key refuses, with the reason.
fn refused_setting(inner: &str, value: &str, err: DataFusionError) -> DataFusionError {
    let declared = DfxConfig::default().entries();
    let field = inner.split('.').next().unwrap_or(inner);
    let message = if declared.iter().any(|entry| entry.key == field) {
        format!("cannot set `{CONFIG_PREFIX}.{inner}` to {value:?}: {err}")
    } else {
        let named: Vec<String> = declared
            .iter()
            .map(|entry| format!("`{CONFIG_PREFIX}.{}`", entry.key))
            .collect();
        let named = named.join(", ");
        format!("`{CONFIG_PREFIX}.{inner}` is not a dfx setting; dfx declares {named}")
    };
    DataFusionError::Configuration(format!("dfx config: {message}"))
}

impl ConfigExtension for DfxConfig {
    const PREFIX: &'static str = CONFIG_PREFIX;
}

impl DfxConfig {
    /// Read dfx's options from a session's config, under either spelling.
    ///
    /// # Errors
    ///
    /// A key under `dfx_engine` that dfx does not declare: a typo must not
    /// silently run a query in one process.
    pub fn from_config(options: &ConfigOptions) -> Result<Self> {
        if let Some(config) = options.extensions.get::<DfxConfig>() {
            return Ok(config.clone());
        }
        let mut config = DfxConfig::default();
        let Some(ffi) = options.extensions.get::<FFI_ExtensionOptions>() else {
            return Ok(config);
        };
        for entry in ffi.entries() {
            let key = entry.key.as_str();
            let key = key
                .strip_prefix(DATAFUSION_FFI_CONFIG_NAMESPACE)
                .and_then(|k| k.strip_prefix('.'))
                .unwrap_or(key);
            let Some(inner) = key
                .strip_prefix(CONFIG_PREFIX)
                .and_then(|k| k.strip_prefix('.'))
            else {
                continue;
            };
            let value = entry.value.unwrap_or_default();
            config
                .set(inner, &value)
                .map_err(|err| refused_setting(inner, &value, err))?;
        }
        Ok(config)
    }

    /// The split rule.
    ///
    /// # Errors
    ///
    /// A value other than `exchange` or `aggregate`, named in the message.
    pub fn split_mode(&self) -> Result<SplitMode> {
        choose(
            SPLIT_KEY,
            &self.split,
            &[
                ("exchange", SplitMode::Exchange),
                ("aggregate", SplitMode::Aggregate),
            ],
        )
    }

    /// How the segments of map files are compressed.
    ///
    /// # Errors
    ///
    /// A value other than `auto`, `lz4` or `none`, named in the message.
    ///
    /// `auto` (the default) follows the location: none for a local
    /// directory, where LZ4 cost a query more CPU than the bytes it saved
    /// (at TPC-H scale 1, 2 partitions, the geo-mean was 1.76x stock
    /// DataFusion without it and 2.02x with it), and LZ4 for S3, where every
    /// byte crosses the network.
    pub fn shuffle_compression(&self, local: bool) -> Result<ShuffleCompression> {
        let by_location = match local {
            true => ShuffleCompression::None,
            false => ShuffleCompression::Lz4,
        };
        let forced = choose(
            SHUFFLE_COMPRESSION_KEY,
            &self.shuffle_compression,
            &[
                ("auto", None),
                ("lz4", Some(ShuffleCompression::Lz4)),
                ("none", Some(ShuffleCompression::None)),
            ],
        )?;
        Ok(forced.unwrap_or(by_location))
    }

    /// Whether (and when) the planner filters probe sides across stages.
    ///
    /// # Errors
    ///
    /// A value other than `auto`, `on` or `off`, or a ratio that is not a
    /// number of at least 0, named in the message.
    pub fn join_filters(&self) -> Result<JoinFilters> {
        let forced = choose(
            JOIN_FILTERS_KEY,
            &self.join_filters,
            &[
                ("auto", None),
                ("on", Some(JoinFilters::On)),
                ("off", Some(JoinFilters::Off)),
            ],
        )?;
        match forced {
            Some(forced) => Ok(forced),
            None => {
                at_least(JOIN_FILTER_RATIO_KEY, self.join_filter_ratio, 0.0).map(JoinFilters::Auto)
            }
        }
    }

    /// Whether a plan whose every stage would be one task is cut, and where
    /// it runs when it is not.
    ///
    /// # Errors
    ///
    /// A value other than `auto`, `task` or `off`, named in the message.
    pub fn collapse_stages(&self) -> Result<CollapseStages> {
        choose(
            COLLAPSE_STAGES_KEY,
            &self.collapse_stages,
            &[
                ("auto", CollapseStages::Auto),
                ("task", CollapseStages::Task),
                ("off", CollapseStages::Off),
            ],
        )
    }

    /// Whether ready stages' small partitions share tasks.
    ///
    /// # Errors
    ///
    /// A value other than `auto`, `on` or `off`, named in the message.
    pub fn coalesce(&self) -> Result<Coalesce> {
        choose(
            COALESCE_KEY,
            &self.coalesce,
            &[
                ("auto", Coalesce::Auto),
                ("on", Coalesce::On),
                ("off", Coalesce::Off),
            ],
        )
    }

    /// The partitions each task of a coalesced stage reads, as the
    /// scheduler set them; `None` when it set none.
    ///
    /// # Errors
    ///
    /// A setting that does not parse (see [`crate::read_settings`]).
    pub fn coalesced_partitions(&self) -> Result<Option<PartitionGroups>> {
        PartitionGroups::parse(&self.coalesced_partitions)
    }

    /// The maps each task of a coalesced stage of slices runs, as the
    /// scheduler set them; `None` when it set none.
    ///
    /// # Errors
    ///
    /// A setting that does not parse (see [`crate::read_settings`]).
    pub fn coalesced_maps(&self) -> Result<Option<PartitionGroups>> {
        PartitionGroups::parse_maps(&self.coalesced_maps)
    }

    /// Whether (and when) a ready stage's skewed partitions are split.
    ///
    /// # Errors
    ///
    /// A value other than `auto`, `on` or `off`, or a factor that is not a
    /// number of at least 1, named in the message.
    pub fn skew_split(&self) -> Result<SkewSplit> {
        let forced = choose(
            SKEW_SPLIT_KEY,
            &self.skew_split,
            &[
                ("auto", None),
                ("on", Some(SkewSplit::On)),
                ("off", Some(SkewSplit::Off)),
            ],
        )?;
        match forced {
            Some(forced) => Ok(forced),
            None => Ok(SkewSplit::Auto {
                factor: at_least(SKEW_SPLIT_FACTOR_KEY, self.skew_split_factor, 1.0)?,
                bytes: self.skew_split_bytes,
            }),
        }
    }

    /// Which part of a split partition this task reads, as the scheduler
    /// set it; `None` when it set none.
    ///
    /// # Errors
    ///
    /// A setting that does not parse (see [`crate::read_settings`]).
    pub fn split_read(&self) -> Result<Option<SplitRead>> {
        SplitRead::parse(&self.split_read)
    }

    /// Which partition of the task's slice runs as several parts, as the
    /// scheduler set it; `None` when it set none.
    ///
    /// # Errors
    ///
    /// A setting that does not parse (see [`crate::read_settings`]).
    pub fn split_parts(&self) -> Result<Option<SplitParts>> {
        SplitParts::parse(&self.split_parts)
    }

    /// Whether (and when) a ready stage's partitioned joins switch to
    /// broadcast joins.
    ///
    /// # Errors
    ///
    /// A value other than `auto`, `on` or `off`, named in the message.
    pub fn broadcast_switch(&self) -> Result<BroadcastSwitch> {
        choose(
            BROADCAST_SWITCH_KEY,
            &self.broadcast_switch,
            &[
                (
                    "auto",
                    BroadcastSwitch::Auto {
                        bytes: self.broadcast_switch_bytes,
                    },
                ),
                ("on", BroadcastSwitch::On),
                ("off", BroadcastSwitch::Off),
            ],
        )
    }

    /// How this task of a switched stage reads, as the scheduler set it;
    /// `None` when it set nothing.
    ///
    /// # Errors
    ///
    /// A setting that does not parse (see [`crate::read_settings`]).
    pub fn broadcast_read(&self) -> Result<Option<BroadcastRead>> {
        BroadcastRead::parse(&self.broadcast_read)
    }

    /// The partitions the running task's slice holds, when a writer running
    /// several set them.
    ///
    /// # Errors
    ///
    /// A value that is not `first-last` with `first <= last`.
    pub fn task_partitions(&self) -> Result<Option<Range<usize>>> {
        let value = self.task_partitions.trim();
        if value.is_empty() {
            return Ok(None);
        }
        let parsed = value
            .split_once('-')
            .and_then(|(first, last)| {
                Some((first.parse::<usize>().ok()?, last.parse::<usize>().ok()?))
            })
            .filter(|(first, last)| first <= last);
        match parsed {
            Some((first, last)) => Ok(Some(first..last + 1)),
            None => Err(DataFusionError::Configuration(format!(
                "dfx config: `{CONFIG_PREFIX}.task_partitions` is {value:?}, not first-last"
            ))),
        }
    }

    /// The address of the map server of the process running the task, when
    /// it serves its map files: a map it holds is read from its disk.
    pub fn own_map_server(&self) -> Option<&str> {
        Some(self.map_server.trim()).filter(|server| !server.is_empty())
    }

    /// Where map files live between stages.
    ///
    /// # Errors
    ///
    /// A durability other than `object_store`, `local` or `both`, named in
    /// the message.
    pub fn shuffle_durability(&self) -> Result<ShuffleDurability> {
        choose(
            &format!("{CONFIG_PREFIX}.{}", dfx_abi::SHUFFLE_DURABILITY),
            &self.shuffle_durability,
            &[
                ("object_store", ShuffleDurability::ObjectStore),
                ("local", ShuffleDurability::Local),
                ("both", ShuffleDurability::Both),
            ],
        )
    }

    /// Every choice setting read once, so a value none of them takes fails
    /// the query when it is planned, whether or not its decision ever comes
    /// up: a plan run as one stage asks no adaptive question.
    ///
    /// # Errors
    ///
    /// The first setting that names no choice of its own, or breaks its
    /// number's bound.
    pub fn check_choices(&self) -> Result<()> {
        self.split_mode()?;
        self.shuffle_compression(true)?;
        self.join_filters()?;
        self.collapse_stages()?;
        self.coalesce()?;
        self.skew_split()?;
        self.broadcast_switch()?;
        self.shuffle_durability()?;
        Ok(())
    }

    /// Whether map files stay only on the disks of the workers that wrote
    /// them (`shuffle_durability` `local`): a map is then read only from
    /// its owner, never from the location by its marker.
    ///
    /// # Errors
    ///
    /// An unknown durability (see [`Self::shuffle_durability`]).
    pub fn maps_only_on_workers(&self) -> Result<bool> {
        Ok(self.shuffle_durability()? == ShuffleDurability::Local)
    }

    /// Whether a reader reads the location's file of a map whose worker
    /// cannot be reached: the query keeps map files in both places
    /// (`shuffle_durability` `both`).
    ///
    /// # Errors
    ///
    /// An unknown durability (see [`Self::shuffle_durability`]).
    pub fn reads_location_when_owner_lost(&self) -> Result<bool> {
        Ok(self.shuffle_durability()? == ShuffleDurability::Both)
    }

    /// Partitions of a stage each task runs (at least one).
    pub fn partitions_per_task(&self) -> usize {
        usize::try_from(self.partitions_per_task)
            .unwrap_or(usize::MAX)
            .max(1)
    }

    /// The memory limit of a stage the plugin runs itself, or `None` when
    /// the session sets none.
    pub fn memory_limit(&self) -> Option<u64> {
        (self.memory_limit > 0).then_some(self.memory_limit)
    }

    /// Where each bucket of each map this task reads lies, as the
    /// scheduler set it; `None` when it set nothing.
    ///
    /// # Errors
    ///
    /// A setting that does not parse.
    pub fn shuffle_ranges(&self) -> Result<Option<StageLayouts>> {
        StageLayouts::parse(&self.shuffle_ranges).map_err(DataFusionError::Configuration)
    }

    /// The shuffle directory, or `None` when distribution is off.
    pub fn shuffle_dir(&self) -> Option<PathBuf> {
        let dir = self.shuffle_dir.trim();
        (!dir.is_empty()).then(|| PathBuf::from(dir))
    }

    /// These options as an `FFI_ExtensionOptions`, for a host to register.
    pub fn to_ffi(&self) -> Result<FFI_ExtensionOptions> {
        let mut options = FFI_ExtensionOptions::default();
        options.add_config(self)?;
        Ok(options)
    }
}

#[cfg(test)]
mod tests;
