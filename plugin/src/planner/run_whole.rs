//! Where a plan none of whose operators runs more partitions than a map
//! runs whole, uncut: in the driver, or as one stage of one task
//! (`dfx_engine.collapse_stages`; [`super::insert_stages`] says why).

use std::sync::Arc;

use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

use super::cut::Cut;
use crate::config::CollapseStages;

/// Whether `cut` keeps `plan` whole for the driver, with no stage: under
/// [`CollapseStages::Auto`], no operator of it runs more partitions than a
/// map does, or than the driver has cores.
pub fn kept_for_the_driver(plan: &Arc<dyn ExecutionPlan>, cut: &Cut) -> bool {
    fits_the_driver(widest_partitions(plan), cut)
}

/// Whether `cut` keeps a plan whose widest operator runs `partitions`
/// whole for the driver ([`kept_for_the_driver`]); the planner asks it of
/// the session's target partitions before a plan exists.
pub(super) fn fits_the_driver(partitions: usize, cut: &Cut) -> bool {
    cut.collapse == CollapseStages::Auto
        && partitions <= cut.partitions_per_map.min(cut.driver_cores)
}

/// Whether `cut` runs `plan` whole, in the driver or as one stage: unless
/// [`CollapseStages::Off`], no operator of it runs more partitions than a
/// map does.
pub(super) fn runs_whole(plan: &Arc<dyn ExecutionPlan>, cut: &Cut) -> bool {
    cut.collapse != CollapseStages::Off && widest_partitions(plan) <= cut.partitions_per_map
}

/// The most partitions any operator of `plan` runs.
fn widest_partitions(plan: &Arc<dyn ExecutionPlan>) -> usize {
    plan.children()
        .into_iter()
        .map(widest_partitions)
        .fold(plan.output_partitioning().partition_count(), usize::max)
}
