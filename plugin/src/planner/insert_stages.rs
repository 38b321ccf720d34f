//! The split rule: where a physical plan is cut into stages.
//!
//! The invariant behind every cut: **an operator whose answer depends on
//! every partition of an input runs in a task that sees every partition of
//! that input.** A task runs one partition of its stage's input, so each
//! operator below a writer must be one that can run a partition alone, and
//! every operator that cannot gets its input through an exchange.
//!
//! `exchange` mode (bottom-up, so nested cuts compose):
//!
//! | node | cut |
//! | --- | --- |
//! | hash or round-robin `RepartitionExec` | hash exchange: writer splits by the same partitioning, reader replaces the repartition (plus a per-partition sort if it preserved order) |
//! | `CoalescePartitionsExec`, `SortPreservingMergeExec` over >1 partitions | pass-through exchange below; the merge runs in the consumer |
//! | CollectLeft `HashJoinExec` (inner, right, right semi/anti/mark), `NestedLoopJoinExec`, `CrossJoinExec` | broadcast: the build side is its own stage, every probe task reads all of it; a build side merged from a stage already cut, under projections, filters and final aggregates without grouping (a scalar subquery), reads that stage whole instead |
//! | the same hash joins of a type that emits unmatched build rows (left, full, left semi/anti/mark) | partitioned instead: both sides hash-exchanged on the join keys, each task owns one partition of each |
//! | null-aware anti joins (`NOT IN`), nested-loop joins of those types | the probe side is gathered: the join runs in one task that sees every probe partition |
//! | any of these whose output partitioning changed | a hash exchange restores the partitioning the operators above were planned for |
//! | `InterleaveExec` | a hash exchange over a union of its inputs (a host rebuilding it would compare partitionings that crossed FFI, which never compare equal) |
//! | `RecursiveQueryExec` | never cut inside: its work table lives in one process |
//! | the root | its own pass-through stage when it has more than one partition or reads a table, so the driver only merges |
//!
//! `aggregate` mode is the aggregate split: one stage per topmost partial
//! aggregate, read back pass-through; a plan with none is one stage. Joins
//! that need every probe partition gather them inside their stage (no cut),
//! so this mode gives right answers too, at the cost of every task computing
//! such a join whole.
//!
//! In either mode, a plan no wider than a map's slice of partitions is not
//! cut at all: it runs in the driver, or as one stage ([`insert_stages`]
//! says why and which).
//!
//! Stages are numbered in pre-order once every cut is made (see
//! [`number_stages`]), so the n-th writer in pre-order has id `FIRST_STAGE_ID + n`.
//! Then the joins whose build side is a stage of its own get their filters
//! ([`crate::planner::add_join_filters`]), and the plan is numbered again: the ids stay,
//! and a stage whose probe side is filtered depends on the build stage too.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::common::{JoinType, Result};
use datafusion::physical_expr::Partitioning;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::{
    CrossJoinExec, HashJoinExec, NestedLoopJoinExec, PartitionMode,
};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::recursive_query::RecursiveQueryExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::union::{InterleaveExec, UnionExec};
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

use super::cut::Cut;
use super::restate_constants::restate_constants;
use super::run_whole::{kept_for_the_driver, runs_whole};
use crate::config::{JoinFilters, SplitMode};
use crate::exec::shuffle_reader::ShuffleReaderExec;
use crate::exec::shuffle_writer::ShuffleWriterExec;
use crate::planner::add_join_filters;
use crate::planner::number_stages::number_stages;
use crate::wire::ReadMode;

