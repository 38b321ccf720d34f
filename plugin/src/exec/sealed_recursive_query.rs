//! Recursive queries (`WITH RECURSIVE`) in a form that crosses to a host and
//! on to a worker.
//!
//! Three things stand in the way, and each has its answer here:
//!
//! - datafusion-proto encodes neither `RecursiveQueryExec` nor the
//!   `WorkTableExec` below it, and the two share the work table in memory.
//!   dfx's codec encodes both; decoding the query node links them again
//!   (`RecursiveQueryExec::try_new` hands its table to the one work table
//!   read of its recursive term).
//! - A `WorkTableExec` cannot say which columns it projects, so before a
//!   plan leaves the planner each projected read becomes a read of the whole
//!   table under a `ProjectionExec` ([`whole_work_tables`]).
//! - Decoding a recursive query builds nodes of its own (projections to its
//!   output schema), so in a host the query's subtree holds plugin nodes that
//!   the host's codecs cannot encode again when a driver ships the stage. So
//!   the planner seals each recursive query in a [`SealedRecursiveQueryExec`]:
//!   a leaf to the host, whose payload is the whole subtree, encoded and
//!   decoded by the plugin alone.
//!
//! The split rule never cuts inside a recursive query, so the whole of it
//! runs in one task (or, locally, in one process).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::exchange::io::io_runtime;
use crate::exec::common::exec_defaults;
use crate::wire::SEALED_NODE_NAME;

/// A recursive query (a `RecursiveQueryExec` and its subtree) that a host
/// sees as a leaf: it runs the query it holds, and the codec carries the
/// whole subtree as one payload (see the module doc for why).
#[derive(Debug)]
pub struct SealedRecursiveQueryExec {
    query: Arc<dyn ExecutionPlan>,
}

impl SealedRecursiveQueryExec {
    /// Seal `query`, a `RecursiveQueryExec`.
    pub fn new(query: Arc<dyn ExecutionPlan>) -> Self {
        Self { query }
    }

    /// The sealed recursive query.
    pub fn query(&self) -> &Arc<dyn ExecutionPlan> {
        &self.query
    }
}

impl DisplayAs for SealedRecursiveQueryExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{SEALED_NODE_NAME}: ")?;
        self.query.fmt_as(t, f)?;
        write!(f, ", runs whole in one task")
    }
}

impl ExecutionPlan for SealedRecursiveQueryExec {
    exec_defaults!(
        name = SEALED_NODE_NAME,
        properties_of = query,
        leaf,
        no_expressions,
        guarded_execute = (drive, place),
    );
}

impl SealedRecursiveQueryExec {
    /// How errors and panics name partition `partition` of this query.
    fn place(&self, partition: usize) -> String {
        format!("{SEALED_NODE_NAME} partition {partition}")
    }

    /// Partition `partition` of the query, run on the plugin's runtime.
    ///
    /// Why: operators inside the query spawn tasks (a repartition, a
    /// coalesce), and a host polls this stream from a runtime of its own
    /// copy of tokio, which the plugin's copy cannot see ("no reactor
    /// running"). The batches come back over a channel, which any executor
    /// can poll.
    fn drive(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let runtime = io_runtime().map_err(DataFusionError::Execution)?;
        let (sender, receiver) = mpsc::channel(2);
        let query = Arc::clone(&self.query);
        let task = runtime.spawn(async move {
            let mut stream = match query.execute(partition, context) {
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
            schema: self.schema(),
            receiver,
            task: Some(task),
        }))
    }
}

/// The batches of a query running on the plugin's runtime.
struct DrivenStream {
    schema: SchemaRef,
    receiver: mpsc::Receiver<Result<RecordBatch>>,
    /// The task running the query, until it is seen to end.
    task: Option<JoinHandle<()>>,
}

impl Stream for DrivenStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(batch) = ready!(self.receiver.poll_recv(cx)) {
            return Poll::Ready(Some(batch));
        }
        // The channel closed: the end of the query, unless its task died
        // (a panic), which must not pass for a complete answer.
        let Some(task) = self.task.as_mut() else {
            return Poll::Ready(None);
        };
        let ended = ready!(Pin::new(task).poll(cx));
        self.task = None;
        match ended {
            Ok(()) => Poll::Ready(None),
            Err(err) => Poll::Ready(Some(Err(DataFusionError::Execution(format!(
                "dfx: the recursive query's task failed before its last batch: {err}"
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
