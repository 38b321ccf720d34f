//! The worker's side of the task protocol, around a Python handler that
//! decodes and executes a stage with a datafusion-python session.
//!
//! ```text
//! serve:          stdin line ─► Request ─► Envelope ─► TaskInput (plan read)
//! run_task_file:  envelope file ─────────► Envelope ─► TaskInput
//! run_task_value: envelope JSON + plan bytes (Ray) ──► TaskInput
//!                   │ the plugin's failure record for the location cleared
//!                   ▼
//!                 handler(task) ─► (rows, bytes) or an exception
//!                   │
//!                   ▼
//!                 Response::of_outcome: the report, or the error classed by
//!                 what the plugin recorded while the task ran ─► one line
//! ```
//!
//! The protocol (its serve loop, the read of an envelope file, the writing
//! of a response line), its checks and the classification of failures are
//! the runtime's (`dfx_runtime::protocol`); the handler only runs the task.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::os::fd::{BorrowedFd, RawFd};
use std::path::Path;
use std::time::{Instant, SystemTime};

use dfx_abi::{FailureClass, MapLayout};
use dfx_runtime::flight::{MapServer, serving};
use dfx_runtime::protocol::report::clear_recorded;
use dfx_runtime::protocol::serve::{read_task_file, serve_blocking, write_response};
use dfx_runtime::protocol::{
    Envelope, Placement, Published, Response, TaskError, TaskInput, check_task,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::error::from_runtime;
use crate::plugin::plugin;

/// One task as the handler receives it: the envelope's fields and the
/// encoded stage, read for it.
#[pyclass(frozen, module = "dfx_engine._internal", name = "Task")]
pub struct Task {
    input: TaskInput,
    plan: Py<PyBytes>,
    spec_json: String,
}

#[pymethods]
impl Task {
    /// The session spec, as JSON in its one spelling (a key for a cache of
    /// sessions).
    #[getter]
    fn spec_json(&self) -> &str {
        &self.spec_json
    }

    /// The encoded stage.
    #[getter]
    fn plan(&self, py: Python<'_>) -> Py<PyBytes> {
        self.plan.clone_ref(py)
    }

    /// The stage's id.
    #[getter]
    fn stage_id(&self) -> u64 {
        self.input.envelope.stage_id
    }

    /// The partition of the stage's plan to execute: the map's own, or, for
    /// a map an adaptive decision added to the stage, the planned map it
    /// was made from (the writer publishes it under its own number).
    #[getter]
    fn map(&self) -> usize {
        self.input.envelope.planned_map()
    }

    /// Which attempt of the task this is (0: the first).
    #[getter]
    fn attempt(&self) -> u32 {
        self.input.envelope.attempt
    }

    /// When the driver wrote the plan file, in nanoseconds since the epoch;
    /// `None` for a plan handed over by value. A kept stage is reused only
    /// for the same bytes written at the same time.
    #[getter]
    fn written_ns(&self) -> Option<u64> {
        let written = self.input.written?;
        let since = written.duration_since(SystemTime::UNIX_EPOCH).ok()?;
        u64::try_from(since.as_nanos()).ok()
    }

    /// `stage S map M`, as the task's messages begin.
    #[getter]
    fn name(&self) -> String {
        self.input.name()
    }

    /// The checks before anything is decoded, in a session carrying
    /// `codec_ids`: its codecs are the driver's, the stage is the
    /// envelope's and publishes into its location, the map exists; with
    /// `vet`, the plugin's vetting of the stage too.
    ///
    /// Raises:
    ///     ValueError: The first check that failed, naming the task.
    fn check(&self, py: Python<'_>, codec_ids: Vec<String>, vet: bool) -> PyResult<()> {
        let plugin = plugin(py)?;
        py.detach(|| check_task(plugin, &self.input, &codec_ids, vet))
            .map_err(PyValueError::new_err)
    }

    /// The encoded stage with its writer's input sealed, so the plugin
    /// runs every operator of it, under the spec's memory limit: the pool a
    /// datafusion-python session's operators would lose crossing into the
    /// plugin and back. Ask after :meth:`check`, which reads the stage as
    /// shipped.
    ///
    /// Raises:
    ///     ValueError: The plugin cannot seal the stage, naming the task.
    fn sealed_plan(&self, py: Python<'_>) -> PyResult<Py<PyBytes>> {
        let plugin = plugin(py)?;
        let plan = self.plan.bind(py).as_bytes().to_vec();
        let sealed = py
            .detach(|| plugin.seal_stage_input(&plan))
            .map_err(|err| PyValueError::new_err(format!("{}: {err}", self.input.name())))?;
        Ok(PyBytes::new(py, &sealed).unbind())
    }

    /// Whether each map of the stage runs a slice of several partitions, as
    /// the plugin reads it from the stage's writer: such a map runs its
    /// partitions at once on the plugin's runtime, where only the plugin's
    /// own operators may run, so the stage is decoded sealed
    /// (:meth:`sealed_plan`). Ask after :meth:`check`.
    ///
    /// Raises:
    ///     ValueError: The plugin cannot read the stage's writer, or was
    ///         built before it could, naming the task.
    fn runs_slices(&self, py: Python<'_>) -> PyResult<bool> {
        let plugin = plugin(py)?;
        let plan = self.plan.bind(py).as_bytes().to_vec();
        let name = self.input.name();
        match py.detach(|| plugin.stage_runs_slices(&plan)) {
            Some(Ok(slices)) => Ok(slices),
            Some(Err(err)) => Err(PyValueError::new_err(format!("{name}: {err}"))),
            None => Err(PyValueError::new_err(format!(
                "{name}: the plugin {} cannot tell whether a stage's maps run slices; rebuild \
                 it with this package",
                plugin.path().display()
            ))),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Task({}, attempt {})",
            self.input.name(),
            self.input.envelope.attempt
        )
    }
}

/// The response to `input`: the handler's outcome, a failure classed by
/// what the plugin recorded for the task's location while it ran.
fn answer(py: Python<'_>, handler: &Bound<'_, PyAny>, input: TaskInput) -> Response {
    let envelope = input.envelope.clone();
    let plugin = match plugin(py) {
        Ok(plugin) => plugin,
        Err(err) => return unclassified(&envelope, err.value(py).to_string()),
    };
    // A record left by an earlier task must not class this one.
    clear_recorded(plugin, &envelope);
    let started = Instant::now();
    let outcome = run_handler(py, handler, input);
    let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
    Response::of_outcome(plugin, &envelope, outcome, elapsed_ms)
}

fn run_handler(
    py: Python<'_>,
    handler: &Bound<'_, PyAny>,
    input: TaskInput,
) -> Result<Published, String> {
    let spec_json = input.envelope.spec.to_json();
    let plan = PyBytes::new(py, &input.plan).unbind();
    let task = Task {
        input,
        plan,
        spec_json,
    };
    let message = |err: PyErr| err.value(py).to_string();
    let returned = handler.call1((task,)).map_err(message)?;
    let (rows, bytes, layout) = returned
        .extract::<(usize, Option<u64>, Option<LayoutTuple>)>()
        .map_err(|_| {
            format!(
                "the worker's handler returned {returned}, not (rows, bytes, (offsets, \
                 lengths, rows, size, e_tag, keys) or None)"
            )
        })?;
    let layout = layout.map(|(offsets, bytes, rows, size, e_tag, keys)| MapLayout {
        first_bucket: 0,
        offsets,
        bytes,
        rows,
        size,
        e_tag,
        keys,
        owner: None,
    });
    Ok(Published {
        rows,
        bytes,
        layout,
    })
}

/// A map's layout as the Python handler returns it: per bucket its
/// offsets, lengths and rows, then the file's size, its entity tag and
/// where its key summary lies (see [`MapLayout`]).
type LayoutTuple = (
    Vec<u64>,
    Vec<u64>,
    Vec<u64>,
    u64,
    Option<String>,
    Option<(u64, u64)>,
);

/// A failure of `envelope`'s task before the plugin could be asked: final.
fn unclassified(envelope: &Envelope, error: String) -> Response {
    Response::Error(TaskError {
        stage_id: Some(envelope.stage_id),
        partition: Some(envelope.partition),
        error,
        retry: FailureClass::Final,
    })
}

/// The response to the task of `envelope`, its plan read from its file.
fn answer_envelope(py: Python<'_>, handler: &Bound<'_, PyAny>, envelope: Envelope) -> Response {
    let read = match plugin(py) {
        Ok(plugin) => {
            let envelope = envelope.clone();
            py.detach(move || TaskInput::read(plugin, envelope))
        }
        Err(err) => return unclassified(&envelope, err.value(py).to_string()),
    };
    match read {
        Ok(input) => answer(py, handler, input),
        Err(err) => match plugin(py) {
            Ok(plugin) => Response::of_outcome(
                plugin,
                &envelope,
                Err(format!("{}: {err}", task_name(&envelope))),
                0.0,
            ),
            Err(_) => unclassified(&envelope, err.to_string()),
        },
    }
}

fn task_name(envelope: &Envelope) -> String {
    format!("stage {} map {}", envelope.stage_id, envelope.partition)
}

/// Flush Python's `sys.stdout` and `sys.stderr`: what a task printed lands
/// before its response, not after it.
fn flush_python(py: Python<'_>) {
    if let Ok(sys) = py.import("sys") {
        for stream in ["stdout", "stderr"] {
            if let Ok(stream) = sys.getattr(stream) {
                let _ = stream.call_method0("flush");
            }
        }
    }
}

/// Serve tasks: read one request per line of standard input, call
/// `handler(task)` for each, and write exactly one response line to the
/// file descriptor `responses_fd`, flushed. A failed task does not end the
/// loop; the end of input does, with status 0. The loop is the runtime's
/// (`dfx_runtime::protocol::serve`), the same as the Rust host's worker;
/// this function brings the lines, the handler and the descriptor.
///
/// The responses go to their own descriptor (the caller's copy of the real
/// stdout, with fd 1 pointed at stderr), so a library or a UDF that prints
/// cannot put a line into the protocol.
///
/// Raises:
///     OSError: When stdin cannot be read or the responses cannot be
///         written (the driver is gone).
#[pyfunction]
pub fn serve(py: Python<'_>, handler: &Bound<'_, PyAny>, responses_fd: RawFd) -> PyResult<i32> {
    // SAFETY: the caller hands over a descriptor it holds open for this
    // call; it is only borrowed here to be duplicated, and the duplicate is
    // what is written and closed.
    let owned = unsafe { BorrowedFd::borrow_raw(responses_fd) }.try_clone_to_owned()?;
    let mut responses = Detached {
        py,
        inner: std::fs::File::from(owned),
    };
    let stdin = std::io::stdin();
    let mut line = String::new();
    let requests = std::iter::from_fn(|| {
        line.clear();
        // Without the GIL: a serving worker waits here between tasks.
        match py.detach(|| stdin.lock().read_line(&mut line)) {
            Ok(0) => None,
            Ok(_) => Some(Ok(line.clone())),
            Err(err) => Some(Err(err)),
        }
    });
    // Without a plugin, each task fails saying why (`answer_envelope`).
    let served = plugin(py).ok();
    serve_blocking(served, requests, &mut responses, |envelope| {
        let response = answer_envelope(py, handler, envelope);
        // What the task printed lands before its response, not after it.
        flush_python(py);
        response
    })
    .map_err(from_runtime)?;
    Ok(0)
}

/// A writer that releases the GIL while it writes: a driver slow to read
/// its pipe blocks this thread only, not every Python thread.
struct Detached<'py, W> {
    py: Python<'py>,
    inner: W,
}

