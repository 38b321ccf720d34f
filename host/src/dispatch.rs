//! Fan-out: every task of a wave on a worker, a bounded number in flight,
//! every failure kept.
//!
//! Two ways to run a task ([`WorkerMode`]): on a long-lived serving worker
//! of the host's [`WorkerPool`] (the default; see [`crate::pool`]), or in a
//! worker process of its own, started for it and ended with it (below).
//!
//! ```text
//!            ┌─► worker task-2-0.json ─► stage-2/map-0.arrow (its buckets, then its marker)
//! driver ────┼─► worker task-2-1.json ─► stage-2/map-1.arrow
//!            └─► ...                      (last stdout line: report)
//! ```
//!
//! Each child is started with `kill_on_drop`, and each is owned by the future
//! waiting for it. Whatever ends the fan-out early — an error, the caller
//! dropping the future, Ctrl-C in the `dfx` binary — drops those futures and
//! so kills the children: a worker left running would keep writing into a
//! shuffle directory its driver believes settled, or is about to delete.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;

use futures::StreamExt;

use crate::envelope::{Envelope, WorkerReport};
use crate::error::{HostError, Result, Retry, TaskFailure};
use crate::pool::WorkerPool;
use crate::retry::{Attempts, DEFAULT_MAX_ATTEMPTS, run_with_attempts};

/// How a host runs its tasks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, clap::ValueEnum)]
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

/// The variable glibc reads its malloc settings from at process start.
pub const MALLOC_TUNABLES_VAR: &str = "GLIBC_TUNABLES";

/// The malloc settings a serving worker starts with, unless the driver's
/// environment (or the command, [`WorkerCommand::env`]) sets
/// [`MALLOC_TUNABLES_VAR`]; other C libraries ignore the variable.
///
/// A serving worker runs task after task, each allocating its batches and
/// tables afresh. By default glibc gives every block past a threshold that
/// adapts at run time its own mapping and unmaps it when freed, and trims
/// the heap's free top, so the next task faults the same memory in again,
/// page by page, zeroed. A fixed threshold of 4 MiB and a trim threshold of
/// 32 MiB keep that memory in the heap between tasks. Measured on TPC-H q9
/// at scale 1 with 8 partitions: about a tenth less CPU over the workers,
/// peak RSS of the largest worker up a fifth, and for q18 with 2 partitions
/// no change in peak RSS.
pub const SERVING_MALLOC_TUNABLES: &str =
    "glibc.malloc.mmap_threshold=4194304:glibc.malloc.trim_threshold=33554432";

/// The command a worker is started with; the envelope path is appended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerCommand {
    program: PathBuf,
    args: Vec<OsString>,
    envs: Vec<(OsString, OsString)>,
}

impl WorkerCommand {
    /// Run `program` with no arguments before the envelope path.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            envs: Vec::new(),
        }
    }

    /// `program worker <envelope>`: a `dfx` binary, or any host built on
    /// this library that answers the `worker` subcommand.
    pub fn dfx(program: impl Into<PathBuf>) -> Self {
        Self::new(program).arg("worker")
    }

    /// This executable as a worker (`<current exe> worker <envelope>`).
    ///
    /// # Errors
    ///
    /// When the path of the running executable is unknown.
    pub fn current_exe() -> Result<Self> {
        let exe = std::env::current_exe()
            .map_err(|e| HostError::io("cannot find", "the running executable", e))?;
        Ok(Self::dfx(exe))
    }

    /// Append an argument before the envelope path.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_os_string());
        self
    }

    /// Set an environment variable for the worker.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.envs
            .push((key.as_ref().to_os_string(), value.as_ref().to_os_string()));
        self
    }

    /// The program started.
    pub fn program(&self) -> &Path {
        &self.program
    }

    fn command(&self, envelope: &Path) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.program);
        command
            .args(&self.args)
            .arg(envelope)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // The guarantee that no worker outlives the future waiting for it.
            .kill_on_drop(true);
        command
    }

    /// `program args... --serve`, every stream piped: a pooled worker.
    pub(crate) fn serve_command(&self) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.program);
        // Before the command's own variables, so that one set with
        // [`Self::env`] wins; one in the driver's environment is inherited.
        if std::env::var_os(MALLOC_TUNABLES_VAR).is_none() {
            command.env(MALLOC_TUNABLES_VAR, SERVING_MALLOC_TUNABLES);
        }
        command
            .args(&self.args)
            .arg("--serve")
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // The guarantee that no worker outlives its owner: the pool when
            // idle, the future running its task when busy.
            .kill_on_drop(true);
        command
    }
}

