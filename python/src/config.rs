//! `DfxEngineConfig`: the plugin's config extension for a `SessionConfig`.

use datafusion::config::ExtensionOptions;
use datafusion_ffi::config::extension_options::FFI_ExtensionOptions;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::capsule;
use crate::plugin::plugin;

/// The plugin's config extension (`dfx_engine.*`), for
/// `SessionConfig().with_extension(DfxEngineConfig(shuffle_dir=...))`.
///
/// It must be on the config before the context is built: the planner reads
/// the shuffle directory from the session's config, and an empty directory
/// means "do not distribute" (no stage is inserted).
#[pyclass(frozen, module = "dfx_engine._internal")]
pub struct DfxEngineConfig {
    options: FFI_ExtensionOptions,
    shuffle_dir: String,
}

#[pymethods]
impl DfxEngineConfig {
    /// The plugin's options with `shuffle_dir` set.
    #[new]
    #[pyo3(signature = (shuffle_dir = String::new()))]
    fn new(py: Python<'_>, shuffle_dir: String) -> PyResult<Self> {
        let plugin = plugin(py)?;
        let mut options = plugin
            .config_options()
            .map_err(crate::extension::runtime_error)?;
        let key = format!("{}.shuffle_dir", plugin.config_prefix());
        options.set(&key, &shuffle_dir).map_err(|err| {
            PyValueError::new_err(format!(
                "dfx_engine: cannot set {key}={shuffle_dir:?}: {err}"
            ))
        })?;
        Ok(Self {
            options,
            shuffle_dir,
        })
    }

    /// The shuffle directory this config carries ("" = do not distribute).
    #[getter]
    fn shuffle_dir(&self) -> &str {
        &self.shuffle_dir
    }

    /// A `datafusion_extension_options` capsule.
    fn __datafusion_extension_options__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        capsule::export(py, self.options.clone(), c"datafusion_extension_options")
    }

    fn __repr__(&self) -> String {
        format!("DfxEngineConfig(shuffle_dir={:?})", self.shuffle_dir)
    }
}
