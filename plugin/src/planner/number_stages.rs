//! Stage ids and deps: the writers of a cut plan numbered in pre-order,
//! each with the stages it reads, and those it reads partition by
//! partition.

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;

use crate::exec::aligned_reads::aligned_reads;
use crate::exec::join_filter::JoinFilterExec;
use crate::exec::shuffle_reader::ShuffleReaderExec;
use crate::exec::shuffle_writer::ShuffleWriterExec;
use crate::paths::stage_id;

/// Number the writers in pre-order and record each one's deps: the writers
/// met first below it on each path.
pub(crate) fn number_stages(
    plan: Arc<dyn ExecutionPlan>,
    next: &mut u64,
) -> Result<Arc<dyn ExecutionPlan>> {
    if let Some(writer) = plan.downcast_ref::<ShuffleWriterExec>() {
        let id = stage_id(*next);
        *next += 1;
        let input = number_stages(Arc::clone(writer.input()), next)?;
        let mut deps = Vec::new();
        first_writers(&input, &mut deps);
        deps.sort_unstable();
        deps.dedup();
        let renumbered = ShuffleWriterExec::try_new(
            id,
            writer.shuffle_dir().to_path_buf(),
            input,
            writer.partitioning().clone(),
            deps,
            writer.partitions_per_map(),
        )?;
        let aligned = aligned_reads(renumbered.input());
        return Ok(Arc::new(renumbered.with_aligned_deps(aligned)));
    }
    if let Some(reader) = plan.downcast_ref::<ShuffleReaderExec>() {
        let writer = number_stages(Arc::clone(reader.planned_writer()?), next)?;
        return Ok(Arc::new(ShuffleReaderExec::try_new(reader.mode(), writer)?));
    }
    let children = plan
        .children()
        .into_iter()
        .map(|child| number_stages(Arc::clone(child), next))
        .collect::<Result<Vec<_>>>()?;
    replace_children_if_necessary(plan, children)
}

/// Ids of the writers met first below `plan` on each path, and of the
/// build stages whose summaries a join filter on the way reads (its task
/// must not start before they are published).
pub(crate) fn first_writers(plan: &Arc<dyn ExecutionPlan>, ids: &mut Vec<u64>) {
    if let Some(writer) = plan.downcast_ref::<ShuffleWriterExec>() {
        ids.push(writer.stage_id());
        return;
    }
    if let Some(filter) = plan.downcast_ref::<JoinFilterExec>() {
        ids.push(filter.build().stage_id);
    }
    for child in plan.children() {
        first_writers(child, ids);
    }
}
