//! A foreign executor: tasks run by something the host supplies (Python's
//! Ray tasks), through a blocking call per attempt.
//!
//! The host's runner receives the attempt's envelope and encoded stage by
//! value (its worker may run on a node that cannot see this machine's disk)
//! and the attempt's timeout, and returns the worker's response, or says
//! that the worker itself was lost. The runtime reads the response and
//! classifies it exactly as it does a pooled worker's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::error::{Retry, TaskFailure};
use crate::protocol::stage_file::read_one_map;
use crate::protocol::{Envelope, Response};
use crate::scheduler::executor::Executor;
use crate::scheduler::task::{Task, TaskReport};

/// Why a foreign runner could not produce a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForeignFailure {
    /// The worker, its process or its node was lost, or the attempt timed
    /// out: another attempt may succeed.
    WorkerLost(String),
    /// The task could not be run at all (the runner refused it): final.
    Refused(String),
}

/// What a host supplies to run one attempt: a blocking call, made on a
/// thread of its own.
pub trait ForeignRunner: Send + Sync + std::fmt::Debug {
    /// Run the task of `envelope` (its encoded stage `plan`), giving up
    /// after `timeout`; the worker's response line.
    ///
    /// # Errors
    ///
    /// The worker was lost, or the task could not be run.
    fn run(
        &self,
        envelope: &Envelope,
        plan: Vec<u8>,
        timeout: Option<Duration>,
    ) -> Result<String, ForeignFailure>;

    /// What results call the executor (`ray`).
    fn name(&self) -> String;

    /// Whether its workers outlive their tasks and serve the map files
    /// they wrote (see [`Executor::serves_map_files`]).
    fn serves_map_files(&self) -> bool {
        false
    }
}

/// The [`Executor`] over a host's [`ForeignRunner`].
#[derive(Debug, Clone)]
pub struct ForeignExecutor {
    runner: Arc<dyn ForeignRunner>,
    timeout: Option<Duration>,
}

impl ForeignExecutor {
    /// Run each attempt through `runner`, telling it the scheduler's
    /// `timeout` so that it can stop its own worker.
    pub fn new(runner: Arc<dyn ForeignRunner>, timeout: Option<Duration>) -> Self {
        Self { runner, timeout }
    }
}

#[async_trait]
impl Executor for ForeignExecutor {
    async fn run(&self, task: &Task, _slots: usize) -> Result<TaskReport, TaskFailure> {
        let started = Instant::now();
        let fail = |reason: String, retry: Retry| TaskFailure {
            stage_id: task.stage_id,
            map: task.map,
            reason,
            stderr: String::new(),
            retry,
        };
        // Read here, by value: the runner's worker may be on another node.
        let envelope = task
            .read_envelope()
            .map_err(|err| fail(format!("cannot read its envelope: {err}"), Retry::No))?;
        // Of a stage cut for its maps, this map's part only.
        let plan = read_one_map(&envelope.plan, envelope.planned_map() as u64).map_err(|err| {
            fail(
                format!("cannot read its plan {}: {err}", envelope.plan.display()),
                Retry::No,
            )
        })?;
        let runner = Arc::clone(&self.runner);
        let timeout = self.timeout;
        let outcome =
            tokio::task::spawn_blocking(move || runner.run(&envelope, plan, timeout)).await;
        let line = match outcome {
            Ok(Ok(line)) => line,
            Ok(Err(ForeignFailure::WorkerLost(reason))) => return Err(fail(reason, Retry::Yes)),
            Ok(Err(ForeignFailure::Refused(reason))) => return Err(fail(reason, Retry::No)),
            Err(err) => {
                return Err(fail(
                    format!("its {} runner did not finish: {err}", self.runner.name()),
                    Retry::Yes,
                ));
            }
        };
        let wall_ms = started.elapsed().as_secs_f64() * 1e3;
        match Response::parse_line(&line) {
            Some(Ok(Response::Report(report)))
                if (report.stage_id, report.partition) == (task.stage_id, task.map) =>
            {
                Ok(TaskReport::from_worker(&report, wall_ms, None))
            }
            Some(Ok(Response::Report(report))) => Err(fail(
                format!(
                    "its worker reported stage {} map {} instead of its own task",
                    report.stage_id, report.partition
                ),
                Retry::Yes,
            )),
            Some(Ok(Response::Error(error))) => Err(fail(
                format!("failed: {}", error.error),
                Retry::from(error.retry),
            )),
            Some(Err(unreadable)) => {
                Err(fail(format!("its worker printed {unreadable}"), Retry::Yes))
            }
            None => Err(fail(
                format!("its worker returned {line:.200?}, not a response"),
                Retry::Yes,
            )),
        }
    }

    fn name(&self) -> String {
        self.runner.name()
    }

    fn serves_map_files(&self) -> bool {
        self.runner.serves_map_files()
    }
}
