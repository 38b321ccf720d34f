//! The runtime's scheduler, for the Python driver.
//!
//! ```text
//! dfx_engine.driver                         this module                 dfx_runtime
//! ─────────────────                         ───────────                 ───────────
//! ClaimedLocation(spec_json)  ───────────►  ClaimedLocation::claim      lock / probe
//! plan, encode each stage     ─ bytes ───►  prepare (crate::prepare)    describe, cut
//! Scheduler(executor).run(...)  ─────────►  Scheduler::run              graph, waves,
//!                                                                       attempts, executors
//! QueryRun.read_root(loc, read) ◄─ read() ─ QueryRun::read_root         reruns lost maps
//! ```
//!
//! The executor is a [`WorkerPool`] of serving workers, `"process"` (a
//! process per task) or any Python object with `run(envelope_json, plan,
//! timeout) -> str` (a foreign executor, such as `dfx_engine.ray`'s). The
//! driver keeps only what needs its session: planning, encoding, the root.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dfx_runtime::scheduler::{
    ClaimedLocation as RuntimeClaim, ForeignExecutor, ForeignFailure, ForeignRunner,
    ProcessExecutor, Progress, QueryRun as RuntimeRun, Speculation, TerminalLine, WorkerCommand,
    WorkerPool as RuntimePool,
};
use dfx_runtime::{
    Envelope, Executor, Scheduler as RuntimeScheduler, SchedulerOptions, SessionSpec,
};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString, PyTuple};

use crate::blocking::{call_python, wait};
use crate::error::{WorkerLost, from_runtime};
use crate::plugin::{PLUGIN_ENV, plugin};
use crate::prepare::PreparedStages;
use crate::stage_info::StageInfo;

/// The command a worker is started with, pinned to the plugin file this
/// process loaded: a worker that loaded another build would decode with
/// another codec.
fn worker_command(py: Python<'_>, command: &[String]) -> PyResult<WorkerCommand> {
    let Some((program, args)) = command.split_first() else {
        return Err(PyValueError::new_err("a worker command needs a program"));
    };
    let command = args
        .iter()
        .fold(WorkerCommand::new(program), |command, arg| command.arg(arg));
    Ok(command.env(PLUGIN_ENV, plugin(py)?.path()))
}

/// Long-lived serving workers (`<command> --serve`), started when a task
/// needs one and reused across waves and queries; at most `max_workers`
/// (default: the cores) run tasks at once.
#[pyclass(subclass, module = "dfx_engine._internal")]
pub struct WorkerPool {
    pool: Option<Arc<RuntimePool>>,
    max_workers: Option<usize>,
    command: Vec<String>,
}

#[pymethods]
impl WorkerPool {
    /// A pool of `command --serve` workers; none is started yet.
    ///
    /// Raises:
    ///     ValueError: An empty command, or `max_workers` of 0.
    #[new]
    #[pyo3(signature = (command, max_workers = None))]
    fn new(py: Python<'_>, command: Vec<String>, max_workers: Option<usize>) -> PyResult<Self> {
        check_bound(max_workers)?;
        let pool = RuntimePool::new(worker_command(py, &command)?);
        Ok(Self {
            pool: Some(Arc::new(pool)),
            max_workers,
            command,
        })
    }

    /// Process ids of every worker alive now, idle or busy.
    fn pids(&self) -> Vec<u32> {
        self.pool
            .as_ref()
            .map(|pool| pool.pids())
            .unwrap_or_default()
    }

    /// Workers started since the pool was made, replacements included.
    #[getter]
    fn started(&self) -> u64 {
        self.pool.as_ref().map_or(0, |pool| pool.started())
    }

    /// The most tasks the pool's workers run at once (`None`: the cores).
    #[getter]
    fn max_workers(&self) -> Option<usize> {
        self.max_workers
    }

    /// The worker command, without `--serve`.
    #[getter]
    fn command(&self) -> Vec<String> {
        self.command.clone()
    }

