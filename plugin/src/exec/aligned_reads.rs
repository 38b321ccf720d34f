//! Which stages a stage reads partition by partition: those whose bucket
//! `p` its input's partition `p` alone reads, so that a map running a slice
//! of partitions reads only the slice's buckets of them, and the driver
//! hands each map the layouts of those buckets only.
//!
//! ```text
//! writer (P partitions)
//!   └ projection / filter / partitioned hash join / aggregate ... (P each)
//!       └ reader of stage 3, hash, P buckets      ─► aligned: bucket p for partition p
//!   └ union (2P) ─► reader of stage 4             ─► not aligned (partition p + P reads bucket p)
//! ```
//!
//! Only the operators known to compute output partition `p` from input
//! partition `p` of the children followed are walked through (the in-memory
//! side of the rule the cut applies to encoded plans,
//! `crate::encoded::walk::child_reads`, kept to the cases where partition
//! `p` reads partition `p`); any other
//! node (a union, a merge, a collected build side, a node of a host) ends
//! the walk, and a stage read beneath it is not aligned. A stage read
//! twice is aligned only if both reads are. Being wrong in the safe
//! direction costs a task the whole layout, never a bucket it reads.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode, SortMergeJoinExec};
use datafusion::physical_plan::limit::LocalLimitExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::windows::{BoundedWindowAggExec, WindowAggExec};
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

use crate::exec::join_filter::JoinFilterExec;
use crate::exec::key_summary::KeySummaryExec;
use crate::exec::shuffle_reader::ShuffleReaderExec;
use crate::wire::ReadMode;

/// The ids of the stages `input` (a writer's input) reads partition by
/// partition (see the module doc), ascending.
pub fn aligned_reads(input: &Arc<dyn ExecutionPlan>) -> Vec<u64> {
    let partitions = input.output_partitioning().partition_count();
    let mut reads = Reads::default();
    walk(input, Some(partitions), &mut reads);
    reads.aligned.difference(&reads.other).copied().collect()
}

#[derive(Default)]
struct Reads {
    aligned: BTreeSet<u64>,
    other: BTreeSet<u64>,
}

/// `node`, reached along partition-preserving operators of `partitions`
/// partitions each (`None`: reached otherwise).
fn walk(node: &Arc<dyn ExecutionPlan>, partitions: Option<usize>, reads: &mut Reads) {
    let partitions = partitions.filter(|&p| node.output_partitioning().partition_count() == p);
    if let Some(reader) = node.downcast_ref::<ShuffleReaderExec>() {
        // A reader's children are not walked: the stage it reads is its own.
        let aligned = reader.mode() == ReadMode::Hash && partitions == Some(reader.buckets());
        match aligned {
            true => reads.aligned.insert(reader.stage_id()),
            false => reads.other.insert(reader.stage_id()),
        };
        return;
    }
    let followed = partitions.map_or(Vec::new(), |_| preserving_children(node.as_ref()));
    for (i, child) in node.children().into_iter().enumerate() {
        let along = partitions.filter(|_| followed.contains(&i));
        walk(child, along, reads);
    }
}

/// The children whose partition `p` alone makes `node`'s partition `p`;
/// none for a node not known to.
fn preserving_children(node: &dyn ExecutionPlan) -> Vec<usize> {
    let all = (0..node.children().len()).collect();
    if let Some(join) = node.downcast_ref::<HashJoinExec>() {
        return match join.partition_mode() {
            PartitionMode::Partitioned => all,
            // The build side is collected whole by every partition.
            PartitionMode::CollectLeft => vec![1],
            PartitionMode::Auto => Vec::new(),
        };
    }
    if let Some(sort) = node.downcast_ref::<SortExec>() {
        return match sort.preserve_partitioning() {
            true => all,
            false => Vec::new(),
        };
    }
    let per_partition = node.downcast_ref::<ProjectionExec>().is_some()
        || node.downcast_ref::<FilterExec>().is_some()
        || node.downcast_ref::<CooperativeExec>().is_some()
        || node.downcast_ref::<AggregateExec>().is_some()
        || node.downcast_ref::<SortMergeJoinExec>().is_some()
        || node.downcast_ref::<LocalLimitExec>().is_some()
        || node.downcast_ref::<BoundedWindowAggExec>().is_some()
        || node.downcast_ref::<WindowAggExec>().is_some()
        || node.downcast_ref::<JoinFilterExec>().is_some()
        || node.downcast_ref::<KeySummaryExec>().is_some();
    match per_partition {
        true => all,
        false => Vec::new(),
    }
}