/// One task to dispatch: one map of one stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    /// The stage.
    pub stage_id: u64,
    /// The map (the stage's input partition the worker runs).
    pub map: usize,
    /// The envelope file the worker is given. With `inline` set, the name
    /// the file would have (messages name the task by it) and nothing on
    /// disk.
    pub envelope: PathBuf,
    /// The envelope itself, sent in the request to a pooled worker instead
    /// of a file; `None` for a task whose envelope is a file (process mode
    /// always: a process is given a path).
    pub inline: Option<Arc<Envelope>>,
}

/// How to run the fan-out.
#[derive(Debug, Clone)]
pub struct FanOutOptions {
    /// At most this many workers at once; `None` means [`default_max_workers`].
    pub max_workers: Option<usize>,
    /// Draw a progress bar on stderr (only when stderr is a terminal, and
    /// only with the `cli-extras` feature).
    pub progress: bool,
    /// Attempts per task, the first included (see [`crate::retry`]); 1
    /// means no retry.
    pub max_attempts: u32,
    /// An attempt running longer is stopped (its worker killed) and counts
    /// as failed, worth retrying; `None`: no limit.
    pub task_timeout: Option<std::time::Duration>,
}

impl Default for FanOutOptions {
    fn default() -> Self {
        Self {
            max_workers: None,
            progress: false,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            task_timeout: None,
        }
    }
}

/// Rows each task reported, keyed by `(stage_id, map)`.
pub type TaskRows = BTreeMap<(u64, usize), usize>;

/// What each task reported, keyed by `(stage_id, map)`.
pub type TaskReports = BTreeMap<(u64, usize), TaskReport>;

/// One completed task, as its worker reported it and the driver saw it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TaskReport {
    /// Rows it published, over all of its buckets.
    pub rows: usize,
    /// Bytes it published, over all of its buckets (`None` from a worker
    /// that does not report them).
    pub bytes: Option<u64>,
    /// The worker's own time for the task, in milliseconds (`None` from a
    /// worker that does not report it).
    pub elapsed_ms: Option<f64>,
    /// The driver's time for the task, from dispatch (process start or
    /// request) to its report, in milliseconds.
    pub wall_ms: f64,
    /// Process id of the worker that ran it.
    pub worker: Option<u32>,
    /// The attempt that succeeded (0: the first).
    pub attempt: u32,
}

impl TaskReport {
    pub(crate) fn from_worker(report: &WorkerReport, wall_ms: f64, worker: Option<u32>) -> Self {
        Self {
            rows: report.rows,
            bytes: report.bytes,
            elapsed_ms: report.elapsed_ms,
            wall_ms,
            worker,
            attempt: 0,
        }
    }
}

