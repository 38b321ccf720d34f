//! The session spec: everything a session depends on, written once for
//! both hosts.
//!
//! A [`SessionSpec`] travels as JSON inside every task envelope, from a
//! driver of either host to a worker of either host. Each host builds its
//! DataFusion session from it (the Rust host in `dfx_host::session`, the
//! Python package in `dfx_engine.session`, which reads the spec through this
//! type), so both sides plan, encode and decode with the same settings.

pub mod choices;
pub mod format;
pub mod location;
pub mod script;
pub mod table;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use choices::{DEFAULT_MAP_SERVER_BIND, ShuffleCompression, ShuffleDurability, Split};
pub use format::TableFormat;
pub use location::{ShuffleLocation, same_location};
pub use script::Script;
pub use table::{Column, TableDefinition};

/// Partitions a session plans for unless told otherwise. Pinned rather than
/// the core count, so a plan's shape does not depend on the machine it was
/// planned on.
pub const DEFAULT_TARGET_PARTITIONS: usize = 2;

/// Everything a session depends on; travels as JSON in a task envelope.
///
/// ```
/// let spec: dfx_runtime::SessionSpec = serde_json::from_str(
///     r#"{"tables": {"lineitem": "/data/lineitem"}, "shuffle_dir": "/tmp/q1"}"#,
/// ).unwrap();
/// assert_eq!(spec.target_partitions, 2);
/// assert!(spec.codec_ids.is_empty());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionSpec {
    /// Table name → its definition ([`TableDefinition`]): a location of
    /// Parquet files, or files of another format with options and partition
    /// columns. Every file is a partition of its table's scan.
    #[serde(default)]
    pub tables: BTreeMap<String, TableDefinition>,
    /// Where stage output goes: a local directory, `file://...` or
    /// `s3://bucket/prefix`. `None` (written as `""`) means "do not
    /// distribute": the planner inserts no stage.
    #[serde(
        default,
        serialize_with = "write_shuffle_dir",
        deserialize_with = "read_shuffle_dir"
    )]
    pub shuffle_dir: Option<PathBuf>,
    /// A root each query gets a fresh location under (`<root>/<query id>/`,
    /// [`crate::shuffle_root`]), removed once its answer is read: a local
    /// directory, `file://...` or `s3://bucket/prefix`. Never beside
    /// `shuffle_dir`. A driver turns it into the query's `shuffle_dir`
    /// before anything ships; left out of the JSON when unset.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "read_shuffle_dir"
    )]
    pub shuffle_root: Option<PathBuf>,
    /// Keep each query's location under [`Self::shuffle_root`] after its
    /// answer is read. Left out of the JSON when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_shuffle: bool,
    /// Partitions the session plans for.
    #[serde(default = "default_target_partitions")]
    pub target_partitions: usize,
    /// The physical codec ids a correctly built session carries. Empty means
    /// "not known yet"; the driver fills it in before shipping the spec.
    #[serde(default)]
    pub codec_ids: Vec<String>,
    /// Where the plugin's planner cuts the plan into stages
    /// (`dfx_engine.split`). Absent in a spec means [`Split::Exchange`].
    #[serde(default)]
    pub split: Split,
    /// How workers compress the segments of their map files (`dfx_engine.shuffle_compression`).
    /// Absent in a spec means [`ShuffleCompression::Auto`]; left out of the
    /// JSON when it is the default, so older readers still take the spec.
    #[serde(default, skip_serializing_if = "ShuffleCompression::is_default")]
    pub shuffle_compression: ShuffleCompression,
    /// Where map files live between stages: in the location, read by every
    /// reader from there (`object_store`, the default); on the disk of the
    /// worker that wrote each, served to the others over Arrow Flight
    /// (`local`); or in both places (`both`). Left out of the JSON when it
    /// is the default.
    #[serde(default, skip_serializing_if = "ShuffleDurability::is_default")]
    pub shuffle_durability: ShuffleDurability,
    /// Where each worker's map server listens under `local` durability:
    /// `host:port`, port 0 for any free one. `None`: `127.0.0.1:0`, this
    /// host only. Left out of the JSON when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub map_server_bind: Option<String>,
    /// How an `s3://` location is reached, over the AWS environment
    /// variables: `s3_endpoint`, `s3_region`, `s3_allow_http` (`"true"`),
    /// set as the plugin's `dfx_engine.<key>`. Never credentials: the spec
    /// is written into every envelope; they come from the environment.
    /// Left out of the JSON when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub store_options: BTreeMap<String, String>,
    /// The most memory, in bytes, each map task's operators may hold: a
    /// memory pool in the worker, below the stage's writer. `None`: no limit.
    /// Left out of the JSON when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<u64>,
    /// Other `dfx_engine.<key>` settings of every session built from the
    /// spec, the driver's and each worker's: the plugin's decisions a user
    /// may tune or turn off (`join_filters`: `auto`, `on` or `off`;
    /// `join_filter_ratio`; `memory_table_limit`). A key the spec holds as a
    /// field of its own is refused here; a key the plugin does not know is
    /// refused when a session is built, naming it. Left out of the JSON
    /// when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub engine_options: BTreeMap<String, String>,
    /// `dfx_engine.<key>` settings the scheduler gives tasks of one stage,
    /// set after the engine options: what an adaptive decision tells the
    /// stage or one task (`coalesced_partitions`, `split_read`). Never a
    /// user's: a driver refuses a spec that carries them. Left out of the
    /// JSON when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub stage_options: BTreeMap<String, String>,
    /// DataFusion settings (`datafusion.<key>`) of every session built from
    /// the spec, the driver's and each worker's, so that each plans and
    /// executes alike: say `datafusion.optimizer.hash_join_single_partition_threshold`.
    /// A key dfx sets itself (for each stage to run alone) is refused when
    /// a session is built, naming it. Left out of the JSON when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub datafusion_options: BTreeMap<String, String>,
}

