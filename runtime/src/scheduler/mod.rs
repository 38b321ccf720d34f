//! The scheduler: every task of a query on an executor, in order, bounded,
//! retried, and the lost output its root finds run again.
//!
//! ```text
//! encoded stages + spec ─► graph (ids, deps, maps) ─► tasks (plan files, envelopes)
//!   ─► ready queue: a stage's tasks enter it once every stage it reads is
//!      published; a free slot takes the task on the longest remaining path
//!        each task on the executor (pool | process | foreign), at most `max_workers`
//!        at once, attempt after attempt (see `attempts`)
//!   ─► QueryRun: the host reads the root; lost output it finds runs again
//! ```
//!
//! No barrier between the graph's levels (its waves): a stage starts while
//! unrelated stages of an earlier level still run. The waves remain the
//! unit of the failure report: once a task fails, no task of a later wave
//! starts, every task of the failed wave and before runs out, and the
//! failures of the first failed wave are reported together.
//!
//! With [`SchedulerOptions::speculation`] set, a slot nothing is waiting for
//! may run a second attempt of a task running well past its stage's median
//! (see [`speculation`]); the first of the two to publish is the task's.
//!
//! Both hosts drive queries through [`Scheduler::run`] and
//! [`QueryRun::read_root`]: the Rust host with its plan, the Python package
//! with the plan its user's session made. What only a host can do (plan,
//! encode with its session, execute the root) stays with the host.

pub mod adaptive;
pub mod attempts;
pub mod claim;
pub mod executor;
pub mod foreign;
pub mod graph;
pub mod pool;
pub mod process;
pub mod speculation;
pub mod task;

use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dfx_abi::{FailureClass, Plugin};
use futures::StreamExt;
use futures::future::{AbortHandle, Aborted, BoxFuture, abortable};
use futures::stream::FuturesUnordered;

pub use adaptive::Decision;
pub use attempts::{Attempts, DEFAULT_MAX_ATTEMPTS};
pub use claim::ClaimedLocation;
pub use executor::{Executor, WorkerMode, default_max_workers};
pub use foreign::{ForeignExecutor, ForeignFailure, ForeignRunner};
pub use graph::{StageInfo, describe, waves};
pub use pool::{Shutdown, WorkerPool};
pub use process::{ProcessExecutor, WorkerCommand};
pub use speculation::Speculation;
pub use task::{Task, TaskReport, TaskReports, TaskRows};

use crate::error::{Result, RuntimeError};
use crate::protocol::{Envelope, envelope_path, plan_path};
use crate::spec::{SessionSpec, same_location};
use speculation::{Running, stage_median, straggler};

/// How often the ready queue looks for stragglers while speculation is on.
const SPECULATION_TICK: Duration = Duration::from_millis(100);

/// One attempt's end: its task's index, whether it was the speculative
/// twin, and its outcome (or that its twin published first and stopped it).
type Finished = (
    usize,
    bool,
    std::result::Result<std::result::Result<TaskReport, crate::TaskFailure>, Aborted>,
);

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
    /// A second attempt for a task running well past its stage's median;
    /// `None` (the default): none.
    pub speculation: Option<Speculation>,
}

