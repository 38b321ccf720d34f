//! What a stage needs to run apart: the isolation settings (the one
//! definition of what changes when a plan's partitions run in separate
//! processes), the settings a host's session must carry for it, and the
//! rebuilds of a task context: under other settings or another runtime
//! (a memory pool), or with the plugin's own functions.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::config::ConfigOptions;
use datafusion::execution::SessionStateDefaults;
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::FairSpillPool;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::logical_expr::{AggregateUDF, HigherOrderUDF, ScalarUDF, WindowUDF};
use datafusion::prelude::SessionConfig;

/// The isolation settings: the one definition of what changes when a plan's
/// partitions run apart, each task in its own process seeing one partition
/// of its stage's input. Each names the failure it prevents:
///
/// (Small build sides stay collected, as DataFusion chooses them: the split
/// rule broadcasts them, or gathers the probe side for join types that emit
/// build rows after the last probe partition.)
///
/// - join dynamic filters (and the umbrella switch, which would turn them back
///   on): a partitioned hash join's filter waits until every partition of the
///   join has built its side, so a task running one partition waits forever;
/// - uncorrelated scalar subqueries planned as joins, not as a
///   `ScalarSubqueryExec` above the plan: expressions below it read its value
///   by reference, so a stage cut below it could not be decoded by a worker;
/// - no round-robin repartition: it reads every input partition to fill each
///   output partition, an exchange that buys nothing across processes;
/// - no file-stream work stealing: a scan that rebalances files between
///   sibling partitions at run time would let the one partition a task runs
///   read every file, and each task would publish the whole input.
pub fn isolate_partitions(options: &mut ConfigOptions) {
    let optimizer = &mut options.optimizer;
    optimizer.enable_dynamic_filter_pushdown = false;
    optimizer.enable_join_dynamic_filter_pushdown = false;
    optimizer.enable_physical_uncorrelated_scalar_subquery = false;
    optimizer.enable_round_robin_repartition = false;
    options.execution.enable_file_stream_work_stealing = false;
}

/// The settings a session running the plugin's stages must carry, by their
/// DataFusion key: those that act when a stage executes, in the host's
/// session rather than the planner's copy of it. Handed to hosts by the
/// export `session_settings`, so no host spells them.
pub fn session_settings() -> Vec<(&'static str, String)> {
    vec![
        // Off, or a task running partition 0 alone would steal every file of
        // its sibling partitions (which no process polls), and the answer
        // would count those rows once per task.
        (
            "datafusion.execution.enable_file_stream_work_stealing",
            "false".to_string(),
        ),
        // Off: one partition per file is a table's contract (a task per
        // file). Split into byte ranges, a range holding no row group's start
        // reads nothing and its neighbour reads the file whole, and the task
        // list would change with the file sizes.
        (
            "datafusion.optimizer.repartition_file_scans",
            "false".to_string(),
        ),
        // Each worker opens its map's files afresh: read a footer with one
        // small read rather than DataFusion's object-store default.
        (
            "datafusion.execution.parquet.metadata_size_hint",
            dfx_abi::PARQUET_FOOTER_HINT.to_string(),
        ),
    ]
}

/// `context` under the isolation settings that matter at execution time.
///
/// A map task's context comes from the host's session, not the planner's, so
/// the writer applies them to its input itself: running one partition alone
/// is the writer's contract whatever the host configured.
pub fn isolated_task_context(context: &Arc<TaskContext>) -> Arc<TaskContext> {
    // Only work stealing acts at execution time; the rest shaped the plan.
    if !context
        .session_config()
        .options()
        .execution
        .enable_file_stream_work_stealing
    {
        return Arc::clone(context);
    }
    let mut config = context.session_config().clone();
    isolate_partitions(config.options_mut());
    Arc::new(rebuilt_task_context(context, config, context.runtime_env()))
}

