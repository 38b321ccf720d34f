//! Peak memory of one map task publishing a large input into hash buckets.
//!
//! `cargo run --release -p dfx-plugin --example publish_rss -- 100 1000`
//! streams a 100 MB and a 1000 MB input (each in a fresh child process, so
//! each peak is its own) through one map of a `ShuffleWriterExec` splitting
//! by hash into 8 buckets, and prints the peak resident set size beside the
//! bytes written. Flat memory means the writer streams; a buffering writer
//! would grow with the input.

use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{Float64Array, Int64Array, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::Partitioning;
use datafusion::physical_expr::expressions::col;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::prelude::SessionContext;
use dfx_plugin::ShuffleWriterExec;
use futures::StreamExt;

const ROWS_PER_BATCH: usize = 65_536;
const BYTES_PER_ROW: usize = 16;

#[derive(Debug)]
struct Generated {
    schema: SchemaRef,
    batches: usize,
}

impl PartitionStream for Generated {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let schema = Arc::clone(&self.schema);
        let batches = (0..self.batches).map(move |i| {
            let base = (i * ROWS_PER_BATCH) as i64;
            let keys = Int64Array::from_iter_values(base..base + ROWS_PER_BATCH as i64);
            let values = Float64Array::from_iter_values((0..ROWS_PER_BATCH).map(|r| r as f64));
            Ok(RecordBatch::try_new(
                Arc::clone(&schema),
                vec![Arc::new(keys), Arc::new(values)],
            )?)
        });
        Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            futures::stream::iter(batches),
        ))
    }
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

async fn publish(megabytes: usize) -> datafusion::common::Result<()> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Float64, false),
    ]));
    let batches = (megabytes << 20) / (ROWS_PER_BATCH * BYTES_PER_ROW);
    let source = Arc::new(Generated {
        schema: Arc::clone(&schema),
        batches,
    });
    let key = col("k", &schema)?;
    let input = Arc::new(StreamingTableExec::try_new(
        schema,
        vec![source],
        None,
        vec![],
        false,
        None,
    )?);
    let dir = tempfile::tempdir()?;
    let stage = ShuffleWriterExec::try_new(
        1,
        dir.path().to_path_buf(),
        input,
        Partitioning::Hash(vec![key], 8),
        vec![],
        1,
    )?;
    let start = Instant::now();
    let mut stream = stage.execute(0, SessionContext::new().task_ctx())?;
    let (mut rows, mut bytes) = (0u64, 0u64);
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let sum = |name: &str| {
            batch
                .column_by_name(name)
                .and_then(|c| c.as_any().downcast_ref::<UInt64Array>())
                .map_or(0, |c| c.iter().flatten().sum::<u64>())
        };
        rows += sum("rows");
        bytes += sum("bytes");
    }
    let written = bytes as f64 / (1 << 20) as f64;
    println!(
        "{megabytes:>6} MB of batches  {rows:>11} rows  8 buckets {written:>8.1} MiB (LZ4)  peak RSS {:>7.1} MiB  {:>6.2} s",
        peak_rss_mib(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

#[tokio::main]
async fn main() -> datafusion::common::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, size] = args.as_slice()
        && flag == "--child"
    {
        let size = size
            .parse()
            .map_err(|e| datafusion::common::DataFusionError::Plan(format!("size: {e}")))?;
        return publish(size).await;
    }
    let sizes = if args.is_empty() {
        vec!["100".to_string(), "1000".to_string()]
    } else {
        args
    };
    let exe = std::env::current_exe()?;
    for size in sizes {
        let status = std::process::Command::new(&exe)
            .args(["--child", &size])
            .status()?;
        if !status.success() {
            return Err(datafusion::common::DataFusionError::Execution(format!(
                "the {size} MB run failed"
            )));
        }
    }
    Ok(())
}