/// Cut `plan` into stages as `cut` says, publishing into `shuffle_dir`;
/// returns the new plan and its number of stages.
///
/// A plan none of whose operators runs more partitions than a map does
/// would run each stage as one task, each waiting for the last one's files
/// (one machine: its cores are both the partitions and a slice). It runs
/// whole instead, pipelined on all the cores of one process, as one
/// process does. Under [`crate::config::CollapseStages::Auto`], when it is no wider than
/// the driver's cores either, it is not cut at all (no stage): the driver
/// that planned it runs it, so a query one machine answers pays no task, no
/// map file and no encoding of its plan. Otherwise (a driver with fewer
/// cores than a worker, or [`crate::config::CollapseStages::Task`]) it is one stage, whose
/// one task a worker runs.
///
/// # Errors
///
/// When a node refuses its new children.
pub fn insert_stages(
    plan: Arc<dyn ExecutionPlan>,
    shuffle_dir: &Path,
    cut: Cut,
) -> Result<(Arc<dyn ExecutionPlan>, u64)> {
    let Cut {
        mode,
        filters,
        partitions_per_map,
        ..
    } = cut;
    let cutter = Cutter {
        shuffle_dir: shuffle_dir.to_path_buf(),
        mode,
        partitions_per_map,
    };
    if kept_for_the_driver(&plan, &cut) {
        return Ok((plan, 0));
    }
    let whole = runs_whole(&plan, &cut);
    let plan = match mode {
        _ if whole => cutter.pass_through(plan)?,
        SplitMode::Exchange => {
            let plan = cutter.cut(plan)?;
            if cutter.head_needs_a_stage(&plan) {
                cutter.pass_through(plan)?
            } else {
                plan
            }
        }
        SplitMode::Aggregate => {
            let mut found = false;
            let plan = cutter.cut(plan)?;
            let plan = cutter.wrap_topmost_partials(plan, &mut found)?;
            if found {
                plan
            } else {
                cutter.pass_through(plan)?
            }
        }
    };
    let mut next = 0;
    let plan = number_stages(plan, &mut next)?;
    // One stage has no build stage to filter by.
    if filters == JoinFilters::Off || whole {
        return Ok((plan, next));
    }
    // Ids do not change (no writer is added); deps gain the build stages.
    let plan = add_join_filters(plan, filters)?;
    let mut again = 0;
    let plan = number_stages(plan, &mut again)?;
    Ok((plan, again))
}

struct Cutter {
    shuffle_dir: PathBuf,
    mode: SplitMode,
    partitions_per_map: usize,
}