/// What runs the tasks of a fan-out.
#[derive(Debug, Clone, Copy)]
pub enum Workers<'a> {
    /// A process of its own per task.
    Process(&'a WorkerCommand),
    /// The pool's serving workers.
    Pool(&'a WorkerPool),
}

/// Workers in flight when the caller sets no bound: the cores this process
/// may use (1 if unknown). More would only make them contend for the cores.
pub fn default_max_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Run every task in its own worker process and collect their rows: the
/// process mode of [`run_tasks`].
///
/// # Errors
///
/// What [`run_tasks`] reports.
pub async fn fan_out(
    command: &WorkerCommand,
    tasks: &[Task],
    options: &FanOutOptions,
) -> Result<TaskRows> {
    let reports = run_tasks(Workers::Process(command), tasks, options).await?;
    Ok(reports
        .into_iter()
        .map(|(key, report)| (key, report.rows))
        .collect())
}

/// Run every task on `workers` and collect their reports.
///
/// At most `options.max_workers` (default [`default_max_workers`]) are in
/// flight at once (and a pool keeps no more idle workers than that).
/// Every failure — a worker that cannot start, exits non-zero or by a
/// signal, reports an error, or gives no readable report for its own task —
/// is collected and reported together once every task has ended.
///
/// # Errors
///
/// [`HostError::Workers`] naming each failed task with its stderr, in
/// dispatch order.
pub async fn run_tasks(
    workers: Workers<'_>,
    tasks: &[Task],
    options: &FanOutOptions,
) -> Result<TaskReports> {
    let attempts = Attempts::new(tasks, options.max_attempts);
    run_wave(workers, tasks, options, &attempts).await
}

/// [`run_tasks`] with the attempts of a whole query: a task that finds an
/// earlier wave's output lost has that map run again from its envelope in
/// `attempts`, and attempt numbers continue across waves.
///
/// # Errors
///
/// What [`run_tasks`] reports.
pub async fn run_wave(
    workers: Workers<'_>,
    tasks: &[Task],
    options: &FanOutOptions,
    attempts: &Attempts,
) -> Result<TaskReports> {
    let bar = progress_bar(tasks.len(), options.progress);
    let limit = options
        .max_workers
        .unwrap_or_else(default_max_workers)
        .max(1);
    let outcomes: Vec<(usize, std::result::Result<TaskReport, TaskFailure>)> =
        futures::stream::iter(tasks.iter().enumerate())
            .map(|(index, task)| {
                let bar = bar.clone();
                async move {
                    let timeout = options.task_timeout;
                    let outcome = run_with_attempts(workers, attempts, task, limit, timeout).await;
                    bar.inc(1);
                    (index, outcome)
                }
            })
            .buffer_unordered(limit)
            .collect()
            .await;
    bar.finish_and_clear();

    let mut outcomes = outcomes;
    // Report failures in dispatch order, not completion order, so a message
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
        Ok(reports)
    } else {
        let mut stages: Vec<u64> = tasks.iter().map(|t| t.stage_id).collect();
        stages.sort_unstable();
        stages.dedup();
        Err(HostError::Workers {
            wave: None,
            stages,
            total: tasks.len(),
            failures,
        })
    }
}

