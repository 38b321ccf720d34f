//! The host's one error type, and its policy.
//!
//! Three kinds of failure reach a user, and each message says which:
//!
//! - **the environment**: a plugin file that is missing or refused, a
//!   directory that cannot be read or written, a worker that cannot be
//!   started. The message names the path.
//! - **the input**: an envelope, spec or plan file that does not parse, a
//!   shuffle location that already holds output, a plan whose codec ids or
//!   shuffle location disagree with its envelope. The message names the
//!   file and, for a task, its stage and map.
//! - **the query**: whatever DataFusion or the plugin reports while planning
//!   or executing, passed through with what the host was doing at the time
//!   (a reader that misses a file names stage, map, bucket and file itself).
//!
//! How a failed task is retried is the runtime's to decide, from the class
//! the plugin recorded where the error was made (see [`dfx_runtime::error`]);
//! the host never reads a message to decide anything.

use std::path::PathBuf;

use datafusion::error::DataFusionError;

/// Result of a host operation.
pub type Result<T> = std::result::Result<T, HostError>;

/// What went wrong in the host. Every variant's message names its culprit.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// No plugin file was found at any of the places the loader looks.
    #[error(
        "cannot find the dfx plugin file {file}. Looked at: {looked}. Pass --plugin PATH, \
         set DFX_PLUGIN, or build it beside the dfx executable (cargo build -p dfx-plugin)."
    )]
    PluginNotFound {
        /// The file name searched for.
        file: String,
        /// Every place looked at, with the rule that produced it.
        looked: String,
    },

    /// A plugin file was found but refused by the ABI handshake.
    #[error("the dfx plugin file was refused ({source}); it was found via {via}")]
    PluginRefused {
        /// How the file was located (`--plugin`, `DFX_PLUGIN`, beside the executable).
        via: String,
        /// The handshake's refusal, naming the file and both sides.
        #[source]
        source: dfx_abi::LoadError,
    },

    /// DataFusion or the plugin failed while the host was doing `context`.
    #[error("{context}: {source}")]
    DataFusion {
        /// What the host was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: DataFusionError,
    },

    /// Anything the user passed in that the host refuses before doing work.
    #[error("{0}")]
    Invalid(String),

    /// The runtime refused the query, or its tasks failed (every failure of
    /// the wave, together; nothing after that wave ran), or a file or
    /// directory operation failed ([`HostError::io`]).
    #[error(transparent)]
    Runtime(#[from] dfx_runtime::RuntimeError),

    /// A query failed in a location made for it under a shuffle root, and
    /// the location is kept, with what its workers left, for inspection.
    #[error("{source}\nthe query's shuffle location is kept for inspection: {location}")]
    LocationKept {
        /// The kept location, in its one spelling.
        location: String,
        /// Why the query failed.
        #[source]
        source: Box<HostError>,
    },
}

impl HostError {
    /// Wrap a DataFusion error with what the host was doing.
    pub fn datafusion(context: impl Into<String>, source: DataFusionError) -> Self {
        HostError::DataFusion {
            context: context.into(),
            source,
        }
    }

    /// Wrap an I/O error with the action and the path.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        HostError::Runtime(dfx_runtime::RuntimeError::io(action, path, source))
    }
}

/// Attach context to a DataFusion result.
pub(crate) trait DataFusionContext<T> {
    /// Map the error into [`HostError::DataFusion`] with `context`.
    fn context(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> DataFusionContext<T> for std::result::Result<T, DataFusionError> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| HostError::datafusion(context(), source))
    }
}
