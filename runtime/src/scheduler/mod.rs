//! The scheduler: every task of a query on an executor, in order, bounded,
//! retried, and the lost output its root finds run again.
//!
//! ```text
//! encoded stages + spec ─► graph (ids, deps, maps) ─► tasks (plan files, envelopes)
//!   ─► wave 1: stages reading nothing ─► wave 2: stages whose deps are done ─► ...
//!        each task on the executor (pool | process | foreign), at most `max_workers`
//!        at once, attempt after attempt (see `attempts`)
//!   ─► QueryRun: the host reads the root; lost output it finds runs again
//! ```
//!
//! Both hosts drive queries through [`Scheduler::run`] and
//! [`QueryRun::read_root`]: the Rust host with its plan, the Python package
//! with the plan its user's session made. What only a host can do (plan,
//! encode with its session, execute the root) stays with the host.

pub mod attempts;
pub mod claim;
pub mod executor;
pub mod foreign;
pub mod graph;
pub mod pool;
pub mod process;
pub mod task;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dfx_abi::{FailureClass, Plugin};
use futures::StreamExt;

pub use attempts::{Attempts, DEFAULT_MAX_ATTEMPTS};
pub use claim::ClaimedLocation;
pub use executor::{Executor, WorkerMode, default_max_workers};
pub use foreign::{ForeignExecutor, ForeignFailure, ForeignRunner};
pub use graph::{StageInfo, describe, waves};
pub use pool::{Shutdown, WorkerPool};
pub use process::{ProcessExecutor, WorkerCommand};
pub use task::{Task, TaskReport, TaskReports, TaskRows};

use crate::error::{Result, RuntimeError};
use crate::protocol::{Envelope, envelope_path, plan_path};
use crate::spec::{SessionSpec, same_location};

/// Told of each task that ended, for a progress display.
pub trait Progress: Send + Sync {
    /// A wave of `total` tasks begins.
    fn start(&self, total: usize);
    /// One more task of the wave ended.
    fn task_done(&self);
    /// The wave ended.
    fn finish(&self);
}

/// How the scheduler runs a query's tasks.
#[derive(Clone, Default)]
pub struct SchedulerOptions {
    /// At most this many tasks at once; `None` means [`default_max_workers`].
    pub max_workers: Option<usize>,
    /// Attempts per task, the first included (see [`attempts`]); 0 means
    /// [`DEFAULT_MAX_ATTEMPTS`], 1 no retry.
    pub max_attempts: u32,
    /// An attempt running longer is stopped (its worker killed) and counts
    /// as failed, worth retrying; `None`: no limit.
    pub task_timeout: Option<Duration>,
    /// Told of each task that ends.
    pub progress: Option<Arc<dyn Progress>>,
}

impl std::fmt::Debug for SchedulerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulerOptions")
            .field("max_workers", &self.max_workers)
            .field("max_attempts", &self.max_attempts)
            .field("task_timeout", &self.task_timeout)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

impl SchedulerOptions {
    fn slots(&self) -> usize {
        self.max_workers.unwrap_or_else(default_max_workers).max(1)
    }

    fn attempts(&self) -> u32 {
        match self.max_attempts {
            0 => DEFAULT_MAX_ATTEMPTS,
            n => n,
        }
    }
}

/// One stage as the host hands it over: the plugin's description and its
/// bytes, encoded with the host's session.
#[derive(Debug, Clone)]
pub struct EncodedStage {
    /// Id, maps, buckets, deps.
    pub info: StageInfo,
    /// The encoded writer.
    pub bytes: Vec<u8>,
}

