//! Finding stages in a host-side plan and running plans.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::Result;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::{ExecutionPlan, collect, displayable};
use futures::StreamExt;

pub use dfx_abi::stages::{find_stages, node_display};

/// The indented display of the whole plan.
pub fn plan_display(plan: &Arc<dyn ExecutionPlan>) -> String {
    displayable(plan.as_ref()).indent(true).to_string()
}

/// Execute every partition of `plan`, draining each stream; returns the rows
/// per partition.
///
/// # Errors
///
/// The first error of any partition, message intact.
pub async fn run_partitions(
    plan: &Arc<dyn ExecutionPlan>,
    task_ctx: Arc<TaskContext>,
) -> Result<Vec<usize>> {
    let count = plan.properties().output_partitioning().partition_count();
    let mut rows = Vec::with_capacity(count);
    for partition in 0..count {
        let stream = plan.execute(partition, Arc::clone(&task_ctx))?;
        rows.push(drain(stream).await?);
    }
    Ok(rows)
}

/// Execute `plan` fully and format its batches as a table.
///
/// # Errors
///
/// Execution errors.
pub async fn run_to_table(
    plan: &Arc<dyn ExecutionPlan>,
    task_ctx: Arc<TaskContext>,
) -> Result<String> {
    let batches = collect(Arc::clone(plan), task_ctx).await?;
    format_batches(&batches)
}

/// Format batches as a table (the comparison form of the tests).
///
/// # Errors
///
/// Unprintable column types.
pub fn format_batches(batches: &[RecordBatch]) -> Result<String> {
    Ok(pretty_format_batches(batches)?.to_string())
}

/// Drain a stream, counting rows.
async fn drain(mut stream: SendableRecordBatchStream) -> Result<usize> {
    let mut rows = 0;
    while let Some(batch) = stream.next().await {
        rows += batch?.num_rows();
    }
    Ok(rows)
}

/// What the child process reports after running a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildReport {
    /// The decoded plan's indented display, as the child sees it.
    pub display: String,
    /// Rows produced by each partition.
    pub rows: Vec<usize>,
}

/// Run the encoded `plan` in a separate process (`child`, the
/// `dfx-ffi-child` binary): it decodes with its own session and executes every
/// partition.
///
/// # Errors
///
/// The child's stderr when it exits unsuccessfully, or a malformed report.
pub fn run_in_child(
    child: &std::path::Path,
    plan: &[u8],
    scratch: &std::path::Path,
) -> std::result::Result<ChildReport, String> {
    let file = scratch.join(format!("plan-{}.bin", std::process::id()));
    std::fs::write(&file, plan).map_err(|err| format!("writing {}: {err}", file.display()))?;
    let output = std::process::Command::new(child)
        .arg("run")
        .arg(&file)
        .output()
        .map_err(|err| format!("spawning {}: {err}", child.display()))?;
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    if !output.status.success() {
        return Err(stderr);
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    // The last non-empty line: anything a library prints before it is noise.
    let line = stdout
        .lines()
        .rev()
        .find(|line| !line.trim().is_empty())
        .ok_or_else(|| format!("the child printed no report; stderr: {stderr}"))?;
    let report: serde_json::Value =
        serde_json::from_str(line).map_err(|err| format!("unreadable report {line:?}: {err}"))?;
    let display = report["display"]
        .as_str()
        .ok_or("report without display")?
        .to_string();
    let rows = report["rows"]
        .as_array()
        .ok_or("report without rows")?
        .iter()
        .map(|n| {
            n.as_u64()
                .map(|n| n as usize)
                .ok_or("a row count is not a number")
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(ChildReport { display, rows })
}
