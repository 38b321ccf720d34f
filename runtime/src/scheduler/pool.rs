//! The worker pool: long-lived serving workers (`<worker command> --serve`),
//! each running one task after another, reused across waves and queries.
//!
//! ```text
//!                      idle ┌──────────────────────────────┐
//!   task ─► check out ◄─────┤ worker --serve (pid 41, warm) │◄─ check in (task done or
//!            │  (or start   │ worker --serve (pid 42, warm) │   reported an error)
//!            │   a new one) └──────────────────────────────┘
//!            ▼
//!   stdin  {"task": {<envelope>}}  (or {"envelope": "<file>"})
//!   stdout ... other lines, kept ...
//!   stdout {"stage_id": S, "partition": M, "rows": R, ...}  or  {..., "error": "...", "retry": ...}
//! ```
//!
//! A task costs a request line and a response line instead of a process
//! start, a plugin load and a session build (the worker keeps its sessions
//! warm). The guarantees of process mode hold:
//!
//! - **nothing outlives its owner**: every worker is started `kill_on_drop`.
//!   An idle worker is owned by the pool (dropping the last host
//!   holding it kills it); a busy one by the future running its task, so
//!   dropping that future (an error upstream, a timeout, Ctrl-C) kills the
//!   worker mid-task rather than letting it write into a directory its driver
//!   believes settled;
//! - **a dead worker fails only its task**: exit, signal or broken pipe while
//!   a request is outstanding fails that task, named with the exit status and
//!   what the worker wrote on stderr during it; the process is dropped and a
//!   fresh one is started for a later task;
//! - **a worker whose state is in doubt is not reused**: a response for
//!   another task, or an unreadable one, ends it like a death.
//!
//! A pool belongs to the tokio runtime it first started workers in (their
//! pipes are registered with it); a host driven from several runtimes in
//! turn should use [`crate::scheduler::WorkerMode::Process`].

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use async_trait::async_trait;

use crate::error::{Retry, TaskFailure};
use crate::protocol::{Envelope, Request, Response, WorkerReport};
use crate::scheduler::executor::Executor;
use crate::scheduler::process::{WorkerCommand, describe_exit};
use crate::scheduler::task::{Task, TaskReport};

/// Lines of stderr kept per worker: enough to explain a failure, bounded so
/// a chatty worker serving thousands of tasks holds no more than this.
pub const STDERR_TAIL_LINES: usize = 200;

/// Longest stderr line kept, in bytes; longer ones are cut.
const STDERR_LINE_BYTES: usize = 4096;

/// How long a worker that closed its stdout gets to exit before it is
/// killed; only bounds a broken worker, never a task.
const EXIT_GRACE: Duration = Duration::from_secs(5);

/// Long-lived serving workers, started on demand and reused.
pub struct WorkerPool {
    command: WorkerCommand,
    idle: Mutex<Vec<PooledWorker>>,
    live: Arc<Mutex<BTreeSet<u32>>>,
    started: AtomicU64,
}

impl std::fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerPool")
            .field("command", &self.command)
            .field("live", &self.pids())
            .field("started", &self.started())
            .finish()
    }
}

/// How a pooled task failed, and whether its worker may serve again.
enum Failed {
    /// The worker reported the error and is still in step: keep it.
    Reported(TaskFailure),
    /// The worker died or lost step with the driver: drop it.
    Lost(TaskFailure),
}

impl WorkerPool {
    /// A pool whose workers are `command --serve`. Nothing starts until a
    /// task needs a worker.
    pub fn new(command: WorkerCommand) -> Self {
        Self {
            command,
            idle: Mutex::new(Vec::new()),
            live: Arc::new(Mutex::new(BTreeSet::new())),
            started: AtomicU64::new(0),
        }
    }

    /// Process ids of every worker alive now, idle or busy.
    pub fn pids(&self) -> Vec<u32> {
        lock(&self.live).iter().copied().collect()
    }

