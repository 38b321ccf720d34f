//! The query planner: plan physically, then split the plan into stages.
//!
//! Split rule: every *topmost* `AggregateExec` in `Partial` mode becomes the
//! child of a `ShuffleStageExec`; a plan without one is wrapped whole, so a
//! distributed query always has at least one stage. Stages are numbered in
//! pre-order from `FIRST_STAGE_ID`, afresh on every call: the driver plans
//! the same query twice (once to ship the stages, once to read them back) and
//! both plans must name the same files.
//!
//! No shuffle directory configured means no stage: the query runs in process.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::Result;
use datafusion::common::config::ConfigOptions;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::QueryPlanner;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};

use crate::config::DfxConfig;
use crate::counters::{self, LiveObject};
use crate::paths::stage_id;
use crate::stage::ShuffleStageExec;

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
        let shuffle_dir = DfxConfig::from_config(session.config_options())?.shuffle_dir();
        let mut config = session.config().clone();
        if shuffle_dir.is_some() {
            plan_for_isolated_partitions(config.options_mut());
        }
        let state = SessionStateBuilder::new()
            .with_config(config)
            .with_runtime_env(Arc::clone(session.runtime_env()))
            .with_default_features()
            .build();
        // Optimized again under the settings above: the host optimized the
        // plan under its own, which may leave uncorrelated scalar subqueries
        // for a `ScalarSubqueryExec` (see `plan_for_isolated_partitions`).
        let logical_plan = match shuffle_dir {
            Some(_) => &state.optimize(logical_plan)?,
            None => logical_plan,
        };
        let plan = DefaultPhysicalPlanner::default()
            .create_physical_plan(logical_plan, &state)
            .await?;
        match shuffle_dir {
            None => Ok(plan),
            Some(dir) => {
                let (plan, stages) = insert_stages(plan, &dir)?;
                counters::stages_inserted(stages);
                Ok(plan)
            }
        }
    }
}

/// Planner settings under which every partition of a stage can run alone in
/// its own process, with nothing shared with its siblings. Each one names the
/// failure it prevents:
///
/// - join dynamic filters (and the umbrella switch, which would turn them back
///   on): a partitioned hash join's filter waits until every partition of the
///   join has built its side, so a task running one partition waits forever;
/// - no collected (single-partition) build side: such a join emits the build
///   rows it owes to semi, anti and outer joins only after every probe
///   partition finished, which no single task sees, so those rows were lost;
/// - uncorrelated scalar subqueries planned as joins, not as a
///   `ScalarSubqueryExec` above the plan: expressions below it read its value
///   by reference, so a stage cut below it cannot be decoded by a worker.
fn plan_for_isolated_partitions(options: &mut ConfigOptions) {
    let optimizer = &mut options.optimizer;
    optimizer.enable_dynamic_filter_pushdown = false;
    optimizer.enable_join_dynamic_filter_pushdown = false;
    optimizer.hash_join_single_partition_threshold = 0;
    optimizer.hash_join_single_partition_threshold_rows = 0;
    optimizer.enable_physical_uncorrelated_scalar_subquery = false;
}

/// Wrap every topmost partial aggregate of `plan` in a stage (or the whole
/// plan when it has none); returns the new plan and the number of stages.
pub fn insert_stages(
    plan: Arc<dyn ExecutionPlan>,
    shuffle_dir: &Path,
) -> Result<(Arc<dyn ExecutionPlan>, u64)> {
    let mut next_index = 0;
    let plan = wrap_topmost_partials(plan, shuffle_dir, &mut next_index)?;
    if next_index > 0 {
        return Ok((plan, next_index));
    }
    let whole = ShuffleStageExec::new(stage_id(0), PathBuf::from(shuffle_dir), plan);
    Ok((Arc::new(whole), 1))
}

fn is_partial_aggregate(plan: &Arc<dyn ExecutionPlan>) -> bool {
    plan.downcast_ref::<AggregateExec>()
        .is_some_and(|agg| *agg.mode() == AggregateMode::Partial)
}

/// Pre-order walk: a partial aggregate is wrapped and not descended into, so
/// stages never nest and the n-th stage met is the n-th in pre-order.
fn wrap_topmost_partials(
    plan: Arc<dyn ExecutionPlan>,
    shuffle_dir: &Path,
    next_index: &mut u64,
) -> Result<Arc<dyn ExecutionPlan>> {
    if is_partial_aggregate(&plan) {
        let id = stage_id(*next_index);
        *next_index += 1;
        return Ok(Arc::new(ShuffleStageExec::new(
            id,
            PathBuf::from(shuffle_dir),
            plan,
        )));
    }
    let children: Vec<Arc<dyn ExecutionPlan>> = plan.children().into_iter().cloned().collect();
    if children.is_empty() {
        return Ok(plan);
    }
    let before = *next_index;
    let new_children = children
        .into_iter()
        .map(|child| wrap_topmost_partials(child, shuffle_dir, next_index))
        .collect::<Result<Vec<_>>>()?;
    if *next_index == before {
        return Ok(plan);
    }
    #[expect(
        deprecated,
        reason = "replace_children's modes are not needed: stages keep their child's properties"
    )]
    plan.with_new_children(new_children)
}