impl Default for SessionSpec {
    fn default() -> Self {
        Self {
            tables: BTreeMap::new(),
            shuffle_dir: None,
            shuffle_root: None,
            keep_shuffle: false,
            target_partitions: DEFAULT_TARGET_PARTITIONS,
            codec_ids: Vec::new(),
            split: Split::default(),
            shuffle_compression: ShuffleCompression::default(),
            shuffle_durability: ShuffleDurability::default(),
            map_server_bind: None,
            store_options: BTreeMap::new(),
            memory_limit: None,
            engine_options: BTreeMap::new(),
            stage_options: BTreeMap::new(),
            datafusion_options: BTreeMap::new(),
        }
    }
}

impl SessionSpec {
    /// A spec over `tables` (a path alone is a location of Parquet files),
    /// with defaults for everything else.
    pub fn new<T: Into<TableDefinition>>(tables: impl IntoIterator<Item = (String, T)>) -> Self {
        Self {
            tables: tables
                .into_iter()
                .map(|(name, table)| (name, table.into()))
                .collect(),
            ..Self::default()
        }
    }

    /// Where each table's files lie ([`TableDefinition::root`]): what a
    /// worker's vet lets a stage read.
    pub fn table_roots(&self) -> Vec<PathBuf> {
        self.tables.values().map(TableDefinition::root).collect()
    }

    /// This spec with `shuffle_dir` set.
    pub fn with_shuffle_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.shuffle_dir = Some(dir.into());
        self
    }

    /// This spec with no shuffle directory or root (for a local run).
    pub fn without_shuffle_dir(mut self) -> Self {
        self.shuffle_dir = None;
        self.shuffle_root = None;
        self
    }

    /// This spec giving each query a fresh location under `root`.
    pub fn with_shuffle_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.shuffle_root = Some(root.into());
        self
    }

    /// This spec planning for `partitions` partitions.
    pub fn with_target_partitions(mut self, partitions: usize) -> Self {
        self.target_partitions = partitions;
        self
    }

    /// This spec cutting plans into stages by `split`.
    pub fn with_split(mut self, split: Split) -> Self {
        self.split = split;
        self
    }

    /// This spec's workers compressing their map files with `compression`.
    pub fn with_shuffle_compression(mut self, compression: ShuffleCompression) -> Self {
        self.shuffle_compression = compression;
        self
    }
}

fn default_target_partitions() -> usize {
    DEFAULT_TARGET_PARTITIONS
}

// `""` rather than `null` for "no directory": the Python driver's spec
// spells it that way, and envelopes cross between the two hosts.
fn write_shuffle_dir<S: Serializer>(
    dir: &Option<PathBuf>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    match dir {
        Some(dir) => dir.serialize(s),
        None => s.serialize_str(""),
    }
}

fn read_shuffle_dir<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<PathBuf>, D::Error> {
    let dir: Option<String> = Option::deserialize(d)?;
    Ok(dir.filter(|d| !d.is_empty()).map(PathBuf::from))
}