impl Cutter {
    /// A writer of a stage not numbered yet (see [`number_stages`]).
    fn writer(
        &self,
        input: Arc<dyn ExecutionPlan>,
        partitioning: Partitioning,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(ShuffleWriterExec::try_new(
            0,
            self.shuffle_dir.clone(),
            input,
            partitioning,
            Vec::new(),
            self.partitions_per_map,
        )?))
    }

    fn read(
        &self,
        mode: ReadMode,
        writer: Arc<dyn ExecutionPlan>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(ShuffleReaderExec::try_new(mode, writer)?))
    }

    /// `input` as its own stage, read back partition for partition.
    fn pass_through(&self, input: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        let writer = self.writer(input, Partitioning::UnknownPartitioning(1))?;
        self.read(ReadMode::PassThrough, writer)
    }

    /// `input` as its own stage, read whole by every consumer task.
    fn broadcast(&self, input: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        if input.is::<ShuffleReaderExec>() {
            return Ok(input);
        }
        if let Some(read) = self.read_whole(&input)? {
            return Ok(read);
        }
        let writer = self.writer(input, Partitioning::UnknownPartitioning(1))?;
        self.read(ReadMode::Broadcast, writer)
    }

    /// `input` as a broadcast read of a stage that already exists, when it is
    /// a coalesce over a pass-through read (what the rule below a merge made
    /// of a multi-partition build side), possibly under row-by-row operators
    /// (a projection, a filter) and final aggregates without grouping, which
    /// run on the whole build side in each consumer task just as well: a
    /// scalar subquery's `avg` or `max` is then computed by each task from
    /// its partial stage's rows (one per partition), and is not a stage of
    /// its own on the query's critical path.
    fn read_whole(&self, input: &Arc<dyn ExecutionPlan>) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        if let Some(coalesce) = input.downcast_ref::<CoalescePartitionsExec>()
            && coalesce.fetch().is_none()
            && let Some(reader) = coalesce.input().downcast_ref::<ShuffleReaderExec>()
            && reader.mode() == ReadMode::PassThrough
        {
            return Ok(Some(self.read(
                ReadMode::Broadcast,
                Arc::clone(reader.planned_writer()?),
            )?));
        }
        if !is_row_by_row(input) && !is_global_final_aggregate(input) {
            return Ok(None);
        }
        let child = Arc::clone(input.children()[0]);
        match self.read_whole(&child)? {
            Some(read) => Ok(Some(replace_children_if_necessary(
                Arc::clone(input),
                vec![read],
            )?)),
            None => Ok(None),
        }
    }

    /// Bottom-up: cut the children first, then this node.
    fn cut(&self, plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        // Its work table is shared with the recursive term in one process,
        // and the recursive term runs again on every iteration.
        if plan.is::<RecursiveQueryExec>() {
            return Ok(plan);
        }
        let children = plan
            .children()
            .into_iter()
            .map(|child| self.cut(Arc::clone(child)))
            .collect::<Result<Vec<_>>>()?;
        let plan = replace_children_if_necessary(plan, children)?;
        self.cut_node(plan)
    }

    fn cut_node(&self, plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        if self.mode == SplitMode::Aggregate {
            return self.gather_in_process(plan);
        }
        if let Some(repartition) = plan.downcast_ref::<RepartitionExec>() {
            return self.cut_repartition(repartition, &plan);
        }
        if let Some(coalesce) = plan.downcast_ref::<CoalescePartitionsExec>() {
            return self.below_merge(&plan, coalesce.input());
        }
        if let Some(merge) = plan.downcast_ref::<SortPreservingMergeExec>() {
            return self.below_merge(&plan, merge.input());
        }
        if plan.is::<InterleaveExec>() {
            return self.cut_interleave(&plan);
        }
        if let Some(join) = plan.downcast_ref::<HashJoinExec>() {
            let collected = *join.partition_mode() == PartitionMode::CollectLeft;
            if join.null_aware {
                return self.gather_join(&plan, collected);
            }
            if collected && emits_unmatched_build_rows(join.join_type()) {
                return self.partition_join(&plan, join);
            }
            if collected {
                return self.broadcast_build(&plan);
            }
            return Ok(plan);
        }
        if let Some(join) = plan.downcast_ref::<NestedLoopJoinExec>() {
            if emits_unmatched_build_rows(join.join_type()) {
                return self.gather_join(&plan, true);
            }
            return self.broadcast_build(&plan);
        }
        if plan.is::<CrossJoinExec>() {
            return self.broadcast_build(&plan);
        }
        Ok(plan)
    }

    /// `aggregate` mode cuts only at partial aggregates, so a join that needs
    /// every probe partition gathers them inside its stage instead: each task
    /// computes the whole join (the aggregate split's cost), but no row is
    /// lost.
    fn gather_in_process(&self, plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        let gathers = if let Some(join) = plan.downcast_ref::<HashJoinExec>() {
            let collected = *join.partition_mode() == PartitionMode::CollectLeft;
            join.null_aware || (collected && emits_unmatched_build_rows(join.join_type()))
        } else if let Some(join) = plan.downcast_ref::<NestedLoopJoinExec>() {
            emits_unmatched_build_rows(join.join_type())
        } else {
            false
        };
        if gathers {
            self.gather_join(&plan, false)
        } else {
            Ok(plan)
        }
    }

    fn cut_repartition(
        &self,
        repartition: &RepartitionExec,
        plan: &Arc<dyn ExecutionPlan>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let partitioning = repartition.partitioning().clone();
        if !matches!(
            partitioning,
            Partitioning::Hash(_, _) | Partitioning::RoundRobinBatch(_)
        ) {
            return Ok(Arc::clone(plan));
        }
        let writer = self.writer(Arc::clone(repartition.input()), partitioning)?;
        let reader = self.read(ReadMode::Hash, writer)?;
        let reader = restate_constants(reader, repartition.input())?;
        // A reader concatenates each bucket map after map; an order-keeping
        // repartition promised each partition sorted, so sort it again.
        match (repartition.preserve_order(), plan.output_ordering()) {
            (true, Some(ordering)) => Ok(Arc::new(
                SortExec::new(ordering.clone(), reader).with_preserve_partitioning(true),
            )),
            _ => Ok(reader),
        }
    }

    /// An `InterleaveExec` (partition `i` = partition `i` of every input,
    /// all hash-partitioned alike) becomes a hash exchange over a union of
    /// its inputs: each row hashes back to the bucket its input partition
    /// held, so bucket `i` is what interleaved partition `i` was.
    ///
    /// Why: a host decodes the plan it is handed, and an `InterleaveExec`
    /// checks when it is built that its inputs' hash partitionings are equal;
    /// above a reader that partitioning crossed the FFI boundary, whose
    /// expressions compare by identity, so the host would refuse the plan.
    fn cut_interleave(&self, plan: &Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        let partitioning = plan.output_partitioning().clone();
        let union = UnionExec::try_new(plan.children().into_iter().cloned().collect())?;
        let writer = self.writer(union, partitioning)?;
        self.read(ReadMode::Hash, writer)
    }

    /// A merge of several partitions: each becomes a map of a stage of its
    /// own, and the merge reads them pass-through.
    fn below_merge(
        &self,
        plan: &Arc<dyn ExecutionPlan>,
        input: &Arc<dyn ExecutionPlan>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if input.output_partitioning().partition_count() <= 1 {
            return Ok(Arc::clone(plan));
        }
        let reader = self.pass_through(Arc::clone(input))?;
        replace_children_if_necessary(Arc::clone(plan), vec![reader])
    }

    /// A join whose build side (the left) is collected whole by each task:
    /// build it once, in a stage of its own, and let every task read it all.
    fn broadcast_build(&self, plan: &Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        let children: Vec<Arc<dyn ExecutionPlan>> = plan.children().into_iter().cloned().collect();
        let [left, right] = children.as_slice() else {
            return Ok(Arc::clone(plan));
        };
        if left.output_partitioning().partition_count() != 1 {
            return Ok(Arc::clone(plan));
        }
        let left = self.broadcast(Arc::clone(left))?;
        replace_children_if_necessary(Arc::clone(plan), vec![left, Arc::clone(right)])
    }

    /// A collected hash join of a type that emits build rows after the last
    /// probe partition: partition both sides by the join keys instead, so
    /// each task joins one hash partition of each side and owns its build
    /// rows (DataFusion's partitioned mode, with hash exchanges).
    fn partition_join(
        &self,
        plan: &Arc<dyn ExecutionPlan>,
        join: &HashJoinExec,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let buckets = join.right().output_partitioning().partition_count().max(2);
        // The build side was merged into one partition for collecting; the
        // exchange splits what fed that merge.
        let left = match join.left().downcast_ref::<CoalescePartitionsExec>() {
            Some(coalesce) if coalesce.fetch().is_none() => {
                match coalesce.input().downcast_ref::<ShuffleReaderExec>() {
                    Some(reader) if reader.mode() == ReadMode::PassThrough => {
                        Arc::clone(reader.planned_writer()?.children()[0])
                    }
                    _ => Arc::clone(coalesce.input()),
                }
            }
            _ => Arc::clone(join.left()),
        };
        let (left_keys, right_keys): (Vec<_>, Vec<_>) = join
            .on()
            .iter()
            .map(|(l, r)| (Arc::clone(l), Arc::clone(r)))
            .unzip();
        let left = self.hash_exchange(left, Partitioning::Hash(left_keys, buckets))?;
        let right = self.hash_exchange(
            Arc::clone(join.right()),
            Partitioning::Hash(right_keys, buckets),
        )?;
        let partitioned = join
            .builder()
            .with_partition_mode(PartitionMode::Partitioned)
            .with_new_children(vec![left, right])?
            .recompute_properties()
            .build_exec()?;
        self.restore(plan, partitioned)
    }

    /// `input` split by `partitioning`: a hash exchange, or in `aggregate`
    /// mode (which cuts only at partial aggregates) an in-process repartition.
    fn hash_exchange(
        &self,
        input: Arc<dyn ExecutionPlan>,
        partitioning: Partitioning,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match self.mode {
            SplitMode::Exchange => {
                let writer = self.writer(input, partitioning)?;
                self.read(ReadMode::Hash, writer)
            }
            SplitMode::Aggregate => Ok(Arc::new(RepartitionExec::try_new(input, partitioning)?)),
        }
    }

    /// `replacement` with the partitioning `original` promised to the
    /// operators above: merged into one partition when it promised one, and
    /// through a hash exchange (keeping per-partition order) when it promised
    /// another hash partitioning.
    fn restore(
        &self,
        original: &Arc<dyn ExecutionPlan>,
        replacement: Arc<dyn ExecutionPlan>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let promised = original.output_partitioning();
        // One partition promised (to an operator that requires a single
        // partition, such as a `Single` aggregate): merge back into one.
        if promised.partition_count() == 1
            && replacement.output_partitioning().partition_count() > 1
        {
            let merged: Arc<dyn ExecutionPlan> = match original.output_ordering() {
                Some(ordering) => {
                    Arc::new(SortPreservingMergeExec::new(ordering.clone(), replacement))
                }
                None => Arc::new(CoalescePartitionsExec::new(replacement)),
            };
            return self.cut_node(merged);
        }
        if !matches!(promised, Partitioning::Hash(_, n) if *n > 1)
            || replacement.output_partitioning() == promised
        {
            return Ok(replacement);
        }
        let reader = self.hash_exchange(replacement, promised.clone())?;
        match original.output_ordering() {
            Some(ordering) => Ok(Arc::new(
                SortExec::new(ordering.clone(), reader).with_preserve_partitioning(true),
            )),
            None => Ok(reader),
        }
    }

    /// A join that emits rows only once every probe partition has run: gather
    /// its inputs so one task runs it whole. When it promised a hash
    /// partitioning to the operators above, a hash exchange restores it.
    fn gather_join(
        &self,
        plan: &Arc<dyn ExecutionPlan>,
        collected: bool,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let children: Vec<Arc<dyn ExecutionPlan>> = plan.children().into_iter().cloned().collect();
        let [left, right] = children.as_slice() else {
            return Ok(Arc::clone(plan));
        };
        let left = if collected && self.mode == SplitMode::Exchange {
            self.broadcast_input(left)?
        } else {
            self.gather(left)?
        };
        let right = self.gather(right)?;
        let gathered = replace_children_if_necessary(Arc::clone(plan), vec![left, right])?;
        if self.mode == SplitMode::Exchange
            && !matches!(plan.output_partitioning(), Partitioning::Hash(_, n) if *n > 1)
        {
            // A single-task stage of its own, so the driver does not run it.
            return self.pass_through(gathered);
        }
        self.restore(plan, gathered)
    }

    /// A collected build side, kept single-partition, as a broadcast read.
    fn broadcast_input(&self, left: &Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        if left.output_partitioning().partition_count() == 1 {
            self.broadcast(Arc::clone(left))
        } else {
            self.gather(left)
        }
    }

    /// Every partition of `input` as one: through a pass-through stage and a
    /// merge, order-keeping when `input` is sorted.
    fn gather(&self, input: &Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        if input.output_partitioning().partition_count() <= 1 {
            return Ok(Arc::clone(input));
        }
        let merged: Arc<dyn ExecutionPlan> = match input.output_ordering() {
            Some(ordering) => Arc::new(SortPreservingMergeExec::new(
                ordering.clone(),
                Arc::clone(input),
            )),
            None => Arc::new(CoalescePartitionsExec::new(Arc::clone(input))),
        };
        match self.mode {
            SplitMode::Exchange => self.cut_node(merged),
            SplitMode::Aggregate => Ok(merged),
        }
    }

    /// The head (what the driver runs) should only merge what stages
    /// publish: it gets a stage of its own when it has several partitions,
    /// reads a table, or when nothing was cut at all.
    fn head_needs_a_stage(&self, plan: &Arc<dyn ExecutionPlan>) -> bool {
        if plan.is::<ShuffleReaderExec>() {
            return false;
        }
        plan.output_partitioning().partition_count() > 1 || head_has_leaf(plan)
    }

    /// The aggregate split: wrap each topmost partial aggregate, not
    /// descending into it, so stages never nest.
    fn wrap_topmost_partials(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        found: &mut bool,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if plan
            .downcast_ref::<AggregateExec>()
            .is_some_and(|agg| *agg.mode() == AggregateMode::Partial)
        {
            *found = true;
            return self.pass_through(plan);
        }
        let children = plan
            .children()
            .into_iter()
            .map(|child| self.wrap_topmost_partials(Arc::clone(child), found))
            .collect::<Result<Vec<_>>>()?;
        replace_children_if_necessary(plan, children)
    }
}