impl EncodedStage {
    /// The stages of a plan from their encoded writers in pre-order,
    /// described by the plugin from the bytes themselves.
    ///
    /// # Errors
    ///
    /// Bytes the plugin cannot describe, or a stage whose id is not the one
    /// its pre-order position gives: the host and the plugin would then name
    /// different files for it.
    pub fn describe_all(plugin: &Plugin, encoded: Vec<Vec<u8>>) -> Result<Vec<Self>> {
        encoded
            .into_iter()
            .enumerate()
            .map(|(index, bytes)| {
                let expected = plugin.stage_id(index);
                let info = plugin.encoded_stage_info(&bytes).map_err(|err| {
                    RuntimeError::Invalid(format!(
                        "cannot describe stage {expected} (writer {} in pre-order): {}",
                        index + 1,
                        err.strip_backtrace()
                    ))
                })?;
                check_numbering(index, expected, info.stage_id)?;
                Ok(Self {
                    info: info.into(),
                    bytes,
                })
            })
            .collect()
    }
}

/// Refuse a stage whose id is not the one its pre-order position gives.
///
/// # Errors
///
/// [`RuntimeError::Invalid`] naming both ids.
pub fn check_numbering(index: usize, expected: u64, found: u64) -> Result<()> {
    if found == expected {
        return Ok(());
    }
    Err(RuntimeError::Invalid(format!(
        "stage numbering disagrees: writer {} in pre-order should be stage {expected} but the \
         plugin says it is stage {found}; the host and the plugin would name different files \
         for it",
        index + 1
    )))
}

/// Runs queries' tasks on one executor.
#[derive(Debug, Clone)]
pub struct Scheduler {
    executor: Arc<dyn Executor>,
    options: SchedulerOptions,
}

impl Scheduler {
    /// A scheduler handing attempts to `executor`.
    pub fn new(executor: Arc<dyn Executor>, options: SchedulerOptions) -> Self {
        Self { executor, options }
    }

    /// The executor's name (`pool`, `process`, ...).
    pub fn executor_name(&self) -> String {
        self.executor.name()
    }

    /// Run every task of `stages` (a query's, in pre-order), stage after
    /// stage as their inputs are published; `spec` is shipped to every
    /// worker (with the codec ids the host encoded with) and `task_dir`
    /// receives the encoded stages. Envelopes travel inline unless
    /// `envelope_files`.
    ///
    /// # Errors
    ///
    /// Stages that publish outside the spec's location, deps that name no
    /// stage or wait for each other, a plan file that cannot be written, or
    /// failed tasks ([`RuntimeError::Workers`]: every failure of the first
    /// wave that had one; nothing after it ran).
    pub async fn run(
        &self,
        spec: &SessionSpec,
        task_dir: &Path,
        stages: Vec<EncodedStage>,
        envelope_files: bool,
    ) -> Result<QueryRun> {
        let location = spec.shuffle_dir.as_deref().ok_or_else(|| {
            RuntimeError::Invalid(
                "a distributed run needs a shuffle location; the spec has none".into(),
            )
        })?;
        if stages.is_empty() {
            return Err(RuntimeError::Invalid(
                "the plan has no stage: the plugin's planner did not run, or saw no shuffle \
                 location"
                    .into(),
            ));
        }
        for stage in &stages {
            // The workers would refuse every one of them, after the driver
            // had started them all.
            if !same_location(&stage.info.shuffle_dir, location) {
                return Err(RuntimeError::Invalid(format!(
                    "stage {} publishes into {}, not into the query's shuffle location {}",
                    stage.info.stage_id,
                    stage.info.shuffle_dir.display(),
                    location.display()
                )));
            }
        }
        let infos: Vec<StageInfo> = stages.iter().map(|s| s.info.clone()).collect();
        let waves = waves(&infos)?;
        let tasks = write_tasks(spec, task_dir, &stages, envelope_files)?;
        // One for the whole query: a lost map of an earlier wave is run again
        // from its first envelope, and attempt numbers never repeat.
        let attempts = Attempts::new(&tasks, self.options.attempts());
        let mut run = QueryRun {
            scheduler: self.clone(),
            attempts,
            stages: infos,
            waves: waves.clone(),
            tasks: Vec::new(),
            reports: TaskReports::new(),
        };
        for (index, wave) in waves.iter().enumerate() {
            let wave_tasks: Vec<Task> = tasks
                .iter()
                .filter(|t| wave.contains(&t.stage_id))
                .cloned()
                .collect();
            // A wave returns only once every task of it has ended, and a
            // failed wave stops the query: no stage ever runs over an input
            // that was not published.
            match self.run_wave(&wave_tasks, &run.attempts).await {
                Ok(reports) => run.reports.extend(reports),
                Err(RuntimeError::Workers {
                    total, failures, ..
                }) => {
                    return Err(RuntimeError::Workers {
                        wave: Some(index + 1),
                        stages: wave.clone(),
                        total,
                        failures,
                    });
                }
                Err(other) => return Err(other),
            }
            run.tasks
                .extend(wave_tasks.iter().map(|t| (t.stage_id, t.map)));
        }
        Ok(run)
    }