    /// End every idle worker and reap it (closing its input, then killing
    /// one that has not exited within a grace period); the pool then
    /// refuses work. Closing again does nothing.
    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        if let Some(pool) = self.pool.take() {
            wait(py, move || async move { pool.shutdown().await })?;
        }
        Ok(())
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&mut self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "WorkerPool(command={:?}, max_workers={:?}, live={:?})",
            self.command,
            self.max_workers,
            self.pids()
        )
    }
}

fn check_bound(max_workers: Option<usize>) -> PyResult<()> {
    if max_workers == Some(0) {
        return Err(PyValueError::new_err(
            "max_workers must be at least 1, got 0",
        ));
    }
    Ok(())
}

/// A Python object with `run(envelope_json, plan, timeout) -> str`, as the
/// runtime's [`ForeignRunner`]: called on a blocking thread, with the GIL.
#[derive(Debug)]
struct PythonRunner {
    executor: Py<PyAny>,
    name: String,
    /// The executor's `serves_map_files`, read once (absent: false).
    serves: bool,
}

impl ForeignRunner for PythonRunner {
    fn run(
        &self,
        envelope: &Envelope,
        plan: Vec<u8>,
        timeout: Option<Duration>,
    ) -> Result<String, ForeignFailure> {
        let envelope = serde_json::to_string(envelope)
            .map_err(|err| ForeignFailure::Refused(format!("cannot write its envelope: {err}")))?;
        Python::attach(|py| {
            let plan = PyBytes::new(py, &plan);
            let timeout = timeout.map(|t| t.as_secs_f64());
            let line = self
                .executor
                .call_method1(py, "run", (envelope, plan, timeout))
                .and_then(|line| line.extract::<String>(py));
            line.map_err(|err| {
                let message = describe(py, &err);
                // Classified by the exception's type, which the executor
                // chose where it saw the failure.
                if err.is_instance_of::<WorkerLost>(py) {
                    ForeignFailure::WorkerLost(message)
                } else {
                    ForeignFailure::Refused(message)
                }
            })
        })
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn serves_map_files(&self) -> bool {
        self.serves
    }
}

/// `Type: message` of a Python exception.
fn describe(py: Python<'_>, err: &PyErr) -> String {
    let kind = err
        .get_type(py)
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "an exception".into());
    format!("{kind}: {}", err.value(py))
}

/// Runs queries' tasks on one executor, with the runtime's attempts,
/// timeouts and reruns.
#[pyclass(frozen, module = "dfx_engine._internal")]
pub struct Scheduler {
    scheduler: RuntimeScheduler,
}

