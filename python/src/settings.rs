//! The DataFusion settings every dfx session of this package is built with.
//!
//! They are the plugin's (its export `session_settings`): what a session
//! must set for the plugin's stages to divide work as planned is the
//! plugin's knowledge, so neither host spells them; `dfx_engine.session`
//! applies whatever this returns.

use std::collections::BTreeMap;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::plugin::plugin;

/// Each setting a dfx session needs, by its DataFusion key, as the plugin
/// states them.
///
/// Raises:
///     ImportError: If the plugin cannot be loaded.
///     RuntimeError: If the plugin cannot state its settings (built before
///         it could, or its answer does not parse).
#[pyfunction]
pub fn session_settings(py: Python<'_>) -> PyResult<BTreeMap<String, String>> {
    let settings = plugin(py)?
        .session_settings()
        .map_err(PyRuntimeError::new_err)?;
    Ok(settings.into_iter().collect())
}
