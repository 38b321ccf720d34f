//! Attempts: a failed task runs again when another attempt may succeed.
//!
//! ```text
//! attempt 0 ── task-S-M.json ───────────► worker ── died / killed / timed out / no report ─┐
//! attempt 1 ── task-S-M.attempt-1.json ─► worker ◄──────────────────────────────────────────┘
//!                                           └─ {"retry": {"lost": [U, V]}}
//!                                                ─► rerun U/V (its next attempt), then S/M again
//! ```
//!
//! Which failures are retried is decided where each is seen
//! ([`crate::Retry`]): a worker that died, was killed, timed out or
//! left no readable report, yes; an error the worker reports about the task
//! itself, no (it would recur); lost upstream output, yes, after running
//! that upstream map again. One [`Attempts`] serves a whole query, so attempt
//! numbers never repeat: a rerun of an earlier wave's map is that map's next
//! attempt, and one rerun mends a loss for every task that saw it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dfx_abi::SHUFFLE_RANGES;
use futures::FutureExt;
use futures::future::BoxFuture;

use crate::error::{Retry, TaskFailure};
use crate::protocol::{Envelope, attempt_path};
use crate::scheduler::executor::{Executor, run_attempt};
use crate::scheduler::graph::StageInfo;
use crate::scheduler::layouts::Layouts;
use crate::scheduler::task::{Task, TaskReport, TaskReports};

/// Attempts per task when the caller sets none: the first and two retries.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

type Key = (u64, usize);

/// The attempts of one query's tasks: their numbers, why each retry
/// happened, and the reruns of maps whose output was lost.
#[derive(Debug)]
pub struct Attempts {
    /// The first attempt of every task of the query (its envelope file, or
    /// the envelope itself), the ones a lost map can be run again from.
    /// A map a coalesced task covers maps to that task's (see
    /// [`Attempts::regroup`]).
    first_tasks: Mutex<BTreeMap<Key, Task>>,
    max_attempts: u32,
    state: Mutex<State>,
    /// The layouts published maps reported, handed to each attempt of a
    /// task that reads them.
    layouts: Layouts,
}

#[derive(Debug, Default)]
struct State {
    /// Attempts started per task.
    made: BTreeMap<Key, u32>,
    /// Why each retry or rerun happened, in the order they did.
    retries: Vec<String>,
    /// Attempts made again after a failure, and reruns of lost maps (a
    /// speculative twin is neither).
    retried: usize,
    /// A logical clock of finished reruns: a loss seen by an attempt that
    /// began before a rerun of that map finished is mended already.
    clock: u64,
    rerun_at: BTreeMap<Key, u64>,
    /// One rerun at a time per map.
    rerun_locks: BTreeMap<Key, Arc<tokio::sync::Mutex<()>>>,
    /// The reports of maps run again (they replace the earlier reports).
    reruns: TaskReports,
}

impl Attempts {
    /// Attempts for `tasks` (every task of the query, their first
    /// envelopes), each task at most `max_attempts` times (at least once).
    pub fn new(tasks: &[Task], max_attempts: u32) -> Self {
        Self {
            first_tasks: Mutex::new(
                tasks
                    .iter()
                    .map(|t| ((t.stage_id, t.map), t.clone()))
                    .collect(),
            ),
            max_attempts: max_attempts.max(1),
            state: Mutex::new(State::default()),
            layouts: Layouts::default(),
        }
    }

    /// These attempts, handing each task of a stage of `infos` the layouts
    /// of the maps it reads (see [`Layouts`]).
    pub fn with_stages(mut self, infos: &[StageInfo]) -> Self {
        self.layouts = Layouts::new(infos);
        self
    }

    /// The layouts published maps reported so far.
    pub fn layouts(&self) -> &Layouts {
        &self.layouts
    }

    /// Attempt `attempt` of map `key` published `report`: its layout is
    /// the one its readers are handed from now on.
    fn published(&self, key: Key, report: &TaskReport) {
        self.layouts.record(key, report.layout.as_ref());
    }

    /// Attempts per task, the first included.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// Why each retry or rerun happened (`stage S map M attempt A: reason`),
    /// in order.
    pub fn retries(&self) -> Vec<String> {
        self.lock().retries.clone()
    }

    /// Attempts made again so far: retries after a failure worth retrying,
    /// and reruns of maps whose output was lost.
    pub fn retried(&self) -> usize {
        self.lock().retried
    }

