//! A stage's operators run inside the plugin, so a memory limit reaches
//! them.
//!
//! datafusion-ffi rebuilds every task context that crosses the boundary
//! with a default runtime, so a host's memory pool never reaches the
//! operators below the plugin's writer, and the operators a host decoded
//! (its own sorts and joins) lose any pool the plugin gives them when the
//! writer runs them. A worker that cannot put the pool back itself (the
//! Python worker) has the plugin seal the writer's input
//! ([`crate::encoded::seal_stage_input`]): the writer's one input becomes
//! this node, whose payload is the whole input, decoded by the plugin alone.
//! Every operator of the stage is then the plugin's, and this node runs
//! them with a pool of the session's `dfx_engine.memory_limit`
//! ([`crate::isolation::limited_task_context`]):
//!
//! ```text
//! ShuffleWriterExec (plugin)
//!   └─ SealedInputExec ─────────── the context gets the pool here
//!        └─ SortExec, HashJoinExec, ... (the plugin's, pool applies)
//! ```
//!
//! Sorts and aggregations then spill to the runtime's temp directory when
//! the pool is full; operators that cannot spill fail with DataFusion's
//! "Resources exhausted".

use std::fmt;
use std::sync::Arc;

use datafusion::common::Result;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};

use crate::config::DfxConfig;
use crate::exec::common::exec_defaults;
use crate::exec::driven;
use crate::isolation::limited_task_context;
use crate::wire::SEALED_INPUT_NODE_NAME;

/// A writer's input that the plugin decoded and runs itself, a leaf to the
/// host (see the module doc for why).
#[derive(Debug)]
pub struct SealedInputExec {
    input: Arc<dyn ExecutionPlan>,
}

impl SealedInputExec {
    /// Seal `input`, the plugin's own decoding of a writer's input.
    pub fn new(input: Arc<dyn ExecutionPlan>) -> Self {
        Self { input }
    }

    /// The sealed input.
    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }
}

impl DisplayAs for SealedInputExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{SEALED_INPUT_NODE_NAME}: ")?;
        self.input.fmt_as(t, f)?;
        write!(f, ", run by the plugin")
    }
}

impl ExecutionPlan for SealedInputExec {
    exec_defaults!(
        name = SEALED_INPUT_NODE_NAME,
        properties_of = input,
        leaf,
        no_expressions,
        guarded_execute = (drive, place),
    );
}

impl SealedInputExec {
    /// How errors and panics name partition `partition` of this input.
    fn place(&self, partition: usize) -> String {
        format!("{SEALED_INPUT_NODE_NAME} partition {partition}")
    }

    /// Partition `partition` of the input, under the session's memory
    /// limit when it sets one, on the plugin's runtime.
    fn drive(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        drive_sealed(Arc::clone(&self.input), partition, context)
    }
}

/// Partition `partition` of `plan`, the sealed input or a node of it (the
/// build side below a key summary, which the writer sums up itself), run
/// as the sealed input runs: under the session's memory limit when it sets
/// one, on the plugin's runtime.
pub(crate) fn drive_sealed(
    plan: Arc<dyn ExecutionPlan>,
    partition: usize,
    context: Arc<TaskContext>,
) -> Result<SendableRecordBatchStream> {
    let context = sealed_context(context)?;
    driven::drive(plan, partition, context, "the stage's sealed input")
}

/// The context a partition of the sealed input runs with: `context` under
/// the session's memory limit when it sets one.
///
/// # Errors
///
/// The session's dfx settings, or the limited runtime, cannot be built.
pub(crate) fn sealed_context(context: Arc<TaskContext>) -> Result<Arc<TaskContext>> {
    let config = DfxConfig::from_config(context.session_config().options())?;
    Ok(match config.memory_limit() {
        Some(limit) => Arc::new(limited_task_context(&context, limit)?),
        None => context,
    })
}
