//! Coalescing: adjacent small partitions of a consumer stage read by one
//! task, decided from the bytes its inputs published.
//!
//! A stage can be coalesced when every partition its tasks run comes from
//! hash reads alone: followed from the writer down (as
//! [`crate::encoded`] follows which partition a map reads), each input a
//! task reads partition by partition is a hash reader whose partition p is
//! the task's map p. Then partitions p..=q in one task are buckets p..=q of
//! every such reader: rows of one key still meet in one task, and every
//! operator between the readers and the writer (a partitioned join, a final
//! aggregate, a sort) runs over them as over one partition. A stage that
//! scans a table, reads map by map (pass-through) or unions inputs at an
//! offset is left as planned.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::path::PathBuf;

use datafusion::common::Result;
use datafusion_proto::protobuf::partitioning::PartitionMethod;
use datafusion_proto::protobuf::physical_plan_node::PhysicalPlanType;
use datafusion_proto::protobuf::{self, PhysicalPlanNode};
use prost::Message;

use crate::config::{Coalesce, DfxConfig};
use crate::encoded::{Reads, child_reads, children_mut, find_payload, is_file_scan};
use crate::error::Area;
use crate::error::fail;
use crate::exchange::locate::read_map_marker;
use crate::wire::{Payload, ReadMode, WriterPayload};

/// The fewest bytes a task is given when partitions are coalesced to
/// spread a stage over the workers: below this, a task's fixed cost
/// (a dispatch, a plan, the markers of every map) outweighs its rows.
pub const MIN_TASK_BYTES: u64 = 1 << 20;

/// A hash read a stage's partitions come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashRead {
    /// The stage read.
    pub stage_id: u64,
    /// Its maps.
    pub maps: usize,
    /// Its buckets: the consumer's partitions.
    pub buckets: usize,
    /// Where it published.
    pub shuffle_dir: PathBuf,
}

/// The hash reads every partition of the stage `root` (an encoded writer)
/// comes from, or why its partitions cannot be coalesced.
pub fn hash_reads(root: &PhysicalPlanNode) -> std::result::Result<Vec<HashRead>, String> {
    let mut root = root.clone();
    let (maps, per_map) = match root.physical_plan_type.as_ref() {
        Some(PhysicalPlanType::Extension(ext)) => match find_payload(&ext.node) {
            Some((_, Payload::Writer(writer))) => (
                writer.maps as usize,
                (writer.partitions_per_map as usize).max(1),
            ),
            _ => return Err("its root is not a stage writer".into()),
        },
        _ => return Err("its root is not a stage writer".into()),
    };
    let mut reads = Vec::new();
    walk(&mut root, Reads::Map { offset: 0 }, &mut reads)?;
    if reads.is_empty() {
        return Err("it reads no stage partition by partition".into());
    }
    // Each map runs `per_map` partitions (the last one maybe fewer).
    if let Some(read) = reads.iter().find(|r| r.buckets.div_ceil(per_map) != maps) {
        let partitions = match per_map {
            1 => format!("{maps} partitions"),
            _ => format!("{maps} slices of {per_map} partitions"),
        };
        return Err(format!(
            "its {partitions} are not the {} buckets of stage {}",
            read.buckets, read.stage_id
        ));
    }
    Ok(reads)
}

/// Whether the maps of the stage `writer` keep a bucket for each partition
/// of their slice (a writer that splits rows by no partitioning, as
/// `ShuffleWriterExec::keeps_partitions` says of the decoded writer), so
/// that their slices cannot be run by one task.
///
/// # Errors
///
/// A partitioning that is not encoded protobuf.
pub fn keeps_partitions(writer: &WriterPayload) -> Result<bool> {
    let partitioning =
        protobuf::Partitioning::decode(writer.partitioning.as_slice()).map_err(|e| {
            fail(
                Area::Adapt,
                format!(
                    "stage {}: partitioning is not valid protobuf: {e}",
                    writer.stage_id
                ),
            )
        })?;
    Ok(matches!(
        partitioning.partition_method,
        Some(PartitionMethod::Unknown(1))
    ))
}