    /// Attempts started per task.
    pub fn made(&self) -> BTreeMap<Key, u32> {
        self.lock().made.clone()
    }

    /// Reports of the maps run again because their output was lost.
    pub fn reruns(&self) -> TaskReports {
        self.lock().reruns.clone()
    }

    /// The tasks of `stage` as an adaptive decision made them before any
    /// started: `rewritten` by map, and each map `heads` names run by its
    /// head's task, so a lost one is restored by running the head again.
    pub(crate) fn regroup(
        &self,
        stage: u64,
        rewritten: &BTreeMap<usize, Task>,
        heads: &BTreeMap<usize, usize>,
    ) {
        // Its tasks read other buckets than their slices' (a group's, a
        // switched side's): each is handed whole layouts.
        self.layouts.hand_whole(stage);
        self.layouts.cover(
            stage,
            heads
                .iter()
                .filter(|(map, head)| map != head)
                .map(|(&map, _)| map),
        );
        let mut first = self.first_tasks.lock().unwrap_or_else(|p| p.into_inner());
        for (&map, task) in rewritten {
            let head = heads.get(&map).copied().unwrap_or(map);
            if let Some(head_task) = rewritten.get(&head) {
                first.insert((stage, map), head_task.clone());
            } else {
                first.insert((stage, map), task.clone());
            }
        }
    }

    /// `tasks` as an adaptive decision made them before any started, each
    /// the first attempt of its map from now on (an added map included).
    pub(crate) fn replace_first<'a>(&self, tasks: impl IntoIterator<Item = &'a Task>) {
        let mut first = self.first_tasks.lock().unwrap_or_else(|p| p.into_inner());
        for task in tasks {
            // A split partition's parts read other buckets than their
            // slices': whole layouts.
            self.layouts.hand_whole(task.stage_id);
            first.insert((task.stage_id, task.map), task.clone());
        }
    }

    /// The first attempt's task of `key` (for a covered map, its head's).
    fn first_task(&self, key: Key) -> Option<Task> {
        self.first_tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock only means a task panicked holding it; the counts
        // are still whole.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next attempt of `task`: its number and its envelope (attempt 0's
    /// is the driver's file; a later one a copy with the number, under its
    /// own name).
    fn next(&self, task: &Task) -> Result<(u32, Task), TaskFailure> {
        let key = (task.stage_id, task.map);
        let attempt = {
            let mut state = self.lock();
            let made = state.made.entry(key).or_insert(0);
            *made += 1;
            *made - 1
        };
        let first = self.first_task(key).unwrap_or_else(|| task.clone());
        let path = attempt_path(&first.envelope, attempt);
        // The layouts of the maps it reads, as published now: a map run
        // again since an earlier attempt published a file of its own.
        let ranges = self.layouts.setting_for_map(task.stage_id, task.map);
        let with_ranges = |mut envelope: Envelope| {
            envelope.attempt = attempt;
            if let Some(ranges) = &ranges {
                envelope
                    .spec
                    .stage_options
                    .insert(SHUFFLE_RANGES.to_string(), ranges.clone());
            }
            envelope
        };
        // Attempt 0 is the driver's envelope; a later one (or one handed
        // layouts) a copy: in memory for a task that travels inline, else
        // a file.
        let inline = first.inline.as_ref().map(|envelope| {
            if attempt == 0 && ranges.is_none() {
                Arc::clone(envelope)
            } else {
                Arc::new(with_ranges(Envelope::clone(envelope)))
            }
        });
        if inline.is_none() && (attempt > 0 || ranges.is_some()) {
            let fail = |err: crate::error::RuntimeError| TaskFailure {
                stage_id: task.stage_id,
                map: task.map,
                reason: format!(
                    "cannot write the envelope of attempt {attempt} from {}: {err}",
                    first.envelope.display()
                ),
                stderr: String::new(),
                retry: Retry::No,
            };
            let envelope = with_ranges(Envelope::read(&first.envelope).map_err(fail)?);
            envelope.write(&path).map_err(fail)?;
        }
        let attempted = Task {
            envelope: path,
            inline,
            ..task.clone()
        };
        Ok((attempt, attempted))
    }

    pub(crate) fn log(&self, line: String) {
        self.lock().retries.push(line);
    }

    pub(crate) fn clock(&self) -> u64 {
        self.lock().clock
    }
}