impl std::fmt::Debug for SchedulerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulerOptions")
            .field("max_workers", &self.max_workers)
            .field("max_attempts", &self.max_attempts)
            .field("task_timeout", &self.task_timeout)
            .field("progress", &self.progress.is_some())
            .field("speculation", &self.speculation)
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

    /// Run every task of `stages` (a query's, in pre-order), each as soon as
    /// every stage it reads is published (see the module doc); `spec` is shipped to every
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
        plugin: &Plugin,
        spec: &SessionSpec,
        task_dir: &Path,
        stages: Vec<EncodedStage>,
        envelope_files: bool,
    ) -> Result<QueryRun> {
        if !spec.stage_options.is_empty() {
            return Err(RuntimeError::Invalid(format!(
                "the session spec sets stage_options {:?}; the scheduler sets them for a \
                 stage's tasks, a query's spec never does (set engine_options instead)",
                spec.stage_options.keys().collect::<Vec<_>>()
            )));
        }
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
        let adapter = Adapter {
            plugin,
            spec,
            stages: stages
                .iter()
                .map(|stage| (stage.info.stage_id, stage.bytes.as_slice()))
                .collect(),
        };
        let (tasks, failures, decisions) = self
            .run_ready(&infos, &waves, &tasks, &attempts, Some(&adapter))
            .await;
        let mut run = QueryRun {
            scheduler: self.clone(),
            attempts,
            stages: infos,
            waves: waves.clone(),
            tasks: Vec::new(),
            reports: TaskReports::new(),
            decisions,
        };
        match failures {
            None => {
                for (task, report) in tasks {
                    run.tasks.push(task);
                    run.reports.insert(task, report);
                }
                Ok(run)
            }
            Some(failed) => Err(failed),
        }
    }

    /// Every task of `tasks` through the ready queue: the reports in
    /// dispatch order, or the failure report of the first wave that had a
    /// failure (see the module doc); and the adaptive decisions `adapter`
    /// made for stages as they became ready.
    async fn run_ready(
        &self,
        infos: &[StageInfo],
        waves: &[Vec<u64>],
        tasks: &[Task],
        attempts: &Attempts,
        adapter: Option<&Adapter<'_>>,
    ) -> (
        Vec<((u64, usize), TaskReport)>,
        Option<RuntimeError>,
        Vec<Decision>,
    ) {
        let slots = self.options.slots();
        let timeout = self.options.task_timeout;
        let executor = self.executor.as_ref();
        let speculation = self.options.speculation;
        let progress = self.options.progress.clone();
        if let Some(progress) = &progress {
            progress.start(tasks.len());
        }
        // Tasks as they run: an adaptive decision rewrites a ready stage's.
        let mut tasks: Vec<Task> = tasks.to_vec();
        // Tasks another task of their stage runs (a coalesced group's).
        let mut covered: BTreeSet<usize> = BTreeSet::new();
        let mut decisions: Vec<Decision> = Vec::new();
        let wave_of: BTreeMap<u64, usize> = waves
            .iter()
            .enumerate()
            .flat_map(|(index, wave)| wave.iter().map(move |&stage| (stage, index)))
            .collect();
        let remaining_path = remaining_paths(infos);
        let mut unpublished: BTreeMap<u64, usize> = infos
            .iter()
            .map(|info| (info.stage_id, info.maps))
            .collect();
        let mut waiting: BTreeMap<u64, BTreeSet<u64>> = infos
            .iter()
            .map(|info| (info.stage_id, info.deps.iter().copied().collect()))
            .collect();
        let mut ready: BinaryHeap<Ready> = BinaryHeap::new();
        // Stages whose inputs are all published, to be adapted and queued.
        let mut newly_ready: Vec<u64> = infos
            .iter()
            .filter(|info| info.deps.is_empty())
            .map(|info| info.stage_id)
            .collect();
        let maps_of: BTreeMap<u64, usize> = infos
            .iter()
            .map(|info| (info.stage_id, info.maps))
            .collect();
        let mut running: FuturesUnordered<BoxFuture<'_, Finished>> = FuturesUnordered::new();
        // What stops each running attempt, by (task index, speculative).
        let mut stoppers: BTreeMap<(usize, bool), AbortHandle> = BTreeMap::new();
        // When each unfinished task was dispatched, and its dispatch position.
        let mut began: BTreeMap<usize, (Instant, usize)> = BTreeMap::new();
        // The times of each stage's finished tasks, for its median.
        let mut times: BTreeMap<u64, Vec<Duration>> = BTreeMap::new();
        let mut speculated: BTreeSet<usize> = BTreeSet::new();
        // A first attempt's failure while its speculative twin still runs.
        let mut held: BTreeMap<usize, crate::TaskFailure> = BTreeMap::new();
        let mut dispatched: Vec<usize> = Vec::new();
        let mut done: Vec<((u64, usize), TaskReport)> = Vec::new();
        // (dispatch position, wave, failure) of every task that failed.
        let mut failures: Vec<(usize, usize, crate::TaskFailure)> = Vec::new();
        loop {
            // Queue the tasks of each stage whose inputs are all published,
            // as the plugin decides they run; a stage of no map is
            // published at once, and may ready its readers.
            while let Some(stage) = newly_ready.pop() {
                if let Some(adapter) = adapter
                    && !reads_no_stage(infos, stage)
                    && let Some(decision) = adapter.adapt(
                        stage,
                        maps_of[&stage],
                        slots,
                        &mut tasks,
                        &mut covered,
                        attempts,
                    )
                {
                    decisions.push(decision);
                }
                let mut any = false;
                for (index, task) in tasks.iter().enumerate() {
                    if task.stage_id == stage && !covered.contains(&index) {
                        any = true;
                        ready.push(Ready {
                            path: remaining_path[&stage],
                            stage,
                            map: task.map,
                            index,
                        });
                    }
                }
                let queued = tasks
                    .iter()
                    .enumerate()
                    .filter(|(index, task)| task.stage_id == stage && !covered.contains(index))
                    .count();
                unpublished.insert(stage, queued);
                if !any {
                    newly_ready.extend(published(&mut waiting, stage));
                }
            }
            // After a failure no later wave starts: the report is the first
            // failed wave's, with every task of it run out.
            let last_wave = failures.iter().map(|(_, wave, _)| *wave).min();
            while running.len() < slots {
                let Some(next) = ready.peek() else {
                    break;
                };
                if last_wave.is_some_and(|last| wave_of[&next.stage] > last) {
                    break;
                }
                let next = ready.pop().expect("peeked");
                let index = next.index;
                began.insert(index, (Instant::now(), dispatched.len()));
                dispatched.push(index);
                let task = tasks[index].clone();
                let (attempt, stopper) = abortable(async move {
                    attempts::run_with_attempts(executor, attempts, &task, slots, timeout).await
                });
                stoppers.insert((index, false), stopper);
                running.push(Box::pin(async move { (index, false, attempt.await) }));
            }
            // A slot nothing is waiting for may take a straggler's twin.
            let speculating = speculation.filter(|_| failures.is_empty());
            if let Some(policy) = &speculating
                && running.len() < slots
                && ready.is_empty()
            {
                let candidates: Vec<Running> = began
                    .iter()
                    .filter(|(index, _)| !speculated.contains(index))
                    .map(|(&index, (start, _))| {
                        let stage = tasks[index].stage_id;
                        Running {
                            index,
                            elapsed: start.elapsed(),
                            median: stage_median(
                                times.get(&stage).map_or(&[][..], Vec::as_slice),
                                unpublished_total(&tasks, &covered, stage),
                            ),
                        }
                    })
                    .collect();
                if let Some(index) = straggler(policy, &candidates) {
                    let slow = candidates
                        .iter()
                        .find(|c| c.index == index)
                        .expect("chosen");
                    let why = format!(
                        "its first attempt ran {:.1?}, past {} times its stage's median {:.1?}",
                        slow.elapsed,
                        policy.factor,
                        slow.median.unwrap_or_default()
                    );
                    speculated.insert(index);
                    let task = tasks[index].clone();
                    let (attempt, stopper) = abortable(async move {
                        attempts::speculate(executor, attempts, &task, slots, timeout, &why).await
                    });
                    stoppers.insert((index, true), stopper);
                    running.push(Box::pin(async move { (index, true, attempt.await) }));
                }
            }
            let next = if speculating.is_some() && !began.is_empty() {
                // Wake now and then to look for stragglers.
                match tokio::time::timeout(SPECULATION_TICK, running.next()).await {
                    Ok(next) => next,
                    Err(_) => continue,
                }
            } else {
                running.next().await
            };
            let Some((index, speculative, outcome)) = next else {
                break;
            };
            // Stopped because its twin published first.
            let Ok(outcome) = outcome else {
                continue;
            };
            stoppers.remove(&(index, speculative));
            let task = &tasks[index];
            let twin = (index, !speculative);
            match outcome {
                Ok(report) => {
                    if let Some(stopper) = stoppers.remove(&twin) {
                        stopper.abort();
                        attempts.log(format!(
                            "stage {} map {} attempt {}: published first; the {} attempt was \
                             stopped",
                            task.stage_id,
                            task.map,
                            report.attempt,
                            if speculative { "first" } else { "speculative" }
                        ));
                    }
                    held.remove(&index);
                    if let Some((start, _)) = began.remove(&index) {
                        times
                            .entry(task.stage_id)
                            .or_default()
                            .push(start.elapsed());
                    }
                    if let Some(progress) = &progress {
                        progress.task_done();
                    }
                    done.push(((task.stage_id, task.map), report));
                    let left = unpublished.entry(task.stage_id).or_default();
                    *left = left.saturating_sub(1);
                    if *left == 0 {
                        // Published: its readers may be ready now.
                        newly_ready.extend(published(&mut waiting, task.stage_id));
                    }
                }
                Err(failure) => {
                    if stoppers.contains_key(&twin) {
                        // The twin may still publish; a first attempt's
                        // failure is reported if it does not.
                        if !speculative {
                            held.insert(index, failure);
                        }
                        continue;
                    }
                    let failure = held.remove(&index).unwrap_or(failure);
                    let position = began.remove(&index).map_or(0, |(_, position)| position);
                    if let Some(progress) = &progress {
                        progress.task_done();
                    }
                    failures.push((position, wave_of[&task.stage_id], failure));
                }
            }
        }
        if let Some(progress) = &progress {
            progress.finish();
        }
        let expected = tasks.len() - covered.len();
        if failures.is_empty() && done.len() < expected {
            // Cannot happen for a graph `waves` accepted; said rather than
            // returning a run with tasks missing.
            let error = RuntimeError::Invalid(format!(
                "{} of {} tasks never became ready",
                expected - done.len(),
                expected
            ));
            return (Vec::new(), Some(error), decisions);
        }
        let Some(first_wave) = failures.iter().map(|(_, wave, _)| *wave).min() else {
            // In dispatch order, as the tasks started.
            let order: BTreeMap<(u64, usize), usize> = dispatched
                .iter()
                .enumerate()
                .map(|(position, &index)| ((tasks[index].stage_id, tasks[index].map), position))
                .collect();
            done.sort_by_key(|(key, _)| order[key]);
            return (done, None, decisions);
        };
        // Failures in dispatch order, not completion order, so a message
        // reads the same from one run to the next.
        failures.sort_by_key(|(position, _, _)| *position);
        let stages = waves[first_wave].clone();
        let total = tasks
            .iter()
            .enumerate()
            .filter(|(index, t)| stages.contains(&t.stage_id) && !covered.contains(index))
            .count();
        let failures = failures
            .into_iter()
            .filter(|(_, wave, _)| *wave == first_wave)
            .map(|(_, _, failure)| failure)
            .collect();
        let error = RuntimeError::Workers {
            wave: Some(first_wave + 1),
            stages,
            total,
            failures,
        };
        (Vec::new(), Some(error), decisions)
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

/// `stage` is published: take it off each reader's wait list, and answer
/// the readers now waiting for nothing.
fn published(waiting: &mut BTreeMap<u64, BTreeSet<u64>>, stage: u64) -> Vec<u64> {
    let mut ready = Vec::new();
    for (&reader, deps) in waiting.iter_mut() {
        if deps.remove(&stage) && deps.is_empty() {
            ready.push(reader);
        }
    }
    ready
}

/// Whether `stage` reads no stage: nothing it reads has published, so
/// there is nothing to adapt it to.
fn reads_no_stage(infos: &[StageInfo], stage: u64) -> bool {
    infos
        .iter()
        .find(|info| info.stage_id == stage)
        .is_none_or(|info| info.deps.is_empty())
}

/// The tasks `stage` runs (its maps, less those a coalesced task covers):
/// what its median is taken over.
fn unpublished_total(tasks: &[Task], covered: &BTreeSet<usize>, stage: u64) -> usize {
    tasks
        .iter()
        .enumerate()
        .filter(|(index, task)| task.stage_id == stage && !covered.contains(index))
        .count()
}

/// What the scheduler asks the plugin about each ready stage with (see
/// [`adaptive`]).
pub(crate) struct Adapter<'a> {
    plugin: &'a Plugin,
    spec: &'a SessionSpec,
    /// Each stage's plan bytes, by id.
    stages: BTreeMap<u64, &'a [u8]>,
}

