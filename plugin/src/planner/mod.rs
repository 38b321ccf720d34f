//! The query planner: plan physically under isolation settings, then cut the
//! plan into stages ([`crate::planner`]).
//!
//! No shuffle directory configured means no stage: the query runs in
//! process, planned exactly as DataFusion would. So is a plan the driver
//! keeps whole ([`kept_for_the_driver`]), which runs in one process too.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::Result;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion::logical_expr::registry::FunctionRegistry;
use datafusion::logical_expr::{Expr, LogicalPlan, WindowFunctionDefinition};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};

mod add_join_filters;
mod cut;
mod insert_stages;
mod number_stages;
mod restate_constants;
mod run_whole;
mod seal_recursive_queries;
mod wrap_store_scans;

pub use add_join_filters::add_join_filters;
pub use cut::Cut;
pub use insert_stages::insert_stages;
pub use restate_constants::restate_constants;
use run_whole::fits_the_driver;
pub use run_whole::kept_for_the_driver;
pub use seal_recursive_queries::{seal_recursive_queries, whole_work_tables};
pub use wrap_store_scans::wrap_store_scans;

use crate::config::DfxConfig;
use crate::counters;
use crate::counters::LiveObject;
use crate::exchange::store::S3Options;
use crate::isolation::isolate_partitions;
use crate::tables::with_table_stores;

/// dfx's query planner.
///
/// Plans with a session of its own built from the caller's config and
/// runtime, rather than with the caller's session: a session that arrives
/// over FFI carries the host's physical optimizer rules, and running those
/// would hand back opaque foreign nodes that no codec can serialize.
#[derive(Debug)]
pub struct DfxQueryPlanner {
    _live: LiveObject,
}

impl Default for DfxQueryPlanner {
    fn default() -> Self {
        Self {
            _live: LiveObject::new(),
        }
    }
}

#[async_trait]
impl QueryPlanner for DfxQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        counters::planner_called();
        let dfx = DfxConfig::from_config(session.config_options())?;
        let split = dfx.split_mode()?;
        let filters = dfx.join_filters()?;
        // Every choice, so a typo fails the query before any task runs.
        dfx.check_choices()?;
        let Some(dir) = dfx.shuffle_dir() else {
            return plan_physically(logical_plan, session, &dfx, Planning::AsOneProcess).await;
        };
        let cut = Cut {
            mode: split,
            filters,
            partitions_per_map: dfx.partitions_per_task(),
            collapse: dfx.collapse_stages()?,
            driver_cores: std::thread::available_parallelism().map_or(1, usize::from),
        };
        // A plan the driver may keep whole runs in one process, so it is
        // first planned as one process plans it (join dynamic filters, a
        // physical scalar subquery, round-robin repartitions); only a plan
        // that turns out wider is planned again under the isolation settings.
        if fits_the_driver(session.config().target_partitions(), &cut) {
            let plan = plan_physically(logical_plan, session, &dfx, Planning::AsOneProcess).await?;
            if kept_for_the_driver(&plan, &cut) {
                counters::stages_inserted(0);
                return wrap_store_scans(plan);
            }
        }
        let plan = plan_physically(logical_plan, session, &dfx, Planning::Isolated).await?;
        let plan = wrap_store_scans(plan)?;
        let (plan, stages) = insert_stages(plan, &dir, cut)?;
        counters::stages_inserted(stages);
        Ok(plan)
    }
}

/// How a plan is planned physically.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Planning {
    /// As DataFusion plans it for one process: under the caller's settings.
    AsOneProcess,
    /// Under the isolation settings, for partitions that run apart
    /// ([`isolate_partitions`]).
    Isolated,
}

/// `logical_plan` planned physically, as `planning` says, with a session
/// of the plugin's own built from `session`'s config and runtime (see
/// [`DfxQueryPlanner`]), its recursive queries sealed.
async fn plan_physically(
    logical_plan: &LogicalPlan,
    session: &dyn Session,
    dfx: &DfxConfig,
    planning: Planning,
) -> Result<Arc<dyn ExecutionPlan>> {
    let mut config = session.config().clone();
    if planning == Planning::Isolated {
        isolate_partitions(config.options_mut());
    }
    // The host's object stores do not cross the boundary: a table on S3
    // is listed through the plugin's (see `crate::tables`).
    let runtime = with_table_stores(session.runtime_env(), S3Options::from_config(dfx))?;
    let mut state = SessionStateBuilder::new()
        .with_config(config)
        .with_runtime_env(runtime)
        .with_default_features()
        .build();
    for udf in crate::functions::scalar_udfs() {
        state.register_udf(udf)?;
    }
    for udaf in crate::functions::aggregate_udfs() {
        state.register_udaf(udaf)?;
    }
    let logical_plan = &with_native_functions(logical_plan.clone(), &state)?;
    // Optimized again under the settings above: the host optimized the
    // plan under its own, which may leave uncorrelated scalar subqueries
    // for a `ScalarSubqueryExec` (see `isolate_partitions`).
    let logical_plan = match planning {
        Planning::Isolated => &state.optimize(logical_plan)?,
        Planning::AsOneProcess => logical_plan,
    };
    let plan = DefaultPhysicalPlanner::default()
        .create_physical_plan(logical_plan, &state)
        .await?;
    // Every plan crosses to the host encoded, so also one without stages.
    seal_recursive_queries(plan)
}

/// `plan` with every function it calls by a name the plugin's own session
/// also has (DataFusion's built-ins, dfx's functions) replaced by the
/// plugin's implementation of it.
///
/// Why: the host hands the plan over as protobuf, decoded against the
/// host's session, so each function arrives as an FFI wrapper. Some
/// functions inspect their arguments' physical expressions when planned
/// (`lag(x, 2)`, `lead(x, 1, 0)`, `ntile(4)`, `nth_value(x, 2)` look for a
/// literal offset), and a literal wrapped across FFI is not one: the plan
/// failed with "only support Literal types". The plugin links the same
/// DataFusion as the plan's functions, so its own are the same functions.
/// A function only the host has (a Python UDF, say) stays as it came.
fn with_native_functions(plan: LogicalPlan, state: &SessionState) -> Result<LogicalPlan> {
    plan.transform_up_with_subqueries(|node| {
        node.map_expressions(|expr| expr.transform_up(|expr| Ok(native_function(expr, state))))
    })
    .data()
}

/// `expr` calling the plugin's own implementation of its function, when
/// the plugin's session has one by that name.
fn native_function(mut expr: Expr, state: &SessionState) -> Transformed<Expr> {
    let swapped = match &mut expr {
        Expr::ScalarFunction(call) => {
            let native = state.scalar_functions().get(call.func.name());
            swap(&mut call.func, native)
        }
        Expr::AggregateFunction(call) => {
            let native = state.aggregate_functions().get(call.func.name());
            swap(&mut call.func, native)
        }
        Expr::WindowFunction(window) => match &mut window.fun {
            WindowFunctionDefinition::WindowUDF(func) => {
                let native = state.window_functions().get(func.name());
                swap(func, native)
            }
            WindowFunctionDefinition::AggregateUDF(func) => {
                let native = state.aggregate_functions().get(func.name());
                swap(func, native)
            }
        },
        _ => false,
    };
    if swapped {
        Transformed::yes(expr)
    } else {
        Transformed::no(expr)
    }
}

/// Point `func` at `native` when there is one; whether it did.
fn swap<F>(func: &mut Arc<F>, native: Option<&Arc<F>>) -> bool {
    match native {
        Some(native) => {
            *func = Arc::clone(native);
            true
        }
        None => false,
    }
}
