//! Errors as Python sees them: one place that turns the plugin's and the
//! runtime's errors into exceptions.
//!
//! Every other module imports from here and this module imports none of
//! them, so no two modules import each other through an error helper.
//!
//! | Rust error                                   | Python exception |
//! |----------------------------------------------|------------------|
//! | a DataFusion error from the plugin           | `RuntimeError`   |
//! | `RuntimeError::Invalid` (spec, location, stages) | `ValueError` |
//! | `RuntimeError::Io`, `RuntimeError::Json`     | `OSError`        |
//! | failed tasks, a failed read of the root      | `RuntimeError`   |
//!
//! [`WorkerLost`] goes the other way: a foreign executor raises it to say
//! that the worker, its process or its node was lost, so that the task is
//! tried again.

use dfx_runtime::RuntimeError;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

pyo3::create_exception!(
    _internal,
    WorkerLost,
    pyo3::exceptions::PyException,
    "Raised by a foreign executor's `run` when the worker running the task, \
     its process or its node was lost, or the attempt timed out: the task is \
     tried again. Any other exception fails the task for good."
);

/// A DataFusion error from the plugin, as a Python `RuntimeError`.
pub fn runtime_error(err: datafusion::common::DataFusionError) -> PyErr {
    PyRuntimeError::new_err(err.to_string())
}

/// A runtime error as the Python exception the module's table names.
pub fn from_runtime(err: RuntimeError) -> PyErr {
    match err {
        RuntimeError::Invalid(message) => PyValueError::new_err(message),
        err @ (RuntimeError::Io { .. } | RuntimeError::Json { .. }) => {
            PyOSError::new_err(err.to_string())
        }
        err @ (RuntimeError::Workers { .. } | RuntimeError::Root(_)) => {
            PyRuntimeError::new_err(err.to_string())
        }
    }
}