fn walk(
    node: &mut PhysicalPlanNode,
    reads: Reads,
    out: &mut Vec<HashRead>,
) -> std::result::Result<(), String> {
    // Read whole in every task, or not run at all: no partition of it
    // follows the task's map.
    let Reads::Map { offset } = reads else {
        return Ok(());
    };
    let Some(kind) = node.physical_plan_type.as_mut() else {
        return Err("a node the plan does not name".into());
    };
    if is_file_scan(kind) {
        return Err("it scans a table partition by partition".into());
    }
    if let PhysicalPlanType::Extension(extension) = kind {
        return match find_payload(&extension.node).map(|(_, p)| p) {
            Some(Payload::Writer(_) | Payload::JoinFilter { .. }) => {
                for input in &mut extension.inputs {
                    walk(input, reads, out)?;
                }
                Ok(())
            }
            Some(Payload::Reader(writer)) if writer.mode == ReadMode::Hash => {
                if offset != 0 {
                    return Err(format!(
                        "it reads stage {} at an offset (a union)",
                        writer.stage_id
                    ));
                }
                out.push(HashRead {
                    stage_id: writer.stage_id,
                    maps: writer.maps as usize,
                    buckets: writer.buckets as usize,
                    shuffle_dir: PathBuf::from(writer.shuffle_dir),
                });
                Ok(())
            }
            Some(Payload::Reader(reader)) => Err(format!(
                "it reads a stage {} partition by partition",
                reader.mode.as_str()
            )),
            Some(other) => Err(format!(
                "its {} runs partition by partition",
                other.node_name()
            )),
            None => Err("an extension node that is not dfx's".into()),
        };
    }
    let inputs = child_reads(kind, reads);
    let children = children_mut(kind);
    if children.is_empty() {
        return Err("a leaf that is not a hash read runs partition by partition".into());
    }
    for (child, reads) in children.into_iter().zip(inputs) {
        walk(child, reads, out)?;
    }
    Ok(())
}

/// Bytes of each partition of a stage reading `reads`: bucket p of every
/// map of each, summed, as their markers list them.
///
/// # Errors
///
/// A marker that cannot be read (a lost map among them).
pub async fn partition_bytes(reads: &[HashRead], config: &DfxConfig) -> Result<Vec<u64>> {
    let partitions = reads.first().map_or(0, |r| r.buckets);
    let mut bytes = vec![0u64; partitions];
    let mut seen: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for read in reads {
        if let std::collections::btree_map::Entry::Vacant(slot) = seen.entry(read.stage_id) {
            let mut per_bucket = vec![0u64; read.buckets];
            for map in map_bucket_bytes(read, config).await? {
                for (slot, b) in per_bucket.iter_mut().zip(map) {
                    *slot += b;
                }
            }
            slot.insert(per_bucket);
        }
        for (slot, b) in bytes.iter_mut().zip(&seen[&read.stage_id]) {
            *slot += b;
        }
    }
    Ok(bytes)
}

/// Bytes of each bucket of each map `read` names (`[map][bucket]`): as
/// the maps reported them, when the driver handed their layouts
/// (`dfx_engine.shuffle_ranges`, every planned map and no added one), else
/// as their markers list them; a map's companions (the other parts of a
/// split partition, see [`super::skew_split`]) count as the map's.
///
/// # Errors
///
/// A marker that cannot be read (a lost map among them), or one listing a
/// bucket past the stage's buckets.
pub async fn map_bucket_bytes(read: &HashRead, config: &DfxConfig) -> Result<Vec<Vec<u64>>> {
    let layouts = config.shuffle_ranges()?;
    if let Some(maps) = layouts.as_ref().and_then(|l| l.stages.get(&read.stage_id))
        && maps.len() == read.maps
        && maps.iter().all(|m| m.described() == (0..read.buckets))
    {
        return Ok(maps.iter().map(|m| m.bytes.clone()).collect());
    }
    let mut out = Vec::with_capacity(read.maps);
    for map in 0..read.maps {
        let mut per_bucket = vec![0u64; read.buckets];
        let mut pending = vec![map];
        while let Some(physical) = pending.pop() {
            let marker = read_map_marker(
                &read.shuffle_dir,
                config,
                read.stage_id,
                physical,
                read.buckets,
            )
            .await?;
            for entry in &marker.buckets {
                let bucket = per_bucket.get_mut(entry.bucket as usize).ok_or_else(|| {
                    fail(
                        Area::Adapt,
                        format!(
                            "stage {} map {physical}: bucket {} is past its {} buckets",
                            read.stage_id, entry.bucket, read.buckets
                        ),
                    )
                })?;
                *bucket += entry.bytes;
            }
            if physical == map {
                pending.extend(marker.companions.iter().map(|&c| c as usize));
            }
        }
        out.push(per_bucket);
    }
    Ok(out)
}

