//! Wrapping each scan of a table on an object store in a
//! [`StoreScanExec`], so that a worker decodes and runs it with its own
//! stores for the scan's bucket.

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::physical_plan::ExecutionPlan;

use crate::exec::store_scan::StoreScanExec;

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
