//! The host's one error type, and its policy.
//!
//! Three kinds of failure reach a user, and each message says which:
//!
//! - **the environment**: a plugin file that is missing or refused, a
//!   directory that cannot be read or written, a worker that cannot be
//!   started. The message names the path.
//! - **the input**: an envelope, spec or plan file that does not parse, a
//!   shuffle directory that already holds output, a plan whose codec ids or
//!   shuffle directory disagree with its envelope. The message names the file
//!   and, for a task, its stage and map.
//! - **the query**: whatever DataFusion or the plugin reports while planning
//!   or executing, passed through with what the host was doing at the time
//!   (a reader that misses a file names stage, map, bucket and file itself).
//!
//! A task's failure is classified where it is seen ([`Retry`]): a worker
//! that died, was killed, timed out or left no readable report may succeed
//! on another attempt; an error the worker reports about the task itself
//! (planning, decoding, SQL, schemas) would recur and is final; a report of
//! *lost output* (an upstream map's published files are gone) means that map
//! runs again, then the task. A distributed run either completes every task
//! or reports every task of the first wave that did not (after its
//! attempts), and runs nothing after.

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

    /// A file or directory operation failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What the host tried to do ("cannot read", "cannot create").
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A JSON file (spec, envelope) did not parse.
    #[error("cannot parse {what} {}: {source}", path.display())]
    Json {
        /// Which kind of file.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },

    /// Anything the user passed in that the host refuses before doing work.
    #[error("{0}")]
    Invalid(String),

    /// A distributed run whose workers failed; every failure of the wave,
    /// together. Nothing after that wave ran.
    #[error(
        "{} of {total} worker task(s) failed{}:\n{}",
        failures.len(),
        render_wave(wave, stages),
        render_failures(failures)
    )]
    Workers {
        /// The wave (1-based) the tasks belonged to, when a driver ran them in waves.
        wave: Option<usize>,
        /// The stages of that wave.
        stages: Vec<u64>,
        /// Tasks dispatched in that wave.
        total: usize,
        /// Every task that did not report, in dispatch order.
        failures: Vec<TaskFailure>,
    },
}

/// One task that did not complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskFailure {
    /// The stage the task belonged to.
    pub stage_id: u64,
    /// The map task it ran (the stage's input partition).
    pub map: usize,
    /// Why: the exit status, an unreadable report, or a spawn error.
    pub reason: String,
    /// What the worker wrote on stderr (while running the task, for a
    /// pooled worker).
    pub stderr: String,
    /// Whether another attempt may succeed.
    pub retry: Retry,
}

/// Whether another attempt of a failed task may succeed, decided where the
/// failure is seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// No: the worker reported an error about the task itself (its plan,
    /// decoding, the SQL, a schema), or could not be started at all; another
    /// attempt would fail the same way.
    No,
    /// Yes: the worker died, was killed, timed out, or left no readable
    /// report; nothing says the task itself is at fault.
    Yes,
    /// The output of an upstream map is gone (the plugin's *lost output*):
    /// run that map again, then this task.
    Lost {
        /// The stage of the map whose output is lost.
        stage_id: u64,
        /// The map.
        map: usize,
    },
}

/// The plugin's wording for output a reader needs and cannot find:
/// `dfx stage S map M[ bucket B]: lost output...`.
pub const LOST_OUTPUT: &str = "lost output";

impl Retry {
    /// How to treat an error message a worker reported: [`Retry::Lost`] when
    /// it names an upstream map's lost output, [`Retry::Yes`] when shuffle
    /// storage failed under it ([`dfx_abi::IO_FAILURE`]), else [`Retry::No`].
    pub fn of_reported(message: &str) -> Self {
        match lost_output(message) {
            Some((stage_id, map)) => Retry::Lost { stage_id, map },
            // Shuffle storage failed under the task (a full disk, a dropped
            // connection): another attempt, maybe elsewhere, may succeed.
            None if message.contains(dfx_abi::IO_FAILURE) => Retry::Yes,
            None => Retry::No,
        }
    }
}

/// The `(stage, map)` a message reports lost output of, parsed from the
/// plugin's `dfx stage S map M[ bucket B]: lost output`.
pub fn lost_output(message: &str) -> Option<(u64, usize)> {
    const PREFIX: &str = "dfx stage ";
    let mut rest = message;
    while let Some(at) = rest.find(PREFIX) {
        rest = &rest[at + PREFIX.len()..];
        if let Some(found) = parse_lost(rest) {
            return Some(found);
        }
    }
    None
}

/// `S map M[ bucket B]: lost output` at the start of `text`.
fn parse_lost(text: &str) -> Option<(u64, usize)> {
    fn number(text: &str) -> Option<(&str, &str)> {
        let end = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        (end > 0).then(|| text.split_at(end))
    }
    let (stage, rest) = number(text)?;
    let (map, mut rest) = number(rest.strip_prefix(" map ")?)?;
    if let Some(bucket) = rest.strip_prefix(" bucket ") {
        rest = number(bucket)?.1;
    }
    rest.strip_prefix(": ")?
        .starts_with(LOST_OUTPUT)
        .then_some(())?;
    Some((stage.parse().ok()?, map.parse().ok()?))
}

impl std::fmt::Display for TaskFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "stage {} map {} {}",
            self.stage_id, self.map, self.reason
        )?;
        let stderr = self.stderr.trim_end();
        if !stderr.is_empty() {
            write!(f, "; its stderr:\n{}", indent(stderr))?;
        }
        Ok(())
    }
}

fn render_wave(wave: &Option<usize>, stages: &[u64]) -> String {
    match wave {
        Some(wave) => format!(" in wave {wave} (stages {stages:?})"),
        None => String::new(),
    }
}

fn render_failures(failures: &[TaskFailure]) -> String {
    failures
        .iter()
        .map(|f| format!("- {f}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|line| format!("    {line}"))
        .collect::<Vec<_>>()
        .join("\n")
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
        HostError::Io {
            action,
            path: path.into(),
            source,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_output_names_the_upstream_map() {
        let marker = "stage 1 map 0 failed: cannot execute: dfx stage 2 map 3: lost output: the \
                      map's file is missing (/s/stage-2/map-3.arrow)";
        assert_eq!(lost_output(marker), Some((2, 3)));
        let bucket = "dfx reader of stage 1 partition 0: dfx stage 12 map 0 bucket 4: lost \
                      output: the marker promises 7 row(s) but the file is missing";
        assert_eq!(lost_output(bucket), Some((12, 0)));
        assert_eq!(
            Retry::of_reported(bucket),
            Retry::Lost {
                stage_id: 12,
                map: 0
            }
        );
        for other in [
            "dfx stage 2 map 3: cannot read the commit marker: permission denied",
            "dfx stage 2 map x: lost output",
            "stage 2 map 3: lost output",
            "",
        ] {
            assert_eq!(lost_output(other), None, "{other}");
            assert_eq!(Retry::of_reported(other), Retry::No, "{other}");
        }
    }
}