/// The keys of [`SessionSpec::store_options`], each set as the plugin's
/// `dfx_engine.<key>`: the S3 endpoint, region, and whether plain http is
/// allowed (`"true"` or `"false"`). Never credentials: the spec is written
/// into every envelope.
pub const STORE_OPTION_KEYS: [&str; 3] = [
    location::S3_ENDPOINT,
    location::S3_REGION,
    location::S3_ALLOW_HTTP,
];

/// The `dfx_engine` keys a spec holds as fields of its own, refused in
/// [`SessionSpec::engine_options`].
const SPEC_FIELD_KEYS: [&str; 5] = [
    "shuffle_dir",
    "split",
    "shuffle_compression",
    dfx_abi::SHUFFLE_DURABILITY,
    "memory_limit",
];

impl SessionSpec {
    /// The plugin's `dfx_engine.<key>` settings (keys without the prefix)
    /// every session built from the spec makes besides its shuffle location
    /// and split, in the order a host sets them: the compression of a
    /// distributing session's map files, its memory limit (for a stage the
    /// plugin runs itself), the store options, then the engine options.
    /// Both hosts set exactly these.
    pub fn plugin_settings(&self) -> Vec<(String, String)> {
        let mut settings = Vec::new();
        // Only a distributing session publishes map files.
        if self.shuffle_dir.is_some() {
            settings.push((
                "shuffle_compression".to_string(),
                self.shuffle_compression.as_str().to_string(),
            ));
        }
        // Whatever the location (a root's query gets its own later): the
        // adaptive step and every reader ask it.
        if self.shuffle_durability != ShuffleDurability::default() {
            settings.push((
                dfx_abi::SHUFFLE_DURABILITY.to_string(),
                self.shuffle_durability.as_str().to_string(),
            ));
        }
        if let Some(limit) = self.memory_limit {
            settings.push(("memory_limit".to_string(), limit.to_string()));
        }
        // Every session reaches S3 by the spec's options: its tables may be
        // there, distributed or not.
        settings.extend(self.store_options.clone());
        settings.extend(self.engine_options.clone());
        settings.extend(self.stage_options.clone());
        settings
    }

    /// The DataFusion settings every session built from the spec makes:
    /// the plugin's (`stated`, what each stage needs to run alone), then
    /// the spec's [`Self::datafusion_options`]. Both hosts set exactly these.
    ///
    /// # Errors
    ///
    /// [`crate::error::RuntimeError::Invalid`] when the spec sets a key the plugin
    /// states, naming the key and both values.
    pub fn datafusion_settings(
        &self,
        stated: impl IntoIterator<Item = (String, String)>,
    ) -> crate::error::Result<Vec<(String, String)>> {
        let mut settings: Vec<(String, String)> = stated.into_iter().collect();
        for (key, value) in &self.datafusion_options {
            if let Some((_, needed)) = settings.iter().find(|(k, _)| k == key) {
                return Err(crate::error::RuntimeError::Invalid(format!(
                    "session spec datafusion_options sets {key} to {value:?}, but dfx sets it \
                     to {needed:?} in every session so that each stage runs alone"
                )));
            }
            settings.push((key.clone(), value.clone()));
        }
        Ok(settings)
    }

    /// Read a spec from its JSON text and check it ([`Self::validate`]).
    ///
    /// # Errors
    ///
    /// JSON that is not a spec (the parser's message names the field), or a
    /// spec [`Self::validate`] refuses.
    pub fn from_json(text: &str) -> crate::error::Result<Self> {
        // Through the path of the field that failed, so the message names it
        // (serde's own says only "unknown variant" for a bad `split`).
        let deserializer = &mut serde_json::Deserializer::from_str(text);
        let spec: Self = serde_path_to_error::deserialize(deserializer).map_err(|err| {
            crate::error::RuntimeError::Invalid(format!(
                "not a dfx session spec: field {}: {}",
                err.path(),
                err.inner()
            ))
        })?;
        spec.validate()?;
        Ok(spec)
    }

