//! Skew splitting: a partition far larger than its stage's others read by
//! several tasks, decided from the bytes its inputs published.
//!
//! A partition of a partitioned join is split by the maps of its probe
//! side (as Spark's skew join splits by ranges of mappers): part `i`
//! reads the partition's bucket from probe maps `first..=last` only, and
//! every other input (the build side) whole, so each probe row meets every
//! build row of its key in exactly one part. That is right only where
//! every operator between the probe reader and the stage's writer treats
//! rows one by one or keeps each probe row's output to itself:
//!
//! - projections, filters, batch coalescing, partial aggregates (the
//!   next stage's final aggregate merges the parts' partial states);
//! - hash joins, through their probe (right) input, of a kind that emits
//!   nothing for build rows that found no match: inner, right, right
//!   semi, right anti, right mark.
//!
//! Anything else (a final aggregate, a sort, a window, a left or full
//! join, a limit, a key summary for a filter) leaves the stage as planned.
//!
//! The parts publish as maps of their own: the first as the partition's
//! map, the others as maps numbered from the stage's planned maps up (its
//! *companions*). The first names its companions in its marker, and every
//! reader of a map reads its companions too, so the stage's maps mean what
//! they meant unsplit, whoever reads them (a stage, the root, any host).
//!
//! ```text
//! "<stage>:<partition>:<probe stage>:<first>-<last>:<map>:<companion>,..."   e.g. "4:1:2:0-0:1:3"
//! ```
//!
//! is what each part's task is told (`dfx_engine.split_read`): which
//! partition it reads, whose probe maps, the map it publishes as, and, for
//! the first part, the maps of the others. Every part's task executes the
//! partition itself (an added map's task runs its planned map's part of
//! the plan), so no operator is asked for a partition it does not have.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use datafusion_proto::protobuf::physical_plan_node::PhysicalPlanType;
use datafusion_proto::protobuf::{AggregateMode, JoinType, PartitionMode, PhysicalPlanNode};

use crate::adapt::coalesce::{HashRead, human};
use crate::config::SkewSplit;
use crate::encoded::find_payload;
use crate::read_settings::{SplitParts, SplitRead};
use crate::wire::{Payload, ReadMode};

/// The least bytes a part aims at when a partition is split: below this,
/// a task's fixed cost outweighs its rows.
pub const MIN_PART_BYTES: u64 = 1 << 20;

/// The stage the probe side of the stage `root` (an encoded writer) reads
/// partition by partition, when its partitions can be split, or why not.
pub fn probe_stage(root: &PhysicalPlanNode) -> std::result::Result<u64, String> {
    probe_path(writer_input(root)?, &mut Vec::new())
}

/// The input of the stage writer `root`, or why it is not one.
pub(super) fn writer_input(
    root: &PhysicalPlanNode,
) -> std::result::Result<&PhysicalPlanNode, String> {
    let Some(PhysicalPlanType::Extension(writer)) = root.physical_plan_type.as_ref() else {
        return Err("its root is not a stage writer".into());
    };
    match &writer.inputs[..] {
        [input] => Ok(input),
        _ => Err("its writer has no one input".into()),
    }
}

/// Down the probe side of `node` to the hash read it divides, through the
/// operators listed above; for each partitioned join on the way, what its
/// build side reads (the stage of a hash read under row-by-row nodes, or
/// why it is something else) goes into `builds`.
pub(super) fn probe_path(
    node: &PhysicalPlanNode,
    builds: &mut Vec<std::result::Result<u64, String>>,
) -> std::result::Result<u64, String> {
    use PhysicalPlanType as T;
    let Some(kind) = node.physical_plan_type.as_ref() else {
        return Err("a node the plan does not name".into());
    };
    let only = |input: &Option<Box<PhysicalPlanNode>>,
                builds: &mut Vec<std::result::Result<u64, String>>| match input {
        Some(input) => probe_path(input, builds),
        None => Err("a node without its input".into()),
    };
    match kind {
        T::Projection(n) => only(&n.input, builds),
        T::Filter(n) => only(&n.input, builds),
        T::CoalesceBatches(n) => only(&n.input, builds),
        T::Aggregate(n) if n.mode == AggregateMode::Partial as i32 => only(&n.input, builds),
        T::Aggregate(_) => Err("an aggregate that is not partial sees every row of a key".into()),
        T::HashJoin(join) => {
            let keeps_probe_rows_apart = [
                JoinType::Inner,
                JoinType::Right,
                JoinType::Rightsemi,
                JoinType::Rightanti,
                JoinType::Rightmark,
            ]
            .iter()
            .any(|t| *t as i32 == join.join_type);
            if !keeps_probe_rows_apart {
                return Err("a join that emits its build side's unmatched rows".into());
            }
            if join.partition_mode == PartitionMode::Partitioned as i32 {
                builds.push(match join.left.as_deref() {
                    Some(left) => build_read(left),
                    None => Err("a join without its build side".into()),
                });
            } else if join.partition_mode != PartitionMode::CollectLeft as i32 {
                return Err("a join that is neither partitioned nor a broadcast one".into());
            }
            only(&join.right, builds)
        }
        T::Extension(extension) => hash_read_stage(extension, "its probe side"),
        _ => Err("an operator between the probe side and the writer sees many rows at once".into()),
    }
}

