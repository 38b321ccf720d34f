//! The driver's and the worker's checks, from the plugin and `dfx_abi`, so
//! that Python states none of them again:
//!
//! - [`probe_location`]: a shuffle location holding stage output is refused,
//!   and an S3 one is probed (endpoint, bucket, credentials) and locked;
//! - [`DriverLock`]: one driver per local shuffle directory (`flock`);
//! - [`vet_stage`]: a worker refuses a stage holding a sink, a file outside
//!   its tables or a writer aimed elsewhere, before decoding it;
//! - [`temporary_root`]: the process's shuffle root for specs naming
//!   neither a location nor a root ([`dfx_runtime::shuffle_root::TemporaryRoot`]).

use std::collections::HashMap;
use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::plugin::plugin;

/// The process's temporary shuffle root, made on first use.
static TEMPORARY_ROOT: std::sync::Mutex<Option<dfx_runtime::shuffle_root::TemporaryRoot>> =
    std::sync::Mutex::new(None);

/// The process's temporary shuffle root (made now if it is the first call),
/// for a spec naming neither a location nor a root. Removed, with whatever
/// failed queries left in it, by [`remove_temporary_root`].
///
/// Raises:
///     ValueError: A directory that cannot be created.
#[pyfunction]
pub fn temporary_root() -> PyResult<String> {
    let mut root = TEMPORARY_ROOT.lock().unwrap_or_else(|p| p.into_inner());
    if root.is_none() {
        let made = dfx_runtime::shuffle_root::TemporaryRoot::new()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        *root = Some(made);
    }
    Ok(root
        .as_ref()
        .map(|r| r.path().display().to_string())
        .unwrap_or_default())
}

/// Remove the process's temporary shuffle root, if one was made (at exit).
#[pyfunction]
pub fn remove_temporary_root() {
    TEMPORARY_ROOT
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
}

/// Refuse the shuffle `location` (a path, `file://` or `s3://bucket/prefix`)
/// if it already holds stage output, or for S3 if the endpoint cannot be
/// reached, the bucket is missing, the credentials are refused or another
/// driver holds the prefix; `store_options` are the spec's (`s3_endpoint`,
/// `s3_region`, `s3_allow_http`).
///
/// Raises:
///     ValueError: One message naming the location and what is wrong.
#[pyfunction]
#[pyo3(signature = (location, store_options = None))]
pub fn probe_location(
    py: Python<'_>,
    location: &str,
    store_options: Option<HashMap<String, String>>,
) -> PyResult<()> {
    let plugin = plugin(py)?;
    let options = store_options.unwrap_or_default();
    // The probe may wait on the network for seconds: let other threads run.
    py.detach(|| plugin.probe_location(location, &options))
        .map_err(PyValueError::new_err)
}

/// Refuse the encoded stage `plan` unless it reads only under `tables` and
/// `shuffle_dir`, and writes only through dfx's writer into `shuffle_dir`.
///
/// Raises:
///     ValueError: Naming every node refused and where it sits.
#[pyfunction]
pub fn vet_stage(
    py: Python<'_>,
    plan: &[u8],
    tables: Vec<PathBuf>,
    shuffle_dir: &str,
) -> PyResult<()> {
    plugin(py)?
        .vet_stage(plan, &tables, shuffle_dir)
        .map_err(|e| PyValueError::new_err(e.strip_backtrace()))
}

/// An exclusive lock on a local shuffle directory, held by one driver for
/// its run (`with DriverLock(dir): ...`, or `release()`); the kernel drops
/// it if the process dies.
#[pyclass(module = "dfx_engine._internal")]
pub struct DriverLock {
    lock: Option<dfx_abi::DriverLock>,
    path: String,
}

#[pymethods]
impl DriverLock {
    /// Lock `directory` (created with mode 0700 if missing).
    ///
    /// Raises:
    ///     ValueError: Another driver holds it (naming its pid), or the
    ///         directory or lock file cannot be created.
    #[new]
    fn new(directory: PathBuf) -> PyResult<Self> {
        let lock = dfx_abi::DriverLock::acquire(&directory).map_err(PyValueError::new_err)?;
        let path = lock.path().display().to_string();
        Ok(Self {
            lock: Some(lock),
            path,
        })
    }

    /// The lock file's path.
    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    /// Whether the lock is still held.
    #[getter]
    fn held(&self) -> bool {
        self.lock.is_some()
    }

    /// Release the lock (again: nothing).
    fn release(&mut self) {
        self.lock = None;
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&mut self, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.release();
        false
    }

    fn __repr__(&self) -> String {
        format!("DriverLock({:?}, held={})", self.path, self.lock.is_some())
    }
}