    /// Run `tasks` outside any query's graph (each once, with its attempts),
    /// for tools and tests that dispatch tasks of their own.
    ///
    /// # Errors
    ///
    /// [`RuntimeError::Workers`] naming each failed task, in dispatch order.
    pub async fn run_tasks(&self, tasks: &[Task]) -> Result<TaskReports> {
        let attempts = Attempts::new(tasks, self.options.attempts());
        self.run_wave(tasks, &attempts).await
    }

    /// Every task of `tasks` on the executor, at most the bound at once,
    /// every failure kept and reported together in dispatch order.
    async fn run_wave(&self, tasks: &[Task], attempts: &Attempts) -> Result<TaskReports> {
        let slots = self.options.slots();
        let progress = self.options.progress.clone();
        if let Some(progress) = &progress {
            progress.start(tasks.len());
        }
        let executor = self.executor.as_ref();
        let timeout = self.options.task_timeout;
        let mut outcomes: Vec<(usize, std::result::Result<TaskReport, crate::TaskFailure>)> =
            futures::stream::iter(tasks.iter().enumerate())
                .map(|(index, task)| {
                    let progress = progress.clone();
                    async move {
                        let outcome =
                            attempts::run_with_attempts(executor, attempts, task, slots, timeout)
                                .await;
                        if let Some(progress) = &progress {
                            progress.task_done();
                        }
                        (index, outcome)
                    }
                })
                .buffer_unordered(slots)
                .collect()
                .await;
        if let Some(progress) = &progress {
            progress.finish();
        }
        // Failures in dispatch order, not completion order, so a message
        // reads the same from one run to the next.
        outcomes.sort_by_key(|(index, _)| *index);
        let mut reports = TaskReports::new();
        let mut failures = Vec::new();
        for (index, outcome) in outcomes {
            let task = &tasks[index];
            match outcome {
                Ok(report) => {
                    reports.insert((task.stage_id, task.map), report);
                }
                Err(failure) => failures.push(failure),
            }
        }
        if failures.is_empty() {
            return Ok(reports);
        }
        let mut stages: Vec<u64> = tasks.iter().map(|t| t.stage_id).collect();
        stages.sort_unstable();
        stages.dedup();
        Err(RuntimeError::Workers {
            wave: None,
            stages,
            total: tasks.len(),
            failures,
        })
    }
}

