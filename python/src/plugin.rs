//! Finding and loading the plugin file, once per process.
//!
//! Where the file is looked for, in order:
//! 1. `DFX_PLUGIN`, when set and non-empty;
//! 2. next to this extension module, inside the installed `dfx_engine`
//!    package, where the wheel bundles it.
//!
//! The library stays loaded for the life of the process: every FFI struct it
//! hands out points into it.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use dfx_abi::Plugin;
use pyo3::exceptions::{PyImportError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The environment variable naming the plugin file, overriding the bundled one.
pub const PLUGIN_ENV: &str = "DFX_PLUGIN";

static PLUGIN: OnceLock<Plugin> = OnceLock::new();

/// The loaded plugin, loading it on first use.
///
/// # Errors
///
/// `ImportError` saying where the file was looked for, or which handshake
/// check refused it.
pub fn plugin(py: Python<'_>) -> PyResult<&'static Plugin> {
    if let Some(plugin) = PLUGIN.get() {
        return Ok(plugin);
    }
    let path = locate(py)?;
    let loaded = dfx_abi::load(&path).map_err(|err| {
        PyImportError::new_err(format!("dfx_engine cannot use the dfx plugin: {err}"))
    })?;
    // Two threads may both load; `load` of one file twice yields the same
    // library, so whichever wins is as good as the other.
    Ok(PLUGIN.get_or_init(|| loaded))
}

fn locate(py: Python<'_>) -> PyResult<PathBuf> {
    if let Some(value) = std::env::var_os(PLUGIN_ENV).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(value);
        if !path.is_file() {
            return Err(PyImportError::new_err(format!(
                "dfx_engine: {PLUGIN_ENV} names {}, which is not a file",
                path.display()
            )));
        }
        return Ok(path);
    }
    let bundled = bundled_path(py)?;
    if !bundled.is_file() {
        return Err(PyImportError::new_err(format!(
            "dfx_engine: no dfx plugin found. {PLUGIN_ENV} is not set and the package has no \
             bundled plugin at {}. Install a wheel that bundles it, or set {PLUGIN_ENV} to the \
             path of {}",
            bundled.display(),
            dfx_abi::plugin_file_name()
        )));
    }
    Ok(bundled)
}

/// Where the wheel puts the plugin: beside the package's `__init__.py`.
fn bundled_path(py: Python<'_>) -> PyResult<PathBuf> {
    let package = py.import("dfx_engine")?;
    let init: String = package.getattr("__file__")?.extract()?;
    let dir = Path::new(&init).parent().ok_or_else(|| {
        PyRuntimeError::new_err(format!("dfx_engine: package file {init} has no directory"))
    })?;
    Ok(dir.join(dfx_abi::plugin_file_name()))
}

/// Path of the plugin file this process loaded.
#[pyfunction]
pub fn plugin_path(py: Python<'_>) -> PyResult<String> {
    Ok(plugin(py)?.path().to_string_lossy().into_owned())
}

/// The plugin's package name.
#[pyfunction]
pub fn plugin_name(py: Python<'_>) -> PyResult<&'static str> {
    Ok(plugin(py)?.name())
}

/// The plugin's package version.
#[pyfunction]
pub fn plugin_version(py: Python<'_>) -> PyResult<&'static str> {
    Ok(plugin(py)?.version())
}

/// The dfx ABI version the plugin declares.
#[pyfunction]
pub fn abi_version(py: Python<'_>) -> PyResult<u32> {
    Ok(plugin(py)?.abi_version())
}

/// The `datafusion-ffi` major the plugin was built with.
#[pyfunction]
pub fn datafusion_ffi_major(py: Python<'_>) -> PyResult<u64> {
    Ok(plugin(py)?.datafusion_ffi_major())
}

/// The `datafusion-ffi` major this module was built with (what it checked
/// the plugin against).
#[pyfunction]
pub fn host_datafusion_ffi_major() -> u64 {
    dfx_abi::host_datafusion_ffi_major()
}

/// The stage root's name (`ShuffleWriterExec`): a plan's stages are the nodes
/// whose display contains it.
#[pyfunction]
pub fn stage_node_name(py: Python<'_>) -> PyResult<&'static str> {
    Ok(plugin(py)?.stage_node_name())
}

/// The consumer node's name (`ShuffleReaderExec`), or `None` for a plugin
/// without one.
#[pyfunction]
pub fn reader_node_name(py: Python<'_>) -> PyResult<Option<&'static str>> {
    Ok(plugin(py)?.reader_node_name())
}

/// The prefix of the plugin's config extension (`dfx_engine`).
#[pyfunction]
pub fn config_prefix(py: Python<'_>) -> PyResult<&'static str> {
    Ok(plugin(py)?.config_prefix())
}

/// The last bytes of every published map file, and the length of the
/// footer they end (the commit marker's length, then the magic): what a
/// reader of a shuffle directory needs to find a map's marker.
#[pyfunction]
pub fn map_footer() -> (&'static [u8], u64) {
    (dfx_abi::MAP_FOOTER_MAGIC, dfx_abi::MAP_FOOTER_BYTES)
}

/// The id of the plugin's physical codec (`dfx_engine.physical.v5`).
#[pyfunction]
pub fn physical_codec_id(py: Python<'_>) -> PyResult<&'static str> {
    Ok(plugin(py)?.codec_id())
}

/// The id of the `index`-th stage in pre-order.
#[pyfunction]
#[pyo3(signature = (index = 0))]
pub fn stage_id(py: Python<'_>, index: usize) -> PyResult<u64> {
    Ok(plugin(py)?.stage_id(index))
}

/// The file of map task `map` of stage `stage` under `dir`
/// (`stage-S/K-map-M.arrow`): every bucket of the map, closed by its commit
/// marker, so the map is published once it exists.
#[pyfunction]
pub fn map_path(py: Python<'_>, dir: PathBuf, stage: u64, map: usize) -> PyResult<String> {
    Ok(plugin(py)?
        .map_path(&dir, stage, map)
        .to_string_lossy()
        .into_owned())
}

/// The map's file, as `map_path`: kept for callers that ask which file says
/// the map is published.
#[pyfunction]
pub fn marker_path(py: Python<'_>, dir: PathBuf, stage: u64, map: usize) -> PyResult<String> {
    map_path(py, dir, stage, map)
}

/// The map's file, as `map_path` (`bucket` changes nothing: every bucket of
/// a map is in its one file): kept for callers that ask which file holds a
/// bucket.
///
/// # Errors
///
/// `RuntimeError` when the plugin predates the exchange's file layout.
#[pyfunction]
pub fn bucket_path(
    py: Python<'_>,
    dir: PathBuf,
    stage: u64,
    map: usize,
    bucket: usize,
) -> PyResult<String> {
    let path = plugin(py)?
        .bucket_path(&dir, stage, map, bucket)
        .map_err(crate::error::runtime_error)?;
    Ok(path.to_string_lossy().into_owned())
}

/// The failure classes the plugin recorded for the shuffle `location` since
/// they were last taken, as the plugin's JSON array (`["io", {"lost": [2,
/// 3]}]`); taking them forgets them. A trailing `/` or `file://` names the
/// same location.
///
/// # Errors
///
/// `RuntimeError` when the plugin's answer is not such an array, naming
/// the plugin file.
#[pyfunction]
pub fn take_failures(py: Python<'_>, location: &str) -> PyResult<String> {
    plugin(py)?
        .take_failures_json(location)
        .map_err(PyRuntimeError::new_err)
}

/// Glob, relative to a shuffle directory, matching any stage output entry
/// (`stage-*`).
#[pyfunction]
pub fn partition_glob(py: Python<'_>) -> PyResult<&'static str> {
    Ok(plugin(py)?.partition_glob())
}

/// A snapshot of the plugin's process-wide counters, as a dict.
#[pyfunction]
pub fn counters(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let c = plugin(py)?.counters();
    let dict = PyDict::new(py);
    dict.set_item("planner_calls", c.planner_calls)?;
    dict.set_item("stages_inserted", c.stages_inserted)?;
    dict.set_item("stages_encoded", c.stages_encoded)?;
    dict.set_item("stages_decoded", c.stages_decoded)?;
    dict.set_item("live_objects", c.live_objects)?;
    Ok(dict)
}
