//! What an encoded stage says about itself, read without decoding it.
//!
//! A worker must refuse a stage whose shuffle directory differs from its
//! spec before running it, and a decoded stage is a foreign node whose
//! display carries only its name. The plugin reads its own payload out of
//! the plan bytes (`encoded_stage_info`), so this module states no layout.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::plugin::plugin;

/// `(stage_id, shuffle_dir)` of the stage at the root of `plan` (bytes of an
/// encoded stage, as the driver writes them).
///
/// # Errors
///
/// `ValueError` with the plugin's reason: not a plan, a root that is not a
/// stage, a truncated or unknown payload.
#[pyfunction]
pub fn stage_payload(py: Python<'_>, plan: &[u8]) -> PyResult<(u64, String)> {
    let info = plugin(py)?.encoded_stage_info(plan).map_err(|err| {
        PyValueError::new_err(format!(
            "dfx_engine: encoded stage ({} bytes): {err}",
            plan.len()
        ))
    })?;
    Ok((info.stage_id, info.shuffle_dir.into_string()))
}