impl Adapter<'_> {
    /// Ask the plugin how the ready `stage` (of `maps` maps) runs, and make
    /// its tasks so: every task of the stage is told the plugin's settings;
    /// when partitions are grouped, each group's first task runs the
    /// group, the others are `covered`, and a lost map of theirs reruns
    /// the group's task. The decision, if one was made; a failed answer
    /// leaves the stage as planned and says why.
    fn adapt(
        &self,
        stage: u64,
        maps: usize,
        slots: usize,
        tasks: &mut Vec<Task>,
        covered: &mut BTreeSet<usize>,
        attempts: &Attempts,
    ) -> Option<Decision> {
        let bytes = self.stages.get(&stage)?;
        let kept = |reason: String| Decision {
            stage_id: stage,
            planned_tasks: maps,
            tasks: maps,
            reason,
        };
        let adaptation = match adaptive::ask(self.plugin, bytes, self.spec, slots) {
            Ok(Some(adaptation)) => adaptation,
            Ok(None) => return None,
            Err(err) => {
                return Some(kept(format!(
                    "kept as planned: the plugin {} could not decide: {err}",
                    self.plugin.path().display()
                )));
            }
        };
        let reason = adaptation.reason.clone()?;
        if let Some(planned) = &adaptation.tasks {
            let tasks_now = match self.with_planned_tasks(stage, maps, tasks, &adaptation, planned)
            {
                Ok(added) => maps + added,
                Err(err) => return Some(kept(format!("kept as planned: {err}"))),
            };
            attempts.replace_first(tasks.iter().filter(|t| t.stage_id == stage));
            return Some(Decision {
                stage_id: stage,
                planned_tasks: maps,
                tasks: tasks_now,
                reason,
            });
        }
        // Settings alone (a switched join's reads) keep the planned tasks.
        if adaptation.groups.is_none() && adaptation.settings.is_empty() {
            return Some(kept(reason));
        }
        let groups = adaptation.groups.unwrap_or_default();
        if let Err(err) = adaptive::check_groups(&groups, maps) {
            return Some(kept(format!("kept as planned: the plugin's {err}")));
        }
        let index_of: BTreeMap<usize, usize> = tasks
            .iter()
            .enumerate()
            .filter(|(_, task)| task.stage_id == stage)
            .map(|(index, task)| (task.map, index))
            .collect();
        // Every task of the stage told the settings, before any is covered.
        let mut rewritten = BTreeMap::new();
        for (&map, &index) in &index_of {
            match with_stage_options(&tasks[index], &adaptation.settings) {
                Ok(task) => {
                    rewritten.insert(map, task);
                }
                Err(err) => {
                    return Some(kept(format!(
                        "kept as planned: the envelope of stage {stage} map {map} could not be \
                         rewritten: {err}"
                    )));
                }
            }
        }
        for (&map, task) in &rewritten {
            tasks[index_of[&map]] = task.clone();
        }
        let mut heads = BTreeMap::new();
        for &[first, last] in &groups {
            for member in first + 1..=last {
                let index = index_of[&member];
                covered.insert(index);
                heads.insert(member, first);
                // No worker is given it: its head's task runs the map.
                if tasks[index].inline.is_none() {
                    let _ = std::fs::remove_file(&tasks[index].envelope);
                }
            }
        }
        attempts.regroup(stage, &rewritten, &heads);
        Some(Decision {
            stage_id: stage,
            planned_tasks: maps,
            tasks: maps - heads.len(),
            reason,
        })
    }
}

