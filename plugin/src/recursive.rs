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
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result, not_impl_err};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::execution_plan::ReplaceChildrenOptions;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::recursive_query::RecursiveQueryExec;
use datafusion::physical_plan::work_table::WorkTableExec;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::exchange::store::io_runtime;
use crate::guard::{self, GuardedStream};

/// `plan` with every recursive query's work table reads made whole
/// ([`whole_work_tables`]) and each topmost recursive query sealed.
///
/// # Errors
///
/// As [`whole_work_tables`].
pub fn seal_recursive_queries(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    whole_work_tables(plan)?
        .transform_down(|node| {
            if node.is::<RecursiveQueryExec>() {
                let sealed: Arc<dyn ExecutionPlan> = Arc::new(SealedRecursiveQueryExec::new(node));
                return Ok(Transformed::new(sealed, true, TreeNodeRecursion::Jump));
            }
            Ok(Transformed::no(node))
        })
        .data()
}

/// `plan` with every work table read of each recursive query reading the
/// whole work table, any projection made a `ProjectionExec` above it.
///
/// # Errors
///
/// A recursive query whose columns share a name (a projected read could
/// not be told apart from another), or a node refusing its new children.
pub fn whole_work_tables(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let Some(query) = node.downcast_ref::<RecursiveQueryExec>() else {
            return Ok(Transformed::no(node));
        };
        let recursive = whole_reads_of(query)?;
        if !recursive.transformed {
            return Ok(Transformed::no(node));
        }
        let rebuilt = RecursiveQueryExec::try_new(
            query.name().to_string(),
            query.schema(),
            Arc::clone(query.static_term()),
            recursive.data,
            query.is_distinct(),
        )?;
        Ok(Transformed::yes(Arc::new(rebuilt) as Arc<dyn ExecutionPlan>))
    })
    .data()
}

/// `query`'s recursive term with its own work table read whole.
fn whole_reads_of(query: &RecursiveQueryExec) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
    // The work table holds batches of the query's output schema: both
    // terms are projected to it before their rows go in.
    let table = query.schema();
    let name = query.name();
    Arc::clone(query.recursive_term()).transform_down(|node| {
        let Some(read) = node.downcast_ref::<WorkTableExec>() else {
            return Ok(Transformed::no(node));
        };
        let read_schema = read.schema();
        if read.name() != name || read_schema.fields() == table.fields() {
            return Ok(Transformed::no(node));
        }
        let whole: Arc<dyn ExecutionPlan> = Arc::new(WorkTableExec::new(
            name.to_string(),
            Arc::clone(&table),
            None,
        )?);
        let mut columns = Vec::with_capacity(read_schema.fields().len());
        for field in read_schema.fields() {
            let mut matches = table.fields().iter().enumerate();
            let index = match matches.find(|(_, f)| f.name() == field.name()) {
                Some((index, _)) if !matches.any(|(_, f)| f.name() == field.name()) => index,
                Some(_) => {
                    return not_impl_err!(
                        "recursive query {name:?}: its work table has more than one column \
                         named {:?}, so dfx cannot tell which one a read projects; rename one",
                        field.name()
                    );
                }
                None => {
                    return not_impl_err!(
                        "recursive query {name:?}: a read of its work table projects column \
                         {:?}, which the table ({}) does not have",
                        field.name(),
                        table
                    );
                }
            };
            let column: Arc<dyn datafusion::physical_plan::PhysicalExpr> =
                Arc::new(Column::new(field.name(), index));
            columns.push((column, field.name().clone()));
        }
        let projected: Arc<dyn ExecutionPlan> = Arc::new(ProjectionExec::try_new(columns, whole)?);
        Ok(Transformed::new(projected, true, TreeNodeRecursion::Jump))
    })
}

/// Name of [`SealedRecursiveQueryExec`] in plans.
pub const SEALED_NODE_NAME: &str = "SealedRecursiveQueryExec";

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
    fn name(&self) -> &str {
        SEALED_NODE_NAME
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.query.properties()
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
            "{SEALED_NODE_NAME} is a leaf, given {} children",
            children.len()
        )))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(
                datafusion::physical_plan::execution_plan::ChildrenPropertiesMode::Recompute,
            ),
        )
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let place = format!("{SEALED_NODE_NAME} partition {partition}");
        let stream = guard::catch(format_args!("{place} execute"), || {
            self.drive(partition, context)
        })?;
        Ok(GuardedStream::wrap(place, stream))
    }
}

impl SealedRecursiveQueryExec {
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
