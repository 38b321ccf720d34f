//! The task context a query's head is read in: its readers handed where
//! each bucket of the stages they read lies, so the driver's own read of
//! the last stages makes no marker request.

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::execution::TaskContext;
use dfx_abi::SHUFFLE_RANGES;

/// `context`, with the plugin's `shuffle_ranges` setting (under the plugin's
/// `prefix`) set to `ranges`; `context` itself when there are none.
///
/// # Errors
///
/// A session whose configuration has no place for the plugin's settings
/// (the plugin's extension is not registered in it).
pub fn head_context(
    context: &Arc<TaskContext>,
    prefix: &str,
    ranges: Option<String>,
) -> Result<Arc<TaskContext>> {
    let Some(ranges) = ranges else {
        return Ok(Arc::clone(context));
    };
    let mut config = context.session_config().clone();
    config
        .options_mut()
        .set(&format!("{prefix}.{SHUFFLE_RANGES}"), &ranges)?;
    Ok(Arc::new(TaskContext::new(
        context.task_id(),
        context.session_id(),
        config,
        context.scalar_functions().clone(),
        context.higher_order_functions().clone(),
        context.aggregate_functions().clone(),
        context.window_functions().clone(),
        context.runtime_env(),
    )))
}
