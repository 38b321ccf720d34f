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
/// means "do not distribute" (no stage is inserted). `split` chooses where
/// the planner cuts (`exchange`, the plugin's default, or `aggregate`);
/// `None` leaves the plugin's default in place.
#[pyclass(frozen, module = "dfx_engine._internal")]
pub struct DfxEngineConfig {
    options: FFI_ExtensionOptions,
    shuffle_dir: String,
    split: Option<String>,
}

#[pymethods]
impl DfxEngineConfig {
    /// The plugin's options with `shuffle_dir` (and `split`, when given) set.
    #[new]
    #[pyo3(signature = (shuffle_dir = String::new(), split = None))]
    fn new(py: Python<'_>, shuffle_dir: String, split: Option<String>) -> PyResult<Self> {
        let plugin = plugin(py)?;
        let mut options = plugin
            .config_options()
            .map_err(crate::error::runtime_error)?;
        let prefix = plugin.config_prefix();
        let mut set = |name: &str, value: &str| {
            let key = format!("{prefix}.{name}");
            // The plugin validates the value (an unknown split mode is
            // refused here, not at planning time).
            options.set(&key, value).map_err(|err| {
                PyValueError::new_err(format!("dfx_engine: cannot set {key}={value:?}: {err}"))
            })
        };
        set("shuffle_dir", &shuffle_dir)?;
        if let Some(split) = &split {
            set("split", split)?;
        }
        Ok(Self {
            options,
            shuffle_dir,
            split,
        })
    }

    /// The shuffle directory this config carries ("" = do not distribute).
    #[getter]
    fn shuffle_dir(&self) -> &str {
        &self.shuffle_dir
    }

    /// The split mode this config sets, or `None` for the plugin's default.
    #[getter]
    fn split(&self) -> Option<&str> {
        self.split.as_deref()
    }

    /// A `datafusion_extension_options` capsule.
    fn __datafusion_extension_options__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        capsule::export(py, self.options.clone(), c"datafusion_extension_options")
    }

    fn __repr__(&self) -> String {
        format!(
            "DfxEngineConfig(shuffle_dir={:?}, split={:?})",
            self.shuffle_dir, self.split
        )
    }
}
