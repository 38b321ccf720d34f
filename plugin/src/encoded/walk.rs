//! Walking an encoded plan without decoding it: a node's children, which
//! partitions of each child a partition of the node reads ([`Reads`]), and
//! the dfx payload an extension node carries.

use datafusion_proto::protobuf::physical_plan_node::PhysicalPlanType;
use datafusion_proto::protobuf::{self, FileScanExecConf, PhysicalPlanNode, partitioning};
use prost::Message;

use crate::wire::{PAYLOAD_MAGIC, Payload, ReadMode};

/// Which partition of a node one map task runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reads {
    /// Every partition, or partitions the cut cannot tell: left whole.
    All,
    /// None: the node does not run in the task.
    Nothing,
    /// Partition `map - offset` (none when that is out of range).
    Map { offset: u64 },
}

/// Whether the node is a file scan (Parquet, CSV, JSON, Avro, Arrow).
pub(crate) fn is_file_scan(kind: &mut PhysicalPlanType) -> bool {
    scan_conf(kind).is_some()
}

/// The dfx payload in an extension node's bytes and where it starts (a
/// host's codec chain may frame it).
pub(crate) fn find_payload(bytes: &[u8]) -> Option<(usize, Payload)> {
    (0..bytes.len().saturating_sub(3))
        .filter(|&i| bytes[i..i + 4] == PAYLOAD_MAGIC)
        .find_map(|start| Payload::decode(&bytes[start..]).ok().map(|p| (start, p)))
}

/// The inputs of a node that is not an extension, in a fixed order.
pub(crate) fn children_mut(kind: &mut PhysicalPlanType) -> Vec<&mut PhysicalPlanNode> {
    use PhysicalPlanType as T;
    match kind {
        T::Projection(n) => one(&mut n.input),
        T::GlobalLimit(n) => one(&mut n.input),
        T::LocalLimit(n) => one(&mut n.input),
        T::Aggregate(n) => one(&mut n.input),
        T::Sort(n) => one(&mut n.input),
        T::CoalesceBatches(n) => one(&mut n.input),
        T::Filter(n) => one(&mut n.input),
        T::Merge(n) => one(&mut n.input),
        T::Repartition(n) => one(&mut n.input),
        T::Window(n) => one(&mut n.input),
        T::SortPreservingMerge(n) => one(&mut n.input),
        T::Analyze(n) => one(&mut n.input),
        T::JsonSink(n) => one(&mut n.input),
        T::CsvSink(n) => one(&mut n.input),
        T::ParquetSink(n) => one(&mut n.input),
        T::Unnest(n) => one(&mut n.input),
        T::Cooperative(n) => one(&mut n.input),
        T::AsyncFunc(n) => one(&mut n.input),
        T::Buffer(n) => one(&mut n.input),
        T::HashJoin(n) => pair(&mut n.left, &mut n.right),
        T::CrossJoin(n) => pair(&mut n.left, &mut n.right),
        T::NestedLoopJoin(n) => pair(&mut n.left, &mut n.right),
        T::SymmetricHashJoin(n) => pair(&mut n.left, &mut n.right),
        T::SortMergeJoin(n) => pair(&mut n.left, &mut n.right),
        T::Union(n) => n.inputs.iter_mut().collect(),
        T::Interleave(n) => n.inputs.iter_mut().collect(),
        T::ScalarSubquery(n) => {
            let mut children = one(&mut n.input);
            children.extend(n.subqueries.iter_mut());
            children
        }
        T::Extension(n) => n.inputs.iter_mut().collect(),
        T::ParquetScan(_)
        | T::CsvScan(_)
        | T::Empty(_)
        | T::AvroScan(_)
        | T::Explain(_)
        | T::PlaceholderRow(_)
        | T::JsonScan(_)
        | T::GenerateSeries(_)
        | T::MemoryScan(_)
        | T::ArrowScan(_) => Vec::new(),
    }
}

fn one(input: &mut Option<Box<PhysicalPlanNode>>) -> Vec<&mut PhysicalPlanNode> {
    input.as_deref_mut().into_iter().collect()
}

fn pair<'a>(
    left: &'a mut Option<Box<PhysicalPlanNode>>,
    right: &'a mut Option<Box<PhysicalPlanNode>>,
) -> Vec<&'a mut PhysicalPlanNode> {
    left.as_deref_mut()
        .into_iter()
        .chain(right.as_deref_mut())
        .collect()
}