#[pymethods]
impl Scheduler {
    /// A scheduler over `executor`: a `WorkerPool`, `"process"` (one
    /// `command ENVELOPE` process per attempt), or an object with
    /// `run(envelope_json, plan, timeout) -> str` returning the worker's
    /// response line, raising `WorkerLost` when its worker was lost.
    ///
    /// `max_workers` bounds the attempts in flight (default: the pool's
    /// bound, else the cores); `max_attempts` counts the first; an attempt
    /// running past `task_timeout` seconds is stopped and retried. With
    /// `speculate`, a task running that many times its stage's median gets
    /// a second attempt on an idle slot, and the first to publish wins.
    /// With `progress`, a query running past about a second shows the live
    /// progress line on stderr (the caller has found it a terminal), drawn
    /// over itself and erased when its tasks end.
    ///
    /// Raises:
    ///     ValueError: An unknown executor, `"process"` without a command, a
    ///         closed pool, or a bound, attempt count or timeout below 1 (0
    ///         for the timeout), or a speculation factor not above 1.
    #[new]
    #[pyo3(signature = (executor, *, command = None, max_workers = None, max_attempts = 3, task_timeout = None, speculate = None, progress = false))]
    fn new(
        executor: &Bound<'_, PyAny>,
        command: Option<Vec<String>>,
        max_workers: Option<usize>,
        max_attempts: u32,
        task_timeout: Option<f64>,
        speculate: Option<f64>,
        progress: bool,
    ) -> PyResult<Self> {
        let py = executor.py();
        let speculation = speculate
            .map(Speculation::after)
            .transpose()
            .map_err(PyValueError::new_err)?;
        check_bound(max_workers)?;
        if max_attempts < 1 {
            return Err(PyValueError::new_err(format!(
                "max_attempts must be at least 1, got {max_attempts}"
            )));
        }
        let task_timeout = match task_timeout {
            Some(seconds) if !(seconds > 0.0 && seconds.is_finite()) => {
                return Err(PyValueError::new_err(format!(
                    "task_timeout must be a positive number of seconds, got {seconds}"
                )));
            }
            seconds => seconds.map(Duration::from_secs_f64),
        };
        let mut bound = max_workers;
        let executor: Arc<dyn Executor> = if let Ok(pool) = executor.cast::<WorkerPool>() {
            let pool = pool.borrow();
            bound = bound.or(pool.max_workers);
            match &pool.pool {
                Some(pool) => Arc::clone(pool) as Arc<dyn Executor>,
                None => return Err(PyValueError::new_err("the worker pool is closed")),
            }
        } else if let Ok(kind) = executor.cast::<PyString>() {
            let kind = kind.to_str()?;
            let (true, Some(command)) = (kind == "process", command.as_deref()) else {
                return Err(PyValueError::new_err(format!(
                    "an executor is a WorkerPool, \"process\" with a command, or an object \
                     with run(envelope_json, plan, timeout); got {kind:?}{}",
                    if kind == "process" {
                        " without a command"
                    } else {
                        ""
                    }
                )));
            };
            Arc::new(ProcessExecutor::new(worker_command(py, command)?))
        } else if executor.hasattr("run")? {
            let name = executor.get_type().name()?.to_string();
            let serves = match executor.getattr("serves_map_files") {
                Ok(value) => value.is_truthy()?,
                Err(_) => false,
            };
            let runner = PythonRunner {
                executor: executor.clone().unbind(),
                name,
                serves,
            };
            Arc::new(ForeignExecutor::new(Arc::new(runner), task_timeout))
        } else {
            return Err(PyValueError::new_err(format!(
                "an executor is a WorkerPool, \"process\" with a command, or an object with \
                 run(envelope_json, plan, timeout); got {}",
                executor.get_type().name()?
            )));
        };
        let options = SchedulerOptions {
            max_workers: bound,
            max_attempts,
            task_timeout,
            progress: progress.then(|| {
                Arc::new(TerminalLine::new(Box::new(std::io::stderr()))) as Arc<dyn Progress>
            }),
            speculation,
        };
        Ok(Self {
            scheduler: RuntimeScheduler::new(executor, options),
        })
    }

    /// Run every task of `stages` (the query's, as `prepare` made them from
    /// its writers encoded in pre-order), stage after stage as their inputs
    /// are published; `spec_json` (with the codec ids the stages were
    /// encoded with) goes to every worker, and `task_dir` receives the plans
    /// (and the envelopes, when `envelope_files`).
    ///
    /// Raises:
    ///     ValueError: Stages publishing outside the spec's location.
    ///     RuntimeError: Failed tasks: every failure of the first wave that
    ///         had one, each naming stage and map; nothing after it ran.
    #[pyo3(signature = (spec_json, task_dir, stages, envelope_files = false))]
    fn run(
        &self,
        py: Python<'_>,
        spec_json: &str,
        task_dir: PathBuf,
        stages: &Bound<'_, PreparedStages>,
        envelope_files: bool,
    ) -> PyResult<QueryRun> {
        let plugin = plugin(py)?;
        let spec = SessionSpec::from_json(spec_json).map_err(from_runtime)?;
        let stages = stages.get().encoded().to_vec();
        let scheduler = self.scheduler.clone();
        let run = wait(py, move || async move {
            scheduler
                .run(plugin, &spec, &task_dir, stages, envelope_files)
                .await
        })?
        .map_err(from_runtime)?;
        Ok(QueryRun { run: Arc::new(run) })
    }