/// Write every stage's plan file into `task_dir` and make one task per map:
/// its envelope inline, or written as a file when `envelope_files`. Tasks in
/// pre-order of their stages, maps ascending.
fn write_tasks(
    spec: &SessionSpec,
    task_dir: &Path,
    stages: &[EncodedStage],
    envelope_files: bool,
) -> Result<Vec<Task>> {
    // The driver's scratch lives in its own directory, never beside stage
    // output.
    std::fs::create_dir_all(task_dir)
        .map_err(|e| RuntimeError::io("cannot create", task_dir, e))?;
    let mut tasks = Vec::new();
    for stage in stages {
        let stage_id = stage.info.stage_id;
        let plan_file = plan_path(task_dir, stage_id);
        std::fs::write(&plan_file, &stage.bytes)
            .map_err(|e| RuntimeError::io("cannot write", &plan_file, e))?;
        for map in 0..stage.info.maps {
            let envelope = Envelope {
                spec: spec.clone(),
                plan: plan_file.clone(),
                stage_id,
                partition: map,
                attempt: 0,
            };
            let path = envelope_path(task_dir, stage_id, map);
            let inline = if envelope_files {
                envelope.write(&path)?;
                None
            } else {
                Some(Arc::new(envelope))
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

/// A query whose stages are all published: what ran, and the reruns its
/// root read may still need.
#[derive(Debug)]
pub struct QueryRun {
    scheduler: Scheduler,
    attempts: Attempts,
    stages: Vec<StageInfo>,
    waves: Vec<Vec<u64>>,
    tasks: Vec<(u64, usize)>,
    reports: TaskReports,
}

impl QueryRun {
    /// Read the query's root with `read`, which the host runs over the same
    /// plan the stages were cut from. When it fails and the plugin recorded
    /// lost output for `location` while it ran, each lost map runs again on
    /// a worker (its next attempt) and the root is read again from the
    /// start, up to the query's attempts. The root never computes a stage.
    ///
    /// # Errors
    ///
    /// `Ok(Err(e))`: the read's own last error, when nothing was lost or the
    /// attempts are spent. `Err`: a lost map that could not be run again.
    pub async fn read_root<T, E, F, Fut>(
        &self,
        plugin: &Plugin,
        location: &str,
        mut read: F,
    ) -> Result<std::result::Result<(T, f64), E>>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, E>>,
    {
        let max = self.attempts.max_attempts();
        // Nothing recorded before the read belongs to it.
        let _ = plugin.take_failures(location);
        for tries in 1..=max {
            let began = self.attempts.clock();
            let started = Instant::now();
            let error = match read().await {
                Ok(value) => return Ok(Ok((value, started.elapsed().as_secs_f64() * 1e3))),
                Err(error) => error,
            };
            let recorded = plugin
                .take_failures(location)
                .map_err(RuntimeError::Invalid)?;
            let lost = FailureClass::lost_maps(&recorded);
            if lost.is_empty() || tries == max {
                return Ok(Err(error));
            }
            for (stage_id, map) in lost {
                let options = &self.scheduler.options;
                attempts::restore(
                    (stage_id, map),
                    "the query's root",
                    began,
                    self.scheduler.executor.as_ref(),
                    &self.attempts,
                    options.slots(),
                    options.task_timeout,
                )
                .await
                .map_err(|reason| RuntimeError::Root(format!("the query's root {reason}")))?;
            }
        }
        unreachable!("every read returns, and there is at least one")
    }

    /// Every stage, in pre-order, as the plugin described it.
    pub fn stages(&self) -> &[StageInfo] {
        &self.stages
    }

    /// The stage ids of each wave, in the order the waves ran.
    pub fn waves(&self) -> &[Vec<u64>] {
        &self.waves
    }

    /// `(stage_id, map)` of every task dispatched, in dispatch order.
    pub fn tasks(&self) -> &[(u64, usize)] {
        &self.tasks
    }

    /// What each task reported; a map run again reports its last run.
    pub fn reports(&self) -> TaskReports {
        let mut reports = self.reports.clone();
        reports.extend(self.attempts.reruns());
        reports
    }

    /// Attempts made per task (1: it ran once).
    pub fn attempts(&self) -> std::collections::BTreeMap<(u64, usize), u32> {
        self.attempts.made()
    }

    /// Why each retry or rerun happened, in order.
    pub fn retries(&self) -> Vec<String> {
        self.attempts.retries()
    }

    /// The executor's name.
    pub fn executor_name(&self) -> String {
        self.scheduler.executor_name()
    }
}