/// Run `task` until it succeeds, fails for good, or has made its attempts.
///
/// # Errors
///
/// The final failure: one not worth retrying, or the last of
/// `max_attempts` (then its reason says how many were made).
pub(crate) fn run_with_attempts<'a>(
    executor: &'a dyn Executor,
    attempts: &'a Attempts,
    task: &'a Task,
    limit: usize,
    timeout: Option<Duration>,
) -> BoxFuture<'a, Result<TaskReport, TaskFailure>> {
    async move {
        for tries in 1..=attempts.max_attempts {
            let (attempt, attempted) = attempts.next(task)?;
            let began = attempts.clock();
            let failure = match run_attempt(executor, &attempted, limit, timeout).await {
                Ok(mut report) => {
                    report.attempt = attempt;
                    attempts.published((task.stage_id, task.map), &report);
                    return Ok(report);
                }
                Err(failure) => failure,
            };
            if failure.retry == Retry::No {
                return Err(failure);
            }
            if tries == attempts.max_attempts {
                if tries == 1 {
                    return Err(failure);
                }
                return Err(TaskFailure {
                    reason: format!("failed {tries} attempts; the last {}", failure.reason),
                    ..failure
                });
            }
            if let Retry::Lost { stage_id, map } = failure.retry {
                let reader = format!("stage {} map {}", task.stage_id, task.map);
                restore(
                    (stage_id, map),
                    &reader,
                    began,
                    executor,
                    attempts,
                    limit,
                    timeout,
                )
                .await
                .map_err(|reason| TaskFailure {
                    stage_id: task.stage_id,
                    map: task.map,
                    reason,
                    stderr: String::new(),
                    retry: Retry::No,
                })?;
            }
            let first_line = failure.reason.lines().next().unwrap_or_default();
            attempts.lock().retried += 1;
            attempts.log(format!(
                "stage {} map {} attempt {attempt}: {first_line}",
                task.stage_id, task.map
            ));
        }
        unreachable!("every attempt returns or goes on to the next, and there is at least one")
    }
    .boxed()
}

/// One speculative attempt of `task` while its first attempt still runs
/// (see [`super::speculation`]): a number of its own and no retry of its own,
/// since the first attempt keeps its retries. `why` says what made it a
/// straggler.
///
/// # Errors
///
/// The attempt's failure.
pub(crate) async fn speculate(
    executor: &dyn Executor,
    attempts: &Attempts,
    task: &Task,
    limit: usize,
    timeout: Option<Duration>,
    why: &str,
) -> Result<TaskReport, TaskFailure> {
    let (attempt, attempted) = attempts.next(task)?;
    attempts.log(format!(
        "stage {} map {} attempt {attempt}: speculative, {why}",
        task.stage_id, task.map
    ));
    let mut report = run_attempt(executor, &attempted, limit, timeout).await?;
    report.attempt = attempt;
    attempts.published((task.stage_id, task.map), &report);
    Ok(report)
}

/// Run the map whose output `reader` (`stage S map M`, or the query's root)
/// found lost, unless a rerun of it finished since the reader's attempt
/// began (at `began` on the attempts' clock).
///
/// # Errors
///
/// Why the output cannot be restored: the query has no such map, or
/// running it again failed.
pub(crate) async fn restore(
    lost: Key,
    reader: &str,
    began: u64,
    executor: &dyn Executor,
    attempts: &Attempts,
    limit: usize,
    timeout: Option<Duration>,
) -> Result<(), String> {
    let (lost_stage, lost_map) = lost;
    let Some(first) = attempts.first_task(lost) else {
        return Err(format!(
            "failed: the output of stage {lost_stage} map {lost_map} is lost, and this query \
             has no such task to run again"
        ));
    };
    let lock = Arc::clone(attempts.lock().rerun_locks.entry(lost).or_default());
    let _one_at_a_time = lock.lock().await;
    if attempts.lock().rerun_at.get(&lost).copied().unwrap_or(0) > began {
        return Ok(());
    }
    let upstream = first;
    let report = run_with_attempts(executor, attempts, &upstream, limit, timeout)
        .await
        .map_err(|err| {
            format!(
                "failed: the output of stage {lost_stage} map {lost_map} is lost, and running \
                 that map again failed: {err}"
            )
        })?;
    let mut state = attempts.lock();
    state.clock += 1;
    let now = state.clock;
    state.rerun_at.insert(lost, now);
    state.retried += 1;
    let attempt = report.attempt;
    state.reruns.insert(lost, report);
    state.retries.push(format!(
        "stage {lost_stage} map {lost_map} attempt {attempt}: run again, its output was lost \
         (read by {reader})"
    ));
    Ok(())
}
