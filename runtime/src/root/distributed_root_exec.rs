//! `DistributedRootExec`: the root a driving session puts on each plan with
//! stages. Executing it runs the query: the stages on the session's
//! executor, then the head (the part above the topmost readers) here.

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties,
};
use futures::{FutureExt, StreamExt, TryStreamExt};
use tokio::sync::{mpsc, oneshot};

use crate::prepare::prepare;
use crate::root::head_context::head_context;
use crate::root::{QueryDriver, external, location_kept};
use crate::scheduler::ClaimedLocation;
use crate::spec::SessionSpec;

/// The node's name, as plans display it.
pub const DISTRIBUTED_ROOT_NODE_NAME: &str = "DistributedRootExec";

/// The root of a plan with stages, planned by a driving session: one output
/// partition, the head's rows once every stage has run.
#[derive(Debug)]
pub struct DistributedRootExec {
    head: Arc<dyn ExecutionPlan>,
    query: Arc<PendingQuery>,
    properties: Arc<PlanProperties>,
}

/// The claim a plan holds until it runs, and its stages, encoded when it
/// was planned; shared by every copy of the node.
#[derive(Debug)]
struct PendingQuery {
    driver: Arc<QueryDriver>,
    claim: Mutex<Option<(ClaimedLocation, Vec<Vec<u8>>)>>,
}

impl Drop for PendingQuery {
    /// A plan dropped without running gives its location back (removed
    /// when made under a root; it holds no stage output).
    fn drop(&mut self) {
        let claim = self.claim.get_mut().ok().and_then(Option::take);
        if let (Some((claim, _)), Ok(handle)) = (claim, self.driver.handle()) {
            handle.spawn(async move {
                let _ = claim.finish(true).await;
            });
        }
    }
}

impl DistributedRootExec {
    /// `head`, whose stages run on `driver`'s executor in the location of
    /// `claim`. The stages are encoded now, by the host's encoder, while
    /// the plan is the one its planner made: a host that moves the plan
    /// elsewhere afterwards (datafusion-python decodes it into its own
    /// nodes) could no longer encode them here.
    ///
    /// # Errors
    ///
    /// A stage the host cannot encode, naming it; the claim is given back
    /// to the caller with the error.
    pub fn new(
        head: Arc<dyn ExecutionPlan>,
        driver: Arc<QueryDriver>,
        claim: ClaimedLocation,
    ) -> std::result::Result<Self, Box<(DataFusionError, ClaimedLocation)>> {
        let encoded = match encode_stages(&driver, &head) {
            Ok(encoded) => encoded,
            Err(err) => return Err(Box::new((err, claim))),
        };
        let query = Arc::new(PendingQuery {
            driver,
            claim: Mutex::new(Some((claim, encoded))),
        });
        Ok(Self::with_query(head, query))
    }

    fn with_query(head: Arc<dyn ExecutionPlan>, query: Arc<PendingQuery>) -> Self {
        // One partition: the head's, one after another. Their order holds
        // only when the head has one.
        let eq_properties = if head.output_partitioning().partition_count() == 1 {
            head.equivalence_properties().clone()
        } else {
            EquivalenceProperties::new(head.schema())
        };
        let properties = Arc::new(PlanProperties::new(
            eq_properties,
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Self {
            head,
            query,
            properties,
        }
    }

    /// The plan it runs: the head over its stages.
    pub fn head(&self) -> &Arc<dyn ExecutionPlan> {
        &self.head
    }

    /// The query's location, while the plan has not run.
    pub fn location(&self) -> Option<String> {
        let claim = self.query.claim.lock().ok()?;
        claim.as_ref().map(|(claim, _)| claim.canonical())
    }
}

impl DisplayAs for DistributedRootExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match self.location() {
            Some(location) => write!(f, "{DISTRIBUTED_ROOT_NODE_NAME}: location={location}"),
            None => write!(f, "{DISTRIBUTED_ROOT_NODE_NAME}: ran"),
        }
    }
}

impl ExecutionPlan for DistributedRootExec {
    fn name(&self) -> &str {
        DISTRIBUTED_ROOT_NODE_NAME
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.head]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [head] = <[_; 1]>::try_from(children).map_err(|children| {
            DataFusionError::Internal(format!(
                "{DISTRIBUTED_ROOT_NODE_NAME} has one child, the plan's head; given {}",
                children.len()
            ))
        })?;
        Ok(Arc::new(Self::with_query(head, Arc::clone(&self.query))))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "{DISTRIBUTED_ROOT_NODE_NAME} has one partition; partition {partition} was asked"
            )));
        }
        let (claim, encoded) = self
            .query
            .claim
            .lock()
            .ok()
            .and_then(|mut claim| claim.take())
            .ok_or_else(|| {
                DataFusionError::Execution(
                    "this distributed plan ran already, and its location is gone; plan the \
                     query again (each DataFrame action plans anew)"
                        .into(),
                )
            })?;
        let driver = Arc::clone(&self.query.driver);
        let handle = driver.handle()?;
        let head = Arc::clone(&self.head);
        let answer = answer(driver, handle, head, (claim, encoded), context);
        let stream = futures::stream::once(answer).flat_map(|answer| {
            let items: Vec<Result<RecordBatch>> = match answer {
                Ok(batches) => batches.into_iter().map(Ok).collect(),
                Err(err) => vec![Err(err)],
            };
            futures::stream::iter(items)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.head.schema(),
            stream,
        )))
    }
}

/// A read of the head the driver asks of the consumer: the `shuffle_ranges`
/// setting its readers are handed, and where its rows go.
type ReadRequest = (Option<String>, oneshot::Sender<Result<Vec<RecordBatch>>>);