    fn __repr__(&self) -> String {
        format!("Scheduler(executor={:?})", self.scheduler.executor_name())
    }
}

impl Scheduler {
    /// The runtime's scheduler this one holds (its executor shared).
    pub fn runtime_scheduler(&self) -> RuntimeScheduler {
        self.scheduler.clone()
    }
}

impl From<Arc<RuntimeRun>> for QueryRun {
    fn from(run: Arc<RuntimeRun>) -> Self {
        Self { run }
    }
}

/// A query whose stages are all published: what ran, and the reruns its
/// root may still need.
#[pyclass(frozen, module = "dfx_engine._internal")]
pub struct QueryRun {
    run: Arc<RuntimeRun>,
}

#[pymethods]
impl QueryRun {
    /// The rows of the query's root: `read(ranges)`, called again from the
    /// start after each map whose output it found lost (as the plugin
    /// recorded for `location`) ran again, up to the query's attempts.
    /// `ranges` is the plugin's `shuffle_ranges` setting for the head's
    /// readers (where each bucket of the last stages lies), or `None`.
    ///
    /// Raises:
    ///     RuntimeError: With the read's own message when it failed for
    ///         good, or naming the lost map that could not run again.
    fn read_root(&self, py: Python<'_>, location: String, read: Py<PyAny>) -> PyResult<Py<PyAny>> {
        let plugin = plugin(py)?;
        let run = Arc::clone(&self.run);
        let read = Arc::new(read);
        let outcome = wait(py, move || async move {
            run.read_root(plugin, &location, |ranges| {
                let read = Arc::clone(&read);
                async move { call_python(move |py| read.call1(py, (ranges,))).await }
            })
            .await
        })?
        .map_err(from_runtime)?;
        match outcome {
            Ok((rows, _elapsed_ms)) => Ok(rows),
            Err(err) => {
                let final_error = PyRuntimeError::new_err(err.value(py).to_string());
                final_error.set_cause(py, Some(err));
                Err(final_error)
            }
        }
    }

    /// Every stage, in pre-order, as the plugin described it.
    #[getter]
    fn stages(&self) -> Vec<StageInfo> {
        self.run.stages().iter().map(StageInfo::from).collect()
    }

    /// The stage ids of each wave, in the order the waves ran.
    #[getter]
    fn waves(&self) -> Vec<Vec<u64>> {
        self.run.waves().to_vec()
    }

    /// `(stage_id, map)` of every task dispatched, in dispatch order.
    #[getter]
    fn tasks(&self) -> Vec<(u64, usize)> {
        self.run.tasks().to_vec()
    }

    /// What each task reported, by `(stage_id, map)`: `rows`, `bytes`,
    /// `elapsed_ms` (the worker's time), `wall_ms` (the driver's), `worker`
    /// (its pid, when known) and `attempt` (the one that succeeded).
    #[getter]
    fn reports<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let reports = PyDict::new(py);
        for (task, report) in self.run.reports() {
            let fields = PyDict::new(py);
            fields.set_item("rows", report.rows)?;
            fields.set_item("bytes", report.bytes)?;
            fields.set_item("elapsed_ms", report.elapsed_ms)?;
            fields.set_item("wall_ms", report.wall_ms)?;
            fields.set_item("worker", report.worker)?;
            fields.set_item("attempt", report.attempt)?;
            reports.set_item(task, fields)?;
        }
        Ok(reports)
    }

    /// Attempts made per task (1: it ran once), reruns included.
    #[getter]
    fn attempts(&self) -> BTreeMap<(u64, usize), u32> {
        self.run.attempts()
    }

    /// Why each retry or rerun happened, in order.
    #[getter]
    fn retries(&self) -> Vec<String> {
        self.run.retries()
    }

    /// The adaptive decisions made as stages became ready, in order: each
    /// a dict of `stage_id`, `planned_tasks`, `tasks` and `reason`.
    #[getter]
    fn decisions<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.run
            .decisions()
            .iter()
            .map(|decision| {
                let fields = PyDict::new(py);
                fields.set_item("stage_id", decision.stage_id)?;
                fields.set_item("planned_tasks", decision.planned_tasks)?;
                fields.set_item("tasks", decision.tasks)?;
                fields.set_item("reason", &decision.reason)?;
                Ok(fields)
            })
            .collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "QueryRun(stages={}, waves={:?}, tasks={})",
            self.run.stages().len(),
            self.run.waves(),
            self.run.tasks().len()
        )
    }
}