/// The stage a partitioned join's build side `node` reads by hash, under
/// operators that treat rows one by one.
fn build_read(node: &PhysicalPlanNode) -> std::result::Result<u64, String> {
    use PhysicalPlanType as T;
    let input = match node.physical_plan_type.as_ref() {
        Some(T::Projection(n)) => n.input.as_deref(),
        Some(T::Filter(n)) => n.input.as_deref(),
        Some(T::CoalesceBatches(n)) => n.input.as_deref(),
        Some(T::Extension(extension)) => return hash_read_stage(extension, "its build side"),
        _ => return Err("a build side that is not a stage read by hash".into()),
    };
    input.map_or_else(|| Err("a node without its input".into()), build_read)
}

/// The stage a hash reader reads; `side` names where it was met.
fn hash_read_stage(
    extension: &datafusion_proto::protobuf::PhysicalExtensionNode,
    side: &str,
) -> std::result::Result<u64, String> {
    match find_payload(&extension.node).map(|(_, p)| p) {
        Some(Payload::Reader(reader)) if reader.mode == ReadMode::Hash => Ok(reader.stage_id),
        Some(other) => Err(format!("{side} holds a {}", other.node_name())),
        None => Err("an extension node that is not dfx's".into()),
    }
}

/// One part of a split partition, as the scheduler runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// The map the part publishes as.
    pub map: usize,
    /// What its task is told.
    pub read: SplitRead,
}

/// A skewed partition, and the ranges of probe maps its parts read.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Skewed {
    partition: usize,
    /// Its bytes from the probe stage.
    bytes: u64,
    ranges: Vec<RangeInclusive<usize>>,
}

/// The partitions of `per_map` (`per_map[m][p]`: bytes of bucket p in the
/// probe stage's map m) that are skewed under `mode`, each cut into parts
/// for `slots` at once, and the median partition's bytes. Under `auto` a
/// part is at least the median, its share of the slots and
/// [`MIN_PART_BYTES`]: more parts than slots only queue, and each reads
/// the build side again.
fn skewed(
    partitions: usize,
    per_map: &[Vec<u64>],
    mode: SkewSplit,
    slots: usize,
) -> (Vec<Skewed>, u64) {
    let per_partition: Vec<u64> = (0..partitions)
        .map(|p| per_map.iter().map(|m| m.get(p).copied().unwrap_or(0)).sum())
        .collect();
    let median = median(&per_partition);
    let mut out = Vec::new();
    for (p, &bytes) in per_partition.iter().enumerate() {
        let target = match mode {
            SkewSplit::Off => return (Vec::new(), median),
            SkewSplit::On => 1,
            SkewSplit::Auto {
                factor,
                bytes: least,
            } => {
                if (bytes as f64) <= factor * median as f64 || bytes < least {
                    continue;
                }
                median
                    .max(MIN_PART_BYTES)
                    .max(bytes.div_ceil(slots.max(1) as u64))
            }
        };
        let of_maps: Vec<u64> = per_map
            .iter()
            .map(|m| m.get(p).copied().unwrap_or(0))
            .collect();
        let ranges = ranges(&of_maps, target);
        if ranges.len() >= 2 {
            out.push(Skewed {
                partition: p,
                bytes,
                ranges,
            });
        }
    }
    (out, median)
}

/// Why a decision split what it did, or why it split nothing.
fn said(mode: SkewSplit, probe: u64, split: &[String], median: u64) -> String {
    let forced = if mode == SkewSplit::On {
        ", forced on"
    } else {
        ""
    };
    match split.is_empty() {
        // Forced on, every partition is a candidate: what it lacks is rows
        // in two maps, since a part is a range of maps.
        true if mode == SkewSplit::On => format!(
            "split no partition: none has rows in two or more of stage {probe}'s maps \
             (median {}){forced}",
            human(median)
        ),
        true => format!(
            "split no partition: none of stage {probe}'s is skewed (median {}){forced}",
            human(median)
        ),
        false => format!(
            "split {} (the median partition {}){forced}",
            split.join(", "),
            human(median)
        ),
    }
}