/// Join types that emit build-side rows after the last probe partition
/// (unmatched, semi or anti build rows, or the mark column of build rows).
fn emits_unmatched_build_rows(join_type: &JoinType) -> bool {
    matches!(
        join_type,
        JoinType::Left
            | JoinType::Full
            | JoinType::LeftSemi
            | JoinType::LeftAnti
            | JoinType::LeftMark
    )
}

/// A final aggregate without grouping: one row out of its partial
/// aggregate's rows, one per partition, whatever the rows below them.
fn is_global_final_aggregate(plan: &Arc<dyn ExecutionPlan>) -> bool {
    plan.downcast_ref::<AggregateExec>()
        .is_some_and(|agg| *agg.mode() == AggregateMode::Final && agg.group_expr().is_empty())
}

/// A node that maps each input row (or batch) to output on its own, so it
/// can run above any split or merge of its input.
fn is_row_by_row(plan: &Arc<dyn ExecutionPlan>) -> bool {
    plan.children().len() == 1 && (plan.is::<ProjectionExec>() || plan.is::<FilterExec>())
}

/// A node without children reachable from `plan` without crossing a reader.
fn head_has_leaf(plan: &Arc<dyn ExecutionPlan>) -> bool {
    if plan.is::<ShuffleReaderExec>() {
        return false;
    }
    let children = plan.children();
    children.is_empty() || children.into_iter().any(head_has_leaf)
}
