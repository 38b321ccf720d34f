//! `MapScanExec`: a file scan cut to the one file group its map reads,
//! still declaring every partition of the scan it was cut from.

use std::fmt;
use std::sync::Arc;

use datafusion::common::Result;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::Partitioning;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};

use crate::error::Area;
use crate::error::fail;
use crate::exec::common::exec_defaults;
use crate::wire::MapScanPayload;
use crate::wire::{ANY_MAP, MAP_SCAN_NODE_NAME, NO_PARTITION, UNCUT_MAP};

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
    /// This node over `scan` in place of its own scan.
    fn with_scan(&self, scan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::try_new(self.payload, scan)?))
    }

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
                Area::MapScan,
                "a stage's shared part, not cut for a map, cannot run: its scans hold no \
                 files until a map's file groups are put in (see the export stage_for_map)"
                    .to_string(),
            ));
        }
        let held = scan.output_partitioning().partition_count();
        let expected = usize::from(payload.partition != NO_PARTITION);
        if held != expected {
            return Err(fail(
                Area::MapScan,
                format!(
                    "the scan cut for map {} holds {held} partition(s), not {expected}",
                    payload.map
                ),
            ));
        }
        let partitions = usize::try_from(payload.partitions).map_err(|_| {
            fail(
                Area::MapScan,
                format!("{} partitions do not fit", payload.partitions),
            )
        })?;
        let partitioning = match scan.output_partitioning().clone() {
            Partitioning::Hash(exprs, _) => Partitioning::Hash(exprs, partitions),
            Partitioning::RoundRobinBatch(_) => Partitioning::RoundRobinBatch(partitions),
            Partitioning::UnknownPartitioning(_) => Partitioning::UnknownPartitioning(partitions),
            other => {
                return Err(fail(
                    Area::MapScan,
                    format!("a scan partitioned as {other} is never cut for a map"),
                ));
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
    exec_defaults!(
        name = MAP_SCAN_NODE_NAME,
        properties = properties,
        one_child = (scan, with_scan),
        no_expressions,
    );

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if self.payload.partition != partition as u64 {
            return Err(fail(
                Area::MapScan,
                format!(
                    "cut for map {}, it runs {} of {}; partition {partition} was asked, so the \
                 task runs a stage cut for another map",
                    self.payload.map,
                    self.runs(),
                    self.payload.partitions
                ),
            ));
        }
        self.scan.execute(0, context)
    }
}