/// `context` with a memory pool of `limit` bytes (fair among the operators
/// that spill) over its runtime's other settings (disk manager, object
/// stores): the pool `dfx worker` gives a stage's operators, for those the
/// plugin runs itself ([`crate::exec::SealedInputExec`]).
///
/// # Errors
///
/// A runtime DataFusion refuses to build.
pub fn limited_task_context(context: &TaskContext, limit: u64) -> Result<TaskContext> {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let runtime = RuntimeEnvBuilder::from_runtime_env(&context.runtime_env())
        .with_memory_pool(Arc::new(FairSpillPool::new(limit)))
        .build_arc()?;
    // A sort sets aside this much for merging its spills (10 MiB by
    // default): under a small limit that alone would not fit, so at most a
    // quarter of the limit.
    let mut config = context.session_config().clone();
    let execution = &mut config.options_mut().execution;
    execution.sort_spill_reservation_bytes = execution.sort_spill_reservation_bytes.min(limit / 4);
    Ok(rebuilt_task_context(context, config, runtime))
}

/// `context` with `config` and `runtime` in place of its own; its task and
/// session ids and its functions kept. With [`with_plugin_functions`]
/// (which keeps the rest and changes the functions), the only places the
/// plugin builds a task context: a field DataFusion adds to its
/// constructor is then carried over here, not in every node that needs
/// another config or runtime.
pub fn rebuilt_task_context(
    context: &TaskContext,
    config: SessionConfig,
    runtime: Arc<RuntimeEnv>,
) -> TaskContext {
    TaskContext::new(
        context.task_id(),
        context.session_id(),
        config,
        context.scalar_functions().clone(),
        context.higher_order_functions().clone(),
        context.aggregate_functions().clone(),
        context.window_functions().clone(),
        runtime,
    )
}

/// A kind of function a task context holds by name: its name and aliases.
trait Named {
    /// The names it is registered under.
    fn names(&self) -> Vec<String>;
}

macro_rules! named {
    ($($kind:ty),*) => {$(
        impl Named for $kind {
            fn names(&self) -> Vec<String> {
                std::iter::once(self.name().to_string())
                    .chain(self.aliases().iter().cloned())
                    .collect()
            }
        }
    )*};
}

named!(ScalarUDF, HigherOrderUDF, AggregateUDF, WindowUDF);

/// Every function of `defaults` under each of its names, over `host`'s (a
/// function of the host's of another name kept).
fn overlay<F: Named>(
    host: &HashMap<String, Arc<F>>,
    defaults: Vec<Arc<F>>,
) -> HashMap<String, Arc<F>> {
    let mut functions = host.clone();
    for function in defaults {
        for name in function.names() {
            functions.insert(name, Arc::clone(&function));
        }
    }
    functions
}

/// `context` with the plugin's own functions (DataFusion's built-ins and
/// dfx's) in place of the host's of the same names, the host's others
/// kept (a Python function registered on the worker's session): for
/// decoding a plan the plugin runs itself
/// ([`crate::exec::SealedInputExec`]). A host's built-in reaches the plugin
/// as a foreign function, which loses what DataFusion's own reads from its
/// literal arguments (`date_part('year', d)` fails "First argument of
/// DATE_PART must be non-null scalar Utf8"), and every call would cross
/// the boundary; higher-order functions do not cross it at all.
pub fn with_plugin_functions(context: &TaskContext) -> TaskContext {
    let mut scalar = SessionStateDefaults::default_scalar_functions();
    scalar.extend(crate::functions::scalar_udfs());
    let mut aggregate = SessionStateDefaults::default_aggregate_functions();
    aggregate.extend(crate::functions::aggregate_udfs());
    TaskContext::new(
        context.task_id(),
        context.session_id(),
        context.session_config().clone(),
        overlay(context.scalar_functions(), scalar),
        overlay(
            context.higher_order_functions(),
            SessionStateDefaults::default_higher_order_functions(),
        ),
        overlay(context.aggregate_functions(), aggregate),
        overlay(
            context.window_functions(),
            SessionStateDefaults::default_window_functions(),
        ),
        context.runtime_env(),
    )
}
