//! The driver: plan a query once, hand its stages to the runtime's
//! scheduler, finish it.
//!
//! ```text
//! claim the location ─► build_session ─► plan ONCE ─► encode the plan, the
//!   plugin cuts it into its stages (pre-order) ─► dfx_runtime::prepare (describe, cut)
//!   ─► the scheduler runs every task (dfx_runtime::scheduler)
//!   ─► read the root of the SAME plan here; lost output it finds runs again
//! ```
//!
//! What it keeps, each at the line that keeps it:
//!
//! - the location is claimed (lock, probe) before anything is built;
//! - the shuffle location lives in the session config, so it travels inside
//!   every encoded stage;
//! - every stage is encoded with the session's codecs, and the codec ids
//!   are shipped, so a worker refuses what it would misread;
//! - the stages are described and cut for their maps by the runtime
//!   ([`dfx_runtime::prepare()`]), the one step both hosts call;
//! - a stage runs only once every stage it reads is published, and the root
//!   is read only once every stage is (the scheduler's).

pub mod analyze;
#[cfg(feature = "cli-extras")]
pub mod progress;
pub mod session;
pub mod stages;

use std::sync::{Arc, Mutex};

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::physical_plan::collect;
use dfx_abi::Plugin;
use dfx_runtime::prepare;
use dfx_runtime::root::head_context;
use dfx_runtime::scheduler::{
    ClaimedLocation, Decision, Executor, ProcessExecutor, Progress, Scheduler, SchedulerOptions,
    Shutdown, TaskReports, TaskRows, WorkerCommand, WorkerMode, WorkerPool,
};
use dfx_runtime::shuffle_root::TemporaryRoot;

use crate::driver::stages::{StageInfo, render_with_stages, stages};
use crate::error::{DataFusionContext, HostError, Result};
use crate::session::{SessionSpec, build_session};

/// What a distributed run produced, and how.
#[derive(Debug, Clone)]
pub struct DistributedResult {
    /// The query's answer.
    pub batches: Vec<RecordBatch>,
    /// Every stage of the plan, in pre-order (the order of their ids), as the
    /// plugin described it: maps, buckets, deps.
    pub stages: Vec<StageInfo>,
    /// The stage ids of each wave, in the order the waves ran.
    pub waves: Vec<Vec<u64>>,
    /// `(stage_id, map)` of every task dispatched, one per worker, in
    /// dispatch order (wave by wave). Keyed by both: map 0 of stage 1 and of
    /// stage 2 are different pieces of work.
    pub tasks: Vec<(u64, usize)>,
    /// Rows each task published, keyed as `tasks` is.
    pub task_rows: TaskRows,
    /// What each task reported (rows, bytes, times, worker), keyed as
    /// `tasks` is.
    pub task_reports: TaskReports,
    /// How the tasks ran.
    pub worker_mode: WorkerMode,
    /// The driver's time for the final read (the plan's root over the
    /// published stages), in milliseconds.
    pub final_read_ms: f64,
    /// Attempts made per task, keyed as `tasks` is (1: it ran once).
    pub attempts: std::collections::BTreeMap<(u64, usize), u32>,
    /// Why each retry or rerun happened (`stage S map M attempt A: reason`),
    /// in the order they did; empty when every task succeeded at once.
    pub retries: Vec<String>,
    /// The adaptive decisions made as stages became ready, in that order.
    pub decisions: Vec<Decision>,
    /// The query's shuffle location, in its one spelling (under the
    /// spec's root, a fresh one; removed by now unless the spec keeps it).
    pub shuffle_location: String,
}

impl DistributedResult {
    /// The stage ids, in pre-order.
    pub fn stage_ids(&self) -> Vec<u64> {
        self.stages.iter().map(|s| s.stage_id).collect()
    }

    /// What the plugin said about stage `stage_id`.
    pub fn stage(&self, stage_id: u64) -> Option<&StageInfo> {
        self.stages.iter().find(|s| s.stage_id == stage_id)
    }

    /// Rows in the answer.
    pub fn rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }
}