impl Adapter<'_> {
    /// Make `stage`'s tasks as `planned` says: each planned map named told
    /// the stage's settings and its own, each added map (past `maps`) a
    /// new task made from its `like`. The number of maps added. Added
    /// tasks are written first, and a planned task's envelope is restored
    /// when a later one cannot be rewritten, so a failure leaves the stage
    /// as planned.
    fn with_planned_tasks(
        &self,
        stage: u64,
        maps: usize,
        tasks: &mut Vec<Task>,
        adaptation: &adaptive::Adaptation,
        planned: &[adaptive::PlannedTask],
    ) -> std::result::Result<usize, String> {
        adaptive::check_tasks(planned, maps).map_err(|e| format!("the plugin's {e}"))?;
        let index_of: BTreeMap<usize, usize> = tasks
            .iter()
            .enumerate()
            .filter(|(_, task)| task.stage_id == stage)
            .map(|(index, task)| (task.map, index))
            .collect();
        let settings_of = |task: &adaptive::PlannedTask| {
            let mut settings = adaptation.settings.clone();
            settings.extend(task.settings.clone());
            settings
        };
        let mut added = Vec::new();
        for task in planned.iter().filter(|t| t.map >= maps) {
            let like = index_of.get(&task.like).ok_or_else(|| {
                format!(
                    "stage {stage} has no task of map {} to add map {} from",
                    task.like, task.map
                )
            })?;
            let made = added_task(&tasks[*like], task.map, &settings_of(task)).map_err(|e| {
                format!("map {} of stage {stage} could not be added: {e}", task.map)
            })?;
            added.push(made);
        }
        let mut rewritten: Vec<(usize, Task, Task)> = Vec::new();
        for task in planned.iter().filter(|t| t.map < maps) {
            let index = index_of[&task.map];
            match with_stage_options(&tasks[index], &settings_of(task)) {
                Ok(made) => rewritten.push((index, tasks[index].clone(), made)),
                Err(err) => {
                    for (_, original, _) in &rewritten {
                        restore(original);
                    }
                    for task in &added {
                        if task.inline.is_none() {
                            let _ = std::fs::remove_file(&task.envelope);
                        }
                    }
                    return Err(format!(
                        "the envelope of stage {stage} map {} could not be rewritten: {err}",
                        task.map
                    ));
                }
            }
        }
        for (index, _, made) in rewritten {
            tasks[index] = made;
        }
        let count = added.len();
        tasks.extend(added);
        Ok(count)
    }
}

