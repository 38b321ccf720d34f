//! What every benchmark with files of its own takes and writes: where its
//! files go, the plugin, and the figures as JSON.

use std::path::{Path, PathBuf};

use clap::Args;
use serde::Serialize;

use crate::tpch::TpchError;

/// The options every benchmark with files of its own takes.
#[derive(Debug, Clone, Args)]
pub struct BenchOutput {
    /// Where the tables and shuffle locations go (default: a temp directory).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// The plugin file (default: $DFX_PLUGIN, else beside this executable).
    #[arg(long, value_name = "PATH")]
    pub plugin: Option<PathBuf>,
    /// Also write the figures as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// Write `figures` as pretty JSON to `path`, when one was asked for.
pub(super) fn write_json(path: Option<&Path>, figures: &impl Serialize) -> Result<(), TpchError> {
    let Some(path) = path else {
        return Ok(());
    };
    let text = serde_json::to_string_pretty(figures)
        .map_err(|e| TpchError::Invalid(format!("cannot serialise the figures: {e}")))?;
    std::fs::write(path, text + "\n").map_err(|e| TpchError::io(path, e))
}