/// What the task runs of each input of a node it runs `reads` of, in the
/// order of [`children_mut`]. The rule for each kind of node:
///
/// | node | its partition p runs |
/// | --- | --- |
/// | projection, filter, limits, aggregate, sort, window, unnest, batching | partition p of its input |
/// | partitioned hash join, sort-merge join, symmetric hash join, interleave | partition p of every input |
/// | collected hash join, cross join, nested-loop join | every partition of the left (built once), partition p of the right |
/// | union | partition p - offset of the input holding it, nothing of the others |
/// | merge, sort-preserving merge, repartition, analyze, sink | every partition of its input |
/// | scalar subquery | partition p of its input, every partition of each subquery |
pub(crate) fn child_reads(kind: &PhysicalPlanType, reads: Reads) -> Vec<Reads> {
    use PhysicalPlanType as T;
    let inputs = |kind: &PhysicalPlanType| -> usize {
        match kind {
            T::Union(n) => n.inputs.len(),
            T::Interleave(n) => n.inputs.len(),
            T::ScalarSubquery(n) => usize::from(n.input.is_some()) + n.subqueries.len(),
            T::HashJoin(_)
            | T::CrossJoin(_)
            | T::NestedLoopJoin(_)
            | T::SymmetricHashJoin(_)
            | T::SortMergeJoin(_) => 2,
            _ => 1,
        }
    };
    let all = |n: usize| vec![Reads::All; n];
    if !matches!(reads, Reads::Map { .. }) {
        // All and Nothing pass down unchanged.
        return vec![reads; inputs(kind)];
    }
    match kind {
        T::Projection(_)
        | T::GlobalLimit(_)
        | T::LocalLimit(_)
        | T::Aggregate(_)
        | T::Sort(_)
        | T::CoalesceBatches(_)
        | T::Filter(_)
        | T::Window(_)
        | T::Unnest(_)
        | T::Cooperative(_)
        | T::AsyncFunc(_)
        | T::Buffer(_) => vec![reads],
        T::HashJoin(join) => {
            if join.partition_mode == protobuf::PartitionMode::Partitioned as i32 {
                vec![reads, reads]
            } else if join.partition_mode == protobuf::PartitionMode::CollectLeft as i32 {
                vec![Reads::All, reads]
            } else {
                all(2)
            }
        }
        T::SortMergeJoin(_) | T::SymmetricHashJoin(_) => vec![reads, reads],
        T::CrossJoin(_) | T::NestedLoopJoin(_) => vec![Reads::All, reads],
        T::Interleave(n) => vec![reads; n.inputs.len()],
        T::Union(n) => union_reads(&n.inputs, reads),
        T::ScalarSubquery(n) => {
            let mut reads = vec![reads; usize::from(n.input.is_some())];
            reads.extend(all(n.subqueries.len()));
            reads
        }
        _ => all(inputs(kind)),
    }
}

/// A union's partitions are its inputs' in turn: input i holds partitions
/// `offset_i .. offset_i + count_i`. When an input's count cannot be told
/// from the encoded plan, every input is left whole.
fn union_reads(inputs: &[PhysicalPlanNode], reads: Reads) -> Vec<Reads> {
    let Reads::Map { offset } = reads else {
        return vec![reads; inputs.len()];
    };
    let mut at = offset;
    let mut out = Vec::with_capacity(inputs.len());
    for input in inputs {
        match partitions(input) {
            Some(count) => {
                out.push(Reads::Map { offset: at });
                at += count;
            }
            None => return vec![Reads::All; inputs.len()],
        }
    }
    out
}

