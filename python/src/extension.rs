//! `DfxEngineExtension`: the bundle `SessionContext.with_extensions` installs.
//!
//! datafusion-python calls the bundle twice (see its `datafusion.extensions`):
//!
//! ```text
//! phase 1  __datafusion_session_components__(ctx)
//!            ctx's task-context provider ──► plugin.physical_codec(provider)
//!            ──► DfxPhysicalCodec (id dfx_engine.physical.v5) joins the chain
//!            ctx's task-context provider ──► plugin.logical_codec(provider)
//!            ──► DfxLogicalCodec (id dfx_engine.logical.v1) joins the logical
//!                chain: it carries in-memory tables into the planner
//! phase 2  __datafusion_session_planner__(ctx, fallback)
//!            ctx's final logical + physical chains ──► plugin.query_planner(..)
//!            ──► datafusion_query_planner capsule
//!            the plugin's scalar and aggregate functions ──► ctx.register_udf/udaf
//! ```
//!
//! The functions are registered by the bundle because plans name them: a
//! session with the planner and codec but not the functions cannot run
//! `dfx_net_revenue(..)`, nor decode a stage that calls it.
//!
//! The planner is built in phase 2 so it encodes through the session's
//! complete chain, the one that holds the plugin's codec. It does not wrap
//! `fallback`: the plugin's planner carries DataFusion's default planner
//! itself, so a planner installed on the session before this bundle is
//! replaced, not layered.

use datafusion_ffi::execution::FFI_TaskContextProvider;
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use datafusion_ffi::proto::physical_extension_codec::FFI_PhysicalExtensionCodec;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyTuple};

use crate::blocking::runtime;
use crate::driving::{ROOT_CODEC_ID, RootCodec, SessionDriver};
use crate::error::runtime_error;
use crate::plugin::plugin;
use crate::{capsule, functions};

/// Install dfx on a datafusion-python session:
/// `SessionContext(config).with_extensions(DfxEngineExtension())` installs
/// the plugin's codec and planner and registers its functions.
///
/// Configuration only: it holds no session, so one instance may be installed
/// on any number of sessions. The config extension (the shuffle directory)
/// travels separately, on the `SessionConfig`: see `DfxEngineConfig`.
#[pyclass(frozen, module = "dfx_engine._internal")]
pub struct DfxEngineExtension {
    /// How the session drives its queries, when it does (see
    /// [`crate::driving`]): then its planner is this module's, over the
    /// plugin's.
    driver: Option<Py<SessionDriver>>,
}

#[pymethods]
impl DfxEngineExtension {
    /// Loads the plugin now, so a missing or refused file fails here rather
    /// than inside `with_extensions`. With `driver`, the session's queries
    /// run distributed when their plans execute.
    #[new]
    #[pyo3(signature = (driver = None))]
    fn new(py: Python<'_>, driver: Option<Py<SessionDriver>>) -> PyResult<Self> {
        plugin(py)?;
        Ok(Self { driver })
    }

    /// The session's driver, if it drives its queries.
    #[getter]
    fn driver(&self, py: Python<'_>) -> Option<Py<SessionDriver>> {
        self.driver.as_ref().map(|driver| driver.clone_ref(py))
    }

