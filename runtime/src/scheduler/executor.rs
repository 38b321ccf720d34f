//! What runs a task: the [`Executor`] the scheduler hands each attempt to.
//!
//! Three kinds, one contract: the pool of serving workers
//! ([`crate::scheduler::pool::WorkerPool`]), a process per task
//! ([`crate::scheduler::process::ProcessExecutor`]), and a foreign executor a
//! host supplies ([`crate::scheduler::foreign::ForeignExecutor`]: Python's
//! Ray tasks). Each classifies what it sees of a failure; the scheduler owns
//! the rest (order, bound, attempts, timeouts, reruns).

use std::time::Duration;

use async_trait::async_trait;

use crate::error::{Retry, TaskFailure};
use crate::scheduler::task::{Task, TaskReport};

/// Runs one attempt of a task somewhere.
#[async_trait]
pub trait Executor: Send + Sync + std::fmt::Debug {
    /// Run one attempt of `task`; `slots` is the scheduler's bound on tasks
    /// in flight (a pool keeps no more idle workers than that). Dropping the
    /// future must stop the attempt's worker, or at least never let it be
    /// taken for another task.
    ///
    /// # Errors
    ///
    /// The attempt's failure, classified ([`Retry`]).
    async fn run(&self, task: &Task, slots: usize) -> Result<TaskReport, TaskFailure>;

    /// What results call this executor (`pool`, `process`, `ray`...).
    fn name(&self) -> String;

    /// Whether its workers outlive their tasks and serve the map files they
    /// wrote (the runtime's serve loop, see [`crate::flight`]): what a
    /// query whose map files stay on worker disks needs.
    fn serves_map_files(&self) -> bool {
        false
    }
}

/// How a host runs its tasks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum WorkerMode {
    /// Long-lived `<worker> --serve` processes, one per slot, each running
    /// task after task with the plugin loaded once and sessions kept warm.
    #[default]
    Pool,
    /// One `<worker> <envelope>` process per task.
    Process,
}

impl WorkerMode {
    /// The name on the command line (`pool`, `process`).
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerMode::Pool => "pool",
            WorkerMode::Process => "process",
        }
    }
}

impl std::fmt::Display for WorkerMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Workers in flight when the caller sets no bound: the cores this process
/// may use (1 if unknown). More would only make them contend for the cores.
pub fn default_max_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// One attempt of `task` on `executor`, stopped after `timeout`.
pub(crate) async fn run_attempt(
    executor: &dyn Executor,
    task: &Task,
    slots: usize,
    timeout: Option<Duration>,
) -> Result<TaskReport, TaskFailure> {
    let attempt = executor.run(task, slots);
    let Some(after) = timeout else {
        return attempt.await;
    };
    // On timeout the attempt's future is dropped, which kills its worker
    // (kill_on_drop): a stopped task never goes on writing.
    tokio::time::timeout(after, attempt)
        .await
        .unwrap_or_else(|_| {
            Err(TaskFailure {
                stage_id: task.stage_id,
                map: task.map,
                reason: format!("timed out after {after:?}; its worker was killed"),
                stderr: String::new(),
                retry: Retry::Yes,
            })
        })
}
