//! How the scheduler runs a query's tasks: its bound, attempts, timeout,
//! speculation, and what it tells a progress display.

use std::sync::Arc;
use std::time::Duration;

use crate::scheduler::attempts::DEFAULT_MAX_ATTEMPTS;
use crate::scheduler::executor::default_max_workers;
use crate::scheduler::speculation::Speculation;

/// Told of each task that ended, for a progress display.
pub trait Progress: Send + Sync {
    /// A wave of `total` tasks begins.
    fn start(&self, total: usize);
    /// One more task of the wave ended.
    fn task_done(&self);
    /// The wave ended.
    fn finish(&self);
    /// Where a query's run stands now: told by the ready queue whenever a
    /// task starts or ends (never by [`crate::scheduler::Scheduler::run_tasks`],
    /// which has no stages). A display of counts alone may ignore it.
    fn update(&self, _now: &ProgressSnapshot) {}
}

/// Where a query's run stands, as [`Progress::update`] is told it. Every
/// count is the query's so far, not a wave's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProgressSnapshot {
    /// The query's stages.
    pub stages: usize,
    /// Stages every task of which has published.
    pub stages_done: usize,
    /// Tasks the query runs (an adaptive decision may change it as stages
    /// become ready: a coalesced group is one task, a split partition
    /// several).
    pub tasks: usize,
    /// Attempts running now, speculative twins included.
    pub running: usize,
    /// Tasks published.
    pub tasks_done: usize,
    /// Bytes the published tasks reported (a worker that does not report
    /// them counts nothing).
    pub bytes: u64,
    /// Attempts made again: a task retried after a failure worth retrying,
    /// or a map run again because its output was lost.
    pub retries: usize,
}

/// How the scheduler runs a query's tasks.
#[derive(Clone, Default)]
pub struct SchedulerOptions {
    /// At most this many tasks at once; `None` means [`default_max_workers`].
    pub max_workers: Option<usize>,
    /// Attempts per task, the first included (see
    /// [`crate::scheduler::attempts`]); 0 means [`DEFAULT_MAX_ATTEMPTS`], 1
    /// no retry.
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
    /// Tasks at once: the bound, or the cores; at least one.
    pub(crate) fn slots(&self) -> usize {
        self.max_workers.unwrap_or_else(default_max_workers).max(1)
    }

    /// Attempts per task, the default for 0.
    pub(crate) fn attempts(&self) -> u32 {
        match self.max_attempts {
            0 => DEFAULT_MAX_ATTEMPTS,
            n => n,
        }
    }
}