    /// Phase 1: the plugin's physical codec, bound to `ctx`'s task-context
    /// provider.
    fn __datafusion_session_components__<'py>(
        &self,
        py: Python<'py>,
        ctx: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let plugin = plugin(py)?;
        let provider: FFI_TaskContextProvider = capsule::import(
            ctx,
            "__datafusion_task_context_provider__",
            c"datafusion_task_context_provider",
        )?;
        let root_provider = provider.clone();
        let logical = plugin
            .logical_codec(provider.clone())
            .map_err(runtime_error)?;
        let codec = plugin.physical_codec(provider).map_err(runtime_error)?;
        let codec = Bound::new(py, DfxPhysicalCodec { codec })?.into_any();
        let logical = Bound::new(py, DfxLogicalCodec { codec: logical })?;
        let mut physical = vec![codec];
        // A driving session's plans carry their root as a handle.
        if self.driver.is_some() {
            let codec = RootCodec::ffi(runtime()?.handle().clone(), root_provider);
            physical.push(Bound::new(py, DfxRootCodec { codec })?.into_any());
        }
        let kwargs = PyDict::new(py);
        kwargs.set_item("physical_extension_codecs", PyTuple::new(py, physical)?)?;
        kwargs.set_item("logical_extension_codecs", PyTuple::new(py, [logical])?)?;
        py.import("datafusion.extensions")?
            .getattr("SessionExtensionComponents")?
            .call((), Some(&kwargs))
    }

    /// Phase 2: the plugin's planner on the session's final codec chains.
    /// `fallback` is not wrapped (see the module docs).
    #[allow(unused_variables)]
    fn __datafusion_session_planner__<'py>(
        &self,
        py: Python<'py>,
        ctx: &Bound<'py, PyAny>,
        fallback: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let plugin = plugin(py)?;
        let logical: FFI_LogicalExtensionCodec = capsule::import(
            ctx,
            "__datafusion_logical_extension_codec__",
            c"datafusion_logical_extension_codec",
        )?;
        // SAFETY: `version` is a plain function pointer of the struct we just
        // cloned out of a capsule of the right name.
        capsule::check_version("logical extension codec", unsafe { (logical.version)() })?;
        let physical: FFI_PhysicalExtensionCodec = capsule::import(
            ctx,
            "__datafusion_physical_extension_codec__",
            c"datafusion_physical_extension_codec",
        )?;
        // SAFETY: as above.
        capsule::check_version("physical extension codec", unsafe { (physical.version)() })?;
        let planner = plugin
            .query_planner(logical.clone(), physical.clone())
            .map_err(runtime_error)?;
        let planner = match &self.driver {
            None => planner,
            Some(driver) => driver
                .get()
                .query_planner(plugin, planner, logical, physical)?,
        };
        let planner = capsule::export(py, planner, c"datafusion_query_planner")?;
        // Last, once everything that can fail here has succeeded: the
        // registration is the one write this bundle makes to the session.
        register_functions(py, ctx)?;
        Ok(planner)
    }

    /// Planner calls so far (the plugin's process-wide counter).
    fn plan_calls(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(plugin(py)?.counters().planner_calls)
    }

    /// Stage nodes the planner inserted, summed over calls.
    fn stages_inserted(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(plugin(py)?.counters().stages_inserted)
    }

    /// Stage nodes the plugin's codec encoded.
    fn encode_calls(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(plugin(py)?.counters().stages_encoded)
    }

    /// Stage nodes the plugin's codec decoded.
    fn decode_calls(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(plugin(py)?.counters().stages_decoded)
    }

    /// Plugin-side objects alive right now.
    fn live_objects(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(plugin(py)?.counters().live_objects)
    }

    /// The id the plugin's codec is installed under.
    fn physical_codec_id(&self, py: Python<'_>) -> PyResult<&'static str> {
        Ok(plugin(py)?.codec_id())
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let plugin = plugin(py)?;
        Ok(format!(
            "DfxEngineExtension(plugin={:?}, version={:?})",
            plugin.path().display().to_string(),
            plugin.version()
        ))
    }
}

/// The plugin's physical codec, bound to one session, as datafusion-python
/// installs codecs: an object with `__datafusion_codec_id__` and a getter.
///
/// The id is what datafusion-python frames the codec's payloads with, so it
/// is the plugin's own codec id, identical on every host.
#[pyclass(frozen, module = "dfx_engine._internal")]
pub struct DfxPhysicalCodec {
    codec: FFI_PhysicalExtensionCodec,
}

#[pymethods]
impl DfxPhysicalCodec {
    /// The plugin's codec id (`dfx_engine.physical.v5`).
    #[getter(__datafusion_codec_id__)]
    fn codec_id(&self, py: Python<'_>) -> PyResult<&'static str> {
        Ok(plugin(py)?.codec_id())
    }

    /// A `datafusion_physical_extension_codec` capsule. `session` is ignored:
    /// the codec was bound to its session when the bundle built it.
    #[pyo3(signature = (session = None))]
    #[allow(unused_variables)]
    fn __datafusion_physical_extension_codec__<'py>(
        &self,
        py: Python<'py>,
        session: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        capsule::export(
            py,
            self.codec.clone(),
            c"datafusion_physical_extension_codec",
        )
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("DfxPhysicalCodec({:?})", plugin(py)?.codec_id()))
    }
}