/// A task of `like`'s stage running as map `map`, told `settings`: its
/// own envelope (inline, or a file beside `like`'s).
fn added_task(like: &Task, map: usize, settings: &BTreeMap<String, String>) -> Result<Task> {
    let mut envelope = like.read_envelope()?;
    envelope.added_from = Some(envelope.planned_map());
    envelope.partition = map;
    envelope.attempt = 0;
    envelope.spec.stage_options = settings.clone();
    let dir = like
        .envelope
        .parent()
        .unwrap_or_else(|| std::path::Path::new(""));
    let path = crate::protocol::envelope_path(dir, like.stage_id, map);
    if like.inline.is_some() {
        return Ok(Task {
            stage_id: like.stage_id,
            map,
            envelope: path,
            inline: Some(Arc::new(envelope)),
        });
    }
    envelope.write(&path)?;
    Ok(Task {
        stage_id: like.stage_id,
        map,
        envelope: path,
        inline: None,
    })
}

/// Put back the envelope file of `original` (an inline one has none).
fn restore(original: &Task) {
    if original.inline.is_some() {
        return;
    }
    if let Ok(mut envelope) = original.read_envelope() {
        envelope.spec.stage_options.clear();
        let _ = envelope.write(&original.envelope);
    }
}

/// `task` with its envelope's spec carrying `settings` as stage options:
/// a new inline envelope, or its envelope file rewritten (no attempt of it
/// has started).
fn with_stage_options(task: &Task, settings: &BTreeMap<String, String>) -> Result<Task> {
    let mut envelope = task.read_envelope()?;
    envelope.spec.stage_options = settings.clone();
    if task.inline.is_some() {
        return Ok(Task {
            inline: Some(Arc::new(envelope)),
            ..task.clone()
        });
    }
    envelope.write(&task.envelope)?;
    Ok(task.clone())
}