/// The parts of the stage `stage_id` (of `maps` planned maps) whose
/// partitions read `probe` (`per_map[m][p]`: bytes of bucket p in the
/// probe stage's map m, companions included), under `mode` with `slots`
/// tasks at once; and why. A skewed partition's first part publishes as
/// its map, the others as maps added past `maps`.
pub fn decide(
    stage_id: u64,
    maps: usize,
    probe: &HashRead,
    per_map: &[Vec<u64>],
    mode: SkewSplit,
    slots: usize,
) -> (Vec<Part>, String) {
    if mode == SkewSplit::Off {
        return (Vec::new(), String::new());
    }
    let (skewed, median) = skewed(probe.buckets, per_map, mode, slots);
    let mut parts = Vec::new();
    let mut next = maps;
    let mut split = Vec::new();
    for Skewed {
        partition: p,
        bytes,
        ranges,
    } in skewed
    {
        let companions: Vec<usize> = (next..next + ranges.len() - 1).collect();
        next += ranges.len() - 1;
        for (i, range) in ranges.iter().enumerate() {
            let map = if i == 0 { p } else { companions[i - 1] };
            parts.push(Part {
                map,
                read: SplitRead {
                    stage_id,
                    partition: p,
                    probe_stage: probe.stage_id,
                    maps: range.clone(),
                    map,
                    companions: if i == 0 {
                        companions.clone()
                    } else {
                        Vec::new()
                    },
                },
            });
        }
        split.push(format!(
            "partition {p} ({} from stage {}) into {} tasks by its maps",
            human(bytes),
            probe.stage_id,
            ranges.len()
        ));
    }
    (parts, said(mode, probe.stage_id, &split, median))
}

/// For the stage `stage_id` whose tasks run slices of `per_task`
/// partitions reading `probe` (as in [`decide`]): in each slice, its most
/// skewed partition run as parts inside the slice's task; under `auto`
/// about as many as the task's partitions, since they share its worker's
/// cores. Each slice's map with what its task is told, and why.
pub fn decide_in_slices(
    stage_id: u64,
    per_task: usize,
    probe: &HashRead,
    per_map: &[Vec<u64>],
    mode: SkewSplit,
) -> (Vec<(usize, SplitParts)>, String) {
    if mode == SkewSplit::Off {
        return (Vec::new(), String::new());
    }
    let (skewed, median) = skewed(probe.buckets, per_map, mode, per_task);
    let mut largest: BTreeMap<usize, Skewed> = BTreeMap::new();
    for part in skewed {
        let map = part.partition / per_task.max(1);
        if largest.get(&map).is_none_or(|held| held.bytes < part.bytes) {
            largest.insert(map, part);
        }
    }
    let mut split = Vec::new();
    let mut tasks = Vec::new();
    for (map, skewed) in largest {
        split.push(format!(
            "partition {} ({} from stage {}) into {} parts inside its task by its maps",
            skewed.partition,
            human(skewed.bytes),
            probe.stage_id,
            skewed.ranges.len()
        ));
        tasks.push((
            map,
            SplitParts {
                stage_id,
                partition: skewed.partition,
                probe_stage: probe.stage_id,
                parts: skewed.ranges,
            },
        ));
    }
    (tasks, said(mode, probe.stage_id, &split, median))
}

/// Adjacent maps grouped while a group stays within `target` bytes; a
/// map with no bytes never starts a group, so every group reads rows.
fn ranges(bytes: &[u64], target: u64) -> Vec<RangeInclusive<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut sum = 0u64;
    for (m, &b) in bytes.iter().enumerate() {
        if sum > 0 && b > 0 && sum.saturating_add(b) > target {
            out.push(start..=m - 1);
            start = m;
            sum = 0;
        }
        sum = sum.saturating_add(b);
    }
    if !bytes.is_empty() {
        out.push(start..=bytes.len() - 1);
    }
    out
}

