//! The ready queue: every task of a query dispatched as soon as every stage
//! its stage reads is published, on the longest remaining path first.
//!
//! ```text
//! loop ─► queue_ready   a stage whose inputs are all published: adapted
//!         │             (the plugin's decision), its tasks queued
//!         ├► dispatch    free slots take queued tasks (none of a wave past
//!         │             a failed one)
//!         ├► speculate   a slot nothing waits for may take a straggler's twin
//!         └► finish      one attempt ended: published (its readers may be
//!                        ready), failed, or held while its twin runs
//! ```
//!
//! [`RunState`] holds what changes as the query runs; each step is one of
//! its methods, and [`run_ready`] is the loop over them.

use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::{AbortHandle, Aborted, BoxFuture, abortable};
use futures::stream::FuturesUnordered;

use crate::error::{RuntimeError, TaskFailure};
use crate::scheduler::adaptive::{Adapter, Decision};
use crate::scheduler::attempts::{self, Attempts};
use crate::scheduler::executor::Executor;
use crate::scheduler::graph::{StageInfo, reads_no_stage, remaining_paths};
use crate::scheduler::options::{Progress, ProgressSnapshot, SchedulerOptions};
use crate::scheduler::speculation::{Running, Speculation, stage_median, straggler};
use crate::scheduler::task::{Task, TaskReport};

/// How often the ready queue looks for stragglers while speculation is on.
const SPECULATION_TICK: Duration = Duration::from_millis(100);

/// One attempt's end: its task's index, whether it was the speculative
/// twin, and its outcome (or that its twin published first and stopped it).
type Finished = (
    usize,
    bool,
    std::result::Result<std::result::Result<TaskReport, TaskFailure>, Aborted>,
);

/// What the ready queue ends with: the reports in dispatch order (empty
/// after a failure), the failure report of the first wave that had a
/// failure, and the adaptive decisions made for stages as they became
/// ready.
pub(crate) type ReadyOutcome = (
    Vec<((u64, usize), TaskReport)>,
    Option<RuntimeError>,
    Vec<Decision>,
);

/// The query's stage graph: every stage as the plugin described it, and
/// its waves ([`crate::scheduler::graph::waves`]).
#[derive(Clone, Copy)]
pub(crate) struct Graph<'a> {
    /// Every stage, in pre-order.
    pub(crate) infos: &'a [StageInfo],
    /// The stage ids of each wave.
    pub(crate) waves: &'a [Vec<u64>],
}

/// Every task of `tasks` through the ready queue (see the module doc), on
/// `executor` with `options`; `adapter` asks the plugin how each stage that
/// reads others runs once they are published.
pub(crate) async fn run_ready<'a>(
    executor: &'a dyn Executor,
    options: &SchedulerOptions,
    graph: Graph<'a>,
    tasks: &[Task],
    attempts: &'a Attempts,
    adapter: Option<&Adapter<'_>>,
) -> ReadyOutcome {
    let mut state = RunState::new(executor, options, graph, tasks, attempts);
    if let Some(progress) = &state.progress {
        progress.start(tasks.len());
    }
    loop {
        state.queue_ready(adapter);
        state.dispatch();
        state.speculate();
        state.report_progress();
        match state.next_finished().await {
            Wake::Tick => {}
            Wake::Idle => break,
            Wake::Ended(finished) => state.finish(finished),
        }
    }
    state.report_progress();
    if let Some(progress) = &state.progress {
        progress.finish();
    }
    state.outcome()
}

/// Why the ready queue woke.
enum Wake {
    /// An attempt ended.
    Ended(Finished),
    /// Time to look for stragglers again.
    Tick,
    /// Nothing runs: every task ended, or none can start.
    Idle,
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

/// What the ready queue knows of a running query: the graph and how tasks
/// run (fixed), and every task's progress (changing as attempts end).
struct RunState<'a> {
    executor: &'a dyn Executor,
    attempts: &'a Attempts,
    graph: Graph<'a>,
    slots: usize,
    timeout: Option<Duration>,
    speculation: Option<Speculation>,
    progress: Option<Arc<dyn Progress>>,
    /// The wave of each stage, by id.
    wave_of: BTreeMap<u64, usize>,
    /// The stages from each stage to the root (see [`remaining_paths`]).
    remaining_path: BTreeMap<u64, usize>,
    /// Each stage's planned maps.
    maps_of: BTreeMap<u64, usize>,
    /// Tasks as they run: an adaptive decision rewrites a ready stage's.
    tasks: Vec<Task>,
    /// Tasks another task of their stage runs (a coalesced group's).
    covered: BTreeSet<usize>,
    decisions: Vec<Decision>,
    /// Each stage's tasks not yet published.
    unpublished: BTreeMap<u64, usize>,
    /// Stages every task of which has published.
    stages_done: usize,
    /// Bytes the published tasks reported.
    bytes: u64,
    /// The stages each stage still waits for.
    waiting: BTreeMap<u64, BTreeSet<u64>>,
    ready: BinaryHeap<Ready>,
    /// Stages whose inputs are all published, to be adapted and queued.
    newly_ready: Vec<u64>,
    running: FuturesUnordered<BoxFuture<'a, Finished>>,
    /// What stops each running attempt, by (task index, speculative).
    stoppers: BTreeMap<(usize, bool), AbortHandle>,
    /// When each unfinished task was dispatched, and its dispatch position.
    began: BTreeMap<usize, (Instant, usize)>,
    /// The times of each stage's finished tasks, for its median.
    times: BTreeMap<u64, Vec<Duration>>,
    /// Tasks given a speculative twin.
    speculated: BTreeSet<usize>,
    /// A first attempt's failure while its speculative twin still runs.
    held: BTreeMap<usize, TaskFailure>,
    /// Task indexes in dispatch order.
    dispatched: Vec<usize>,
    done: Vec<((u64, usize), TaskReport)>,
    /// (dispatch position, wave, failure) of every task that failed.
    failures: Vec<(usize, usize, TaskFailure)>,
}

