//! The session spec, read and written by the runtime's one type
//! ([`dfx_runtime::SessionSpec`]), so that `dfx_engine.SessionSpec` states
//! none of its rules again: what a field may hold, what is left out of the
//! JSON, what an absent field means.

use dfx_runtime::spec::{DEFAULT_TARGET_PARTITIONS, STORE_OPTION_KEYS};
use dfx_runtime::{SessionSpec, ShuffleCompression, Split};
use pyo3::prelude::*;

use crate::error::from_runtime;

/// The spec in `json` checked and written as every host writes it: defaults
/// filled in where a field is absent, and left out where the runtime leaves
/// them out.
///
/// Raises:
///     ValueError: Text that is not a spec, or a spec no session can be
///         built from (a partition count of 0, an unknown store option, a
///         location of another scheme...), naming what was wrong.
#[pyfunction]
pub fn normalize_spec(json: &str) -> PyResult<String> {
    let spec = SessionSpec::from_json(json).map_err(from_runtime)?;
    Ok(spec.to_json())
}

/// Add the spec's constants to the module: the defaults of the fields that
/// have one, the split modes and the store option keys.
pub fn add_constants(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("DEFAULT_TARGET_PARTITIONS", DEFAULT_TARGET_PARTITIONS)?;
    let modes: Vec<&str> = Split::ALL.iter().map(|s| s.as_str()).collect();
    m.add("SPLIT_MODES", modes)?;
    m.add("DEFAULT_SPLIT", Split::default().as_str())?;
    m.add(
        "DEFAULT_SHUFFLE_COMPRESSION",
        ShuffleCompression::default().as_str(),
    )?;
    m.add("STORE_OPTION_KEYS", STORE_OPTION_KEYS.to_vec())?;
    Ok(())
}