/// The output partitions of an encoded node, where the plan alone tells.
fn partitions(node: &PhysicalPlanNode) -> Option<u64> {
    use PhysicalPlanType as T;
    let input = |n: &Option<Box<PhysicalPlanNode>>| n.as_deref().and_then(partitions);
    match node.physical_plan_type.as_ref()? {
        T::ParquetScan(n) => n.base_conf.as_ref().map(conf_partitions),
        T::CsvScan(n) => n.base_conf.as_ref().map(conf_partitions),
        T::JsonScan(n) => n.base_conf.as_ref().map(conf_partitions),
        T::AvroScan(n) => n.base_conf.as_ref().map(conf_partitions),
        T::ArrowScan(n) => n.base_conf.as_ref().map(conf_partitions),
        T::Projection(n) => input(&n.input),
        T::Filter(n) => input(&n.input),
        T::CoalesceBatches(n) => input(&n.input),
        T::LocalLimit(n) => input(&n.input),
        T::Aggregate(n) => input(&n.input),
        T::Window(n) => input(&n.input),
        T::Unnest(n) => input(&n.input),
        T::Cooperative(n) => input(&n.input),
        T::AsyncFunc(n) => input(&n.input),
        T::Buffer(n) => input(&n.input),
        T::Sort(n) if n.preserve_partitioning => input(&n.input),
        T::Sort(_) | T::Merge(_) | T::SortPreservingMerge(_) | T::GlobalLimit(_) => Some(1),
        T::Repartition(n) => match n.partitioning.as_ref()?.partition_method.as_ref()? {
            partitioning::PartitionMethod::RoundRobin(count)
            | partitioning::PartitionMethod::Unknown(count) => Some(*count),
            partitioning::PartitionMethod::Hash(hash) => Some(hash.partition_count),
            partitioning::PartitionMethod::Range(_) => None,
        },
        T::HashJoin(n) if n.partition_mode == protobuf::PartitionMode::Partitioned as i32 => {
            input(&n.left)
        }
        T::HashJoin(_) | T::CrossJoin(_) | T::NestedLoopJoin(_) => {
            n_right(node).and_then(partitions)
        }
        T::SymmetricHashJoin(n) => input(&n.left),
        T::SortMergeJoin(n) => input(&n.left),
        T::Union(n) => n.inputs.iter().map(partitions).sum(),
        T::Interleave(n) => n.inputs.first().and_then(partitions),
        T::Extension(n) => match find_payload(&n.node)? {
            (_, Payload::Writer(writer)) => Some(writer.maps),
            (_, Payload::MapScan(scan)) => Some(scan.partitions),
            (_, Payload::JoinFilter { .. }) => n.inputs.first().and_then(partitions),
            (_, Payload::Reader(reader)) => match reader.mode {
                ReadMode::Hash => Some(reader.buckets),
                ReadMode::PassThrough => Some(reader.maps),
                ReadMode::Broadcast => Some(1),
            },
            (_, Payload::StoreScan { plan }) => {
                partitions(&PhysicalPlanNode::decode(plan.as_slice()).ok()?)
            }
            _ => None,
        },
        _ => None,
    }
}

/// The right input of a collected join (its partitions are the join's).
fn n_right(node: &PhysicalPlanNode) -> Option<&PhysicalPlanNode> {
    match node.physical_plan_type.as_ref()? {
        PhysicalPlanType::HashJoin(n) => n.right.as_deref(),
        PhysicalPlanType::CrossJoin(n) => n.right.as_deref(),
        PhysicalPlanType::NestedLoopJoin(n) => n.right.as_deref(),
        _ => None,
    }
}

pub(super) fn conf_partitions(conf: &FileScanExecConf) -> u64 {
    conf.file_groups.len() as u64
}

/// The file scan configuration of a file scan node.
pub(super) fn scan_conf(kind: &mut PhysicalPlanType) -> Option<&mut FileScanExecConf> {
    match kind {
        PhysicalPlanType::ParquetScan(scan) => scan.base_conf.as_mut(),
        PhysicalPlanType::CsvScan(scan) => scan.base_conf.as_mut(),
        PhysicalPlanType::JsonScan(scan) => scan.base_conf.as_mut(),
        PhysicalPlanType::AvroScan(scan) => scan.base_conf.as_mut(),
        PhysicalPlanType::ArrowScan(scan) => scan.base_conf.as_mut(),
        _ => None,
    }
}

/// Restate a declared partitioning for `count` file groups (DataFusion
/// drops a declaration whose count differs from the groups').
pub(super) fn declare_partitions(conf: &mut FileScanExecConf, count: u64) {
    let Some(method) = conf
        .output_partitioning
        .as_mut()
        .and_then(|p| p.partition_method.as_mut())
    else {
        return;
    };
    match method {
        partitioning::PartitionMethod::RoundRobin(n)
        | partitioning::PartitionMethod::Unknown(n) => {
            *n = count;
        }
        partitioning::PartitionMethod::Hash(hash) => hash.partition_count = count,
        partitioning::PartitionMethod::Range(_) => {}
    }
}