    /// Workers started since the pool was made (replacements included).
    pub fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// Run `task` on an idle worker, or on a new one. Afterwards the worker
    /// goes back to the pool unless it died or lost step, or `keep_idle`
    /// workers are idle already (then it is ended).
    ///
    /// # Errors
    ///
    /// The task's failure: a worker that could not start, a reported error,
    /// a death (status and stderr), or a response that does not belong to
    /// the task.
    pub async fn run(&self, task: &Task, keep_idle: usize) -> Result<TaskReport, TaskFailure> {
        let started = Instant::now();
        let mut worker = match self.check_out() {
            Some(worker) => worker,
            None => self.start(task)?,
        };
        // From here the worker is owned by this future: dropped mid-task, it
        // is killed.
        let outcome = worker.run(task).await;
        let wall_ms = started.elapsed().as_secs_f64() * 1e3;
        match outcome {
            Ok(report) => {
                let pid = worker.pid;
                self.check_in(worker, keep_idle);
                Ok(TaskReport::from_worker(&report, wall_ms, Some(pid)))
            }
            Err(Failed::Reported(failure)) => {
                self.check_in(worker, keep_idle);
                Err(failure)
            }
            Err(Failed::Lost(failure)) => Err(failure),
        }
    }

    /// End every idle worker the orderly way: close its stdin (the end of
    /// its requests), then wait for it to exit, killing one that has not
    /// within a grace period. Says how many exited and how many were killed.
    ///
    /// Dropping the pool kills its workers instead, which is as safe but
    /// leaves them unreaped for a moment: a caller that measures its
    /// children's CPU time (`/usr/bin/time dfx run`) or wants no zombie
    /// behind it calls this first. Busy workers are not touched; their
    /// tasks' futures own them.
    pub async fn shutdown(&self) -> Shutdown {
        let idle = std::mem::take(&mut *lock(&self.idle));
        let mut ended = Shutdown::default();
        for mut worker in idle {
            let PooledWorker { child, stdin, .. } = &mut worker;
            // Closing stdin is the serve loop's end of input. Dropping the
            // pipe closes it (a pipe's `shutdown` only flushes).
            drop(stdin.take());
            match tokio::time::timeout(EXIT_GRACE, child.wait()).await {
                Ok(Ok(status)) if status.success() => ended.exited += 1,
                _ => {
                    let _ = child.start_kill();
                    let _ = child.wait().await;
                    ended.killed += 1;
                }
            }
        }
        ended
    }

    fn check_out(&self) -> Option<PooledWorker> {
        let mut idle = lock(&self.idle);
        while let Some(mut worker) = idle.pop() {
            // One that ended while idle (killed, crashed) is dropped here and
            // replaced by a fresh one, rather than failing the next task.
            if matches!(worker.child.try_wait(), Ok(None)) {
                return Some(worker);
            }
        }
        None
    }

    fn check_in(&self, worker: PooledWorker, keep_idle: usize) {
        let mut idle = lock(&self.idle);
        if idle.len() < keep_idle.max(1) {
            idle.push(worker);
        }
        // Otherwise dropped (killed): a smaller bound than before leaves no
        // more workers than it allows.
    }

    fn start(&self, task: &Task) -> Result<PooledWorker, TaskFailure> {
        let mut child = self.command.serve_command().spawn().map_err(|err| {
            failure(
                task,
                format!(
                    "could not start a worker {} --serve: {err}",
                    self.command.program().display()
                ),
                String::new(),
                Retry::No,
            )
        })?;
        let pid = child.id().unwrap_or_default();
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            // Cannot happen: all three are piped by `serve_command`.
            return Err(failure(
                task,
                "its worker was started without pipes".into(),
                String::new(),
                Retry::No,
            ));
        };
        let tail = Arc::new(Mutex::new(StderrTail::default()));
        let stderr_done = {
            let tail = Arc::clone(&tail);
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    lock(&tail).push(line);
                }
            })
        };
        self.started.fetch_add(1, Ordering::Relaxed);
        lock(&self.live).insert(pid);
        Ok(PooledWorker {
            child,
            pid,
            stdin: Some(stdin),
            stdout: BufReader::new(stdout).lines(),
            tail,
            stderr_done: Some(stderr_done),
            live: Arc::clone(&self.live),
        })
    }
}

