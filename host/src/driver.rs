//! The driver: plan a query once, run its stages wave by wave, finish it.
//!
//! ```text
//! refuse a used directory ─► build_session ─► plan ONCE ─► stages (pre-order, asked of the plugin)
//!   ─► encode each writer ─► tasks/stage-S.plan + tasks/task-S-M.json
//!   ─► wave 1: stages reading nothing ─► wave 2: stages whose deps are done ─► ...
//!   ─► execute the root of the SAME plan here (its readers find every file)
//! ```
//!
//! The six rules it keeps (DESIGN.md), each at the line that keeps it:
//!
//! 1. encode each stage with its session's codecs;
//! 2. ship the codec ids, so a worker refuses what it would misread;
//! 3. the shuffle directory lives in the session config, so it travels
//!    inside the encoded stage;
//! 4. a stage runs only once every stage it reads is published, and the
//!    final read only once every stage is;
//! 5. ship every stage, keyed by `(stage_id, map)`;
//! 6. refuse a shuffle directory that already holds stage output, before
//!    building anything.
//!
//! The shuffle location is a local directory or an `s3://bucket/prefix`
//! URL ([`crate::store`]); the plugin reads and writes either. An S3 location
//! is probed before anything else, so a bad one fails once, naming it.
//! Envelopes and encoded stages go into `<dir>/tasks/` for a local location;
//! for an S3 one into a local scratch directory that lives as long as the
//! run, since every worker of this host runs on this machine and reads them
//! from its disk.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::physical_plan::collect;
use dfx_abi::{DriverLock, Plugin};

