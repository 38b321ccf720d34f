//! PyCapsules in both directions, by datafusion-python's conventions.
//!
//! | capsule name                          | holds                         |
//! | ------------------------------------- | ----------------------------- |
//! | `datafusion_task_context_provider`    | `FFI_TaskContextProvider`     |
//! | `datafusion_logical_extension_codec`  | `FFI_LogicalExtensionCodec`   |
//! | `datafusion_physical_extension_codec` | `FFI_PhysicalExtensionCodec`  |
//! | `datafusion_query_planner`            | `FFI_QueryPlanner`            |
//! | `datafusion_extension_options`        | `FFI_ExtensionOptions`        |
//! | `datafusion_scalar_udf`               | `FFI_ScalarUDF`               |
//! | `datafusion_aggregate_udf`            | `FFI_AggregateUDF`            |
//!
//! A capsule owns one boxed struct and drops it with itself; whoever reads a
//! capsule clones the struct out of it (every `FFI_*` clone is a reference
//! count on the producer's side), so a capsule may be collected as soon as
//! it has been read.

use std::ffi::CStr;

use pyo3::exceptions::{PyImportError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// A new capsule named `name` owning `value`.
pub fn export<'py, T: Send + 'static>(
    py: Python<'py>,
    value: T,
    name: &'static CStr,
) -> PyResult<Bound<'py, PyCapsule>> {
    PyCapsule::new_with_value(py, value, name)
}

/// Clone the `T` out of the capsule `getter()` returns on `obj` (or out of
/// `obj` itself when it already is a capsule).
///
/// `T` must be the struct datafusion-python stores under `name`; the table
/// in this module's docs is that contract.
pub fn import<T: Clone>(obj: &Bound<'_, PyAny>, getter: &str, name: &'static CStr) -> PyResult<T> {
    let value = if obj.hasattr(getter)? {
        obj.getattr(getter)?.call0()?
    } else {
        obj.clone()
    };
    let expected = name.to_string_lossy();
    let capsule = value.cast::<PyCapsule>().map_err(|_| {
        PyTypeError::new_err(format!(
            "dfx_engine: expected a {expected} PyCapsule from {getter}(), got {}",
            type_name(&value)
        ))
    })?;
    let found = capsule
        .name()?
        // SAFETY: a capsule's name is a NUL-terminated string that lives as
        // long as the capsule, which `capsule` keeps alive here.
        .map(|n| unsafe { n.as_cstr() }.to_string_lossy().into_owned());
    if found.as_deref() != Some(&*expected) {
        return Err(PyValueError::new_err(format!(
            "dfx_engine: {getter}() returned a capsule named {found:?}, expected {expected:?}"
        )));
    }
    let pointer = capsule.pointer_checked(Some(name))?.cast::<T>();
    // SAFETY: the name check above is datafusion-python's type tag: a capsule
    // named `name` holds a valid, initialized `T` for as long as the capsule
    // lives, and we only borrow it for the clone.
    let value = unsafe { pointer.as_ref() };
    Ok(value.clone())
}

/// Refuse an FFI struct from a different `datafusion-ffi` major.
pub fn check_version(what: &str, found: u64) -> PyResult<()> {
    let expected = datafusion_ffi::version();
    if found != expected {
        return Err(PyImportError::new_err(format!(
            "dfx_engine: the session's {what} comes from datafusion-ffi {found}, this module \
             speaks {expected}"
        )));
    }
    Ok(())
}

fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "an unnamed type".to_string())
}
