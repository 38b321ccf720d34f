//! The scheduler itself: a query's stages checked, written as tasks and
//! run through the ready queue (the `ready` module: one `RunState` whose
//! steps are dispatch, finish and speculate); or tasks of a caller's own,
//! run once each.

use std::path::Path;
use std::sync::Arc;

use dfx_abi::Plugin;
use futures::StreamExt;

use crate::error::{Result, RuntimeError, TaskFailure};
use crate::scheduler::adaptive::Adapter;
use crate::scheduler::attempts::{self, Attempts};
use crate::scheduler::executor::Executor;
use crate::scheduler::graph::{EncodedStage, StageInfo, waves};
use crate::scheduler::options::SchedulerOptions;
use crate::scheduler::query_run::QueryRun;
use crate::scheduler::ready::{Graph, ReadyOutcome, run_ready};
use crate::scheduler::task::{Task, TaskReport, TaskReports};
use crate::scheduler::tasks::write_tasks;
use crate::spec::location::same_location;
use crate::spec::{SessionSpec, ShuffleDurability};

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

    /// Run every task of `stages` (a query's, in pre-order, as
    /// [`crate::prepare()`] made them), each as soon as every stage it reads
    /// is published (see [`crate::scheduler`]); `spec` is shipped to every
    /// worker (with the codec ids the host encoded with) and `task_dir`
    /// receives the encoded stages. Envelopes travel inline unless
    /// `envelope_files`. No stage (a plan the plugin keeps whole for the
    /// driver) runs no task, and its run's root read is the whole plan.
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
        if spec.shuffle_durability != ShuffleDurability::ObjectStore
            && !self.executor.serves_map_files()
        {
            return Err(RuntimeError::Invalid(format!(
                "shuffle durability {} keeps each map file on the disk of the worker that \
                 wrote it, served by that worker; the {} executor's workers do not outlive \
                 their tasks to serve them: use the pool, or shuffle durability object_store",
                spec.shuffle_durability,
                self.executor.name()
            )));
        }
        let location = spec.shuffle_dir.as_deref().ok_or_else(|| {
            RuntimeError::Invalid(
                "a distributed run needs a shuffle location; the spec has none".into(),
            )
        })?;
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
        let attempts = Attempts::new(&tasks, self.options.attempts()).with_stages(&infos);
        let adapter = Adapter::new(plugin, spec, &stages);
        let (done, failure, decisions) = self
            .run_ready(&infos, &waves, &tasks, &attempts, Some(&adapter))
            .await;
        if let Some(failed) = failure {
            return Err(failed);
        }
        Ok(QueryRun::new(
            Arc::clone(&self.executor),
            self.options.clone(),
            attempts,
            (infos, waves),
            done,
            decisions,
        ))
    }

    /// Every task of `tasks` through the ready queue ([`run_ready`]) on
    /// this scheduler's executor and options.
    pub(crate) async fn run_ready(
        &self,
        infos: &[StageInfo],
        waves: &[Vec<u64>],
        tasks: &[Task],
        attempts: &Attempts,
        adapter: Option<&Adapter<'_>>,
    ) -> ReadyOutcome {
        run_ready(
            self.executor.as_ref(),
            &self.options,
            Graph { infos, waves },
            tasks,
            attempts,
            adapter,
        )
        .await
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
        let mut outcomes: Vec<(usize, std::result::Result<TaskReport, TaskFailure>)> =
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
