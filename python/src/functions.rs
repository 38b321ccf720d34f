//! The plugin's functions as objects `datafusion.udf(...)` and
//! `datafusion.udaf(...)` accept.
//!
//! They travel in a plan by name, so every session that decodes a plan
//! (driver and workers) registers them.

use std::sync::Arc;

use datafusion::logical_expr::{AggregateUDFImpl, ScalarUDFImpl};
use datafusion_ffi::udaf::FFI_AggregateUDF;
use datafusion_ffi::udf::FFI_ScalarUDF;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::capsule;
use crate::error::runtime_error;
use crate::plugin::plugin;

/// One of the plugin's scalar functions; pass it to `datafusion.udf(...)`.
#[pyclass(frozen, module = "dfx_engine._internal")]
pub struct DfxScalarFunction {
    udf: FFI_ScalarUDF,
    name: String,
}

#[pymethods]
impl DfxScalarFunction {
    /// The function's SQL name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// A `datafusion_scalar_udf` capsule.
    fn __datafusion_scalar_udf__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        capsule::export(py, self.udf.clone(), c"datafusion_scalar_udf")
    }

    fn __repr__(&self) -> String {
        format!("DfxScalarFunction({:?})", self.name)
    }
}

/// One of the plugin's aggregate functions; pass it to `datafusion.udaf(...)`.
#[pyclass(frozen, module = "dfx_engine._internal")]
pub struct DfxAggregateFunction {
    udaf: FFI_AggregateUDF,
    name: String,
}

#[pymethods]
impl DfxAggregateFunction {
    /// The function's SQL name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// A `datafusion_aggregate_udf` capsule.
    fn __datafusion_aggregate_udf__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        capsule::export(py, self.udaf.clone(), c"datafusion_aggregate_udf")
    }

    fn __repr__(&self) -> String {
        format!("DfxAggregateFunction({:?})", self.name)
    }
}

/// The plugin's scalar functions.
#[pyfunction]
pub fn scalar_functions(py: Python<'_>) -> PyResult<Vec<DfxScalarFunction>> {
    let ffi = plugin(py)?.ffi_scalar_udfs().map_err(runtime_error)?;
    Ok(ffi
        .into_iter()
        .map(|udf| DfxScalarFunction {
            name: Arc::<dyn ScalarUDFImpl>::from(&udf).name().to_string(),
            udf,
        })
        .collect())
}

/// The plugin's aggregate functions.
#[pyfunction]
pub fn aggregate_functions(py: Python<'_>) -> PyResult<Vec<DfxAggregateFunction>> {
    let ffi = plugin(py)?.ffi_aggregate_udfs().map_err(runtime_error)?;
    Ok(ffi
        .into_iter()
        .map(|udaf| DfxAggregateFunction {
            name: Arc::<dyn AggregateUDFImpl>::from(&udaf).name().to_string(),
            udaf,
        })
        .collect())
}
