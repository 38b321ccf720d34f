//! A query whose stages are all published: what ran, and the reruns of
//! lost output its root read may still need.
//!
//! ```text
//! read_root(read) ─► read(ranges) ── ok ────────────────────► the rows
//!                      └─ fails, the plugin recorded lost maps ─► each lost
//!                         map runs again (its next attempt) ─► read(ranges) again
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use dfx_abi::{FailureClass, Plugin};

use crate::error::{Result, RuntimeError};
use crate::scheduler::adaptive::Decision;
use crate::scheduler::attempts::{self, Attempts};
use crate::scheduler::executor::Executor;
use crate::scheduler::graph::StageInfo;
use crate::scheduler::options::SchedulerOptions;
use crate::scheduler::task::{TaskReport, TaskReports};

/// A query whose stages are all published: what ran, and the reruns its
/// root read may still need.
#[derive(Debug)]
pub struct QueryRun {
    /// What runs a lost map again.
    executor: Arc<dyn Executor>,
    /// The bound and timeout its reruns keep.
    options: SchedulerOptions,
    /// One for the whole query: a rerun is the task's next attempt.
    attempts: Attempts,
    stages: Vec<StageInfo>,
    waves: Vec<Vec<u64>>,
    tasks: Vec<(u64, usize)>,
    reports: TaskReports,
    decisions: Vec<Decision>,
}

impl QueryRun {
    /// A query whose every task of `reports` published, in dispatch order,
    /// with the executor and options that ran them.
    pub(crate) fn new(
        executor: Arc<dyn Executor>,
        options: SchedulerOptions,
        attempts: Attempts,
        graph: (Vec<StageInfo>, Vec<Vec<u64>>),
        reports: Vec<((u64, usize), TaskReport)>,
        decisions: Vec<Decision>,
    ) -> Self {
        let (stages, waves) = graph;
        let mut run = Self {
            executor,
            options,
            attempts,
            stages,
            waves,
            tasks: Vec::new(),
            reports: TaskReports::new(),
            decisions,
        };
        for (task, report) in reports {
            run.tasks.push(task);
            run.reports.insert(task, report);
        }
        run
    }

    /// Read the query's root with `read`, which the host runs over the same
    /// plan the stages were cut from, handing its readers the `shuffle_ranges`
    /// setting it is given (see [`Self::head_ranges`]; `None`: they read the
    /// markers). When it fails and the plugin recorded
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
        F: FnMut(Option<String>) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, E>>,
    {
        let max = self.attempts.max_attempts();
        // Nothing recorded before the read belongs to it.
        let _ = plugin.take_failures(location);
        for tries in 1..=max {
            let began = self.attempts.clock();
            let started = Instant::now();
            // Asked on every try: a map run again published a file of its own.
            let error = match read(self.head_ranges()).await {
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
                attempts::restore(
                    (stage_id, map),
                    "the query's root",
                    began,
                    self.executor.as_ref(),
                    &self.attempts,
                    self.options.slots(),
                    self.options.task_timeout,
                )
                .await
                .map_err(|reason| RuntimeError::Root(format!("the query's root {reason}")))?;
            }
        }
        unreachable!("every read returns, and there is at least one")
    }

    /// The `shuffle_ranges` setting (the plugin's key [`dfx_abi::SHUFFLE_RANGES`])
    /// for the query's head: where each bucket of the stages it reads lies,
    /// as their maps reported.
    pub fn head_ranges(&self) -> Option<String> {
        self.attempts.layouts().setting_for_head()
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
    pub fn attempts(&self) -> BTreeMap<(u64, usize), u32> {
        self.attempts.made()
    }

    /// Why each retry or rerun happened, in order.
    pub fn retries(&self) -> Vec<String> {
        self.attempts.retries()
    }

    /// The executor's name.
    pub fn executor_name(&self) -> String {
        self.executor.name()
    }
}
