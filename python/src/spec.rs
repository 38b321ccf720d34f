//! The session spec, read and written by the runtime's one type
//! ([`dfx_runtime::SessionSpec`]), so that `dfx_engine.SessionSpec` states
//! none of its rules again: what a field may hold, what is left out of the
//! JSON, what an absent field means.

use dfx_runtime::spec::{DEFAULT_TARGET_PARTITIONS, STORE_OPTION_KEYS, Script, TableDefinition};
use dfx_runtime::{SessionSpec, ShuffleCompression, ShuffleDurability, Split};
use pyo3::exceptions::PyValueError;
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

/// The `CREATE EXTERNAL TABLE` statement that registers the table `json`
/// defines (a location string, or a definition object) as `name`: the one
/// rule both hosts register tables by.
///
/// Raises:
///     ValueError: A definition that does not parse or that no session can
///         register, naming the table.
#[pyfunction]
pub fn table_statement(name: &str, json: &str) -> PyResult<String> {
    let table: TableDefinition = serde_json::from_str(json)
        .map_err(|e| PyValueError::new_err(format!("table {name}: {e}")))?;
    table.validate(name).map_err(PyValueError::new_err)?;
    let table = table
        .absolute()
        .map_err(|e| PyValueError::new_err(format!("table {name}: cannot resolve: {e}")))?;
    Ok(table.create_statement(name))
}

/// The partitions a session built from the spec `json` plans for: its
/// `target_partitions`, raised to the file count of its largest table,
/// listed as DataFusion lists them (the Rust host's rule too). Lists local
/// directories and S3 prefixes, with the GIL released.
///
/// Raises:
///     ValueError: A spec the runtime refuses, or a table whose location
///         cannot be listed or holds no file of its format.
#[pyfunction]
pub fn effective_target_partitions(py: Python<'_>, json: &str) -> PyResult<usize> {
    let spec = SessionSpec::from_json(json).map_err(from_runtime)?;
    let runtime = crate::blocking::runtime()?;
    py.detach(|| runtime.block_on(dfx_runtime::tables::effective_target_partitions(&spec)))
        .map_err(from_runtime)
}

/// Which file of the table `json` defines cannot be registered, and why
/// (`"table t: /d/x.parquet cannot be read as parquet: ..."`), or `None`:
/// asked after registering the table failed, so the error names the file.
///
/// Raises:
///     ValueError: A definition or store options that do not parse.
#[pyfunction]
pub fn unreadable_file(
    py: Python<'_>,
    name: &str,
    json: &str,
    store_options: std::collections::BTreeMap<String, String>,
) -> PyResult<Option<String>> {
    let table: TableDefinition = serde_json::from_str(json)
        .map_err(|e| PyValueError::new_err(format!("table {name}: {e}")))?;
    let runtime = crate::blocking::runtime()?;
    Ok(py.detach(|| {
        runtime.block_on(dfx_runtime::tables::unreadable_file(
            name,
            &table,
            &store_options,
        ))
    }))
}

/// The refusal of table `name` (the definition `json`) when one of its
/// partition columns is among `file_columns`, the columns of its files
/// (the runtime's rule, the Rust host's too); `None` when none is.
///
/// Raises:
///     ValueError: A definition that does not parse.
#[pyfunction]
pub fn partition_clash(
    name: &str,
    json: &str,
    file_columns: Vec<String>,
) -> PyResult<Option<String>> {
    let table: TableDefinition = serde_json::from_str(json)
        .map_err(|e| PyValueError::new_err(format!("table {name}: {e}")))?;
    let columns: Vec<&str> = file_columns.iter().map(String::as_str).collect();
    Ok(dfx_runtime::tables::partition_clash(name, &table, &columns))
}

/// The plugin's `dfx_engine.<key>` settings (keys without the prefix) a
/// session built from the spec `json` makes besides its shuffle location and
/// split, in order: the runtime's list, which the Rust host sets too.
///
/// Raises:
///     ValueError: A spec the runtime refuses.
#[pyfunction]
pub fn plugin_settings(json: &str) -> PyResult<Vec<(String, String)>> {
    let spec = SessionSpec::from_json(json).map_err(from_runtime)?;
    Ok(spec.plugin_settings())
}

/// A script's tables and queries: each `CREATE EXTERNAL TABLE` as a
/// definition (a JSON object of name to definition), then each query's text.
///
/// Raises:
///     ValueError: SQL that does not parse, a table after a query, or a
///         statement that is neither a table nor a query, naming it.
#[pyfunction]
pub fn parse_script(sql: &str) -> PyResult<(String, Vec<String>)> {
    let script = Script::parse(sql).map_err(from_runtime)?;
    let tables: std::collections::BTreeMap<String, TableDefinition> =
        script.tables.into_iter().collect();
    let tables = serde_json::to_string(&tables)
        .map_err(|e| PyValueError::new_err(format!("cannot write the tables: {e}")))?;
    Ok((tables, script.queries))
}

/// The shuffle durability of a spec naming none, for workers on machines
/// of their own that serve their map files: `local` under a directory,
/// `both` under an object store URL (the runtime's
/// `ShuffleDurability::for_serving_cluster`).
#[pyfunction]
pub fn serving_cluster_durability(location: &str) -> &'static str {
    ShuffleDurability::for_serving_cluster(location).as_str()
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
    m.add(
        "DEFAULT_SHUFFLE_DURABILITY",
        ShuffleDurability::default().as_str(),
    )?;
    m.add("STORE_OPTION_KEYS", STORE_OPTION_KEYS.to_vec())?;
    Ok(())
}
