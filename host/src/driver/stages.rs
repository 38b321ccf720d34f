//! Finding the stages the plugin's planner cut a plan into, and showing them.
//!
//! Glossary: a **stage** is a subtree whose root is the plugin's writer node
//! (`ShuffleWriterExec`); it runs as one **map task** per partition of its
//! input, each task in its own worker process, and each map splits its rows
//! into **buckets**. A consumer reads a stage through a reader node
//! (`ShuffleReaderExec`). The planner hands each reader back carrying its
//! stage as bytes; the session cuts the plan into its stages and gives each
//! reader its writer back ([`crate::session::DfxSession::plan`]), so in the
//! plan shown here the reader's only child is that writer and stages nest:
//!
//! ```text
//! root (driver) ── reader ── writer S1 (deps [2]) ── ... ── reader ── writer S2 (deps [])
//! ```
//!
//! Stages are found by the rule every host shares, [`dfx_abi::stages`]: by
//! containment of the plugin's node name in a node's display, in pre-order,
//! descending into stages, so the n-th writer found has the id
//! `plugin.stage_id(n)`. Everything else about a stage (maps, buckets, the
//! stages it reads) is asked of the plugin, never read off a display string.

use std::fmt::Write as _;
use std::sync::Arc;

use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use dfx_abi::Plugin;
pub use dfx_abi::stages::{find_stages, node_display};
use dfx_runtime::prepare::check_numbering;
pub use dfx_runtime::scheduler::{StageInfo, describe};

use crate::error::{DataFusionContext, Result};

/// One stage of a plan: what the plugin says about it, and the writer node.
#[derive(Debug, Clone)]
pub struct Stage {
    /// Id, maps, buckets, deps.
    pub info: StageInfo,
    /// The writer node itself (the root of the stage).
    pub plan: Arc<dyn ExecutionPlan>,
}

impl Stage {
    /// The stage's id.
    pub fn stage_id(&self) -> u64 {
        self.info.stage_id
    }
}

/// The plan's stages in pre-order, each described by the plugin.
///
/// # Errors
///
/// A writer the plugin cannot describe, or whose id is not the one its
/// pre-order position gives (`plugin.stage_id(n)`): the host and the plugin
/// would then name different files for the same stage.
pub fn stages(plugin: &Plugin, plan: &Arc<dyn ExecutionPlan>) -> Result<Vec<Stage>> {
    let mut found = Vec::new();
    for (index, writer) in find_stages(plan, plugin.stage_node_name())
        .into_iter()
        .enumerate()
    {
        let expected = plugin.stage_id(index);
        let info = plugin.stage_info(&writer).context(|| {
            format!(
                "cannot describe stage {expected} (writer {} in pre-order: {})",
                index + 1,
                node_display(writer.as_ref())
            )
        })?;
        check_numbering(index, expected, info.stage_id)?;
        found.push(Stage {
            info: info.into(),
            plan: writer,
        });
    }
    Ok(found)
}

/// The plan, indented, with each writer marked with its stage id, maps,
/// buckets and deps, and each reader with the stage it reads and the
/// partitions it reads it into.
///
/// ```text
/// FFI_ExecutionPlan: ShuffleReaderExec, number_of_children=1    <-- reads stage 1 as 4 partition(s)
///   FFI_ExecutionPlan: ShuffleWriterExec, number_of_children=1    <== stage 1 (maps 4, buckets 1, single, deps [2])
/// ```
///
/// # Errors
///
/// What [`stages`] reports.
pub fn render_with_stages(plugin: &Plugin, plan: &Arc<dyn ExecutionPlan>) -> Result<String> {
    let stages = stages(plugin, plan)?;
    let mut out = String::new();
    render(plugin, plan, &stages, 0, &mut out);
    Ok(out)
}

fn render(
    plugin: &Plugin,
    plan: &Arc<dyn ExecutionPlan>,
    stages: &[Stage],
    depth: usize,
    out: &mut String,
) {
    let line = node_display(plan.as_ref());
    let _ = write!(out, "{:indent$}{line}", "", indent = depth * 2);
    if let Some(stage) = find(stages, plan) {
        let _ = write!(out, "    <== {}", describe(&stage.info));
    } else if let Some(stage) = read_by(plugin, plan, stages) {
        let _ = write!(
            out,
            "    <-- reads stage {} as {} partition(s)",
            stage.stage_id(),
            plan.output_partitioning().partition_count()
        );
    }
    out.push('\n');
    for child in plan.children() {
        render(plugin, child, stages, depth + 1, out);
    }
}

fn find<'a>(stages: &'a [Stage], plan: &Arc<dyn ExecutionPlan>) -> Option<&'a Stage> {
    stages.iter().find(|s| Arc::ptr_eq(&s.plan, plan))
}

/// The stage `plan` reads, when `plan` is one of the plugin's readers (its
/// only child is the writer of the stage it reads).
pub fn read_by<'a>(
    plugin: &Plugin,
    plan: &Arc<dyn ExecutionPlan>,
    stages: &'a [Stage],
) -> Option<&'a Stage> {
    let reader = plugin.reader_node_name()?;
    if !node_display(plan.as_ref()).contains(reader) {
        return None;
    }
    match plan.children().as_slice() {
        [writer] => find(stages, writer),
        _ => None,
    }
}
