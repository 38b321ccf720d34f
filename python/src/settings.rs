//! The DataFusion settings every dfx session of this package is built with.
//!
//! They are the plugin's (its export `session_settings`): what a session
//! must set for the plugin's stages to divide work as planned is the
//! plugin's knowledge, so neither host spells them; `dfx_engine.session`
//! applies whatever this returns.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use dfx_runtime::SessionSpec;

use crate::error::from_runtime;
use crate::plugin::plugin;

/// Each DataFusion setting a session built from the spec `spec_json`
/// makes, in order: the plugin's (what each stage needs to run alone),
/// then the spec's `datafusion_options`.
///
/// Raises:
///     ImportError: If the plugin cannot be loaded.
///     RuntimeError: If the plugin cannot state its settings (built before
///         it could, or its answer does not parse).
///     ValueError: If the spec is not one, or sets a key the plugin states.
#[pyfunction]
pub fn session_settings(py: Python<'_>, spec_json: &str) -> PyResult<Vec<(String, String)>> {
    let stated = plugin(py)?
        .session_settings()
        .map_err(PyRuntimeError::new_err)?;
    let spec = SessionSpec::from_json(spec_json).map_err(from_runtime)?;
    spec.datafusion_settings(stated).map_err(from_runtime)
}