impl<'a> RunState<'a> {
    fn new(
        executor: &'a dyn Executor,
        options: &SchedulerOptions,
        graph: Graph<'a>,
        tasks: &[Task],
        attempts: &'a Attempts,
    ) -> Self {
        let infos = graph.infos;
        Self {
            executor,
            attempts,
            graph,
            slots: options.slots(),
            timeout: options.task_timeout,
            speculation: options.speculation,
            progress: options.progress.clone(),
            wave_of: graph
                .waves
                .iter()
                .enumerate()
                .flat_map(|(index, wave)| wave.iter().map(move |&stage| (stage, index)))
                .collect(),
            remaining_path: remaining_paths(infos),
            maps_of: infos
                .iter()
                .map(|info| (info.stage_id, info.maps))
                .collect(),
            tasks: tasks.to_vec(),
            covered: BTreeSet::new(),
            decisions: Vec::new(),
            unpublished: infos
                .iter()
                .map(|info| (info.stage_id, info.maps))
                .collect(),
            waiting: infos
                .iter()
                .map(|info| (info.stage_id, info.deps.iter().copied().collect()))
                .collect(),
            stages_done: 0,
            bytes: 0,
            ready: BinaryHeap::new(),
            newly_ready: infos
                .iter()
                .filter(|info| info.deps.is_empty())
                .map(|info| info.stage_id)
                .collect(),
            running: FuturesUnordered::new(),
            stoppers: BTreeMap::new(),
            began: BTreeMap::new(),
            times: BTreeMap::new(),
            speculated: BTreeSet::new(),
            held: BTreeMap::new(),
            dispatched: Vec::new(),
            done: Vec::new(),
            failures: Vec::new(),
        }
    }

    /// Queue the tasks of each stage whose inputs are all published, as the
    /// plugin decides they run; a stage of no map is published at once,
    /// and may ready its readers.
    fn queue_ready(&mut self, adapter: Option<&Adapter<'_>>) {
        while let Some(stage) = self.newly_ready.pop() {
            if let Some(adapter) = adapter
                && !reads_no_stage(self.graph.infos, stage)
                && let Some(decision) = adapter.adapt(
                    stage,
                    self.maps_of[&stage],
                    self.slots,
                    &mut self.tasks,
                    &mut self.covered,
                    self.attempts,
                )
            {
                self.decisions.push(decision);
            }
            let mut queued = 0;
            for (index, task) in self.tasks.iter().enumerate() {
                if task.stage_id == stage && !self.covered.contains(&index) {
                    queued += 1;
                    self.ready.push(Ready {
                        path: self.remaining_path[&stage],
                        stage,
                        map: task.map,
                        index,
                    });
                }
            }
            self.unpublished.insert(stage, queued);
            if queued == 0 {
                self.stages_done += 1;
                let readers = published(&mut self.waiting, stage);
                self.newly_ready.extend(readers);
            }
        }
    }

    /// Start queued tasks while a slot is free. After a failure no later
    /// wave starts: the report is the first failed wave's, with every task
    /// of it run out.
    fn dispatch(&mut self) {
        let last_wave = self.failures.iter().map(|(_, wave, _)| *wave).min();
        while self.running.len() < self.slots {
            let Some(next) = self.ready.peek() else {
                break;
            };
            if last_wave.is_some_and(|last| self.wave_of[&next.stage] > last) {
                break;
            }
            let next = self.ready.pop().expect("peeked");
            let index = next.index;
            self.began
                .insert(index, (Instant::now(), self.dispatched.len()));
            self.dispatched.push(index);
            let task = self.tasks[index].clone();
            let (executor, attempts) = (self.executor, self.attempts);
            let (slots, timeout) = (self.slots, self.timeout);
            let (attempt, stopper) = abortable(async move {
                attempts::run_with_attempts(executor, attempts, &task, slots, timeout).await
            });
            self.stoppers.insert((index, false), stopper);
            self.running
                .push(Box::pin(async move { (index, false, attempt.await) }));
        }
    }

    /// Tell the progress display, if any, where the run stands.
    fn report_progress(&self) {
        let Some(progress) = &self.progress else {
            return;
        };
        progress.update(&ProgressSnapshot {
            stages: self.graph.infos.len(),
            stages_done: self.stages_done,
            tasks: self.tasks.len() - self.covered.len(),
            running: self.running.len(),
            tasks_done: self.done.len(),
            bytes: self.bytes,
            retries: self.attempts.retried(),
        });
    }

