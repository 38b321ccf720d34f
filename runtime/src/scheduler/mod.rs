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
//! Both hosts drive queries through [`crate::prepare()`], [`Scheduler::run`]
//! and [`QueryRun::read_root`]: the Rust host with its plan, the Python
//! package with the plan its user's session made. What only a host can do
//! (plan, encode with its session, execute the root) stays with the host.
//!
//! ```text
//! graph       StageInfo, EncodedStage, waves, remaining paths
//! options     SchedulerOptions, Progress, ProgressSnapshot
//! progress_line  the live line's text, for both hosts; TerminalLine draws it
//! run         Scheduler: a query's checks, its tasks, the ready queue
//! ready       RunState: queue_ready, dispatch, speculate, finish
//! tasks       plan files and envelopes, and their adaptive rewrites
//! adaptive    the plugin's decision for a ready stage (Adapter)
//! query_run   QueryRun: the root's read and the reruns of lost maps
//! attempts    retries, reruns and their log; speculation: the twin's rule
//! executor    Executor; pool, process, foreign: the three executors
//! claim       the driver's claim on its shuffle location
//! ```

pub mod adaptive;
pub mod attempts;
pub mod claim;
pub mod executor;
pub mod foreign;
pub mod graph;
pub mod options;
pub mod pool;
pub mod process;
pub mod progress_line;
pub mod query_run;
mod ready;
pub mod run;
pub mod speculation;
pub mod task;
mod tasks;

pub use adaptive::Decision;
pub use attempts::{Attempts, DEFAULT_MAX_ATTEMPTS};
pub use claim::ClaimedLocation;
pub use executor::{Executor, WorkerMode, default_max_workers};
pub use foreign::{ForeignExecutor, ForeignFailure, ForeignRunner};
pub use graph::{EncodedStage, StageInfo, describe, waves};
pub use options::{Progress, ProgressSnapshot, SchedulerOptions};
pub use pool::{Shutdown, WorkerPool};
pub use process::{ProcessExecutor, WorkerCommand};
pub use progress_line::{SHOW_AFTER, TerminalLine};
pub use query_run::QueryRun;
pub use run::Scheduler;
pub use speculation::Speculation;
pub use task::{Task, TaskReport, TaskReports, TaskRows};

#[cfg(test)]
mod tests;
