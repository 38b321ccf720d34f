//! Adaptive stages: a consumer stage reshaped from what the stages it
//! reads published, before any of its tasks starts.
//!
//! ```text
//! scheduler: stage S is ready (every stage it reads published)
//!   ─► export adapt_stage(S's encoded plan, {settings, slots})
//!        plugin: which partitions of S come from hash reads, their bytes
//!                (from the markers), the decision and its reason
//!   ◄─ {"groups": [[0, 2], [3, 3]], "settings": {"coalesced_partitions": "S:0-2,3"},
//!       "reason": "..."}
//!   ─► S runs one task per group (its head), every task told `settings`
//! ```
//!
//! The decisions are the plugin's, the mechanics the scheduler's: it runs
//! the tasks it is told to and hands each the settings, and knows nothing
//! of plans. Three decisions are made, the first that applies taken, each
//! of which can be turned off: switching a partitioned join whose build
//! side turned out small to a broadcast one ([`broadcast_switch`],
//! `dfx_engine.broadcast_switch`), splitting a skewed partition among
//! several tasks ([`skew_split`], `dfx_engine.skew_split`), and coalescing small
//! ones into one ([`coalesce`], `dfx_engine.coalesce`).
//!
//! Each of them is about partitions run one per task. A stage whose tasks
//! run slices of several partitions (`dfx_engine.partitions_per_task`) is
//! decided by slice instead: in each slice its most skewed partition runs
//! as parts inside the slice's task (`dfx_engine.split_parts`), or else
//! adjacent small slices are run by one task, which executes every
//! partition of its slices at once, each reading its own buckets
//! (`dfx_engine.coalesced_maps`), unless its maps keep a bucket per
//! partition (a stage the root reads map by map). No join is switched:
//! each of a slice's partitions would build the whole build side, where
//! the partitioned join builds one bucket of it.

pub mod broadcast_switch;
pub mod coalesce;
pub mod skew_split;

use std::collections::BTreeMap;

use datafusion::common::config::ExtensionOptions;
use datafusion::common::{DataFusionError, Result};
use datafusion_proto::protobuf::PhysicalPlanNode;
use prost::Message;
use serde::{Deserialize, Serialize};

use crate::config::{BroadcastSwitch, Coalesce, DfxConfig, SkewSplit};
use crate::error::Area;
use crate::error::fail;
use crate::read_settings::{
    BROADCAST_READ, COALESCED_MAPS, COALESCED_PARTITIONS, SPLIT_PARTS, SPLIT_READ,
};
pub use crate::read_settings::{BroadcastRead, PartitionGroups, PartitionRole, SplitRead};
use crate::wire::WriterPayload;

/// What the scheduler asks with a ready stage.
#[derive(Debug, Clone, Deserialize)]
pub struct AdaptRequest {
    /// The `dfx_engine` settings of the query's sessions (keys without the
    /// prefix): its engine options and store options.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    /// Tasks the scheduler runs at once.
    pub slots: usize,
}

/// The plugin's answer for one stage.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Adaptation {
    /// The maps each task runs, first to last, when they are coalesced (a
    /// map runs one partition, or a slice of them); `None`: one task per
    /// map, as planned.
    pub groups: Option<Vec<[usize; 2]>>,
    /// `dfx_engine` settings (without the prefix) every task of the stage
    /// must be given.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    /// What was decided and why, for `--analyze`; `None` when the stage is
    /// not one a decision applies to.
    pub reason: Option<String>,
    /// Tasks run differently from the plan, each with settings of its own
    /// (after the stage's): a map at or past the stage's planned maps is a
    /// task added to it. `None`: as planned (or as `groups` says).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<Vec<PlannedTask>>,
}

/// One task of an adapted stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedTask {
    /// The map it runs as.
    pub map: usize,
    /// The planned map whose task it is made from (its own for a planned one).
    pub like: usize,
    /// `dfx_engine` settings (without the prefix) for this task alone.
    pub settings: BTreeMap<String, String>,
}