impl<W: Write + Send> Write for Detached<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.py.detach(|| self.inner.write(buf))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.py.detach(|| self.inner.flush())
    }
}

/// Run the task of the envelope file `path` (process mode): the response is
/// the last line of stdout, and a failed task also writes its error to
/// stderr and exits with status 1 (the returned status).
#[pyfunction]
pub fn run_task_file(py: Python<'_>, path: &str, handler: &Bound<'_, PyAny>) -> i32 {
    let response = match py.detach(|| read_task_file(Path::new(path))) {
        Ok(envelope) => answer_envelope(py, handler, envelope),
        Err(unknown) => unknown,
    };
    flush_python(py);
    if let Response::Error(error) = &response {
        eprintln!("dfx worker: {}", error.error);
    }
    // Last, and flushed: the driver reads only the last non-empty line.
    let written = write_response(&mut std::io::stdout().lock(), &response);
    if let Err(err) = &written {
        eprintln!("dfx worker: {err}");
    }
    match (written, response.is_error()) {
        (Ok(()), false) => 0,
        _ => 1,
    }
}

/// Run the task of `envelope_json` on the encoded stage `plan`, both handed
/// over by value (a Ray task's node need not see the driver's disk); the
/// response line. With `map_server` (`host:port`), the task runs as a
/// serving worker's does: under `local` or `both` shuffle durability, this
/// process's map server (started there, unless the spec names where)
/// serves its map file, and its report names the server.
#[pyfunction]
#[pyo3(signature = (envelope_json, plan, handler, map_server=None))]
pub fn run_task_value(
    py: Python<'_>,
    envelope_json: &str,
    plan: Vec<u8>,
    handler: &Bound<'_, PyAny>,
    map_server: Option<String>,
) -> String {
    let mut envelope: Envelope = match serde_json::from_str(envelope_json) {
        Ok(envelope) => envelope,
        Err(err) => {
            return Response::unknown_task(format!("cannot read the task's envelope: {err}"))
                .to_line();
        }
    };
    let plugin = match plugin(py) {
        Ok(plugin) => plugin,
        Err(err) => return unclassified(&envelope, err.value(py).to_string()).to_line(),
    };
    let served = match map_server {
        Some(bind) => {
            envelope.spec.map_server_bind.get_or_insert(bind);
            match serving::before_task(Some(plugin), &mut envelope) {
                Ok(served) => served,
                Err(error) => return Response::of_final(&envelope, error).to_line(),
            }
        }
        None => None,
    };
    // A stage cut for its maps arrives as its stage file (or this map's
    // copy of it): put together for this map, as a read from the file is.
    let read = {
        let envelope = envelope.clone();
        py.detach(move || TaskInput::from_bytes(plugin, envelope, plan))
    };
    let response = match read {
        Ok(input) => answer(py, handler, input),
        Err(err) => Response::of_outcome(
            plugin,
            &envelope,
            Err(format!("{}: {err}", task_name(&envelope))),
            0.0,
        ),
    };
    serving::sign(response, served.as_ref()).to_line()
}

