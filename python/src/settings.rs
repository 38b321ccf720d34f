//! The DataFusion settings every dfx session of this package is built with.
//!
//! The plugin is their home: what a session must set for the plugin's
//! stages to divide work as planned is the plugin's knowledge, and it will
//! hand them out itself; until then they are stated here, once, and
//! `dfx_engine.session` applies whatever this returns.

use std::collections::BTreeMap;

use pyo3::prelude::*;

/// DataFusion 55's run-time rebalancing of files between sibling partitions.
const WORK_STEALING: &str = "datafusion.execution.enable_file_stream_work_stealing";

/// DataFusion's splitting of files into byte ranges across partitions.
const REPARTITION_FILE_SCANS: &str = "datafusion.optimizer.repartition_file_scans";

/// How many bytes from a Parquet file's end DataFusion reads for its footer.
const PARQUET_METADATA_SIZE_HINT: &str = "datafusion.execution.parquet.metadata_size_hint";

/// Each setting a dfx session needs, by its DataFusion key.
#[pyfunction]
pub fn session_settings() -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        // Off, or a worker running partition 0 alone would steal every file
        // of its sibling partitions (which no process polls) and the answer
        // would count those rows once per worker.
        (WORK_STEALING, "false".to_string()),
        // Off: one partition per file is a table's contract (a task per
        // file). Split into byte ranges, a range holding no row group's
        // start reads nothing, and a file's neighbour range reads it whole:
        // at TPC-H scale 0.1 one map of each scan stage read every row while
        // its sibling read none.
        (REPARTITION_FILE_SCANS, "false".to_string()),
        // The Rust host's footer read size for local tables, not
        // DataFusion's object-store default (`PARQUET_FOOTER_HINT` says why).
        (
            PARQUET_METADATA_SIZE_HINT,
            dfx_abi::PARQUET_FOOTER_HINT.to_string(),
        ),
    ])
}
