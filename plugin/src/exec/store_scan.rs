//! `StoreScanExec`: a scan of a table on an object store, run with the
//! plugin's stores for it (see the module doc of [`crate::tables`]).

use std::fmt;
use std::sync::Arc;

use datafusion::common::{Result, Statistics};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::statistics::StatisticsArgs;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};

use crate::exec::common::exec_defaults;
use crate::tables::with_table_stores_context;
use crate::wire::STORE_SCAN_NODE_NAME;

/// Runs its scan (a `DataSourceExec` over a table on an object store) with
/// the plugin's stores, configured by the task's session, whatever runtime
/// the context it is handed carries. A leaf: the scan travels inside its
/// payload, encoded by the plugin.
#[derive(Debug)]
pub struct StoreScanExec {
    scan: Arc<dyn ExecutionPlan>,
}

impl StoreScanExec {
    /// The scan it runs.
    pub fn scan(&self) -> &Arc<dyn ExecutionPlan> {
        &self.scan
    }

    /// `scan`, to be run with the plugin's stores.
    pub fn new(scan: Arc<dyn ExecutionPlan>) -> Self {
        Self { scan }
    }
}

impl DisplayAs for StoreScanExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{STORE_SCAN_NODE_NAME}: ")?;
        self.scan.fmt_as(t, f)
    }
}

impl ExecutionPlan for StoreScanExec {
    exec_defaults!(
        name = STORE_SCAN_NODE_NAME,
        properties_of = scan,
        leaf,
        no_expressions,
    );

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        // The scan is a leaf too: it takes no input statistics either.
        self.scan.statistics_from_inputs(input_stats, args)
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let context = with_table_stores_context(&context)?;
        self.scan.execute(partition, Arc::new(context))
    }
}
