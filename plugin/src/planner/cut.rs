//! What the planner cuts a plan by: the session's settings for the split.

use crate::config::{CollapseStages, JoinFilters, SplitMode};

/// How a plan is cut: the split rule, the filters that cross stages, the
/// partitions each map runs, and whether and where a plan of one-task
/// stages runs whole.
#[derive(Debug, Clone, Copy)]
pub struct Cut {
    /// Where the plan is cut.
    pub mode: SplitMode,
    /// Which joins get filters that cross stages.
    pub filters: JoinFilters,
    /// Partitions of a stage each map (each task) runs, at least one.
    pub partitions_per_map: usize,
    /// Whether a plan whose every stage would be one task runs whole, and
    /// where.
    pub collapse: CollapseStages,
    /// The cores of the process planning (the driver), which runs a whole
    /// plan itself under [`CollapseStages::Auto`] only if it has the cores.
    pub driver_cores: usize,
}
