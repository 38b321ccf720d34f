//! The writer's stream guard: a panic in any operator of the stage, below
//! the writer, surfaces as one error of the writer's stream (the host would
//! otherwise abort: `datafusion-ffi` polls the stream from an `extern "C"`
//! function), and the map publishes nothing.

mod common;

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::prelude::SessionContext;
use dfx_plugin::guard::PANIC_PREFIX;
use futures::StreamExt;

use common::{kv_batch, kv_schema, writer};

/// Yields one batch, then panics on the next poll.
#[derive(Debug)]
struct PanicsOnSecondPoll(SchemaRef);

impl PartitionStream for PanicsOnSecondPoll {
    fn schema(&self) -> &SchemaRef {
        &self.0
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let items = futures::stream::iter(0..2).map(|i| {
            if i == 1 {
                panic!("an operator of the stage broke");
            }
            Ok(kv_batch(&[1, 2], &[0.5, 1.0]))
        });
        Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.0), items))
    }
}

#[tokio::test]
async fn a_panic_below_the_writer_is_one_error_of_its_stream_and_nothing_is_published() {
    let dir = tempfile::tempdir().unwrap();
    let stream: Arc<dyn PartitionStream> = Arc::new(PanicsOnSecondPoll(kv_schema()));
    let input: Arc<dyn ExecutionPlan> = Arc::new(
        StreamingTableExec::try_new(kv_schema(), vec![stream], None, vec![], false, None).unwrap(),
    );
    let writer = writer(4, dir.path(), input);
    let ctx = SessionContext::new();
    let mut summary = writer.execute(0, ctx.task_ctx()).unwrap();
    let error = summary.next().await.unwrap().unwrap_err().to_string();
    for expected in [
        PANIC_PREFIX,
        "ShuffleWriterExec stage 4 map 0",
        "an operator of the stage broke",
    ] {
        assert!(
            error.contains(expected),
            "expected `{expected}` in: {error}"
        );
    }
    assert!(
        summary.next().await.is_none(),
        "the stream ends after the panic"
    );
    // Neither a marker nor a map file, nor a temp file left behind.
    let stage = dir.path().join("stage-4");
    assert!(common::files_in(&stage).is_empty());
}