/// The root codec of a driving session, as datafusion-python installs
/// codecs (see [`crate::driving`]).
#[pyclass(frozen, module = "dfx_engine._internal")]
pub struct DfxRootCodec {
    codec: FFI_PhysicalExtensionCodec,
}

#[pymethods]
impl DfxRootCodec {
    /// The root codec's id (`dfx_engine.root.v1`).
    #[getter(__datafusion_codec_id__)]
    fn codec_id(&self) -> &'static str {
        ROOT_CODEC_ID
    }

    /// A `datafusion_physical_extension_codec` capsule. `session` is ignored.
    #[pyo3(signature = (session = None))]
    #[allow(unused_variables)]
    fn __datafusion_physical_extension_codec__<'py>(
        &self,
        py: Python<'py>,
        session: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        capsule::export(
            py,
            self.codec.clone(),
            c"datafusion_physical_extension_codec",
        )
    }

    fn __repr__(&self) -> String {
        format!("DfxRootCodec({ROOT_CODEC_ID:?})")
    }
}

/// The plugin's logical codec, bound to one session, as datafusion-python
/// installs codecs. It carries a table the plan format cannot (an in-memory
/// table, a table function's rows) into the plugin's planner by value, up
/// to the session's `dfx_engine.memory_table_limit`.
#[pyclass(frozen, module = "dfx_engine._internal")]
pub struct DfxLogicalCodec {
    codec: FFI_LogicalExtensionCodec,
}

#[pymethods]
impl DfxLogicalCodec {
    /// The plugin's logical codec id (`dfx_engine.logical.v1`).
    #[getter(__datafusion_codec_id__)]
    fn codec_id(&self, py: Python<'_>) -> PyResult<&'static str> {
        logical_codec_id(py)
    }

    /// A `datafusion_logical_extension_codec` capsule. `session` is ignored:
    /// the codec was bound to its session when the bundle built it.
    #[pyo3(signature = (session = None))]
    #[allow(unused_variables)]
    fn __datafusion_logical_extension_codec__<'py>(
        &self,
        py: Python<'py>,
        session: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        capsule::export(
            py,
            self.codec.clone(),
            c"datafusion_logical_extension_codec",
        )
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("DfxLogicalCodec({:?})", logical_codec_id(py)?))
    }
}

/// The id the plugin's logical codec is installed under.
pub fn logical_codec_id(py: Python<'_>) -> PyResult<&'static str> {
    plugin(py)?.logical_codec_id().ok_or_else(|| {
        pyo3::exceptions::PyRuntimeError::new_err(
            "the dfx plugin was built before its logical codec; rebuild it",
        )
    })
}

/// Register every plugin function on `ctx`, a datafusion-python
/// `SessionContext`, as `ctx.register_udf(udf(f))` would.
///
/// Each function is wrapped before the first is registered, so a function
/// the plugin cannot hand out leaves the session without any of them rather
/// than with some. Registering is by name and idempotent: installing the
/// bundle twice registers the same functions again.
fn register_functions(py: Python<'_>, ctx: &Bound<'_, PyAny>) -> PyResult<()> {
    let datafusion = py.import("datafusion")?;
    let (udf, udaf) = (datafusion.getattr("udf")?, datafusion.getattr("udaf")?);
    let mut wrapped = Vec::new();
    for function in functions::scalar_functions(py)? {
        wrapped.push(("register_udf", udf.call1((function,))?));
    }
    for function in functions::aggregate_functions(py)? {
        wrapped.push(("register_udaf", udaf.call1((function,))?));
    }
    for (method, function) in wrapped {
        ctx.call_method1(method, (function,))?;
    }
    Ok(())
}