#[async_trait]
impl Executor for WorkerPool {
    async fn run(&self, task: &Task, slots: usize) -> Result<TaskReport, TaskFailure> {
        WorkerPool::run(self, task, slots).await
    }

    fn name(&self) -> String {
        "pool".into()
    }

    fn serves_map_files(&self) -> bool {
        true
    }
}

/// A poisoned lock only means another task panicked while holding it; the
/// data (a list of workers, a tail of lines) is still whole.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A failure of `task`; `retry` says whether another attempt may succeed.
fn failure(task: &Task, reason: String, stderr: String, retry: Retry) -> TaskFailure {
    TaskFailure {
        stage_id: task.stage_id,
        map: task.map,
        reason,
        stderr,
        retry,
    }
}

/// The last [`STDERR_TAIL_LINES`] lines a worker wrote on stderr, numbered
/// from its start so a task can take the ones written since it began.
#[derive(Debug, Default)]
struct StderrTail {
    lines: VecDeque<String>,
    /// Lines ever pushed: the number of the next one.
    total: u64,
}

impl StderrTail {
    fn push(&mut self, mut line: String) {
        if line.len() > STDERR_LINE_BYTES {
            let mut cut = STDERR_LINE_BYTES;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push_str(" [cut]");
        }
        self.lines.push_back(line);
        self.total += 1;
        if self.lines.len() > STDERR_TAIL_LINES {
            self.lines.pop_front();
        }
    }

    /// The lines numbered `mark` and later, as text; says so when some of
    /// them were dropped already.
    fn since(&self, mark: u64) -> String {
        let first_kept = self.total - self.lines.len() as u64;
        let skip = mark.saturating_sub(first_kept) as usize;
        let mut out = String::new();
        if mark < first_kept {
            out.push_str(&format!(
                "[{} earlier line(s) not kept]\n",
                first_kept - mark
            ));
        }
        for line in self.lines.iter().skip(skip) {
            out.push_str(line);
            out.push('\n');
        }
        out
    }
}

/// What [`WorkerPool::shutdown`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Shutdown {
    /// Workers that exited with status 0 at the end of their input.
    pub exited: usize,
    /// Workers that failed, or lingered past the grace period and were killed.
    pub killed: usize,
}

/// One serving worker and its pipes.
struct PooledWorker {
    /// Started `kill_on_drop`: dropping the worker kills the process.
    child: Child,
    pid: u32,
    /// `None` only once [`WorkerPool::shutdown`] has closed it.
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
    tail: Arc<Mutex<StderrTail>>,
    stderr_done: Option<tokio::task::JoinHandle<()>>,
    live: Arc<Mutex<BTreeSet<u32>>>,
}

impl Drop for PooledWorker {
    fn drop(&mut self) {
        // The child itself is killed by `kill_on_drop`; only the bookkeeping
        // is ours.
        lock(&self.live).remove(&self.pid);
    }
}

