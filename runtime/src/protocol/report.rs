//! A worker's response to one task: its report, or its classified failure.

use dfx_abi::{FailureClass, MapLayout, Plugin};
use serde::{Deserialize, Serialize};

use crate::protocol::envelope::Envelope;

/// What one map published, from the writer's summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Published {
    /// Rows, over every bucket.
    pub rows: usize,
    /// Bytes, over every bucket; `None` when the summary has no byte counts.
    pub bytes: Option<u64>,
    /// Where each bucket lies in the map's file; `None` from a summary
    /// without offsets.
    pub layout: Option<MapLayout>,
}

/// What a worker reports for a task it completed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerReport {
    /// The stage the worker ran.
    pub stage_id: u64,
    /// The map it ran (the envelope's `partition`).
    pub partition: usize,
    /// Rows it published, over all of its buckets.
    pub rows: usize,
    /// Bytes it published, over all of its buckets (the writer's summary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// The worker's own time for the task, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elapsed_ms: Option<f64>,
    /// Where each bucket lies in the map's file (offsets, bytes and rows as
    /// arrays, the file's size, S3's entity tag): what the driver hands the
    /// readers of the stage, and what its adaptive decisions read.
    /// Boxed: a response is moved around whole, and most of it is small.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<Box<MapLayout>>,
}

/// A task a worker could not complete, as it reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskError {
    /// The envelope's stage; `None` when the envelope could not be read.
    pub stage_id: Option<u64>,
    /// The envelope's map; `None` when the envelope could not be read.
    pub partition: Option<usize>,
    /// What went wrong, for people: names stage, map, bucket and file.
    pub error: String,
    /// How the driver may retry it, as recorded where the error was made.
    /// Absent: final.
    #[serde(default = "final_class")]
    pub retry: FailureClass,
}

fn final_class() -> FailureClass {
    FailureClass::Final
}

/// A worker's answer to one task: its report, or why it failed.
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    /// The task completed.
    Report(WorkerReport),
    /// The task failed; a serving worker goes on serving.
    Error(TaskError),
}

impl Response {
    /// The response to the task of `envelope`: its report, or its failure
    /// classified by what the plugin recorded for the task's shuffle
    /// location while it ran (nothing recorded: final).
    pub fn of_outcome(
        plugin: &Plugin,
        envelope: &Envelope,
        outcome: Result<Published, String>,
        elapsed_ms: f64,
    ) -> Self {
        match outcome {
            Ok(published) => Response::Report(WorkerReport {
                stage_id: envelope.stage_id,
                partition: envelope.partition,
                rows: published.rows,
                bytes: published.bytes,
                elapsed_ms: Some(elapsed_ms),
                layout: published.layout.map(Box::new),
            }),
            Err(error) => Response::Error(TaskError {
                stage_id: Some(envelope.stage_id),
                partition: Some(envelope.partition),
                retry: recorded_class(plugin, envelope),
                error,
            }),
        }
    }

    /// A final failure of `envelope`'s task before it ran.
    pub fn of_final(envelope: &Envelope, error: String) -> Self {
        Response::Error(TaskError {
            stage_id: Some(envelope.stage_id),
            partition: Some(envelope.partition),
            error,
            retry: FailureClass::Final,
        })
    }

    /// A failure before any envelope was read: final, with no task ids.
    pub fn unknown_task(error: String) -> Self {
        Response::Error(TaskError {
            stage_id: None,
            partition: None,
            error,
            retry: FailureClass::Final,
        })
    }

    /// The response as one JSON line (no newline).
    pub fn to_line(&self) -> String {
        // Cannot fail: numbers, nulls, strings and the class.
        match self {
            Response::Report(report) => serde_json::to_string(report),
            Response::Error(error) => serde_json::to_string(error),
        }
        .unwrap_or_default()
    }

    /// Whether this is a failure.
    pub fn is_error(&self) -> bool {
        matches!(self, Response::Error(_))
    }