/// A host: a loaded plugin, and how to start its workers.
///
/// ```no_run
/// # async fn demo() -> dfx_host::Result<()> {
/// let plugin = dfx_host::load_plugin(None)?;
/// let host = dfx_host::Host::new(plugin)?;
/// let spec = dfx_host::SessionSpec::new([("t".to_string(), "data/t")])
///     .with_shuffle_dir("/tmp/dfx-q1");
/// let result = host.run_distributed("SELECT count(*) FROM t", &spec).await?;
/// println!("{} stages, {} tasks", result.stages.len(), result.tasks.len());
/// # Ok(()) }
/// ```
///
/// Clones share one worker pool: its workers serve every query run through
/// any of them, and end when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct Host {
    plugin: Plugin,
    worker: WorkerCommand,
    options: SchedulerOptions,
    progress: bool,
    mode: WorkerMode,
    pool: Arc<WorkerPool>,
    /// The root of queries whose spec names neither a location nor a root,
    /// made on first use; removed when the last clone is dropped.
    temporary_root: Arc<Mutex<Option<TemporaryRoot>>>,
}

impl Host {
    /// A host whose workers are this executable (`<exe> worker --serve` in
    /// the pool, `<exe> worker <envelope>` per task in process mode), told to
    /// load the same plugin file as the driver.
    ///
    /// # Errors
    ///
    /// When the running executable's path is unknown.
    pub fn new(plugin: Plugin) -> Result<Self> {
        let worker = WorkerCommand::current_exe()?;
        Ok(Self::with_worker(plugin, worker))
    }

    /// A host whose workers are started with `worker`: `worker --serve` in
    /// the pool (the default), `worker <envelope>` per task in process mode.
    /// The plugin's path is passed to them in `DFX_PLUGIN`, so driver and
    /// workers load one file. No worker starts before a task needs one.
    pub fn with_worker(plugin: Plugin, worker: WorkerCommand) -> Self {
        let worker = worker.env(crate::loader::PLUGIN_ENV, plugin.path());
        let pool = Arc::new(WorkerPool::new(worker.clone()));
        Self {
            plugin,
            worker,
            options: SchedulerOptions::default(),
            progress: false,
            mode: WorkerMode::default(),
            pool,
            temporary_root: Arc::default(),
        }
    }

    /// Run tasks on the pool's serving workers (the default) or in a process
    /// each.
    pub fn worker_mode(mut self, mode: WorkerMode) -> Self {
        self.mode = mode;
        self
    }

    /// How this host runs tasks.
    pub fn mode(&self) -> WorkerMode {
        self.mode
    }

    /// The pool of serving workers (empty until a pooled task runs).
    pub fn pool(&self) -> &WorkerPool {
        &self.pool
    }

    /// The same pool, shared: an executor for a
    /// [`Scheduler`] of the caller's own (its tasks run on this host's
    /// workers, and they end with the last holder of the pool).
    pub fn shared_pool(&self) -> Arc<WorkerPool> {
        Arc::clone(&self.pool)
    }

    /// End the pool's idle workers in order (end of input, then a wait) and
    /// reap them; see [`WorkerPool::shutdown`]. The pool starts new workers
    /// if the host runs another query afterwards.
    pub async fn shutdown(&self) -> Shutdown {
        self.pool.shutdown().await
    }

    /// Cap the workers running at once (`None`: the cores this process may
    /// use, [`dfx_runtime::scheduler::default_max_workers`]).
    pub fn max_workers(mut self, max: Option<usize>) -> Self {
        self.options.max_workers = max;
        self
    }