/// A task in the ready queue: the longest remaining path first, then the
/// stage first in pre-order, then its maps in order.
#[derive(Debug, PartialEq, Eq)]
struct Ready {
    /// Stages from this one to the root, this one and the root included.
    path: usize,
    stage: u64,
    map: usize,
    /// Its position in the query's task list.
    index: usize,
}

impl Ord for Ready {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.path
            .cmp(&other.path)
            .then_with(|| other.stage.cmp(&self.stage))
            .then_with(|| other.map.cmp(&self.map))
    }
}

impl PartialOrd for Ready {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// For each stage, the stages on the longest chain from it to the root
/// (itself and the root included): the critical path it starts, as far as
/// the graph alone tells, before any task has run.
fn remaining_paths(infos: &[StageInfo]) -> BTreeMap<u64, usize> {
    fn path(stage: u64, infos: &[StageInfo], paths: &mut BTreeMap<u64, usize>) -> usize {
        if let Some(&known) = paths.get(&stage) {
            return known;
        }
        let readers: Vec<u64> = infos
            .iter()
            .filter(|reader| reader.deps.contains(&stage))
            .map(|reader| reader.stage_id)
            .collect();
        // The graph was checked for cycles (`waves`), so this ends.
        let longest = readers
            .into_iter()
            .map(|reader| path(reader, infos, paths))
            .max()
            .unwrap_or(0);
        paths.insert(stage, longest + 1);
        longest + 1
    }
    let mut paths = BTreeMap::new();
    for info in infos {
        path(info.stage_id, infos, &mut paths);
    }
    paths
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
                added_from: None,
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
    decisions: Vec<Decision>,
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

    /// The adaptive decisions made for stages as they became ready, in
    /// that order.
    pub fn decisions(&self) -> &[Decision] {
        &self.decisions
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;

    use super::*;
    use crate::error::{Retry, TaskFailure};

    fn info(stage_id: u64, deps: &[u64]) -> StageInfo {
        StageInfo {
            stage_id,
            shuffle_dir: "/s".into(),
            maps: 1,
            buckets: 1,
            deps: deps.to_vec(),
            partitioning: "single".into(),
        }
    }

    /// Runs a task in process: it takes its stage's time and records when it
    /// started and ended. The times differ by far more than a busy machine
    /// delays a timer, so the order of events is the scheduler's.
    #[derive(Debug, Default)]
    struct Timed {
        millis: BTreeMap<u64, u64>,
        failing: BTreeSet<u64>,
        events: Mutex<Vec<String>>,
    }

    #[async_trait]
    impl Executor for Timed {
        async fn run(
            &self,
            task: &Task,
            _slots: usize,
        ) -> std::result::Result<TaskReport, TaskFailure> {
            let log = |what: &str| {
                let event = format!("{what} {}", task.stage_id);
                self.events.lock().unwrap().push(event);
            };
            log("start");
            let millis = self.millis.get(&task.stage_id).copied().unwrap_or(1);
            tokio::time::sleep(Duration::from_millis(millis)).await;
            log("end");
            outcome(
                task,
                self.failing.contains(&task.stage_id),
                "failed on purpose",
            )
        }

        fn name(&self) -> String {
            "timed".into()
        }
    }

    /// A test executor's answer: one row published, or a final failure.
    fn outcome(
        task: &Task,
        failing: bool,
        reason: &str,
    ) -> std::result::Result<TaskReport, TaskFailure> {
        if failing {
            return Err(TaskFailure {
                stage_id: task.stage_id,
                map: task.map,
                reason: reason.into(),
                stderr: String::new(),
                retry: Retry::No,
            });
        }
        Ok(TaskReport {
            rows: 1,
            bytes: None,
            elapsed_ms: None,
            wall_ms: 0.0,
            worker: None,
            attempt: 0,
        })
    }

    fn tasks(infos: &[StageInfo]) -> Vec<Task> {
        infos
            .iter()
            .map(|info| Task {
                stage_id: info.stage_id,
                map: 0,
                envelope: format!("/t/{}", info.stage_id).into(),
                inline: None,
            })
            .collect()
    }

    async fn run(
        executor: Arc<Timed>,
        infos: &[StageInfo],
        slots: usize,
    ) -> Result<Vec<(u64, usize)>> {
        let scheduler = Scheduler::new(
            executor,
            SchedulerOptions {
                max_workers: Some(slots),
                max_attempts: 1,
                ..SchedulerOptions::default()
            },
        );
        let waves = waves(infos)?;
        let tasks = tasks(infos);
        let attempts = Attempts::new(&tasks, 1);
        match scheduler
            .run_ready(infos, &waves, &tasks, &attempts, None)
            .await
        {
            (done, None, _) => Ok(done.into_iter().map(|(task, _)| task).collect()),
            (_, Some(error), _) => Err(error),
        }
    }

    /// 1 reads 2 and 3; 2 reads 4. Waves: [3, 4], [2], [1].
    fn graph() -> Vec<StageInfo> {
        vec![info(1, &[2, 3]), info(2, &[4]), info(3, &[]), info(4, &[])]
    }

    #[tokio::test]
    async fn a_stage_starts_when_its_own_inputs_are_published_not_its_waves() {
        // 3 is slow; 2 needs only 4, so it starts while 3 still runs.
        let executor = Arc::new(Timed {
            millis: [(3, 600), (4, 10), (2, 10), (1, 10)].into(),
            ..Timed::default()
        });
        let order = run(Arc::clone(&executor), &graph(), 2).await.unwrap();
        assert_eq!(order, vec![(4, 0), (3, 0), (2, 0), (1, 0)]);
        let events = executor.events.lock().unwrap().clone();
        let at = |event: &str| events.iter().position(|e| e == event).unwrap();
        assert!(at("start 2") < at("end 3"), "{events:?}");
        assert!(
            at("end 2") < at("start 1") && at("end 3") < at("start 1"),
            "{events:?}"
        );
    }

    #[tokio::test]
    async fn a_free_slot_takes_the_task_on_the_longest_remaining_path() {
        // One slot: 4 (three stages to the root) before 3 (two).
        let executor = Arc::new(Timed::default());
        let order = run(executor, &graph(), 1).await.unwrap();
        assert_eq!(order, vec![(4, 0), (2, 0), (3, 0), (1, 0)]);
        let paths = remaining_paths(&graph());
        assert_eq!(paths, [(1, 1), (2, 2), (3, 2), (4, 3)].into());
    }

    #[tokio::test]
    async fn a_failure_stops_later_waves_and_reports_its_wave_whole() {
        // 4 fails; 3, of the same wave, still runs and its reader does not.
        let executor = Arc::new(Timed {
            millis: [(3, 50)].into(),
            failing: [4].into(),
            ..Timed::default()
        });
        let err = run(Arc::clone(&executor), &graph(), 2).await.unwrap_err();
        let events = executor.events.lock().unwrap().clone();
        assert!(events.contains(&"end 3".to_string()), "{events:?}");
        assert!(
            !events.iter().any(|e| e == "start 2" || e == "start 1"),
            "{events:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains("1 of 2 worker task(s) failed in wave 1 (stages [3, 4])"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_stage_of_no_map_is_published_at_once() {
        let mut infos = graph();
        infos[3].maps = 0;
        let executor = Arc::new(Timed::default());
        let scheduler = Scheduler::new(executor, SchedulerOptions::default());
        let waves = waves(&infos).unwrap();
        let tasks: Vec<Task> = tasks(&infos)
            .into_iter()
            .filter(|t| t.stage_id != 4)
            .collect();
        let attempts = Attempts::new(&tasks, 1);
        let (done, error, _) = scheduler
            .run_ready(&infos, &waves, &tasks, &attempts, None)
            .await;
        assert!(error.is_none(), "{error:?}");
        assert_eq!(done.len(), 3);
    }

    /// Runs a task in process: each attempt `(stage, map, attempt)` in
    /// `millis` sleeps that long, every other one 100 ms; attempts in
    /// `failing` fail for good.
    #[derive(Debug, Default)]
    struct Straggling {
        millis: BTreeMap<(u64, usize, u32), u64>,
        failing: BTreeSet<(u64, usize, u32)>,
        events: Mutex<Vec<String>>,
    }

    #[async_trait]
    impl Executor for Straggling {
        async fn run(
            &self,
            task: &Task,
            _slots: usize,
        ) -> std::result::Result<TaskReport, TaskFailure> {
            let attempt = task.inline.as_ref().map_or(0, |e| e.attempt);
            let name = format!("{}/{} attempt {attempt}", task.stage_id, task.map);
            self.events.lock().unwrap().push(format!("start {name}"));
            let key = (task.stage_id, task.map, attempt);
            let millis = self.millis.get(&key).copied().unwrap_or(100);
            tokio::time::sleep(Duration::from_millis(millis)).await;
            self.events.lock().unwrap().push(format!("end {name}"));
            let failing = self.failing.contains(&(task.stage_id, task.map, attempt));
            outcome(task, failing, &format!("{name} failed on purpose"))
        }

        fn name(&self) -> String {
            "straggling".into()
        }
    }

    /// Stage 1 reads stage 2, whose three maps run at once on three slots
    /// (a fourth is free for a twin); map 2's first attempt straggles.
    async fn run_straggling(
        executor: Arc<Straggling>,
    ) -> (Result<Vec<((u64, usize), TaskReport)>>, Vec<String>) {
        let mut infos = vec![info(1, &[2]), info(2, &[])];
        infos[1].maps = 3;
        let spec = SessionSpec::new(std::iter::empty::<(String, String)>());
        let tasks: Vec<Task> = [(1, 0), (2, 0), (2, 1), (2, 2)]
            .into_iter()
            .map(|(stage_id, map)| Task {
                stage_id,
                map,
                envelope: format!("/t/{stage_id}-{map}").into(),
                inline: Some(Arc::new(Envelope {
                    spec: spec.clone(),
                    plan: "/t/plan".into(),
                    stage_id,
                    partition: map,
                    attempt: 0,
                    added_from: None,
                })),
            })
            .collect();
        let scheduler = Scheduler::new(
            executor,
            SchedulerOptions {
                max_workers: Some(4),
                max_attempts: 1,
                speculation: Some(Speculation {
                    factor: 2.0,
                    min_elapsed: Duration::from_millis(200),
                }),
                ..SchedulerOptions::default()
            },
        );
        let waves = waves(&infos).unwrap();
        let attempts = Attempts::new(&tasks, 1);
        let outcome = match scheduler
            .run_ready(&infos, &waves, &tasks, &attempts, None)
            .await
        {
            (done, None, _) => Ok(done),
            (_, Some(error), _) => Err(error),
        };
        (outcome, attempts.retries())
    }

    #[tokio::test]
    async fn a_straggler_gets_a_twin_and_the_first_to_finish_wins() {
        let executor = Arc::new(Straggling {
            millis: [((2, 2, 0), 60_000)].into(),
            ..Straggling::default()
        });
        let (done, retries) = run_straggling(Arc::clone(&executor)).await;
        let done: BTreeMap<_, _> = done.unwrap().into_iter().collect();
        assert_eq!(done.len(), 4);
        assert_eq!(done[&(2, 2)].attempt, 1, "{retries:?}");
        assert_eq!(done[&(2, 0)].attempt, 0);
        let events = executor.events.lock().unwrap().clone();
        // The straggler was stopped, never finished; its reader ran.
        assert!(
            !events.iter().any(|e| e == "end 2/2 attempt 0"),
            "{events:?}"
        );
        assert!(
            events.iter().any(|e| e == "end 1/0 attempt 0"),
            "{events:?}"
        );
        assert!(
            retries[0].starts_with("stage 2 map 2 attempt 1: speculative, its first attempt ran"),
            "{retries:?}"
        );
        assert!(
            retries[1].contains("published first; the first attempt was stopped"),
            "{retries:?}"
        );
    }

    #[tokio::test]
    async fn a_failed_twin_leaves_the_first_attempt_to_finish() {
        let executor = Arc::new(Straggling {
            millis: [((2, 2, 0), 1_500)].into(),
            failing: [(2, 2, 1)].into(),
            ..Straggling::default()
        });
        let (done, retries) = run_straggling(Arc::clone(&executor)).await;
        let done: BTreeMap<_, _> = done.unwrap().into_iter().collect();
        assert_eq!(done[&(2, 2)].attempt, 0, "{retries:?}");
        let events = executor.events.lock().unwrap().clone();
        assert!(
            events.iter().any(|e| e == "end 2/2 attempt 1"),
            "{events:?}"
        );
        assert!(
            events.iter().any(|e| e == "end 2/2 attempt 0"),
            "{events:?}"
        );
    }

    #[tokio::test]
    async fn a_failed_first_attempt_waits_for_its_twin() {
        // The first attempt fails for good while its twin runs; the twin
        // publishes, so the task succeeds.
        let millis: BTreeMap<_, _> = [((2, 2, 0), 1_000), ((2, 2, 1), 2_000)].into();
        let executor = Arc::new(Straggling {
            millis: millis.clone(),
            failing: [(2, 2, 0)].into(),
            ..Straggling::default()
        });
        let (done, retries) = run_straggling(Arc::clone(&executor)).await;
        let done: BTreeMap<_, _> = done.unwrap().into_iter().collect();
        assert_eq!(done[&(2, 2)].attempt, 1, "{retries:?}");
        let events = executor.events.lock().unwrap().clone();
        let at = |event: &str| events.iter().position(|e| e == event).unwrap();
        assert!(
            at("end 2/2 attempt 0") < at("end 2/2 attempt 1"),
            "{events:?}"
        );

        // Both fail: the first attempt's failure is the one reported.
        let executor = Arc::new(Straggling {
            millis,
            failing: [(2, 2, 0), (2, 2, 1)].into(),
            ..Straggling::default()
        });
        let (done, _) = run_straggling(executor).await;
        let text = done.unwrap_err().to_string();
        assert!(text.contains("2/2 attempt 0 failed on purpose"), "{text}");
    }
}
