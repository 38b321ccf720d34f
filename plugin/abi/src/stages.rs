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

use std::sync::Arc;

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
