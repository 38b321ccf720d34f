//! A per-worker memory limit (`--memory-limit`), backed by a DataFusion
//! memory pool, and why it needs a node of its own.
//!
//! A stage's root is the plugin's writer, a foreign node. The host runs it
//! with a task context whose runtime carries the pool, but datafusion-ffi 55
//! rebuilds every `TaskContext` that crosses the boundary with
//! `RuntimeEnv::default()`: the writer sees no pool, and when it executes its
//! input (the stage's operators, host nodes) the context crosses back, again
//! without one. So the worker puts a [`BoundContextExec`] between the writer
//! and its input: a host node that runs its input with the context it was
//! built with, whatever context it is handed. Every operator of the stage
//! then registers with the pool; those that can spill (sorts, aggregations)
//! spill to the runtime's temp directory when it is full, and those that
//! cannot fail with DataFusion's "Resources exhausted" error.
//!
//! ```text
//! host:   ShuffleWriterExec (plugin) ── ctx crosses FFI, pool lost
//!           └─ BoundContextExec ──────── runs its input with the worker's ctx
//!                └─ HashJoinExec, SortExec, ... (host nodes, pool applies)
//! ```

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::memory_pool::FairSpillPool;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};

/// Parse a memory size: bytes, or a number with `K`, `M`, `G` or `T`
/// (powers of 1024; `KB`, `MiB` and lower case are taken too).
///
/// # Errors
///
/// Anything else, naming the text and the forms taken.
pub fn parse_size(text: &str) -> std::result::Result<u64, String> {
    let trimmed = text.trim();
    let digits = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(digits);
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => u32::MAX,
    };
    let value = number.parse::<u64>().ok();
    match (value, shift) {
        (Some(value), shift) if shift != u32::MAX && value > 0 => value
            .checked_mul(1 << shift)
            .ok_or_else(|| format!("memory size {text:?} is too large")),
        _ => Err(format!(
            "memory size {text:?}: expected a positive number of bytes, or one with K, M, G \
             or T (512M, 2G)"
        )),
    }
}

/// `ctx` with a memory pool of `limit` bytes (fair among the operators that
/// spill) over its runtime's other settings (disk manager, object stores).
///
/// # Errors
///
/// A runtime DataFusion refuses to build.
pub fn limited_context(ctx: &TaskContext, limit: u64) -> Result<Arc<TaskContext>> {
    let runtime = RuntimeEnvBuilder::from_runtime_env(&ctx.runtime_env())
        .with_memory_pool(Arc::new(FairSpillPool::new(limit as usize)))
        .build_arc()?;
    // A sort sets aside this much for merging its spills (10 MiB by
    // default): under a small limit that alone would not fit, so at most a
    // quarter of the limit.
    let mut config = ctx.session_config().clone();
    let execution = &mut config.options_mut().execution;
    execution.sort_spill_reservation_bytes = execution
        .sort_spill_reservation_bytes
        .min((limit / 4) as usize);
    Ok(Arc::new(TaskContext::new(
        ctx.task_id(),
        ctx.session_id(),
        config,
        ctx.scalar_functions().clone(),
        ctx.higher_order_functions().clone(),
        ctx.aggregate_functions().clone(),
        ctx.window_functions().clone(),
        runtime,
    )))
}

/// Put a [`BoundContextExec`] holding `ctx` below the stage root `stage`
/// (see the module doc), so its operators run with `ctx`'s memory pool.
///
/// # Errors
///
/// A root without exactly one input, or one that refuses new children.
pub fn bind_below_root(
    stage: &Arc<dyn ExecutionPlan>,
    ctx: Arc<TaskContext>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let children = stage.children();
    let [input] = children.as_slice() else {
        return Err(DataFusionError::Internal(format!(
            "a stage root has one input; {} has {}",
            stage.name(),
            children.len()
        )));
    };
    let bound: Arc<dyn ExecutionPlan> = Arc::new(BoundContextExec::new(Arc::clone(input), ctx));
    Arc::clone(stage).replace_children(
        vec![bound],
        ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
    )
}

/// Runs its input with the task context it was built with, ignoring the one
/// it is handed (see the module doc). Host-only: never encoded.
#[derive(Debug)]
pub struct BoundContextExec {
    input: Arc<dyn ExecutionPlan>,
    ctx: Arc<TaskContext>,
}

impl BoundContextExec {
    /// `input`, to be run with `ctx`.
    pub fn new(input: Arc<dyn ExecutionPlan>, ctx: Arc<TaskContext>) -> Self {
        Self { input, ctx }
    }
}

impl DisplayAs for BoundContextExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "BoundContextExec: memory pool {:?}",
            self.ctx.memory_pool()
        )
    }
}

impl ExecutionPlan for BoundContextExec {
    fn name(&self) -> &str {
        "BoundContextExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal(format!(
                "BoundContextExec takes one child, got {}",
                children.len()
            )));
        }
        Ok(Arc::new(Self::new(
            children.swap_remove(0),
            Arc::clone(&self.ctx),
        )))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )
    }

    fn execute(
        &self,
        partition: usize,
        _handed: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        self.input.execute(partition, Arc::clone(&self.ctx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size(" 3 g ").unwrap(), 3 << 30);
        for bad in ["", "0", "M", "1.5G", "12Q", "-1"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