/// A driver's claim on its spec's shuffle location for one query (or on a
/// fresh one made under its root): a local directory locked and checked, an
/// S3 prefix probed and claimed, and where the query's plans and envelopes
/// go (`with ClaimedLocation(spec_json) as claim: ... claim.task_dir`).
/// Released on exit; `finish` first removes a location made under a root.
#[pyclass(module = "dfx_engine._internal")]
pub struct ClaimedLocation {
    claim: Option<RuntimeClaim>,
    task_dir: String,
    canonical: String,
    query_spec_json: String,
}

#[pymethods]
impl ClaimedLocation {
    /// Claim the location of the spec in `spec_json`.
    ///
    /// Raises:
    ///     ValueError: A spec without a location, one of another scheme,
    ///         one another driver holds, one holding stage output, or an S3
    ///         location the plugin cannot reach; each naming the location.
    #[new]
    fn new(py: Python<'_>, spec_json: &str) -> PyResult<Self> {
        let plugin = plugin(py)?;
        let spec = SessionSpec::from_json(spec_json).map_err(from_runtime)?;
        let given = spec.clone();
        let claim = wait(py, move || async move {
            RuntimeClaim::claim(plugin, &spec).await
        })?
        .map_err(from_runtime)?;
        Ok(Self {
            task_dir: claim.task_dir().display().to_string(),
            canonical: claim.canonical(),
            query_spec_json: claim.query_spec(&given).to_json(),
            claim: Some(claim),
        })
    }

    /// The spec as this query runs it: the claimed location as its
    /// `shuffle_dir`, and no root.
    #[getter]
    fn query_spec_json(&self) -> &str {
        &self.query_spec_json
    }

    /// End the claim: a location made under a root is removed once the
    /// answer was read (`answered`) unless the spec keeps it, and kept after
    /// a failure when it holds what the workers left. Returns the location
    /// when kept for a failure, for the error to name; again: `None`.
    ///
    /// Raises:
    ///     ValueError: A location that cannot be listed or removed.
    fn finish(&mut self, py: Python<'_>, answered: bool) -> PyResult<Option<String>> {
        let Some(claim) = self.claim.take() else {
            return Ok(None);
        };
        wait(py, move || async move { claim.finish(answered).await })?.map_err(from_runtime)
    }

    /// Where the query's encoded stages and envelope files go.
    #[getter]
    fn task_dir(&self) -> &str {
        &self.task_dir
    }

    /// The location in its one spelling.
    #[getter]
    fn canonical(&self) -> &str {
        &self.canonical
    }

    /// Whether the claim is still held.
    #[getter]
    fn held(&self) -> bool {
        self.claim.is_some()
    }

    /// Let the location go (its lock, its scratch directory); again: nothing.
    fn release(&mut self) {
        self.claim = None;
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&mut self, _args: &Bound<'_, PyTuple>) -> bool {
        self.release();
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "ClaimedLocation({:?}, held={})",
            self.canonical,
            self.claim.is_some()
        )
    }
}