    /// Speculation while no task has failed: the policy, if any.
    fn speculating(&self) -> Option<Speculation> {
        self.speculation.filter(|_| self.failures.is_empty())
    }

    /// A slot nothing is waiting for may take a straggler's twin.
    fn speculate(&mut self) {
        let Some(policy) = self.speculating() else {
            return;
        };
        if self.running.len() >= self.slots || !self.ready.is_empty() {
            return;
        }
        let candidates: Vec<Running> = self
            .began
            .iter()
            .filter(|(index, _)| !self.speculated.contains(index))
            .map(|(&index, (start, _))| {
                let stage = self.tasks[index].stage_id;
                Running {
                    index,
                    elapsed: start.elapsed(),
                    median: stage_median(
                        self.times.get(&stage).map_or(&[][..], Vec::as_slice),
                        unpublished_total(&self.tasks, &self.covered, stage),
                    ),
                }
            })
            .collect();
        let Some(index) = straggler(&policy, &candidates) else {
            return;
        };
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
        self.speculated.insert(index);
        let task = self.tasks[index].clone();
        let (executor, attempts) = (self.executor, self.attempts);
        let (slots, timeout) = (self.slots, self.timeout);
        let (attempt, stopper) = abortable(async move {
            attempts::speculate(executor, attempts, &task, slots, timeout, &why).await
        });
        self.stoppers.insert((index, true), stopper);
        self.running
            .push(Box::pin(async move { (index, true, attempt.await) }));
    }

    /// Wait for the next attempt to end; while speculating, wake now and
    /// then to look for stragglers.
    async fn next_finished(&mut self) -> Wake {
        let next = if self.speculating().is_some() && !self.began.is_empty() {
            match tokio::time::timeout(SPECULATION_TICK, self.running.next()).await {
                Ok(next) => next,
                Err(_) => return Wake::Tick,
            }
        } else {
            self.running.next().await
        };
        match next {
            Some(finished) => Wake::Ended(finished),
            None => Wake::Idle,
        }
    }

    /// One attempt ended: a published task stops its twin and may ready
    /// its stage's readers; a failed one is held while its twin may still
    /// publish, else counted against its wave.
    fn finish(&mut self, (index, speculative, outcome): Finished) {
        // Stopped because its twin published first.
        let Ok(outcome) = outcome else {
            return;
        };
        self.stoppers.remove(&(index, speculative));
        let twin = (index, !speculative);
        let stage_id = self.tasks[index].stage_id;
        match outcome {
            Ok(report) => {
                if let Some(stopper) = self.stoppers.remove(&twin) {
                    stopper.abort();
                    self.attempts.log(format!(
                        "stage {} map {} attempt {}: published first; the {} attempt was \
                         stopped",
                        stage_id,
                        self.tasks[index].map,
                        report.attempt,
                        if speculative { "first" } else { "speculative" }
                    ));
                }
                self.held.remove(&index);
                if let Some((start, _)) = self.began.remove(&index) {
                    self.times
                        .entry(stage_id)
                        .or_default()
                        .push(start.elapsed());
                }
                if let Some(progress) = &self.progress {
                    progress.task_done();
                }
                self.bytes += report.bytes.unwrap_or(0);
                self.done.push(((stage_id, self.tasks[index].map), report));
                let left = self.unpublished.entry(stage_id).or_default();
                *left = left.saturating_sub(1);
                if *left == 0 {
                    self.stages_done += 1;
                    // Published: its readers may be ready now.
                    let readers = published(&mut self.waiting, stage_id);
                    self.newly_ready.extend(readers);
                }
            }
            Err(failure) => {
                if self.stoppers.contains_key(&twin) {
                    // The twin may still publish; a first attempt's
                    // failure is reported if it does not.
                    if !speculative {
                        self.held.insert(index, failure);
                    }
                    return;
                }
                let failure = self.held.remove(&index).unwrap_or(failure);
                let position = self
                    .began
                    .remove(&index)
                    .map_or(0, |(_, position)| position);
                if let Some(progress) = &self.progress {
                    progress.task_done();
                }
                self.failures
                    .push((position, self.wave_of[&stage_id], failure));
            }
        }
    }

    /// The queue ran dry: the reports in dispatch order, or the failure
    /// report of the first wave that had a failure (see the module doc of
    /// [`crate::scheduler`]).
    fn outcome(self) -> ReadyOutcome {
        let Self {
            tasks,
            covered,
            decisions,
            dispatched,
            mut done,
            mut failures,
            graph,
            ..
        } = self;
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
        let stages = graph.waves[first_wave].clone();
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

/// The tasks `stage` runs (its maps, less those a coalesced task covers):
/// what its median is taken over.
fn unpublished_total(tasks: &[Task], covered: &BTreeSet<usize>, stage: u64) -> usize {
    tasks
        .iter()
        .enumerate()
        .filter(|(index, task)| task.stage_id == stage && !covered.contains(index))
        .count()
}
