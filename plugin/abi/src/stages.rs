//! How a host finds the stages in a plan: the one rule every host shares.
//!
//! A host cannot downcast a foreign node, and across FFI a stage root displays
//! as its wrapper (`FFI_ExecutionPlan: ShuffleWriterExec, number_of_children=1`),
//! so stages are found by *containment* of the plugin's node name
//! ([`crate::Plugin::stage_node_name`]) in a node's one-line display, in
//! pre-order, descending into stages: a stage reads other stages through
//! readers whose only child is the upstream writer, so stages nest. Pre-order
//! is also the order the planner numbers them in, so the n-th writer found has
//! the id [`crate::Plugin::stage_id`]`(n)`.
//!
//! That is the plan once put together. The plan a plugin's planner hands
//! back does not nest its stages: each reader carries the stage it reads as
//! a blob, so that a protobuf decoder meets one stage at a time. A host
//! encodes that plan, has the plugin cut it into its stages
//! ([`crate::Plugin::plan_stages`], pre-order), decodes each and hands every
//! reader its writer back ([`attach_stages`]).

use std::sync::Arc;

use datafusion::common::{DataFusionError, Result};
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::{ExecutionPlan, displayable};

/// The one-line display of `plan`'s root node, without trailing whitespace.
pub fn node_display(plan: &dyn ExecutionPlan) -> String {
    displayable(plan)
        .one_line()
        .to_string()
        .trim_end()
        .to_string()
}

/// Every node of `plan` whose display contains `stage_node_name`, in
/// pre-order, descending into each.
pub fn find_stages(
    plan: &Arc<dyn ExecutionPlan>,
    stage_node_name: &str,
) -> Vec<Arc<dyn ExecutionPlan>> {
    let mut found = Vec::new();
    collect(plan, stage_node_name, &mut found);
    found
}

fn collect(
    plan: &Arc<dyn ExecutionPlan>,
    stage_node_name: &str,
    found: &mut Vec<Arc<dyn ExecutionPlan>>,
) {
    if node_display(plan.as_ref()).contains(stage_node_name) {
        found.push(Arc::clone(plan));
    }
    for child in plan.children() {
        collect(child, stage_node_name, found);
    }
}

/// `plan` (as the planner handed it back: its readers without children)
/// with each reader given the writer of the stage it reads, `writers` being
/// the plan's stages decoded in pre-order (as
/// [`crate::Plugin::plan_stages`] cuts them). Readers are met in the order
/// their stages were numbered: the n-th reader met, descending into each
/// writer given, reads the n-th stage.
///
/// # Errors
///
/// More readers than stages or stages left over, or a node refusing its
/// new children.
pub fn attach_stages(
    plan: &Arc<dyn ExecutionPlan>,
    reader_node_name: &str,
    writers: &[Arc<dyn ExecutionPlan>],
) -> Result<Arc<dyn ExecutionPlan>> {
    let mut next = 0;
    let attached = attach(plan, reader_node_name, writers, &mut next)?;
    if next != writers.len() {
        return Err(DataFusionError::Execution(format!(
            "the plan's readers read {next} stage(s), the plugin cut {} out of it",
            writers.len()
        )));
    }
    Ok(attached)
}

fn attach(
    plan: &Arc<dyn ExecutionPlan>,
    reader_node_name: &str,
    writers: &[Arc<dyn ExecutionPlan>],
    next: &mut usize,
) -> Result<Arc<dyn ExecutionPlan>> {
    let children = plan.children();
    if children.is_empty() && node_display(plan.as_ref()).contains(reader_node_name) {
        let Some(writer) = writers.get(*next) else {
            return Err(DataFusionError::Execution(format!(
                "reader {} in pre-order has no stage: the plugin cut {} out of the plan",
                *next + 1,
                writers.len()
            )));
        };
        *next += 1;
        let writer = attach(writer, reader_node_name, writers, next)?;
        return Arc::clone(plan).replace_children(vec![writer], recompute());
    }
    let mut changed = false;
    let mut attached = Vec::with_capacity(children.len());
    for child in children {
        let new = attach(child, reader_node_name, writers, next)?;
        changed |= !Arc::ptr_eq(&new, child);
        attached.push(new);
    }
    if !changed {
        return Ok(Arc::clone(plan));
    }
    Arc::clone(plan).replace_children(attached, recompute())
}

fn recompute() -> ReplaceChildrenOptions {
    ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute)
}

/// The config key, under the plugin's prefix (`dfx_engine.`), of the
/// partitions of a stage each task runs at once, publishing one map file
/// for them all; hosts set it from their own options without spelling it.
pub const PARTITIONS_PER_TASK: &str = "partitions_per_task";
