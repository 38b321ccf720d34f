//! `StoreScanExec`: a scan of a table on an object store, run with the
//! plugin's stores for it (see the module doc of [`crate::tables`]).

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result, Statistics};
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::statistics::StatisticsArgs;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};

use super::store::with_table_stores_context;

/// The node's name, in plans and payloads.
pub const STORE_SCAN_NODE_NAME: &str = "StoreScanExec";

/// Runs its scan (a `DataSourceExec` over a table on an object store) with
/// the plugin's stores, configured by the task's session, whatever runtime
/// the context it is handed carries. A leaf: the scan travels inside its
/// payload, encoded by the plugin.
#[derive(Debug)]
pub struct StoreScanExec {
    scan: Arc<dyn ExecutionPlan>,
}

impl StoreScanExec {
    /// `scan`, to be run with the plugin's stores.
    pub fn new(scan: Arc<dyn ExecutionPlan>) -> Self {
        Self { scan }
    }

    /// The scan it runs.
    pub fn scan(&self) -> &Arc<dyn ExecutionPlan> {
        &self.scan
    }
}

/// The object store a plan node scans, if it is a file scan.
fn scanned_store(node: &Arc<dyn ExecutionPlan>) -> Option<String> {
    let source = node.downcast_ref::<DataSourceExec>()?;
    let config = source.data_source().downcast_ref::<FileScanConfig>()?;
    Some(config.object_store_url.as_str().to_string())
}

/// `plan` with every file scan over a store other than local files wrapped
/// in a [`StoreScanExec`].
///
/// # Errors
///
/// None in practice: the rewrite only wraps leaves.
pub fn wrap_store_scans(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| match scanned_store(&node) {
        Some(store) if !store.starts_with("file://") => {
            Ok(Transformed::yes(Arc::new(StoreScanExec::new(node)) as _))
        }
        _ => Ok(Transformed::no(node)),
    })
    .map(|transformed| transformed.data)
}

impl DisplayAs for StoreScanExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{STORE_SCAN_NODE_NAME}: ")?;
        self.scan.fmt_as(t, f)
    }
}

impl ExecutionPlan for StoreScanExec {
    fn name(&self) -> &str {
        STORE_SCAN_NODE_NAME
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.scan.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            return Ok(self);
        }
        Err(DataFusionError::Internal(format!(
            "{STORE_SCAN_NODE_NAME} is a leaf, given {} children",
            children.len()
        )))
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
