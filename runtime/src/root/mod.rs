//! A query driven from its plan's root: what makes `collect()` on a dfx
//! session run distributed, in either host.
//!
//! ```text
//! DataFusion plans     DrivingQueryPlanner: claim the query's location
//!                        (a fresh one under a root), plan with it in the
//!                        config (LocatedSession), encode the stages (the
//!                        host's encoder), wrap the plan
//! DataFusion executes  DistributedRootExec partition 0,
//!                      on the driver's runtime: prepare, the scheduler runs
//!                        them on the session's executor;
//!                      on the consumer's thread again: read the head (as
//!                        often as lost output reruns ask); then the claim
//!                        ends and the answer streams out
//! ```
//!
//! Two runtimes may meet here. In Python the plan is executed by
//! datafusion-python, on its Tokio runtime (a copy of Tokio linked into its
//! library), while the scheduler's processes, timers and blocking calls
//! need this library's. So the root does on the consumer's thread what
//! calls into the host's plan (executing the head: the host's nodes spawn
//! on the host's runtime), and on the driver's
//! runtime what the runtime owns; they talk over channels, which need no
//! runtime. The GIL: the consumer waits with it released (datafusion-python
//! releases it while it waits on a plan), and a foreign executor's calls
//! take it on a blocking thread of the driver's runtime.
//!
//! The hosts supply what only they can: the encoder (their session's
//! codecs), the executor and the runtime the work runs on. The scheduler
//! and the claim are the ones `dfx run` and `run_distributed` use.

pub mod distributed_root_exec;
pub mod head_context;
pub mod located_session;
pub mod planner;

use std::sync::{Arc, Mutex};

use datafusion::common::{DataFusionError, Result};
use datafusion::physical_plan::ExecutionPlan;
use dfx_abi::Plugin;
use tokio::runtime::Handle;

use crate::error::RuntimeError;
use crate::scheduler::{ClaimedLocation, QueryRun, Scheduler};
use crate::spec::SessionSpec;

pub use distributed_root_exec::DistributedRootExec;
pub use head_context::head_context;
pub use located_session::LocatedSession;
pub use planner::DrivingQueryPlanner;

/// How a host encodes one stage (a writer) with its session's codecs.
pub type EncodeStage =
    Arc<dyn Fn(Arc<dyn ExecutionPlan>) -> Result<Vec<u8>> + Send + Sync + 'static>;

/// Everything a session needs to drive its queries: the plugin, the
/// session's spec (a location or a root), the executor and the scheduler's
/// options, the host's encoder.
pub struct QueryDriver {
    plugin: Plugin,
    spec: SessionSpec,
    scheduler: Scheduler,
    envelope_files: bool,
    codec_ids: Vec<String>,
    encode: EncodeStage,
    runtime: Option<Handle>,
    last_run: Mutex<Option<Arc<QueryRun>>>,
}

impl std::fmt::Debug for QueryDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryDriver")
            .field("executor", &self.scheduler.executor_name())
            .field("codec_ids", &self.codec_ids)
            .finish()
    }
}

impl QueryDriver {
    /// A driver for sessions of `spec` (which names a shuffle location or a
    /// root), running tasks with `scheduler` (its executor and options),
    /// encoding stages with `encode`; `codec_ids` are the ids shipped to
    /// workers (the host's codecs).
    pub fn new(
        plugin: Plugin,
        spec: SessionSpec,
        scheduler: Scheduler,
        codec_ids: Vec<String>,
        encode: EncodeStage,
    ) -> Self {
        Self {
            plugin,
            spec,
            scheduler,
            envelope_files: false,
            codec_ids,
            encode,
            runtime: None,
            last_run: Mutex::default(),
        }
    }

    /// Write each envelope to a file (an executor that starts a process per
    /// task is given a path).
    pub fn with_envelope_files(mut self, files: bool) -> Self {
        self.envelope_files = files;
        self
    }

    /// Run the driver's work on `runtime`: a host whose plans are executed
    /// on another library's runtime (datafusion-python's) gives its own, so
    /// the scheduler's processes, timers and blocking calls find theirs.
    pub fn with_runtime(mut self, runtime: Handle) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// The spec the driver's sessions were built from.
    pub fn spec(&self) -> &SessionSpec {
        &self.spec
    }

    /// What the scheduler did for the last query whose answer was read.
    pub fn last_run(&self) -> Option<Arc<QueryRun>> {
        self.last_run.lock().ok().and_then(|run| run.clone())
    }

    fn record(&self, run: QueryRun) {
        if let Ok(mut last) = self.last_run.lock() {
            *last = Some(Arc::new(run));
        }
    }

    /// Run `work` on the driver's runtime (the caller's, when it gave
    /// none), a panic in it turned into an error.
    async fn on_runtime<T: Send + 'static>(
        &self,
        work: impl std::future::Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let handle = self.handle()?;
        handle.spawn(work).await.map_err(|e| {
            DataFusionError::Execution(format!("the distributed query's driver stopped: {e}"))
        })?
    }

    fn handle(&self) -> Result<Handle> {
        match &self.runtime {
            Some(handle) => Ok(handle.clone()),
            None => Handle::try_current().map_err(|e| {
                DataFusionError::Execution(format!(
                    "a distributed query runs on a Tokio runtime, and none is current: {e}"
                ))
            }),
        }
    }

    /// Claim the location of one query: the spec's, or a fresh one under
    /// its root.
    async fn claim(&self) -> Result<ClaimedLocation> {
        let (plugin, spec) = (self.plugin.clone(), self.spec.clone());
        self.on_runtime(async move {
            ClaimedLocation::claim(&plugin, &spec)
                .await
                .map_err(external)
        })
        .await
    }

    /// End a claim: the location removed once the answer was read, kept
    /// after a failure when it holds what the workers left; `Ok(Some)`
    /// names a kept one.
    async fn finish(&self, claim: ClaimedLocation, answered: bool) -> Result<Option<String>> {
        self.on_runtime(async move { claim.finish(answered).await.map_err(external) })
            .await
    }
}

/// A runtime error as DataFusion carries one, its message kept.
pub fn external(err: RuntimeError) -> DataFusionError {
    DataFusionError::External(Box::new(err))
}

/// `err`, naming the shuffle location kept for it (the words both hosts use).
pub fn location_kept(err: DataFusionError, location: Option<String>) -> DataFusionError {
    match location {
        None => err,
        Some(location) => DataFusionError::Execution(format!(
            "{err}\nthe query's shuffle location is kept for inspection: {location}"
        )),
    }
}
