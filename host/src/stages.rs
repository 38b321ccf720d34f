//! Finding the stages the plugin's planner inserted, and showing them.
//!
//! Glossary: a **stage** is a subtree the planner wrapped in the plugin's
//! stage node; it runs as one **task** per output partition, each task in its
//! own worker process, and publishes one file per partition.
//!
//! Stages are found by the rule every host shares, [`dfx_abi::stages`]: by
//! containment of the plugin's node name in a node's display, in pre-order,
//! so the n-th stage found has the id `plugin.stage_id(n)`.

use std::fmt::Write as _;
use std::sync::Arc;

use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use dfx_abi::Plugin;
pub use dfx_abi::stages::{find_stages, node_display};

/// One stage of a plan.
#[derive(Debug, Clone)]
pub struct Stage {
    /// The id the planner gave it (recomputed from its position).
    pub stage_id: u64,
    /// Its output partitions: one task and one file each.
    pub partitions: usize,
    /// The stage node itself.
    pub plan: Arc<dyn ExecutionPlan>,
}

/// The plan's stages with their ids and partition counts.
pub fn stages(plugin: &Plugin, plan: &Arc<dyn ExecutionPlan>) -> Vec<Stage> {
    find_stages(plan, plugin.stage_node_name())
        .into_iter()
        .enumerate()
        .map(|(index, plan)| Stage {
            stage_id: plugin.stage_id(index),
            partitions: plan.output_partitioning().partition_count(),
            plan,
        })
        .collect()
}

/// The plan, indented, with each stage node marked with its id and
/// partition count.
pub fn render_with_stages(plugin: &Plugin, plan: &Arc<dyn ExecutionPlan>) -> String {
    let stages = stages(plugin, plan);
    let mut out = String::new();
    render(plan, &stages, 0, &mut out);
    out
}

fn render(plan: &Arc<dyn ExecutionPlan>, stages: &[Stage], depth: usize, out: &mut String) {
    let line = node_display(plan.as_ref());
    let _ = write!(out, "{:indent$}{line}", "", indent = depth * 2);
    if let Some(stage) = stages.iter().find(|s| Arc::ptr_eq(&s.plan, plan)) {
        let _ = write!(
            out,
            "    <== stage {} ({} partition{})",
            stage.stage_id,
            stage.partitions,
            if stage.partitions == 1 { "" } else { "s" }
        );
    }
    out.push('\n');
    for child in plan.children() {
        render(child, stages, depth + 1, out);
    }
}