/// Decide how the ready stage `plan_bytes` (an encoded writer, or a stage
/// file's shared part) runs.
///
/// # Errors
///
/// A request that is not one, settings the plugin refuses, bytes that are
/// not a stage, or markers of its inputs that cannot be read.
pub fn adapt_stage(plan_bytes: &[u8], request_json: &str) -> Result<Adaptation> {
    let request: AdaptRequest = serde_json::from_str(request_json)
        .map_err(|e| fail(Area::Adapt, format!("not an adaptive-stage request: {e}")))?;
    let mut config = DfxConfig::default();
    for (key, value) in &request.settings {
        config.set(key, value).map_err(|e| {
            DataFusionError::Configuration(format!(
                "dfx config: cannot set `dfx_engine.{key}` to {value:?}: {e}"
            ))
        })?;
    }
    let mode = config.coalesce()?;
    let skew = config.skew_split()?;
    let switch = config.broadcast_switch()?;
    if mode == Coalesce::Off && skew == SkewSplit::Off && switch == BroadcastSwitch::Off {
        return Ok(Adaptation::default());
    }
    let root = PhysicalPlanNode::decode(plan_bytes)
        .map_err(|e| fail(Area::Adapt, format!("not an encoded physical plan: {e}")))?;
    let writer = crate::wire::read_encoded_stage(plan_bytes)?;
    let stage_id = writer.stage_id;
    // A task running a slice already holds several partitions: what is
    // decided for it is how many slices one task runs.
    if writer.runs_slices() {
        return adapt_slices(&root, &writer, &config, (mode, skew, switch), request.slots);
    }
    let reads = match coalesce::hash_reads(&root) {
        Ok(reads) => reads,
        Err(_why) => return Ok(Adaptation::default()),
    };
    // Why no join switched and no partition was split, said beside
    // coalescing's decision.
    let mut reasons = Vec::new();
    if switch != BroadcastSwitch::Off {
        match switch_stage(&root, stage_id, &reads, &config, switch, request.slots)? {
            Some(Ok(adaptation)) => return Ok(adaptation),
            Some(Err(why)) => reasons.push(why),
            None => {}
        }
    }
    if skew != SkewSplit::Off && config.maps_only_on_workers()? {
        // The parts of a split partition find their companions by the
        // maps' markers, which only the workers holding them can read.
        reasons.push(
            "no partition is split: the maps stay on the disks of the workers that wrote them \
             (shuffle durability local)"
                .to_string(),
        );
    } else if skew != SkewSplit::Off {
        match split_stage(&root, stage_id, &reads, &config, skew, request.slots)? {
            Some(Ok(adaptation)) => return Ok(adaptation),
            Some(Err(why)) => reasons.push(why),
            None => {}
        }
    }
    if mode == Coalesce::Off {
        return Ok(Adaptation::default());
    }
    let bytes = {
        let config = config.clone();
        on_io_blocking(stage_id, async move {
            coalesce::partition_bytes(&reads, &config).await
        })?
    };
    let (groups, reason) = coalesce::decide(
        &bytes,
        "partitions",
        mode,
        request.slots,
        config.coalesce_task_bytes,
    );
    let reason = match reasons.is_empty() {
        true => reason,
        false => format!("{}; {reason}", reasons.join("; ")),
    };
    let Some(groups) = groups else {
        return Ok(Adaptation {
            reason: Some(reason),
            ..Adaptation::default()
        });
    };
    let setting = PartitionGroups::format(stage_id, &groups);
    Ok(Adaptation {
        groups: Some(groups.iter().map(|g| [*g.start(), *g.end()]).collect()),
        settings: BTreeMap::from([(COALESCED_PARTITIONS.to_string(), setting)]),
        reason: Some(reason),
        tasks: None,
    })
}