    /// Read one stdout line of a worker.
    ///
    /// `None` for a line that is not a response (not a JSON object with a
    /// `rows` or an `error` key): a library's stray print, kept by the caller
    /// as output. `Some(Err)` for a line that claims to be a response but
    /// does not read as one.
    pub fn parse_line(line: &str) -> Option<Result<Self, String>> {
        let value: serde_json::Value = serde_json::from_str(line.trim()).ok()?;
        let object = value.as_object()?;
        let unreadable =
            |err: serde_json::Error| format!("an unreadable response {line:?} ({err})");
        if object.contains_key("error") {
            Some(
                serde_json::from_value(value)
                    .map(Response::Error)
                    .map_err(unreadable),
            )
        } else if object.contains_key("rows") {
            Some(
                serde_json::from_value(value)
                    .map(Response::Report)
                    .map_err(unreadable),
            )
        } else {
            None
        }
    }

    /// The response a process-mode worker left on its stdout: the last
    /// non-empty line, not the whole stream, since anything loaded into a
    /// worker may print to stdout.
    ///
    /// # Errors
    ///
    /// What was wrong, for the caller to attach to the task.
    pub fn parse_last(stdout: &str) -> Result<Self, String> {
        let line = stdout
            .lines()
            .rev()
            .find(|line| !line.trim().is_empty())
            .ok_or_else(|| "printed no report".to_string())?;
        match Self::parse_line(line) {
            Some(parsed) => parsed,
            None => Err(format!("printed an unreadable report {line:?}")),
        }
    }
}

/// The class of the failure of `envelope`'s task: the most telling of what
/// the plugin recorded for its shuffle location (lost output, then a storage
/// failure), final when nothing was recorded.
fn recorded_class(plugin: &Plugin, envelope: &Envelope) -> FailureClass {
    let location = envelope
        .spec
        .shuffle_dir
        .as_deref()
        .map(|dir| dir.display().to_string())
        .unwrap_or_default();
    match plugin.take_failures(&location) {
        Ok(recorded) => FailureClass::most_telling(&recorded),
        // A plugin whose record cannot be read classifies nothing: final,
        // which at worst fails a task that a retry could have saved.
        Err(_) => FailureClass::Final,
    }
}

/// Forget what the plugin recorded for `envelope`'s location before its task
/// runs: a record left by an earlier task must not classify this one.
pub fn clear_recorded(plugin: &Plugin, envelope: &Envelope) {
    let _ = recorded_class(plugin, envelope);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_is_the_last_non_empty_line() {
        let out = "noise\n{\"not\": \"it\"}\n{\"stage_id\": 2, \"partition\": 1, \"rows\": 7}\n\n";
        assert_eq!(
            Response::parse_last(out).unwrap(),
            Response::Report(WorkerReport {
                stage_id: 2,
                partition: 1,
                rows: 7,
                bytes: None,
                elapsed_ms: None,
                layout: None,
            })
        );
        assert!(
            Response::parse_last("\n \n")
                .unwrap_err()
                .contains("no report")
        );
        assert!(
            Response::parse_last("rows: 7")
                .unwrap_err()
                .contains("unreadable")
        );
    }

    #[test]
    fn a_failure_carries_its_class_as_data() {
        let line = r#"{"stage_id": 1, "partition": 0, "error": "gone", "retry": {"lost": [2, 3]}}"#;
        let Some(Ok(Response::Error(error))) = Response::parse_line(line) else {
            panic!("not an error response: {line}");
        };
        assert_eq!(error.retry, FailureClass::Lost([2, 3]));
        // No class: final, whatever the message says.
        let line = r#"{"stage_id": 1, "partition": 0, "error": "dfx stage 2 map 3: lost output"}"#;
        let Some(Ok(Response::Error(error))) = Response::parse_line(line) else {
            panic!("not an error response: {line}");
        };
        assert_eq!(error.retry, FailureClass::Final);
        let round = Response::Error(TaskError {
            stage_id: Some(4),
            partition: Some(1),
            error: "disk full".into(),
            retry: FailureClass::Io,
        });
        assert!(
            round.to_line().contains("\"retry\":\"io\""),
            "{}",
            round.to_line()
        );
        assert_eq!(Response::parse_line(&round.to_line()), Some(Ok(round)));
    }

    #[test]
    fn responses_are_told_from_other_lines() {
        assert_eq!(Response::parse_line("loading the plugin..."), None);
        assert_eq!(Response::parse_line("{\"progress\": 3}"), None);
        assert_eq!(Response::parse_line("[1, 2]"), None);
        let bad = Response::parse_line("{\"rows\": \"many\"}").unwrap();
        assert!(bad.unwrap_err().contains("unreadable response"));
    }
}