/// One attempt of `task` on `workers`, stopped after `timeout`.
pub(crate) async fn run_attempt(
    workers: Workers<'_>,
    task: &Task,
    limit: usize,
    timeout: Option<std::time::Duration>,
) -> std::result::Result<TaskReport, TaskFailure> {
    let attempt = async {
        match workers {
            Workers::Process(command) => run_one(command, task).await,
            Workers::Pool(pool) => pool.run(task, limit).await,
        }
    };
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

async fn run_one(
    command: &WorkerCommand,
    task: &Task,
) -> std::result::Result<TaskReport, TaskFailure> {
    let started = std::time::Instant::now();
    let fail = |reason: String, stderr: String, retry: Retry| TaskFailure {
        stage_id: task.stage_id,
        map: task.map,
        reason,
        stderr,
        retry,
    };
    // A process is given a path: an envelope that travels inline is written
    // out first.
    if let Some(envelope) = &task.inline {
        envelope.write(&task.envelope).map_err(|err| {
            fail(
                format!("could not write its envelope: {err}"),
                String::new(),
                Retry::No,
            )
        })?;
    }
    let child = command.command(&task.envelope).spawn().map_err(|err| {
        fail(
            format!("could not start {}: {err}", command.program.display()),
            String::new(),
            // Not the task's fault, but a program that cannot be started
            // would not start on the next attempt either.
            Retry::No,
        )
    })?;
    let pid = child.id();
    let output = child.wait_with_output().await.map_err(|err| {
        fail(
            format!("could not be waited for: {err}"),
            String::new(),
            Retry::Yes,
        )
    })?;
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    if !output.status.success() {
        // Killed by a signal: nothing says the task is at fault. An exit
        // status is how a worker reports its task's error (on stderr),
        // final unless it names an upstream map's lost output.
        let retry = if output.status.code().is_none() {
            Retry::Yes
        } else {
            Retry::of_reported(&stderr)
        };
        return Err(fail(describe_exit(output.status), stderr, retry));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report =
        WorkerReport::parse(&stdout).map_err(|reason| fail(reason, stderr.clone(), Retry::Yes))?;
    if (report.stage_id, report.partition) != (task.stage_id, task.map) {
        return Err(fail(
            format!(
                "reported stage {} map {} instead of its own task",
                report.stage_id, report.partition
            ),
            stderr,
            Retry::Yes,
        ));
    }
    let wall_ms = started.elapsed().as_secs_f64() * 1e3;
    Ok(TaskReport::from_worker(&report, wall_ms, pid))
}

/// How a worker ended: `was killed by signal 9 (SIGKILL)`, `exited with status 3`.
pub(crate) fn describe_exit(status: ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            let name = match signal {
                1 => " (SIGHUP)",
                2 => " (SIGINT)",
                6 => " (SIGABRT)",
                7 => " (SIGBUS)",
                9 => " (SIGKILL)",
                11 => " (SIGSEGV)",
                13 => " (SIGPIPE)",
                15 => " (SIGTERM)",
                _ => "",
            };
            return format!("was killed by signal {signal}{name}");
        }
    }
    match status.code() {
        Some(code) => format!("exited with status {code}"),
        None => format!("ended with {status}"),
    }
}

/// The fan-out's progress bar on stderr: indicatif's with the `cli-extras`
/// feature, a no-op without it (library embedders need not build indicatif).
#[cfg(feature = "cli-extras")]
fn progress_bar(total: usize, wanted: bool) -> indicatif::ProgressBar {
    use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
    use std::io::IsTerminal as _;
    if !wanted || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} workers {pos}/{len} [{bar:30}] {elapsed}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// Without `cli-extras` there is no bar to draw.
#[cfg(not(feature = "cli-extras"))]
fn progress_bar(_total: usize, _wanted: bool) -> NoProgress {
    NoProgress
}

/// What the fan-out calls on its bar, doing nothing.
#[cfg(not(feature = "cli-extras"))]
#[derive(Clone)]
struct NoProgress;

#[cfg(not(feature = "cli-extras"))]
impl NoProgress {
    fn inc(&self, _delta: u64) {}
    fn finish_and_clear(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(command: &tokio::process::Command, key: &str) -> Option<OsString> {
        command
            .as_std()
            .get_envs()
            .filter(|(k, _)| *k == OsStr::new(key))
            .last()
            .and_then(|(_, v)| v.map(OsStr::to_os_string))
    }

    #[test]
    fn a_serving_worker_gets_the_malloc_settings_unless_its_command_sets_its_own() {
        // The driver's own environment is the test runner's: only when it
        // leaves the variable unset does the default apply.
        if std::env::var_os(MALLOC_TUNABLES_VAR).is_some() {
            return;
        }
        let plain = WorkerCommand::dfx("dfx").serve_command();
        assert_eq!(
            env_of(&plain, MALLOC_TUNABLES_VAR),
            Some(OsString::from(SERVING_MALLOC_TUNABLES))
        );
        let own = WorkerCommand::dfx("dfx")
            .env(MALLOC_TUNABLES_VAR, "glibc.malloc.arena_max=1")
            .serve_command();
        assert_eq!(
            env_of(&own, MALLOC_TUNABLES_VAR),
            Some(OsString::from("glibc.malloc.arena_max=1"))
        );
        let one_shot = WorkerCommand::dfx("dfx").command(Path::new("task.json"));
        assert_eq!(env_of(&one_shot, MALLOC_TUNABLES_VAR), None);
    }
}
