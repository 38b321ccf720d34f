//! What a stage needs to run apart: the isolation settings (the one
//! definition of what changes when a plan's partitions run in separate
//! processes), the settings a host's session must carry for it, and the
//! one rebuild of a task context under other settings.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::execution::TaskContext;
use datafusion::execution::runtime_env::RuntimeEnv;
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

/// `context` with `config` and `runtime` in place of its own; its task and
/// session ids and its functions kept. The one place the plugin rebuilds a
/// task context: a field DataFusion adds to its constructor is then
/// carried over once, not in every node that needs another config or
/// runtime.
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