/// Adjacent partitions grouped while a group stays within `target` bytes
/// (a partition above it alone); with `at_least_two`, every group but a
/// last odd one takes two partitions or more, whatever their bytes.
pub fn group(bytes: &[u64], target: u64, at_least_two: bool) -> Vec<RangeInclusive<usize>> {
    let mut groups = Vec::new();
    let mut start = 0;
    let mut sum = 0u64;
    for (p, &b) in bytes.iter().enumerate() {
        let short = at_least_two && p - start < 2;
        if p > start && sum.saturating_add(b) > target && !short {
            groups.push(start..=p - 1);
            start = p;
            sum = 0;
        }
        sum = sum.saturating_add(b);
    }
    if !bytes.is_empty() {
        groups.push(start..=bytes.len() - 1);
    }
    groups
}

/// The bytes a coalesced task aims at: the stage's bytes spread over
/// `slots` workers, at least [`MIN_TASK_BYTES`], at most the configured
/// target.
pub fn task_target(total: u64, slots: usize, configured: u64) -> u64 {
    let spread = total.div_ceil(slots.max(1) as u64);
    spread.max(MIN_TASK_BYTES).min(configured.max(1))
}

/// The groups for a stage of partitions `bytes` under `mode`, and why;
/// `None` groups when every partition keeps its task.
pub fn decide(
    bytes: &[u64],
    what: &str,
    mode: Coalesce,
    slots: usize,
    configured: u64,
) -> (Option<Vec<RangeInclusive<usize>>>, String) {
    let total: u64 = bytes.iter().sum();
    let target = task_target(total, slots, configured);
    let groups = group(bytes, target, mode == Coalesce::On);
    let n = bytes.len();
    let largest = groups
        .iter()
        .map(|g| bytes[g.clone()].iter().sum::<u64>())
        .max()
        .unwrap_or(0);
    let forced = if mode == Coalesce::On {
        ", forced on"
    } else {
        ""
    };
    if groups.len() == n {
        let why = format!(
            "kept {n} tasks: {} read in all, no two adjacent {what} fit in {} a task{forced}",
            human(total),
            human(target)
        );
        return (None, why);
    }
    let why = format!(
        "coalesced {n} {what} into {} task(s): {} read in all, the largest task {} \
         (target {} a task){forced}",
        groups.len(),
        human(total),
        human(largest),
        human(target)
    );
    (Some(groups), why)
}

/// Bytes for a person: `812 B`, `1.5 KiB`, `3.2 MiB`, `1.1 GiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn adjacent_partitions_share_a_task_up_to_the_target() {
        assert_eq!(group(&[1, 1, 1, 1], 2, false), vec![0..=1, 2..=3]);
        assert_eq!(group(&[5, 1, 1, 5], 2, false), vec![0..=0, 1..=2, 3..=3]);
        assert_eq!(group(&[1, 1, 1], 100, false), vec![0..=2]);
        assert_eq!(group(&[], 100, false), Vec::<RangeInclusive<usize>>::new());
        // Forced: pairs at least, whatever the bytes.
        assert_eq!(group(&[9, 9, 9, 9, 9], 1, true), vec![0..=1, 2..=3, 4..=4]);
    }

    #[test]
    fn the_target_spreads_a_stage_over_the_slots() {
        assert_eq!(task_target(10 * MIB, 2, 64 * MIB), 5 * MIB);
        // A small stage: one task.
        assert_eq!(task_target(100, 2, 64 * MIB), MIN_TASK_BYTES);
        // A large one: never past the configured target.
        assert_eq!(task_target(1 << 40, 2, 64 * MIB), 64 * MIB);
    }

    #[test]
    fn a_decision_says_what_and_why() {
        let (groups, why) = decide(
            &[100, 200, 300, 400],
            "partitions",
            Coalesce::Auto,
            2,
            64 * MIB,
        );
        assert_eq!(groups, Some(vec![0..=3]));
        assert!(why.contains("coalesced 4 partitions into 1 task"), "{why}");
        let (groups, why) = decide(
            &[8 * MIB, 8 * MIB],
            "partitions",
            Coalesce::Auto,
            2,
            64 * MIB,
        );
        assert_eq!(groups, None);
        assert!(why.starts_with("kept 2 tasks"), "{why}");
        let (groups, why) = decide(&[8 * MIB, 8 * MIB], "slices", Coalesce::On, 2, 64 * MIB);
        assert_eq!(groups, Some(vec![0..=1]));
        assert!(why.ends_with("forced on"), "{why}");
    }

    #[test]
    fn bytes_read_for_a_person() {
        assert_eq!(human(812), "812 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(3 * MIB + MIB / 5), "3.2 MiB");
    }
}