use crate::dispatch::{
    FanOutOptions, Task, TaskReports, TaskRows, WorkerCommand, WorkerMode, Workers, run_wave,
};
use crate::envelope::{Envelope, TASK_DIR, envelope_path, plan_path};
use crate::error::{DataFusionContext, HostError, Result};
use crate::pool::WorkerPool;
use crate::retry::Attempts;
use crate::session::{DfxSession, SessionSpec, build_session};
use crate::stages::{Stage, StageInfo, render_with_stages, stages, waves};
use crate::store::{ShuffleLocation, same_location};

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
/// let spec = dfx_host::SessionSpec::new([("t".to_string(), "data/t".into())])
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
    options: FanOutOptions,
    mode: WorkerMode,
    pool: Arc<WorkerPool>,
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
            options: FanOutOptions::default(),
            mode: WorkerMode::default(),
            pool,
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

    /// End the pool's idle workers in order (end of input, then a wait) and
    /// reap them; see [`WorkerPool::shutdown`]. The pool starts new workers
    /// if the host runs another query afterwards.
    pub async fn shutdown(&self) -> crate::pool::Shutdown {
        self.pool.shutdown().await
    }

    /// Cap the workers running at once (`None`: the cores this process may
    /// use, [`crate::dispatch::default_max_workers`]).
    pub fn max_workers(mut self, max: Option<usize>) -> Self {
        self.options.max_workers = max;
        self
    }

    /// Attempts per task, the first included (default
    /// [`crate::retry::DEFAULT_MAX_ATTEMPTS`]; 1: no retry). A task is tried
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

    /// Draw a progress bar on stderr while workers run (only on a terminal).
    pub fn progress(mut self, show: bool) -> Self {
        self.options.progress = show;
        self
    }

    /// The plugin.
    pub fn plugin(&self) -> &Plugin {
        &self.plugin
    }

    /// Run `sql`: each map of each stage on a worker (a pooled one, or a
    /// process of its own), stage after stage as their inputs are published,
    /// then the root of the same plan here.
    ///
    /// Needs `spec.shuffle_dir`, which must not already hold stage output.
    ///
    /// # Errors
    ///
    /// No shuffle directory, a reused one, a plan without stages or whose
    /// stages the plugin describes inconsistently, a stage that cannot be
    /// encoded, any failed worker (every failure of its wave, together;
    /// nothing after that wave runs), or a failure of the final read (a
    /// missing or unreadable file is named by stage, map and bucket).
    pub async fn run_distributed(
        &self,
        sql: &str,
        spec: &SessionSpec,
    ) -> Result<DistributedResult> {
        let shuffle_dir = spec.shuffle_dir.clone().ok_or_else(|| {
            HostError::Invalid(
                "a distributed run needs a shuffle directory; the spec has none".into(),
            )
        })?;
        // Rule 6, first of all: nothing is built, planned or written into a
        // location whose files the readers would take for this query's, or
        // that another driver is using. A local directory is locked for the
        // run; the plugin checks the location (and probes an S3 one) before
        // any worker starts.
        let location = ShuffleLocation::parse(&shuffle_dir)?;
        let (task_dir, _scratch, _lock) = match &location {
            ShuffleLocation::Local(dir) => {
                let lock = DriverLock::acquire(dir).map_err(HostError::Invalid)?;
                self.probe_location(&dir.display().to_string(), spec)
                    .await?;
                (dir.join(TASK_DIR), None, Some(lock))
            }
            ShuffleLocation::S3 { .. } => {
                self.probe_location(&location.canonical(), spec).await?;
                // Workers of this host run on this machine: envelopes and
                // plans stay on its disk, for as long as the run.
                let scratch = tempfile::Builder::new()
                    .prefix("dfx-tasks-")
                    .tempdir()
                    .map_err(|e| HostError::io("cannot create", std::env::temp_dir(), e))?;
                (scratch.path().join(TASK_DIR), Some(scratch), None)
            }
        };

        // Rule 3: the spec's shuffle directory goes into the session config.
        let session = build_session(&self.plugin, spec).await?;
        // Planned once: the plan the stages are cut from is the plan whose
        // root runs here at the end, so both name the same files.
        let plan = session.physical_plan(sql).await?;
        let stages = stages(&self.plugin, &plan)?;
        if stages.is_empty() {
            return Err(HostError::Invalid(format!(
                "no {} in the plan of {sql:?}; the plugin's planner did not run or its config \
                 extension was not registered",
                self.plugin.stage_node_name()
            )));
        }
        check_stage_dirs(&stages, &shuffle_dir)?;
        let infos: Vec<StageInfo> = stages.iter().map(|s| s.info.clone()).collect();
        let waves = waves(&infos)?;

        let tasks = self.write_tasks(&session, spec, &stages, &task_dir)?;
        // One for the whole query: a lost map of an earlier wave is run again
        // from its envelope, and attempt numbers never repeat.
        let attempts = Attempts::new(&tasks, self.options.max_attempts);
        let mut dispatched = Vec::new();
        let mut task_reports = TaskReports::new();
        let workers = match self.mode {
            WorkerMode::Pool => Workers::Pool(&self.pool),
            WorkerMode::Process => Workers::Process(&self.worker),
        };
        for (index, wave) in waves.iter().enumerate() {
            let wave_tasks: Vec<Task> = tasks
                .iter()
                .filter(|t| wave.contains(&t.stage_id))
                .cloned()
                .collect();
            // Rule 4: `run_tasks` returns only once every task of the wave has
            // ended; a failed wave stops the query, so no stage ever runs
            // over an input that was not published.
            match run_wave(workers, &wave_tasks, &self.options, &attempts).await {
                Ok(reports) => task_reports.extend(reports),
                Err(HostError::Workers {
                    total, failures, ..
                }) => {
                    return Err(HostError::Workers {
                        wave: Some(index + 1),
                        stages: wave.clone(),
                        total,
                        failures,
                    });
                }
                Err(other) => return Err(other),
            }
            dispatched.extend(wave_tasks.iter().map(|t| (t.stage_id, t.map)));
        }

        // The root of the same plan: every stage is published, so each reader
        // finds its files (a missing one is an error naming it, never a
        // recompute) and the driver runs only what sits above the stages.
        let final_read = Instant::now();
        let batches = collect(Arc::clone(&plan), session.ctx().task_ctx())
            .await
            .context(|| {
                format!(
                    "cannot read the stage output of {sql:?} in {}",
                    shuffle_dir.display()
                )
            })?;
        let final_read_ms = final_read.elapsed().as_secs_f64() * 1e3;
        // A map run again for a later wave published anew: its report is
        // the one that counts.
        task_reports.extend(attempts.reruns());
        let task_rows: TaskRows = task_reports
            .iter()
            .map(|(key, report)| (*key, report.rows))
            .collect();
        Ok(DistributedResult {
            batches,
            stages: infos,
            waves,
            tasks: dispatched,
            task_rows,
            task_reports,
            worker_mode: self.mode,
            final_read_ms,
            attempts: attempts.made(),
            retries: attempts.retries(),
        })
    }

    /// The plugin's check of the spec's shuffle `location` (see the
    /// plugin's probe): on a blocking thread, since an S3 probe waits on the
    /// network for up to its timeout.
    async fn probe_location(&self, location: &str, spec: &SessionSpec) -> Result<()> {
        let plugin = self.plugin.clone();
        let location = location.to_string();
        let options = spec.store_options.clone();
        tokio::task::spawn_blocking(move || plugin.probe_location(&location, &options))
            .await
            .map_err(|e| {
                HostError::Invalid(format!("the shuffle location probe did not finish: {e}"))
            })?
            .map_err(HostError::Invalid)
    }

    /// Encode every stage and write its plan file into `task_dir`, and one
    /// envelope per map (a file in process mode, in memory for the pool);
    /// returns the tasks in pre-order of their stages, maps ascending.
    fn write_tasks(
        &self,
        session: &DfxSession,
        spec: &SessionSpec,
        stages: &[Stage],
        task_dir: &Path,
    ) -> Result<Vec<Task>> {
        // Rule 2: the ids the workers must carry. The driver's session
        // checked its own against the spec's if the caller set any.
        let shipped = SessionSpec {
            codec_ids: session.codec_ids(),
            ..spec.clone()
        };
        // The driver's scratch lives in `tasks/`, never beside stage output.
        std::fs::create_dir_all(task_dir)
            .map_err(|e| HostError::io("cannot create", task_dir, e))?;

        // Rule 5: every stage, every map.
        let mut tasks = Vec::new();
        for stage in stages {
            let stage_id = stage.stage_id();
            // Rule 1: encoded through the session that owns the codecs.
            let bytes = session
                .encode(Arc::clone(&stage.plan))
                .map_err(|err| HostError::Invalid(format!("stage {stage_id}: {err}")))?;
            let plan_file = plan_path(task_dir, stage_id);
            std::fs::write(&plan_file, &bytes)
                .map_err(|e| HostError::io("cannot write", &plan_file, e))?;
            for map in 0..stage.info.maps {
                let envelope = Envelope {
                    spec: shipped.clone(),
                    plan: plan_file.clone(),
                    stage_id,
                    partition: map,
                    attempt: 0,
                };
                let path = envelope_path(task_dir, stage_id, map);
                // A pooled worker is sent the envelope itself; a process is
                // given a path, so its envelope is a file.
                let inline = match self.mode {
                    WorkerMode::Pool => Some(Arc::new(envelope)),
                    WorkerMode::Process => {
                        envelope.write(&path)?;
                        None
                    }
                };
                tasks.push(Task {
                    stage_id,
                    map,
                    envelope: path,
                    inline,
                });
            }
        }
        Ok(tasks)
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

/// Refuse stages that would publish outside `shuffle_dir`: the workers would
/// refuse every one of them, after the driver had spawned them all.
fn check_stage_dirs(stages: &[Stage], shuffle_dir: &Path) -> Result<()> {
    for stage in stages {
        if !same_location(&stage.info.shuffle_dir, shuffle_dir) {
            return Err(HostError::Invalid(format!(
                "stage {} publishes into {}, not into the query's shuffle directory {}",
                stage.stage_id(),
                stage.info.shuffle_dir.display(),
                shuffle_dir.display()
            )));
        }
    }
    Ok(())
}