    /// Attempts per task, the first included (default
    /// [`dfx_runtime::scheduler::DEFAULT_MAX_ATTEMPTS`]; 1: no retry). A task is tried
    /// again when its worker died, was killed, timed out or left no readable
    /// report, or after an upstream map whose output was lost ran again.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.options.max_attempts = attempts.max(1);
        self
    }

    /// Stop an attempt running longer than `limit` (its worker killed); it
    /// counts as failed and worth retrying. `None` (the default): no limit.
    pub fn task_timeout(mut self, limit: Option<std::time::Duration>) -> Self {
        self.options.task_timeout = limit;
        self
    }

    /// Give a task running well past its stage's median a second attempt on
    /// a slot no other task is waiting for; the first of the two to publish
    /// is the task's, the other is stopped. `None` (the default): no
    /// speculation.
    pub fn speculation(mut self, speculation: Option<dfx_runtime::scheduler::Speculation>) -> Self {
        self.options.speculation = speculation;
        self
    }

    /// Show a live progress line on stderr while a query's tasks run (only
    /// on a terminal, and only once the query has run about a second; see
    /// `dfx_host::driver::progress`).
    pub fn progress(mut self, show: bool) -> Self {
        self.progress = show;
        self
    }

    /// The plugin.
    pub fn plugin(&self) -> &Plugin {
        &self.plugin
    }

    /// Run `sql`: each map of each stage on a worker (a pooled one, or a
    /// process of its own), stage after stage as their inputs are published,
    /// then the root of the same plan here. A plan the plugin keeps whole
    /// (no wider than a task and than this machine's cores, see
    /// `dfx_engine.collapse_stages`) has no stage and runs here entirely.
    ///
    /// In `spec.shuffle_dir`, which must not already hold stage output; or
    /// in a fresh location under `spec.shuffle_root` (under this host's
    /// temporary root when the spec names neither), removed once the answer
    /// is read unless the spec keeps it, and kept after a failure
    /// ([`HostError::LocationKept`] names it).
    ///
    /// # Errors
    ///
    /// Both a shuffle directory and a root, a reused directory, stages the
    /// plugin describes inconsistently, a stage that cannot be
    /// encoded, any failed worker (every failure of its wave, together;
    /// nothing after that wave runs), or a failure of the final read (a
    /// missing or unreadable file is named by stage, map and bucket).
    pub async fn run_distributed(
        &self,
        sql: &str,
        spec: &SessionSpec,
    ) -> Result<DistributedResult> {
        let spec = self.with_temporary_root(spec)?;
        // First of all: nothing is built, planned or written into a location
        // another driver uses or that holds stage output.
        let claim = ClaimedLocation::claim(&self.plugin, &spec).await?;
        let spec = claim.query_spec(&spec);
        let outcome = self.run_claimed(sql, &spec, &claim).await;
        // The location goes only once the answer is read; after a failure
        // it is kept, named, when it holds what the workers left.
        let kept = claim.finish(outcome.is_ok()).await;
        match (outcome, kept) {
            (Ok(result), kept) => kept.map(|_| result).map_err(HostError::from),
            (Err(err), Ok(Some(location))) => Err(HostError::LocationKept {
                location,
                source: Box::new(err),
            }),
            (Err(err), _) => Err(err),
        }
    }

    /// `spec`, or `spec` under this host's temporary root (made now if it
    /// is the first) when it names neither a location nor a root.
    fn with_temporary_root(&self, spec: &SessionSpec) -> Result<SessionSpec> {
        if spec.shuffle_dir.is_some() || spec.shuffle_root.is_some() {
            return Ok(spec.clone());
        }
        let mut root = self
            .temporary_root
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if root.is_none() {
            *root = Some(TemporaryRoot::new()?);
        }
        Ok(root
            .as_ref()
            .map_or_else(|| spec.clone(), |r| r.apply(spec)))
    }

    /// [`Host::run_distributed`] in its claimed location; `spec` names it.
    async fn run_claimed(
        &self,
        sql: &str,
        spec: &SessionSpec,
        claim: &ClaimedLocation,
    ) -> Result<DistributedResult> {
        // The spec's shuffle location goes into the session config, so it
        // travels inside every encoded stage.
        let session = build_session(&self.plugin, spec).await?;
        // Planned once: the plan the stages are cut from is the plan whose
        // root runs here at the end, so both name the same files.
        // A plan with no stage is one the plugin keeps whole for the driver
        // (`dfx_engine.collapse_stages`): no task runs, and its root below is
        // the whole plan.
        let planned = session.plan(sql).await?;
        let plan = planned.plan;
        // Every stage, encoded through the session that owns the codecs
        // (without them only DataFusion's own nodes survive) and cut out of
        // the plan by the plugin.
        let encoded = planned.stages;
        // Described by the plugin from their bytes, numbered, and cut so a
        // task carries only the files its map reads: the runtime's step, the
        // same as the Python host's.
        let encoded = prepare(&self.plugin, encoded)?;
        // The codec ids the workers must carry, so a worker refuses a stage
        // it would misread. And the partitions the driver planned for (the
        // spec's, raised to its largest table's file count): a worker takes
        // them as they are, listing no table.
        let shipped = SessionSpec {
            codec_ids: session.codec_ids(),
            target_partitions: session.ctx().copied_config().target_partitions(),
            ..spec.clone()
        };
        // A process is given a path, so its envelope is a file; a pooled
        // worker is sent the envelope itself.
        let envelope_files = self.mode == WorkerMode::Process;
        let run = self
            .scheduler()
            .run(
                &self.plugin,
                &shipped,
                claim.task_dir(),
                encoded,
                envelope_files,
            )
            .await?;

        // The root of the same plan: every stage is published, so each reader
        // finds its files and the driver runs only what sits above the
        // stages. A map whose output the root finds lost runs again first.
        // Its readers are handed the last stages' layouts: no marker read.
        let prefix = self.plugin.config_prefix();
        let read = |ranges| {
            let plan = Arc::clone(&plan);
            let context = head_context(&session.ctx().task_ctx(), prefix, ranges);
            async move { collect(plan, context?).await }
        };
        let (batches, final_read_ms) = run
            .read_root(&self.plugin, &claim.canonical(), read)
            .await?
            .context(|| {
                format!(
                    "cannot read the stage output of {sql:?} in {}",
                    claim.canonical()
                )
            })?;
        let task_reports = run.reports();
        let task_rows: TaskRows = task_reports
            .iter()
            .map(|(key, report)| (*key, report.rows))
            .collect();
        Ok(DistributedResult {
            batches,
            stages: run.stages().to_vec(),
            waves: run.waves().to_vec(),
            tasks: run.tasks().to_vec(),
            task_rows,
            task_reports,
            worker_mode: self.mode,
            final_read_ms,
            attempts: run.attempts(),
            retries: run.retries(),
            decisions: run.decisions().to_vec(),
            shuffle_location: claim.canonical(),
        })
    }

    /// The scheduler over this host's executor and options.
    fn scheduler(&self) -> Scheduler {
        let executor: Arc<dyn Executor> = match self.mode {
            WorkerMode::Pool => Arc::clone(&self.pool) as Arc<dyn Executor>,
            WorkerMode::Process => Arc::new(ProcessExecutor::new(self.worker.clone())),
        };
        let options = SchedulerOptions {
            progress: progress_bar(self.progress),
            ..self.options.clone()
        };
        Scheduler::new(executor, options)
    }

    /// Run `sql` in this process with the same session factory and no
    /// shuffle directory, for comparison with a distributed run.
    ///
    /// # Errors
    ///
    /// Whatever building the session, planning or executing reports.
    pub async fn run_local(&self, sql: &str, spec: &SessionSpec) -> Result<Vec<RecordBatch>> {
        let spec = spec.clone().without_shuffle_dir();
        let session = build_session(&self.plugin, &spec).await?;
        session
            .ctx()
            .sql(sql)
            .await
            .context(|| format!("cannot plan {sql:?}"))?
            .collect()
            .await
            .context(|| format!("cannot execute {sql:?}"))
    }

    /// The physical plan of `sql` in `spec`'s session, each writer marked
    /// with its stage id, maps, buckets and deps. Writes nothing.
    ///
    /// # Errors
    ///
    /// Whatever building the session or planning reports, or writers the
    /// plugin cannot describe.
    pub async fn explain(&self, sql: &str, spec: &SessionSpec) -> Result<String> {
        let session = build_session(&self.plugin, spec).await?;
        let plan = session.physical_plan(sql).await?;
        render_with_stages(&self.plugin, &plan)
    }

    /// The stages `sql` is cut into in `spec`'s session, in pre-order.
    /// Writes nothing.
    ///
    /// # Errors
    ///
    /// What [`Host::explain`] reports.
    pub async fn plan_stages(&self, sql: &str, spec: &SessionSpec) -> Result<Vec<StageInfo>> {
        let session = build_session(&self.plugin, spec).await?;
        let plan = session.physical_plan(sql).await?;
        Ok(stages(&self.plugin, &plan)?
            .into_iter()
            .map(|s| s.info)
            .collect())
    }
}

/// The scheduler's live progress line on stderr ([`progress`]): with the
/// `cli-extras` feature, only on a terminal and when asked for.
#[cfg(feature = "cli-extras")]
fn progress_bar(wanted: bool) -> Option<Arc<dyn Progress>> {
    progress::live_line(wanted)
}

/// Without `cli-extras` there is no line to draw.
#[cfg(not(feature = "cli-extras"))]
fn progress_bar(_wanted: bool) -> Option<Arc<dyn Progress>> {
    None
}