impl PooledWorker {
    async fn run(&mut self, task: &Task) -> Result<WorkerReport, Failed> {
        let mark = lock(&self.tail).total;
        let request = match &task.inline {
            Some(envelope) => Request::Inline {
                task: Box::new(Envelope::clone(envelope)),
            },
            None => Request::File {
                envelope: task.envelope.clone(),
            },
        };
        let sent = async {
            let stdin = self.stdin.as_mut().ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::BrokenPipe, "stdin already closed")
            })?;
            stdin.write_all(request.to_line().as_bytes()).await?;
            stdin.flush().await
        }
        .await;
        if let Err(err) = sent {
            let reason = format!("could not be sent its task ({err})");
            return Err(Failed::Lost(self.ended(task, mark, &reason, &[]).await));
        }
        // Lines before the response are a library's prints: kept, not parsed
        // as the answer (the last line, not the first, is the contract).
        let mut output = Vec::new();
        let response = loop {
            match self.stdout.next_line().await {
                Ok(Some(line)) => match Response::parse_line(&line) {
                    None => output.push(line),
                    Some(Ok(response)) => break response,
                    Some(Err(unreadable)) => {
                        let reason = format!("its worker (pid {}) printed {unreadable}", self.pid);
                        return Err(Failed::Lost(failure(
                            task,
                            reason,
                            self.stderr_with_output(mark, &output),
                            Retry::Yes,
                        )));
                    }
                },
                Ok(None) => {
                    return Err(Failed::Lost(
                        self.ended(task, mark, "closed its output", &output).await,
                    ));
                }
                Err(err) => {
                    let reason = format!("could not be read ({err})");
                    return Err(Failed::Lost(self.ended(task, mark, &reason, &output).await));
                }
            }
        };
        match response {
            Response::Report(report) => {
                if (report.stage_id, report.partition) != (task.stage_id, task.map) {
                    let reason = format!(
                        "its worker (pid {}) reported stage {} map {} instead of its own task",
                        self.pid, report.stage_id, report.partition
                    );
                    return Err(Failed::Lost(failure(
                        task,
                        reason,
                        self.stderr_with_output(mark, &output),
                        Retry::Yes,
                    )));
                }
                Ok(report)
            }
            Response::Error(error) => {
                let own = error.stage_id.is_none_or(|s| s == task.stage_id)
                    && error.partition.is_none_or(|m| m == task.map);
                let stderr = self.stderr_with_output(mark, &output);
                if own {
                    // The worker is in step and says why, with the class the
                    // plugin recorded where the error was made.
                    let retry = Retry::from(error.retry);
                    Err(Failed::Reported(failure(
                        task,
                        format!("failed: {}", error.error),
                        stderr,
                        retry,
                    )))
                } else {
                    let reason = format!(
                        "its worker (pid {}) reported an error for stage {:?} map {:?} instead \
                         of its own task: {}",
                        self.pid, error.stage_id, error.partition, error.error
                    );
                    Err(Failed::Lost(failure(task, reason, stderr, Retry::Yes)))
                }
            }
        }
    }

    /// The failure of a task whose worker stopped answering (`what`): waits
    /// for the process to end and names how it ended, with its stderr since
    /// the task began.
    async fn ended(
        &mut self,
        task: &Task,
        mark: u64,
        what: &str,
        output: &[String],
    ) -> TaskFailure {
        let status = match tokio::time::timeout(EXIT_GRACE, self.child.wait()).await {
            Ok(Ok(status)) => describe_exit(status),
            Ok(Err(err)) => format!("could not be waited for ({err})"),
            Err(_) => {
                let _ = self.child.start_kill();
                let _ = self.child.wait().await;
                format!("{what} but did not exit; it was killed")
            }
        };
        // Everything it wrote before it died, not only what had been read.
        if let Some(done) = self.stderr_done.take() {
            let _ = tokio::time::timeout(EXIT_GRACE, done).await;
        }
        let reason = format!(
            "failed: its worker (pid {}) {status} while running it ({what})",
            self.pid
        );
        failure(
            task,
            reason,
            self.stderr_with_output(mark, output),
            Retry::Yes,
        )
    }

    /// Stderr since `mark`, then any other stdout lines the task printed.
    fn stderr_with_output(&self, mark: u64, output: &[String]) -> String {
        let mut text = lock(&self.tail).since(mark);
        if !output.is_empty() {
            text.push_str("[its other stdout lines]\n");
            for line in output {
                text.push_str(line);
                text.push('\n');
            }
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stderr_tail_is_bounded_and_numbered_from_the_start() {
        let mut tail = StderrTail::default();
        tail.push("before".into());
        let mark = tail.total;
        tail.push("during 1".into());
        tail.push("during 2".into());
        assert_eq!(tail.since(mark), "during 1\nduring 2\n");
        for n in 0..STDERR_TAIL_LINES + 5 {
            tail.push(format!("line {n}"));
        }
        assert_eq!(tail.lines.len(), STDERR_TAIL_LINES);
        let text = tail.since(mark);
        assert!(text.starts_with("[7 earlier line(s) not kept]\n"), "{text}");
        assert!(text.ends_with(&format!("line {}\n", STDERR_TAIL_LINES + 4)));
        tail.push("x".repeat(STDERR_LINE_BYTES + 10));
        assert!(tail.lines.back().unwrap().ends_with(" [cut]"));
    }
}
