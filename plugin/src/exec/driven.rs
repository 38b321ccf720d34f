//! A subtree of plugin operators (or any of the plugin's streams) run on
//! the plugin's runtime, its batches handed back over a channel.
//!
//! Why: operators spawn tasks (a repartition, a coalesce, a sort writing
//! its spills), and a host polls a plugin node's stream from a runtime of
//! its own copy of tokio, which the plugin's copy cannot see ("no reactor
//! running"). A channel can be polled by any executor.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::stream::BoxStream;
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
    let schema = plan.schema();
    let batches = drive_stream(move || plan.execute(partition, context), what)?;
    Ok(Box::pin(RecordBatchStreamAdapter::new(schema, batches)))
}

/// The stream `open` opens, polled on the plugin's runtime (where it is
/// opened too), its items handed back over a channel; `what` names it in
/// the error of a task that died.
///
/// # Errors
///
/// The plugin's runtime cannot start.
pub(crate) fn drive_stream<T, S, F>(
    open: F,
    what: &'static str,
) -> Result<BoxStream<'static, Result<T>>>
where
    T: Send + 'static,
    S: Stream<Item = Result<T>> + Send + 'static,
    F: FnOnce() -> Result<S> + Send + 'static,
{
    let runtime = io_runtime().map_err(DataFusionError::Execution)?;
    let (sender, receiver) = mpsc::channel(2);
    let task = runtime.spawn(async move {
        let stream = match open() {
            Ok(stream) => stream,
            Err(err) => {
                let _ = sender.send(Err(err)).await;
                return;
            }
        };
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            let failed = item.is_err();
            // A closed channel: the consumer is gone, so stop.
            if sender.send(item).await.is_err() || failed {
                return;
            }
        }
    });
    Ok(Box::pin(DrivenStream {
        receiver,
        task: Some(task),
        what,
    }))
}

/// The items of a stream polled on the plugin's runtime.
struct DrivenStream<T> {
    receiver: mpsc::Receiver<Result<T>>,
    /// The task polling the stream, until it is seen to end.
    task: Option<JoinHandle<()>>,
    /// What runs, for the error of a task that died.
    what: &'static str,
}

impl<T> Stream for DrivenStream<T> {
    type Item = Result<T>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(item) = ready!(self.receiver.poll_recv(cx)) {
            return Poll::Ready(Some(item));
        }
        // The channel closed: the end of the stream, unless its task died
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

impl<T> Drop for DrivenStream<T> {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}
