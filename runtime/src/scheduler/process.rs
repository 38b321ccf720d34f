//! Process mode: one worker process per task, started for it and ended with
//! it; and the command every worker, pooled or not, is started with.
//!
//! ```text
//!            ┌─► worker task-2-0.json ─► stage-2/0-map-0.arrow (its buckets, then its marker)
//! driver ────┼─► worker task-2-1.json ─► stage-2/1-map-1.arrow
//!            └─► ...                      (last stdout line: the response)
//! ```
//!
//! Each child is started with `kill_on_drop` and owned by the future waiting
//! for it. Whatever ends a query early (an error, the caller dropping the
//! future, Ctrl-C, a timeout) drops those futures and so kills the children:
//! a worker left running would keep writing into a shuffle location its
//! driver believes settled, or is about to delete.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};

use async_trait::async_trait;

use crate::error::{Retry, RuntimeError, TaskFailure};
use crate::protocol::Response;
use crate::scheduler::executor::Executor;
use crate::scheduler::task::{Task, TaskReport};

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
    pub fn current_exe() -> crate::error::Result<Self> {
        let exe = std::env::current_exe()
            .map_err(|e| RuntimeError::io("cannot find", "the running executable", e))?;
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

/// The process-per-task executor: `<worker> <envelope file>` for each
/// attempt, its response read off the last line of its stdout.
#[derive(Debug, Clone)]
pub struct ProcessExecutor {
    command: WorkerCommand,
}

impl ProcessExecutor {
    /// Run each task as `command <envelope>`.
    pub fn new(command: WorkerCommand) -> Self {
        Self { command }
    }
}

#[async_trait]
impl Executor for ProcessExecutor {
    async fn run(&self, task: &Task, _slots: usize) -> Result<TaskReport, TaskFailure> {
        run_one(&self.command, task).await
    }

    fn name(&self) -> String {
        "process".into()
    }
}

async fn run_one(command: &WorkerCommand, task: &Task) -> Result<TaskReport, TaskFailure> {
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
    let stdout = String::from_utf8_lossy(&output.stdout);
    if output.status.code().is_none() {
        // Killed by a signal: nothing says the task is at fault.
        return Err(fail(describe_exit(output.status), stderr, Retry::Yes));
    }
    let response = match Response::parse_last(&stdout) {
        Ok(response) => response,
        // A worker that exited with an error but printed no response (it
        // could not even start its serve code): final, as the exit says.
        Err(_) if !output.status.success() => {
            return Err(fail(describe_exit(output.status), stderr, Retry::No));
        }
        Err(reason) => return Err(fail(reason, stderr, Retry::Yes)),
    };
    let wall_ms = started.elapsed().as_secs_f64() * 1e3;
    match response {
        Response::Report(report) if output.status.success() => {
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
            Ok(TaskReport::from_worker(&report, wall_ms, pid))
        }
        Response::Report(_) => Err(fail(
            format!("{} after printing a report", describe_exit(output.status)),
            stderr,
            Retry::Yes,
        )),
        Response::Error(error) => Err(fail(
            format!("failed: {}", error.error),
            stderr,
            Retry::from(error.retry),
        )),
    }
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
        // The driver's own environment is the test runner's: a value set
        // there is inherited, so the command sets none; otherwise the
        // default applies.
        let plain = WorkerCommand::dfx("dfx").serve_command();
        let expected = match std::env::var_os(MALLOC_TUNABLES_VAR) {
            Some(_) => None,
            None => Some(OsString::from(SERVING_MALLOC_TUNABLES)),
        };
        assert_eq!(env_of(&plain, MALLOC_TUNABLES_VAR), expected);
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