/// The query's answer, polled by the plan's consumer: the stages run on
/// the driver's runtime, the head read here whenever the driver asks (see
/// the module docs of [`crate::root`]).
async fn answer(
    driver: Arc<QueryDriver>,
    handle: tokio::runtime::Handle,
    head: Arc<dyn ExecutionPlan>,
    (claim, encoded): (ClaimedLocation, Vec<Vec<u8>>),
    context: Arc<TaskContext>,
) -> Result<Vec<RecordBatch>> {
    let target_partitions = context.session_config().target_partitions();
    let (reads, mut requests) = mpsc::channel::<ReadRequest>(1);
    let prefix = driver.plugin.config_prefix();
    let work = drive(driver, claim, encoded, target_partitions, reads);
    // A panic stays on the driver's side: the consumer gets an error.
    let work = handle.spawn(AssertUnwindSafe(work).catch_unwind());
    // Until the driver is done (and drops its sender): each read it asks.
    while let Some((ranges, reply)) = requests.recv().await {
        let read = AssertUnwindSafe(read_head(&head, &context, prefix, ranges))
            .catch_unwind()
            .await
            .unwrap_or_else(|_| {
                Err(DataFusionError::Execution(
                    "reading the query's head panicked".into(),
                ))
            });
        let _ = reply.send(read);
    }
    match work.await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(_)) => Err(DataFusionError::Execution(
            "the distributed query's driver panicked".into(),
        )),
        Err(err) => Err(DataFusionError::Execution(format!(
            "the distributed query's driver stopped: {err}"
        ))),
    }
}

/// Every stage of `head`, in pre-order, encoded: the head is encoded by the
/// host (each reader carries the stage it reads as a blob) and cut into its
/// stages by the plugin, as a driver ships them.
fn encode_stages(driver: &QueryDriver, head: &Arc<dyn ExecutionPlan>) -> Result<Vec<Vec<u8>>> {
    let bytes = (driver.encode)(Arc::clone(head))
        .map_err(|err| DataFusionError::Execution(format!("cannot encode the plan: {err}")))?;
    driver.plugin.plan_stages(&bytes).map_err(|err| {
        DataFusionError::Execution(format!("cannot cut the plan into its stages: {err}"))
    })
}

/// Every partition of the head, polled together in this task (an operator
/// of one partition may wait for another's consumer), none spawned: the
/// head's nodes spawn what they need on their own runtime.
async fn read_head(
    head: &Arc<dyn ExecutionPlan>,
    context: &Arc<TaskContext>,
    prefix: &str,
    ranges: Option<String>,
) -> Result<Vec<RecordBatch>> {
    let context = &head_context(context, prefix, ranges)?;
    let partitions = head.output_partitioning().partition_count();
    let streams = (0..partitions)
        .map(|partition| head.execute(partition, Arc::clone(context)))
        .collect::<Result<Vec<_>>>()?;
    let parts = futures::future::try_join_all(
        streams
            .into_iter()
            .map(|stream| stream.try_collect::<Vec<_>>()),
    )
    .await?;
    Ok(parts.into_iter().flatten().collect())
}

/// Ask the consumer for a read of the head, and wait for its rows.
async fn request_read(
    reads: &mpsc::Sender<ReadRequest>,
    ranges: Option<String>,
) -> Result<Vec<RecordBatch>> {
    let (reply, rows) = oneshot::channel();
    let gone = || DataFusionError::Execution("the query's consumer is gone".into());
    reads.send((ranges, reply)).await.map_err(|_| gone())?;
    rows.await.map_err(|_| gone())?
}

/// Run the query in `claim`'s location and end the claim: removed once the
/// answer is read (under a root), kept and named after a failure.
async fn drive(
    driver: Arc<QueryDriver>,
    claim: ClaimedLocation,
    encoded: Vec<Vec<u8>>,
    target_partitions: usize,
    reads: mpsc::Sender<ReadRequest>,
) -> Result<Vec<RecordBatch>> {
    let outcome = run(&driver, &claim, encoded, target_partitions, &reads).await;
    // No read after this: the consumer stops serving reads.
    drop(reads);
    let kept = claim.finish(outcome.is_ok()).await.map_err(external);
    match (outcome, kept) {
        (Ok(batches), kept) => kept.map(|_| batches),
        (Err(err), Ok(location)) => Err(location_kept(err, location)),
        (Err(err), Err(_)) => Err(err),
    }
}

/// Prepare the stages, run them with the scheduler, have the head read.
async fn run(
    driver: &QueryDriver,
    claim: &ClaimedLocation,
    encoded: Vec<Vec<u8>>,
    target_partitions: usize,
    reads: &mpsc::Sender<ReadRequest>,
) -> Result<Vec<RecordBatch>> {
    let plugin = &driver.plugin;
    let stages = prepare(plugin, encoded).map_err(external)?;
    // The codec ids the workers must carry, and the partitions the session
    // planned for: a worker takes them as they are, listing no table.
    let shipped = SessionSpec {
        codec_ids: driver.codec_ids.clone(),
        target_partitions,
        ..claim.query_spec(&driver.spec)
    };
    let run = driver
        .scheduler
        .run(
            plugin,
            &shipped,
            claim.task_dir(),
            stages,
            driver.envelope_files,
        )
        .await
        .map_err(external)?;
    // Every stage is published: the head's readers find their files; a map
    // whose output the head finds lost runs again first.
    let location = claim.canonical();
    let (batches, _read_ms) = run
        .read_root(plugin, &location, |ranges| request_read(reads, ranges))
        .await
        .map_err(external)?
        .map_err(|err| {
            DataFusionError::Execution(format!("cannot read the stage output in {location}: {err}"))
        })?;
    driver.record(run);
    Ok(batches)
}
