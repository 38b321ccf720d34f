//! A subtree of plugin operators run on the plugin's runtime, its batches
//! handed back over a channel.
//!
//! Why: operators spawn tasks (a repartition, a coalesce, a sort writing
//! its spills), and a host polls a plugin node's stream from a runtime of
//! its own copy of tokio, which the plugin's copy cannot see ("no reactor
//! running"). A channel can be polled by any executor.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::ExecutionPlan;
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::exchange::io::io_runtime;

/// Partition `partition` of `plan`, run with `context` on the plugin's
/// runtime; `what` names the plan in the error of a task that died.
///
/// # Errors
///
/// The plugin's runtime cannot start.
pub(crate) fn drive(
    plan: Arc<dyn ExecutionPlan>,
    partition: usize,
    context: Arc<TaskContext>,
    what: &'static str,
) -> Result<SendableRecordBatchStream> {
    let runtime = io_runtime().map_err(DataFusionError::Execution)?;
    let (sender, receiver) = mpsc::channel(2);
    let schema = plan.schema();
    let task = runtime.spawn(async move {
        let mut stream = match plan.execute(partition, context) {
            Ok(stream) => stream,
            Err(err) => {
                let _ = sender.send(Err(err)).await;
                return;
            }
        };
        while let Some(batch) = stream.next().await {
            let failed = batch.is_err();
            // A closed channel: the consumer is gone, so stop.
            if sender.send(batch).await.is_err() || failed {
                return;
            }
        }
    });
    Ok(Box::pin(DrivenStream {
        schema,
        receiver,
        task: Some(task),
        what,
    }))
}

/// The batches of a plan running on the plugin's runtime.
struct DrivenStream {
    schema: SchemaRef,
    receiver: mpsc::Receiver<Result<RecordBatch>>,
    /// The task running the plan, until it is seen to end.
    task: Option<JoinHandle<()>>,
    /// What runs, for the error of a task that died.
    what: &'static str,
}

impl Stream for DrivenStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(batch) = ready!(self.receiver.poll_recv(cx)) {
            return Poll::Ready(Some(batch));
        }
        // The channel closed: the end of the plan, unless its task died
        // (a panic), which must not pass for a complete answer.
        let Some(task) = self.task.as_mut() else {
            return Poll::Ready(None);
        };
        let ended = ready!(Pin::new(task).poll(cx));
        self.task = None;
        match ended {
            Ok(()) => Poll::Ready(None),
            Err(err) => Poll::Ready(Some(Err(DataFusionError::Execution(format!(
                "dfx: {}'s task failed before its last batch: {err}",
                self.what
            ))))),
        }
    }
}

impl RecordBatchStream for DrivenStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}

impl Drop for DrivenStream {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}
