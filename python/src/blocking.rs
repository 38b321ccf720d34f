//! The module's one tokio runtime, and waiting on it from Python.
//!
//! ```text
//! Python thread ──detach (GIL released)──► runtime.block_on(future)
//!                                            │ every 100 ms: attach, check signals
//!                                            │   (Ctrl-C drops the future: its
//!                                            │    workers are killed with it)
//!                                            ▼
//!                       blocking threads ──attach──► Python callables
//!                                                    (a foreign executor's run,
//!                                                     the read of the root)
//! ```
//!
//! One runtime for the whole process: a worker pool belongs to the runtime
//! that started its workers (their pipes are registered with it), and a
//! pool serves query after query.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// How often a wait looks for a signal (Ctrl-C) to raise in Python.
const SIGNAL_POLL: Duration = Duration::from_millis(100);

static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();

/// The process-wide runtime, started on first use.
///
/// # Errors
///
/// `RuntimeError` when the runtime cannot be started (no threads left).
pub fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    if let Some(runtime) = RUNTIME.get() {
        return Ok(runtime);
    }
    let built = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("dfx-runtime")
        .build()
        .map_err(|err| {
            PyRuntimeError::new_err(format!("dfx_engine cannot start its runtime: {err}"))
        })?;
    // Two threads may both build one; the loser's is dropped unused.
    Ok(RUNTIME.get_or_init(|| built))
}

/// Run the future `make` returns to completion on the runtime, with the GIL
/// released. The future is made on the waiting thread and never leaves it,
/// so it need not be `Send` (the scheduler's futures are not provably so).
///
/// A signal Python would raise for (Ctrl-C's `KeyboardInterrupt`) is raised
/// within [`SIGNAL_POLL`]: the future is dropped first, and with it every
/// worker it owns (they are started `kill_on_drop`), so none outlives an
/// interrupted driver.
///
/// # Errors
///
/// The exception of the signal's handler.
pub fn wait<M, F>(py: Python<'_>, make: M) -> PyResult<F::Output>
where
    M: FnOnce() -> F + Send,
    F: Future,
    F::Output: Send,
{
    let runtime = runtime()?;
    py.detach(|| {
        let future = make();
        runtime.block_on(async {
            let mut future = std::pin::pin!(future);
            let mut poll = tokio::time::interval(SIGNAL_POLL);
            loop {
                tokio::select! {
                    output = &mut future => return Ok(output),
                    _ = poll.tick() => Python::attach(|py| py.check_signals())?,
                }
            }
        })
    })
}

/// Call `f` with the GIL on a blocking thread of the runtime, from async
/// code: a Python callable may itself block on another runtime (DataFusion's
/// own, when it executes a plan), which tokio refuses on a thread that is
/// driving async code.
///
/// # Errors
///
/// What `f` returned, or `RuntimeError` when its thread panicked.
pub async fn call_python<T, F>(f: F) -> PyResult<T>
where
    F: for<'py> FnOnce(Python<'py>) -> PyResult<T> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(move || Python::attach(f))
        .await
        .map_err(|err| {
            PyRuntimeError::new_err(format!("a Python callback did not finish: {err}"))
        })?
}
