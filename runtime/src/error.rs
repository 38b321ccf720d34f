//! The runtime's one error type, and its failure policy.
//!
//! A task's failure is classified where it is made, never by reading its
//! message: a worker's report carries the class the plugin recorded
//! ([`dfx_abi::FailureClass`]: `"final"`, `"io"` or `{"lost": [stage, map]}`),
//! and an executor classifies what it sees itself (a worker that died, was
//! killed, timed out or left no readable report may succeed on another
//! attempt). The scheduler's view of both is [`Retry`]:
//!
//! | seen                                              | [`Retry`]      |
//! |---------------------------------------------------|----------------|
//! | the worker reported an error about the task        | `No`           |
//! | the worker reported a storage failure (`"io"`)     | `Yes`          |
//! | the worker reported lost upstream output          | `Lost`         |
//! | the worker died, was killed, timed out, said nothing readable | `Yes` |
//! | the worker could not be started at all            | `No`           |
//!
//! A distributed run either completes every task or reports every task of
//! the first wave that did not (after its attempts), and runs nothing after.

use std::path::PathBuf;

use dfx_abi::FailureClass;

/// Result of a runtime operation.
pub type Result<T> = std::result::Result<T, RuntimeError>;

/// What went wrong in the runtime. Every variant's message names its culprit.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A file or directory operation failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was tried ("cannot read", "cannot create").
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

    /// Anything refused before work is done: a bad spec, a used location,
    /// stages the plugin describes inconsistently.
    #[error("{0}")]
    Invalid(String),

    /// Tasks that failed; every failure of the wave, together. Nothing after
    /// that wave ran.
    #[error(
        "{} of {total} worker task(s) failed{}:\n{}",
        failures.len(),
        render_wave(wave, stages),
        render_failures(failures)
    )]
    Workers {
        /// The wave (1-based) the tasks belonged to, when run in waves.
        wave: Option<usize>,
        /// The stages of that wave.
        stages: Vec<u64>,
        /// Tasks dispatched in that wave.
        total: usize,
        /// Every task that did not report, in dispatch order.
        failures: Vec<TaskFailure>,
    },

    /// The driver's read of the query's root failed, after any lost output
    /// it found was run again as often as the attempts allow.
    #[error("{0}")]
    Root(String),
}

impl RuntimeError {
    /// Wrap an I/O error with the action and the path.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

/// One task that did not complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskFailure {
    /// The stage the task belonged to.
    pub stage_id: u64,
    /// The map task it ran (the stage's input partition).
    pub map: usize,
    /// Why: the exit status, the worker's message, an unreadable report, or
    /// a spawn error.
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
    /// decoding, the SQL, a schema), or could not be started at all.
    No,
    /// Yes: the worker died, was killed, timed out, left no readable report,
    /// or reported that shuffle storage failed under it.
    Yes,
    /// The output of an upstream map is gone: run that map again, then this
    /// task.
    Lost {
        /// The stage of the map whose output is lost.
        stage_id: u64,
        /// The map.
        map: usize,
    },
}

impl From<FailureClass> for Retry {
    fn from(class: FailureClass) -> Self {
        match class {
            FailureClass::Final => Retry::No,
            FailureClass::Io => Retry::Yes,
            FailureClass::Lost([stage_id, map]) => Retry::Lost {
                stage_id,
                map: map as usize,
            },
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reported_class_is_the_schedulers_retry() {
        assert_eq!(Retry::from(FailureClass::Final), Retry::No);
        assert_eq!(Retry::from(FailureClass::Io), Retry::Yes);
        assert_eq!(
            Retry::from(FailureClass::Lost([12, 3])),
            Retry::Lost {
                stage_id: 12,
                map: 3
            }
        );
    }
}