/// The stage `root` (`writer`), whose tasks run slices of several
/// partitions: in each slice its most skewed partition run as parts inside
/// the slice's task, or else its adjacent small slices run by one task
/// each group; or why neither. A group's task runs every partition of its
/// slices at once, each reading its own buckets. No join is switched: each
/// of a slice's partitions would build the whole build side.
fn adapt_slices(
    root: &PhysicalPlanNode,
    writer: &WriterPayload,
    config: &DfxConfig,
    (mode, skew, switch): (Coalesce, SkewSplit, BroadcastSwitch),
    slots: usize,
) -> Result<Adaptation> {
    let (stage_id, per_map) = (writer.stage_id, writer.partitions_per_map as usize);
    let slices = format!("each task runs a slice of {per_map} partitions");
    let mut reasons = Vec::new();
    // Switched, each of a slice's partitions would build the whole build
    // side, and a skewed partition is split instead.
    if switch != BroadcastSwitch::Off {
        reasons.push(format!(
            "no join is switched (each of its {per_map} partitions would build the whole build \
             side)"
        ));
    }
    let said = |reasons: &[String]| format!("{slices}: {}", reasons.join("; "));
    let kept = |mut reasons: Vec<String>, why: String| {
        reasons.push(why);
        Ok(Adaptation {
            reason: Some(said(&reasons)),
            ..Adaptation::default()
        })
    };
    let reads = match coalesce::hash_reads(root) {
        Ok(reads) => reads,
        Err(_) if mode == Coalesce::Off && skew == SkewSplit::Off && reasons.is_empty() => {
            return Ok(Adaptation::default());
        }
        Err(why) => return kept(reasons, format!("nothing can be decided: {why}")),
    };
    if skew != SkewSplit::Off
        && let Some(split) = split_in_slices(root, writer, &reads, config, skew)?
    {
        match split {
            Ok((tasks, why)) => {
                reasons.push(why);
                return Ok(Adaptation {
                    reason: Some(said(&reasons)),
                    tasks: Some(tasks),
                    ..Adaptation::default()
                });
            }
            Err(why) => reasons.push(why),
        }
    }
    if mode == Coalesce::Off {
        return match reasons.is_empty() {
            true => Ok(Adaptation::default()),
            false => kept(reasons, "no slice is coalesced (coalesce off)".into()),
        };
    }
    if coalesce::keeps_partitions(writer)? {
        return kept(
            reasons,
            format!("its maps keep a bucket for each of the {per_map} partitions of their slice"),
        );
    }
    if writer.maps <= 1 {
        return kept(reasons, "its one task runs every partition".into());
    }
    let bytes = {
        let config = config.clone();
        on_io_blocking(stage_id, async move {
            coalesce::partition_bytes(&reads, &config).await
        })?
    };
    let slice_bytes: Vec<u64> = bytes.chunks(per_map).map(|c| c.iter().sum()).collect();
    let (groups, grouped) = coalesce::decide(
        &slice_bytes,
        "slices",
        mode,
        slots,
        config.coalesce_task_bytes,
    );
    let Some(groups) = groups else {
        return kept(reasons, grouped);
    };
    reasons.push(grouped);
    Ok(Adaptation {
        groups: Some(groups.iter().map(|g| [*g.start(), *g.end()]).collect()),
        settings: BTreeMap::from([(
            COALESCED_MAPS.to_string(),
            PartitionGroups::format(stage_id, &groups),
        )]),
        reason: Some(said(&reasons)),
        tasks: None,
    })
}

/// The tasks of a stage of slices told their split partitions, and why;
/// or why no partition is split.
type SliceSplit = std::result::Result<(Vec<PlannedTask>, String), String>;

/// The tasks of the stage of slices `root` (`writer`, reading `reads`)
/// each told the partition of its slice run as parts, and why; or why
/// none is; `None` for a stage whose partitions cannot be split (see
/// [`skew_split`]).
fn split_in_slices(
    root: &PhysicalPlanNode,
    writer: &WriterPayload,
    reads: &[coalesce::HashRead],
    config: &DfxConfig,
    mode: SkewSplit,
) -> Result<Option<SliceSplit>> {
    let Ok(probe) = skew_split::probe_stage(root) else {
        return Ok(None);
    };
    let Some(read) = reads.iter().find(|r| r.stage_id == probe).cloned() else {
        return Ok(None);
    };
    let per_map = {
        let (config, read) = (config.clone(), read.clone());
        on_io_blocking(writer.stage_id, async move {
            coalesce::map_bucket_bytes(&read, &config).await
        })?
    };
    let per_task = writer.partitions_per_map as usize;
    let (split, why) =
        skew_split::decide_in_slices(writer.stage_id, per_task, &read, &per_map, mode);
    if split.is_empty() {
        return Ok(Some(Err(why)));
    }
    let tasks = split
        .into_iter()
        .map(|(map, parts)| PlannedTask {
            map,
            like: map,
            settings: BTreeMap::from([(SPLIT_PARTS.to_string(), parts.format())]),
        })
        .collect();
    Ok(Some(Ok((tasks, why))))
}

/// `work` (reading the markers of stage `stage_id`'s inputs, local or on
/// S3) run to its end on the plugin's I/O runtime, from this synchronous
/// export.
fn on_io_blocking<T: Send + 'static>(
    stage_id: u64,
    work: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    futures::executor::block_on(crate::exchange::io::on_io(work))
        .map_err(|e| fail(Area::Adapt, format!("stage {stage_id}: {e}")))?
}

