//! `MapScanExec`: a file scan cut to the one file group its map reads,
//! still declaring every partition of the scan it was cut from.

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};

use super::{ANY_MAP, MAP_SCAN_NODE_NAME, NO_PARTITION, UNCUT_MAP};

/// What a [`MapScanExec`] carries across a process boundary besides its
/// scan (its input).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapScanPayload {
    /// The map the scan was cut for; [`UNCUT_MAP`] in a stage's shared part
    /// (no map's files filled in yet), [`ANY_MAP`] where no map reads it.
    pub map: u64,
    /// Partitions of the scan it was cut from: the partitions it declares.
    pub partitions: u64,
    /// The one partition it can run (its scan's only file group), or
    /// [`NO_PARTITION`].
    pub partition: u64,
    /// Which cut scan of its stage it is, in the order the cut met them.
    pub slot: u32,
}

/// A file scan holding only the file group of the partition its map reads,
/// declaring the partitions of the whole scan, so every operator above it
/// sees the partitioning the stage was planned with.
///
/// ```text
/// DataSourceExec (N file groups)  ── cut for map M ──►  MapScanExec (N partitions, runs partition p)
///                                                          └─ DataSourceExec (group p only)
/// ```
///
/// Any other partition is an error rather than no rows: a task asking for
/// one was cut for another map, and empty output would be a wrong answer.
#[derive(Debug)]
pub struct MapScanExec {
    payload: MapScanPayload,
    scan: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

impl MapScanExec {
    /// `scan` (one file group, or none) standing for `payload.partitions`
    /// partitions.
    ///
    /// # Errors
    ///
    /// A payload of a stage's shared part (not cut for a map), or a scan
    /// whose partitions do not match the payload's.
    pub fn try_new(payload: MapScanPayload, scan: Arc<dyn ExecutionPlan>) -> Result<Self> {
        if payload.map == UNCUT_MAP {
            return Err(fail(
                "a stage's shared part, not cut for a map, cannot run: its scans hold no \
                 files until a map's file groups are put in (see the export stage_for_map)"
                    .to_string(),
            ));
        }
        let held = scan.output_partitioning().partition_count();
        let expected = usize::from(payload.partition != NO_PARTITION);
        if held != expected {
            return Err(fail(format!(
                "the scan cut for map {} holds {held} partition(s), not {expected}",
                payload.map
            )));
        }
        let partitions = usize::try_from(payload.partitions)
            .map_err(|_| fail(format!("{} partitions do not fit", payload.partitions)))?;
        let partitioning = match scan.output_partitioning().clone() {
            Partitioning::Hash(exprs, _) => Partitioning::Hash(exprs, partitions),
            Partitioning::RoundRobinBatch(_) => Partitioning::RoundRobinBatch(partitions),
            Partitioning::UnknownPartitioning(_) => Partitioning::UnknownPartitioning(partitions),
            other => {
                return Err(fail(format!(
                    "a scan partitioned as {other} is never cut for a map"
                )));
            }
        };
        let properties = Arc::new(
            scan.properties()
                .as_ref()
                .clone()
                .with_partitioning(partitioning),
        );
        Ok(Self {
            payload,
            scan,
            properties,
        })
    }

    /// What the node carries besides its scan.
    pub fn payload(&self) -> MapScanPayload {
        self.payload
    }

    /// The scan it runs (one file group, or none).
    pub fn scan(&self) -> &Arc<dyn ExecutionPlan> {
        &self.scan
    }

    fn runs(&self) -> String {
        match self.payload.partition {
            NO_PARTITION => "no partition".to_string(),
            p => format!("partition {p}"),
        }
    }
}

fn fail(what: String) -> DataFusionError {
    DataFusionError::Execution(format!("dfx {MAP_SCAN_NODE_NAME}: {what}"))
}

impl DisplayAs for MapScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let map = match self.payload.map {
            ANY_MAP => "any map".to_string(),
            map => format!("map {map}"),
        };
        write!(
            f,
            "{MAP_SCAN_NODE_NAME}: {map}, {} of {}",
            self.runs(),
            self.payload.partitions
        )
    }
}

impl ExecutionPlan for MapScanExec {
    fn name(&self) -> &str {
        MAP_SCAN_NODE_NAME
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.scan]
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
                "{MAP_SCAN_NODE_NAME} takes one child, given {}",
                children.len()
            )));
        }
        Ok(Arc::new(Self::try_new(
            self.payload,
            children.swap_remove(0),
        )?))
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
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if self.payload.partition != partition as u64 {
            return Err(fail(format!(
                "cut for map {}, it runs {} of {}; partition {partition} was asked, so the \
                 task runs a stage cut for another map",
                self.payload.map,
                self.runs(),
                self.payload.partitions
            )));
        }
        self.scan.execute(0, context)
    }
}