/// What this process's map server sent since it started: `(streams,
/// bytes, refused)`; `None` when it has none.
#[pyfunction]
pub fn map_server_counts() -> Option<(u64, u64, u64)> {
    MapServer::started().map(|server| {
        let counts = server.counts();
        (counts.streams, counts.bytes, counts.refused)
    })
}

/// Start this process's map server on `bind` (`host:port`, port 0 for
/// any), once; its address (`http://host:port`), which a later call
/// answers whatever its `bind`.
///
/// Raises:
///     ValueError: An address that does not parse, is unspecified, or
///         cannot be bound.
#[pyfunction]
pub fn start_map_server(py: Python<'_>, bind: &str) -> PyResult<String> {
    let plugin = plugin(py)?;
    MapServer::running(plugin, bind)
        .map(|server| server.address().to_string())
        .map_err(PyValueError::new_err)
}

/// Which task an envelope names, where it writes and where its input lies
/// (the runtime's `Placement`): what a foreign executor places it by,
/// without decoding the rest of the envelope.
#[pyclass(frozen, module = "dfx_engine._internal")]
pub struct TaskPlacement {
    /// The task's stage.
    #[pyo3(get)]
    stage_id: u64,
    /// The task's map.
    #[pyo3(get)]
    map: usize,
    /// The attempt (0 for the first).
    #[pyo3(get)]
    attempt: u32,
    /// The shuffle location the spec names, or empty.
    #[pyo3(get)]
    location: String,
    /// Bytes of the task's input each map server holds, by address.
    #[pyo3(get)]
    input_by_owner: BTreeMap<String, u64>,
}

/// The placement of the task whose envelope is `envelope_json`.
///
/// Raises:
///     ValueError: An envelope without a spec, stage or map, or layouts that
///         are not the driver's.
#[pyfunction]
pub fn task_placement(envelope_json: &str) -> PyResult<TaskPlacement> {
    let placement = Placement::of(envelope_json).map_err(from_runtime)?;
    Ok(TaskPlacement {
        stage_id: placement.stage_id,
        map: placement.map,
        attempt: placement.attempt,
        location: placement.location,
        input_by_owner: placement.input_by_owner,
    })
}