/// The median of `values` (the lower middle one of an even count).
fn median(values: &[u64]) -> u64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted
        .get(sorted.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    const MIB: u64 = 1 << 20;

    fn probe(maps: usize, buckets: usize) -> HashRead {
        HashRead {
            stage_id: 2,
            maps,
            buckets,
            shuffle_dir: PathBuf::from("/s"),
        }
    }

    #[test]
    fn a_skewed_partition_is_split_by_its_probe_maps() {
        // Partition 1 holds 90 MiB over two maps, the others 1 MiB each.
        let per_map = vec![vec![MIB, 45 * MIB, MIB], vec![0, 45 * MIB, 0]];
        let mode = SkewSplit::Auto {
            factor: 4.0,
            bytes: 64 * MIB,
        };
        let (parts, why) = decide(7, 3, &probe(2, 3), &per_map, mode, 2);
        assert_eq!(parts.len(), 2, "{why}");
        assert_eq!(parts[0].map, 1);
        assert_eq!(parts[0].read.maps, 0..=0);
        assert_eq!(parts[0].read.companions, vec![3]);
        assert_eq!(parts[1].map, 3);
        assert_eq!(parts[1].read.maps, 1..=1);
        assert!(parts[1].read.companions.is_empty());
        assert!(
            why.contains("partition 1 (90.0 MiB from stage 2) into 2 tasks"),
            "{why}"
        );
        // Below the least bytes: kept.
        let small = SkewSplit::Auto {
            factor: 4.0,
            bytes: 128 * MIB,
        };
        let (parts, why) = decide(7, 3, &probe(2, 3), &per_map, small, 2);
        assert!(parts.is_empty());
        assert!(why.starts_with("split no partition"), "{why}");
    }

    #[test]
    fn a_skewed_partition_is_cut_into_about_as_many_parts_as_slots() {
        // Partition 0 holds 10 MiB in each of eight maps; partition 1 a
        // little in each.
        let per_map = vec![vec![10 * MIB, MIB / 8]; 8];
        let mode = SkewSplit::Auto {
            factor: 4.0,
            bytes: 64 * MIB,
        };
        let (parts, why) = decide(7, 2, &probe(8, 2), &per_map, mode, 2);
        let ranges: Vec<_> = parts.iter().map(|p| p.read.maps.clone()).collect();
        assert_eq!(ranges, vec![0..=3, 4..=7], "{why}");
    }

    #[test]
    fn every_group_of_maps_reads_rows() {
        assert_eq!(ranges(&[10, 20], 1), vec![0..=0, 1..=1]);
        assert_eq!(ranges(&[0, 5], 1), vec![0..=1]);
        assert_eq!(ranges(&[10, 0, 20, 0], 1), vec![0..=1, 2..=3]);
        assert_eq!(ranges(&[3, 3, 3], 6), vec![0..=1, 2..=2]);
    }

    #[test]
    fn a_slice_runs_its_most_skewed_partition_as_parts_inside_its_task() {
        // Slices of two: partitions 0 and 1 (map 0), 2 and 3 (map 1).
        // Partition 1 holds 80 MiB over four probe maps, partition 0 40 MiB,
        // the others 1 MiB.
        let per_map = vec![vec![10 * MIB, 20 * MIB, MIB / 4, MIB / 4]; 4];
        let mode = SkewSplit::Auto {
            factor: 4.0,
            bytes: 16 * MIB,
        };
        let (tasks, why) = decide_in_slices(7, 2, &probe(4, 4), &per_map, mode);
        // One partition a slice, the larger; about a part per partition of
        // the slice, since the parts share its task's cores.
        assert_eq!(tasks.len(), 1, "{why}");
        let (map, parts) = &tasks[0];
        assert_eq!((*map, parts.partition, parts.probe_stage), (0, 1, 2));
        assert_eq!(parts.parts, vec![0..=1, 2..=3]);
        assert!(
            why.contains("partition 1 (80.0 MiB from stage 2) into 2 parts inside its task"),
            "{why}"
        );
        // The other slice has nothing skewed; forced on, each slice's
        // largest partition is cut at every map.
        let (tasks, why) = decide_in_slices(7, 2, &probe(4, 4), &per_map, SkewSplit::On);
        let split: Vec<_> = tasks
            .iter()
            .map(|(m, p)| (*m, p.partition, p.parts.len()))
            .collect();
        assert_eq!(split, vec![(0, 1, 4), (1, 2, 4)], "{why}");
        assert!(
            decide_in_slices(7, 2, &probe(4, 4), &per_map, SkewSplit::Off)
                .0
                .is_empty()
        );
    }

    #[test]
    fn forced_on_splits_every_partition_with_rows_in_two_maps() {
        let per_map = vec![vec![10, 0], vec![20, 5]];
        let (parts, why) = decide(7, 2, &probe(2, 2), &per_map, SkewSplit::On, 2);
        // Partition 0 in two parts; partition 1's rows are in one map.
        assert_eq!(parts.iter().map(|p| p.map).collect::<Vec<_>>(), vec![0, 2]);
        assert!(why.ends_with("forced on"), "{why}");
        let (parts, _) = decide(7, 2, &probe(2, 2), &per_map, SkewSplit::Off, 2);
        assert!(parts.is_empty());
        // Forced on, with every partition's rows in one map: nothing to cut.
        let one_map = vec![vec![10, 20]];
        let (parts, why) = decide(7, 2, &probe(1, 2), &one_map, SkewSplit::On, 2);
        assert!(parts.is_empty());
        assert!(
            why.contains("none has rows in two or more of stage 2's maps"),
            "{why}"
        );
    }
}
