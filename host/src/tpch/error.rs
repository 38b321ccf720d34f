//! Errors of `dfx tpch` and `dfx bench`, each naming its culprit.

use std::path::{Path, PathBuf};

/// What went wrong while generating data, running or comparing queries.
#[derive(Debug, thiserror::Error)]
pub enum TpchError {
    /// A file or directory operation failed on `path`.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// Writing or reading a Parquet file failed.
    #[error("parquet file {}: {message}", path.display())]
    Parquet {
        /// The file.
        path: PathBuf,
        /// The Parquet or Arrow error text.
        message: String,
    },

    /// The TPC-H generator failed for one part of one table.
    #[error("generating TPC-H table {table} part {part}: {message}")]
    Generate {
        /// The table.
        table: String,
        /// The 1-based part.
        part: usize,
        /// The generator's error text.
        message: String,
    },

    /// The host failed (loading the plugin, building a session, a worker).
    #[error(transparent)]
    Host(#[from] crate::HostError),

    /// An argument or an answer the command cannot use.
    #[error("{0}")]
    Invalid(String),
}

impl TpchError {
    /// An I/O error on `path`.
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        TpchError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// A Parquet error on `path`.
    pub fn parquet(path: &Path, source: impl std::fmt::Display) -> Self {
        TpchError::Parquet {
            path: path.to_path_buf(),
            message: source.to_string(),
        }
    }
}

/// The runtime failed (an envelope or plan file of `dfx bench`, a worker):
/// a host failure, as the host reports it.
impl From<dfx_runtime::RuntimeError> for TpchError {
    fn from(err: dfx_runtime::RuntimeError) -> Self {
        TpchError::Host(err.into())
    }
}

impl From<TpchError> for crate::HostError {
    fn from(err: TpchError) -> Self {
        match err {
            TpchError::Host(host) => host,
            other => crate::HostError::Invalid(other.to_string()),
        }
    }
}