/// The stage `root` (`stage_id`, reading `reads`) with its partitioned
/// joins switched to broadcast ones, or why they are not; `None` for a
/// stage that cannot switch (see [`broadcast`]). A switched stage's
/// partitions are coalesced too, by the probe bytes of their shares of
/// maps, for `slots` tasks at once: each task reads the build side whole
/// once, however many partitions it runs.
fn switch_stage(
    root: &PhysicalPlanNode,
    stage_id: u64,
    reads: &[coalesce::HashRead],
    config: &DfxConfig,
    mode: BroadcastSwitch,
    slots: usize,
) -> Result<Option<std::result::Result<Adaptation, String>>> {
    let Ok((probe, builds)) = broadcast_switch::switchable(root) else {
        return Ok(None);
    };
    let build_reads: Vec<coalesce::HashRead> = builds
        .iter()
        .filter_map(|b| reads.iter().find(|r| r.stage_id == *b).cloned())
        .collect();
    if build_reads.len() != builds.len() {
        return Ok(None);
    }
    let Some(probe_read) = reads.iter().find(|r| r.stage_id == probe).cloned() else {
        return Ok(None);
    };
    let bytes = {
        let config = config.clone();
        on_io_blocking(stage_id, async move {
            let mut build_buckets = vec![0u64; probe_read.buckets];
            for read in &build_reads {
                for map in coalesce::map_bucket_bytes(read, &config).await? {
                    for (total, bucket) in build_buckets.iter_mut().zip(map) {
                        *total += bucket;
                    }
                }
            }
            let probe_maps = coalesce::map_bucket_bytes(&probe_read, &config).await?;
            Ok(broadcast_switch::JoinBytes {
                build_buckets,
                probe_maps,
            })
        })?
    };
    let (read, reason) =
        broadcast_switch::decide(stage_id, reads, (probe, &builds), &bytes, mode, slots);
    let Some(read) = read else {
        return Ok(Some(Err(reason)));
    };
    let mut settings = BTreeMap::from([(BROADCAST_READ.to_string(), read.format())]);
    let coalescing = config.coalesce()?;
    if coalescing == Coalesce::Off {
        return Ok(Some(Ok(Adaptation {
            groups: None,
            settings,
            reason: Some(reason),
            tasks: None,
        })));
    }
    let partitions = bytes.build_buckets.len();
    let maps: Vec<u64> = bytes.probe_maps.iter().map(|m| m.iter().sum()).collect();
    let shares: Vec<u64> = (0..partitions)
        .map(|p| {
            BroadcastRead::probe_maps(p, partitions, maps.len())
                .map(|m| maps[m])
                .sum()
        })
        .collect();
    let (groups, grouped) = coalesce::decide(
        &shares,
        "partitions",
        coalescing,
        slots,
        config.coalesce_task_bytes,
    );
    let reason = format!("{reason}; {grouped}");
    let Some(groups) = groups else {
        return Ok(Some(Ok(Adaptation {
            groups: None,
            settings,
            reason: Some(reason),
            tasks: None,
        })));
    };
    settings.insert(
        COALESCED_PARTITIONS.to_string(),
        PartitionGroups::format(stage_id, &groups),
    );
    Ok(Some(Ok(Adaptation {
        groups: Some(groups.iter().map(|g| [*g.start(), *g.end()]).collect()),
        settings,
        reason: Some(reason),
        tasks: None,
    })))
}

/// The stage `root` (`stage_id`, reading `reads`) with its skewed
/// partitions split for `slots` tasks at once, or why none is; `None` for
/// a stage whose partitions cannot be split (see [`split`]).
fn split_stage(
    root: &PhysicalPlanNode,
    stage_id: u64,
    reads: &[coalesce::HashRead],
    config: &DfxConfig,
    mode: SkewSplit,
    slots: usize,
) -> Result<Option<std::result::Result<Adaptation, String>>> {
    let Ok(probe) = skew_split::probe_stage(root) else {
        return Ok(None);
    };
    let Some(read) = reads.iter().find(|r| r.stage_id == probe).cloned() else {
        return Ok(None);
    };
    let maps = read.buckets;
    let per_map = {
        let (config, read) = (config.clone(), read.clone());
        on_io_blocking(stage_id, async move {
            coalesce::map_bucket_bytes(&read, &config).await
        })?
    };
    let (parts, reason) = skew_split::decide(stage_id, maps, &read, &per_map, mode, slots);
    if parts.is_empty() {
        return Ok(Some(Err(reason)));
    }
    let tasks = parts
        .into_iter()
        .map(|part| PlannedTask {
            map: part.map,
            like: part.read.partition,
            settings: BTreeMap::from([(SPLIT_READ.to_string(), part.read.format())]),
        })
        .collect();
    Ok(Some(Ok(Adaptation {
        groups: None,
        settings: BTreeMap::new(),
        reason: Some(reason),
        tasks: Some(tasks),
    })))
}