    /// The spec as JSON text.
    pub fn to_json(&self) -> String {
        // Cannot fail: strings, numbers and maps with string keys.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Refuse a spec no session can be built from, naming the field: a
    /// `target_partitions` of 0, a store option the plugin does not take, an
    /// `s3_allow_http` other than `true` or `false`, an engine option the
    /// spec holds as a field, or a shuffle location of an unsupported scheme.
    ///
    /// # Errors
    ///
    /// [`crate::error::RuntimeError::Invalid`] saying what was expected and found.
    pub fn validate(&self) -> crate::error::Result<()> {
        let invalid = |message: String| Err(crate::error::RuntimeError::Invalid(message));
        if self.target_partitions == 0 {
            return invalid("session spec target_partitions must be at least 1, got 0".into());
        }
        let unknown: Vec<&String> = self
            .store_options
            .keys()
            .filter(|key| !STORE_OPTION_KEYS.contains(&key.as_str()))
            .collect();
        if !unknown.is_empty() {
            return invalid(format!(
                "session spec store_options has unknown keys {unknown:?}; the keys are \
                 {STORE_OPTION_KEYS:?} (credentials come from the environment, never from the \
                 spec)"
            ));
        }
        if let Some(allow) = self.store_options.get(location::S3_ALLOW_HTTP)
            && !matches!(allow.trim().to_ascii_lowercase().as_str(), "true" | "false")
        {
            return invalid(format!(
                "session spec store_options s3_allow_http must be 'true' or 'false', got \
                 {allow:?}"
            ));
        }
        // No pool holds nothing (and the plugin reads 0 as no limit).
        if self.memory_limit == Some(0) {
            return invalid("session spec memory_limit is 0; expected a positive number".into());
        }
        if let Some(key) = self
            .datafusion_options
            .keys()
            .find(|key| !key.starts_with("datafusion."))
        {
            return invalid(format!(
                "session spec datafusion_options sets {key:?}, which is not a DataFusion \
                 setting (expected a key starting with \"datafusion.\"; dfx's own settings go \
                 in engine_options)"
            ));
        }
        let owned: Vec<&String> = self
            .engine_options
            .keys()
            .filter(|key| {
                SPEC_FIELD_KEYS.contains(&key.as_str()) || STORE_OPTION_KEYS.contains(&key.as_str())
            })
            .collect();
        if !owned.is_empty() {
            return invalid(format!(
                "session spec engine_options sets {owned:?}, which the spec holds as fields of \
                 their own (shuffle_dir, split, shuffle_compression, shuffle_durability, \
                 memory_limit, store_options): set them there"
            ));
        }
        if let (Some(dir), Some(root)) = (&self.shuffle_dir, &self.shuffle_root) {
            return invalid(format!(
                "session spec sets both shuffle_dir ({}) and shuffle_root ({}); expected one: \
                 shuffle_dir is one query's own location, shuffle_root a root each query gets a \
                 fresh location under",
                dir.display(),
                root.display()
            ));
        }
        for dir in self.shuffle_dir.iter().chain(&self.shuffle_root) {
            let parsed = ShuffleLocation::parse(dir)?;
            if self.shuffle_durability == ShuffleDurability::Local
                && !matches!(parsed, ShuffleLocation::Local(_))
            {
                return invalid(format!(
                    "session spec shuffle_durability is local, which keeps each map file on \
                     its worker's disk, but the location {} is not a local directory; expected \
                     a directory (each node has its own), or shuffle_durability object_store",
                    dir.display()
                ));
            }
        }
        if let Some(bind) = &self.map_server_bind
            && bind.parse::<std::net::SocketAddr>().is_err()
        {
            return invalid(format!(
                "session spec map_server_bind is {bind:?}; expected host:port, say 127.0.0.1:0"
            ));
        }
        for (name, table) in &self.tables {
            table
                .validate(name)
                .map_err(crate::error::RuntimeError::Invalid)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_options_are_set_after_the_specs_own_settings_and_never_repeat_them() {
        let mut spec = SessionSpec::default().with_shuffle_dir("/s");
        spec.store_options
            .insert(location::S3_REGION.to_string(), "eu-west-1".into());
        spec.engine_options
            .insert("join_filters".into(), "off".into());
        let settings = spec.plugin_settings();
        let keys: Vec<&str> = settings.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["shuffle_compression", "s3_region", "join_filters"]);
        let text = spec.to_json();
        assert!(
            text.contains(r#""engine_options":{"join_filters":"off"}"#),
            "{text}"
        );
        assert_eq!(SessionSpec::from_json(&text).unwrap(), spec);
        // Not distributing: no compression to set.
        spec.shuffle_dir = None;
        assert_eq!(spec.plugin_settings().len(), 2);
        // A memory limit reaches the plugin, for a stage it runs itself.
        spec.memory_limit = Some(1 << 20);
        assert_eq!(
            spec.plugin_settings()[0],
            ("memory_limit".to_string(), "1048576".to_string())
        );
        spec.memory_limit = Some(0);
        let err = spec.validate().unwrap_err().to_string();
        assert!(err.contains("memory_limit is 0"), "{err}");

        for key in [
            "split",
            "shuffle_compression",
            "memory_limit",
            "s3_endpoint",
        ] {
            let mut spec = SessionSpec::default();
            spec.engine_options.insert(key.into(), "x".into());
            let err = spec.validate().unwrap_err().to_string();
            assert!(
                err.contains(key) && err.contains("fields of their own"),
                "{err}"
            );
        }
    }

    #[test]
    fn datafusion_options_follow_the_plugins_settings_and_never_replace_them() {
        let stated = || {
            vec![(
                "datafusion.optimizer.enable_join_dynamic_filter_pushdown".to_string(),
                "false".to_string(),
            )]
        };
        let mut spec = SessionSpec::default();
        let key = "datafusion.optimizer.hash_join_single_partition_threshold";
        spec.datafusion_options.insert(key.into(), "0".into());
        spec.validate().unwrap();
        let settings = spec.datafusion_settings(stated()).unwrap();
        assert_eq!(settings.len(), 2);
        assert_eq!(settings[1], (key.to_string(), "0".to_string()));
        let text = serde_json::to_string(&spec).unwrap();
        assert_eq!(SessionSpec::from_json(&text).unwrap(), spec);
        // A key the plugin sets for every stage to run alone.
        spec.datafusion_options
            .insert(stated()[0].0.clone(), "true".into());
        let err = spec.datafusion_settings(stated()).unwrap_err().to_string();
        assert!(
            err.contains("enable_join_dynamic_filter_pushdown") && err.contains("\"false\""),
            "{err}"
        );
        // Not a DataFusion key.
        let mut spec = SessionSpec::default();
        spec.datafusion_options.insert("split".into(), "x".into());
        let err = spec.validate().unwrap_err().to_string();
        assert!(
            err.contains("\"split\"") && err.contains("engine_options"),
            "{err}"
        );
    }

    #[test]
    fn every_field_round_trips_and_defaults_are_left_out() {
        let spec = SessionSpec::new([("t".to_string(), PathBuf::from("/d/t"))])
            .with_shuffle_dir("s3://b/q")
            .with_shuffle_compression(ShuffleCompression::Lz4)
            .with_split(Split::Aggregate);
        let text = spec.to_json();
        assert!(text.contains("\"shuffle_compression\":\"lz4\""), "{text}");
        assert_eq!(SessionSpec::from_json(&text).unwrap(), spec);
        let plain = SessionSpec::default().to_json();
        assert!(!plain.contains("shuffle_compression"), "{plain}");
        assert!(!plain.contains("memory_limit"), "{plain}");
        assert!(plain.contains("\"shuffle_dir\":\"\""), "{plain}");
    }

    #[test]
    fn a_bad_spec_is_refused_naming_the_field() {
        let err = SessionSpec::from_json(r#"{"target_partitions": 0}"#).unwrap_err();
        assert!(err.to_string().contains("target_partitions"), "{err}");
        let err = SessionSpec::from_json(r#"{"store_options": {"aws_secret": "x"}}"#).unwrap_err();
        assert!(err.to_string().contains("unknown keys"), "{err}");
        let err =
            SessionSpec::from_json(r#"{"store_options": {"s3_allow_http": "yes"}}"#).unwrap_err();
        assert!(err.to_string().contains("s3_allow_http"), "{err}");
        let err = SessionSpec::from_json(r#"{"shuffle_dir": "gs://b/p"}"#).unwrap_err();
        assert!(err.to_string().contains("unsupported scheme"), "{err}");
        let err = SessionSpec::from_json(r#"{"shuffle_dir": "/a", "shuffle_root": "/b"}"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("both shuffle_dir (/a) and shuffle_root (/b)"),
            "{err}"
        );
        let err = SessionSpec::from_json(r#"{"shuffle_root": "gs://b"}"#).unwrap_err();
        assert!(err.to_string().contains("unsupported scheme"), "{err}");
        let err = SessionSpec::from_json(r#"{"split": "waves"}"#).unwrap_err();
        assert!(err.to_string().contains("split"), "{err}");
    }
}
