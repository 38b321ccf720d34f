//! What travels between driver and worker: the task envelope, the report,
//! and the serve protocol. The one definition of the driver/worker contract;
//! the Python host's driver and workers speak it too.
//!
//! ```text
//! driver ── <shuffle_dir>/tasks/task-S-M.json ───────► worker          (Envelope)
//!
//! process mode: one `dfx worker <envelope>` per task
//! driver ◄── last non-empty stdout line ─────────────── dfx worker      (WorkerReport)
//!
//! pool mode: one long-lived `dfx worker --serve` per slot, many tasks each
//! driver ── stdin:  {"task": {<envelope>}}\n ────────► dfx worker --serve   (ServeRequest)
//!                   or {"envelope": "<path>"}\n
//! driver ◄── stdout: one response line per request ──── dfx worker --serve   (ServeResponse)
//! ```
//!
//! # Envelope
//!
//! A JSON file: `spec` (the session spec, an object or a string holding
//! one), `plan` (path of the encoded stage), `stage_id`, `partition` (the
//! map) and `attempt` (0 when absent). A retry gets a copy of the first
//! attempt's envelope with its number, `task-S-M.attempt-N.json`, so a
//! worker still reading an earlier attempt's file is not disturbed.
//!
//! # Report (process mode)
//!
//! The last non-empty line of the worker's stdout, exit status 0:
//! `{"stage_id": S, "partition": M, "rows": R, "bytes": B, "elapsed_ms": T}`.
//! `rows` and `bytes` are summed over the writer's summary (every bucket it
//! published); `elapsed_ms` (a float) is the worker's own time for the task.
//! `bytes` and `elapsed_ms` are newer: a report without them (an older
//! worker) is read with both unknown. A failed task exits non-zero with its
//! message on stderr. Any other stdout line is ignored.
//!
//! # Serve protocol (pool mode)
//!
//! `<worker command> --serve` loads the plugin once, then reads requests from
//! stdin, one JSON object per line: `{"envelope": "<path>"}` (an envelope
//! file), or `{"task": {...}}` holding the envelope itself (what the Rust
//! driver's pool sends: it writes no envelope files). For each it runs
//! the task exactly as process mode does (same checks, same order) and
//! writes exactly one JSON line to stdout:
//!
//! - success: `{"stage_id": S, "partition": M, "rows": R, "bytes": B, "elapsed_ms": T}`,
//!   the report above, `elapsed_ms` measured from reading the request to
//!   writing the report;
//! - a task that failed: `{"stage_id": S, "partition": M, "error": "<message>"}`,
//!   with `stage_id` and `partition` `null` when the envelope could not be
//!   read; the worker then serves the next request.
//!
//! End of stdin: the worker exits with status 0. A worker may keep the last
//! one or two sessions it built (keyed by the spec) for the next tasks.
//! Other lines a library prints to stdout may come before a response: the
//! driver reads lines until one is a response object (a JSON object with a
//! `rows` or an `error` key) and keeps the others as the task's output. A
//! worker that exits or is killed while a request is outstanding fails that
//! task; the driver replaces it with a fresh process for later tasks.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize};

use crate::error::{HostError, Result};
use crate::session::SessionSpec;

/// Name of the driver's scratch directory inside a shuffle directory. Stage
/// output owns the shuffle directory itself; nothing else is written there.
pub const TASK_DIR: &str = "tasks";

/// One task: which stage, which map, and the session to run it in.
///
/// The JSON keys are the contract shared with the Python host; the map
/// travels as `partition` (a map is one partition of the stage's input).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// The session to build (same factory as the driver's).
    #[serde(deserialize_with = "spec_object_or_string")]
    pub spec: SessionSpec,
    /// Path of the encoded stage.
    pub plan: PathBuf,
    /// The stage's id.
    pub stage_id: u64,
    /// The map to run: the partition of the stage's input it reads.
    pub partition: usize,
    /// Which attempt of the task this is: 0 for the first, counted up by
    /// each retry (and each rerun of a map whose output was lost). Absent in
    /// envelopes written before retries existed: the first.
    #[serde(default)]
    pub attempt: u32,
}

// The spec may arrive as an object or as a JSON string holding one (a
// driver that serialized the spec first and embedded the text).
fn spec_object_or_string<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<SessionSpec, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Object(SessionSpec),
        Text(String),
    }
    match Either::deserialize(d)? {
        Either::Object(spec) => Ok(spec),
        Either::Text(text) => serde_json::from_str(&text).map_err(serde::de::Error::custom),
    }
}

impl Envelope {
    /// Read an envelope file.
    ///
    /// # Errors
    ///
    /// A file that cannot be read or does not parse, named in the message.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| HostError::io("cannot read envelope", path, e))?;
        serde_json::from_str(&text).map_err(|source| HostError::Json {
            what: "envelope",
            path: path.to_path_buf(),
            source,
        })
    }

    /// Write this envelope to `path`.
    ///
    /// # Errors
    ///
    /// A file that cannot be written.
    pub fn write(&self, path: &Path) -> Result<()> {
        // Cannot fail: every field serializes.
        let text = serde_json::to_string_pretty(self).unwrap_or_default();
        std::fs::write(path, text).map_err(|e| HostError::io("cannot write envelope", path, e))
    }
}

/// The file the envelope of map `map` of stage `stage_id` is written to
/// (`task-S-M.json`).
pub fn envelope_path(task_dir: &Path, stage_id: u64, map: usize) -> PathBuf {
    task_dir.join(format!("task-{stage_id}-{map}.json"))
}

/// The envelope of attempt `attempt` of the task whose first envelope is
/// `first` (`task-S-M.json` → `task-S-M.attempt-N.json`); `first` itself for
/// attempt 0.
pub fn attempt_path(first: &Path, attempt: u32) -> PathBuf {
    if attempt == 0 {
        return first.to_path_buf();
    }
    let stem = first
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    first.with_file_name(format!("{stem}.attempt-{attempt}.json"))
}

/// The file the encoded stage `stage_id` is written to.
pub fn plan_path(task_dir: &Path, stage_id: u64) -> PathBuf {
    task_dir.join(format!("stage-{stage_id}.plan"))
}

/// What a worker reports for a task it completed: the last line of stdout in
/// process mode, the response line in serve mode.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WorkerReport {
    /// The stage the worker ran.
    pub stage_id: u64,
    /// The map it ran (the envelope's `partition`).
    pub partition: usize,
    /// Rows it published, over all of its buckets.
    pub rows: usize,
    /// Bytes it published, over all of its buckets (the writer's summary);
    /// unknown from an older worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// The worker's own time for the task, in milliseconds; unknown from an
    /// older worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elapsed_ms: Option<f64>,
}

impl WorkerReport {
    /// The report as one JSON line (no newline).
    pub fn to_line(&self) -> String {
        // Cannot fail: integers and a float (a non-finite one becomes null).
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Read the report off a worker's stdout.
    ///
    /// The last non-empty line, not the whole stream: anything loaded into a
    /// worker may print to stdout, and parsing the whole buffer would turn one
    /// stray line into a failure far from its cause.
    ///
    /// # Errors
    ///
    /// A description of what was wrong, for the caller to attach to the task.
    pub fn parse(stdout: &str) -> std::result::Result<Self, String> {
        let line = stdout
            .lines()
            .rev()
            .find(|line| !line.trim().is_empty())
            .ok_or_else(|| "printed no report".to_string())?;
        serde_json::from_str(line.trim())
            .map_err(|err| format!("printed an unreadable report {line:?} ({err})"))
    }
}

/// One request to a serving worker (`--serve`): run one task, named by its
/// envelope file or carried whole.
///
/// The Rust driver's pool sends the envelope itself, so a query's tasks need
/// no file each (creating one is a few hundred microseconds of the driver's
/// CPU, more on a file system without a journal that was just cleaned up);
/// process mode and the Python driver use files. A worker of either host
/// takes both forms.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ServeRequest {
    /// `{"envelope": "<path>"}`: the task's envelope file.
    File {
        /// The envelope file of the task.
        envelope: PathBuf,
    },
    /// `{"task": {<envelope>}}`: the envelope itself.
    Inline {
        /// The task's envelope, as its file would hold it.
        task: Box<Envelope>,
    },
}

impl ServeRequest {
    /// The request as one JSON line, newline included.
    pub fn to_line(&self) -> String {
        // Cannot fail: a path (a non-UTF-8 one is an error we map to "") or
        // an envelope, whose every field serializes.
        let mut line = serde_json::to_string(self).unwrap_or_default();
        line.push('\n');
        line
    }

    /// The envelope the request names or carries.
    ///
    /// # Errors
    ///
    /// An envelope file that cannot be read or does not parse.
    pub fn envelope(self) -> Result<Envelope> {
        match self {
            Self::File { envelope } => Envelope::read(&envelope),
            Self::Inline { task } => Ok(*task),
        }
    }
}

/// A serving worker's answer to one request: the task's report, or why it
/// failed.
#[derive(Debug, Clone, PartialEq)]
pub enum ServeResponse {
    /// The task completed.
    Report(WorkerReport),
    /// The task failed; the worker goes on serving.
    Error(TaskError),
}

/// A task a serving worker could not complete, as it reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskError {
    /// The envelope's stage; `None` when the envelope could not be read.
    pub stage_id: Option<u64>,
    /// The envelope's map; `None` when the envelope could not be read.
    pub partition: Option<usize>,
    /// What went wrong.
    pub error: String,
}

impl ServeResponse {
    /// The response as one JSON line (no newline).
    pub fn to_line(&self) -> String {
        // Cannot fail: numbers, nulls and strings.
        match self {
            ServeResponse::Report(report) => report.to_line(),
            ServeResponse::Error(error) => serde_json::to_string(error).unwrap_or_default(),
        }
    }

    /// Read one stdout line of a serving worker.
    ///
    /// `None` for a line that is not a response (not a JSON object with a
    /// `rows` or an `error` key): a library's stray print, kept by the caller
    /// as output. `Some(Err)` for a line that claims to be a response but
    /// does not read as one.
    pub fn parse_line(line: &str) -> Option<std::result::Result<Self, String>> {
        let value: serde_json::Value = serde_json::from_str(line.trim()).ok()?;
        let object = value.as_object()?;
        let unreadable =
            |err: serde_json::Error| format!("an unreadable response {line:?} ({err})");
        if object.contains_key("error") {
            Some(
                serde_json::from_value(value)
                    .map(ServeResponse::Error)
                    .map_err(unreadable),
            )
        } else if object.contains_key("rows") {
            Some(
                serde_json::from_value(value)
                    .map(ServeResponse::Report)
                    .map_err(unreadable),
            )
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_is_the_last_non_empty_line() {
        let out = "noise\n{\"not\": \"it\"}\n{\"stage_id\": 2, \"partition\": 1, \"rows\": 7}\n\n";
        assert_eq!(
            WorkerReport::parse(out).unwrap(),
            WorkerReport {
                stage_id: 2,
                partition: 1,
                rows: 7,
                bytes: None,
                elapsed_ms: None,
            }
        );
        assert!(
            WorkerReport::parse("\n \n")
                .unwrap_err()
                .contains("no report")
        );
        assert!(
            WorkerReport::parse("rows: 7")
                .unwrap_err()
                .contains("unreadable")
        );
    }

    #[test]
    fn spec_may_be_embedded_as_text() {
        let json = r#"{"spec": "{\"tables\": {}, \"shuffle_dir\": \"/s\"}", "plan": "/s/tasks/stage-1.plan", "stage_id": 1, "partition": 0}"#;
        let envelope: Envelope = serde_json::from_str(json).unwrap();
        assert_eq!(envelope.spec.shuffle_dir, Some(PathBuf::from("/s")));
    }

    #[test]
    fn a_report_with_bytes_and_time_round_trips() {
        let report = WorkerReport {
            stage_id: 3,
            partition: 0,
            rows: 5,
            bytes: Some(640),
            elapsed_ms: Some(1.5),
        };
        assert_eq!(WorkerReport::parse(&report.to_line()).unwrap(), report);
        assert_eq!(
            ServeResponse::parse_line(&report.to_line()),
            Some(Ok(ServeResponse::Report(report)))
        );
    }

    #[test]
    fn serve_responses_are_told_from_other_lines() {
        assert_eq!(ServeResponse::parse_line("loading the plugin..."), None);
        assert_eq!(ServeResponse::parse_line("{\"progress\": 3}"), None);
        assert_eq!(ServeResponse::parse_line("[1, 2]"), None);
        let error = ServeResponse::parse_line(
            "{\"stage_id\": null, \"partition\": null, \"error\": \"cannot read envelope\"}",
        );
        assert_eq!(
            error,
            Some(Ok(ServeResponse::Error(TaskError {
                stage_id: None,
                partition: None,
                error: "cannot read envelope".into()
            })))
        );
        let bad = ServeResponse::parse_line("{\"rows\": \"many\"}").unwrap();
        assert!(bad.unwrap_err().contains("unreadable response"));
        let request = ServeRequest::File {
            envelope: "/s/tasks/task-1-0.json".into(),
        };
        assert_eq!(
            request.to_line(),
            "{\"envelope\":\"/s/tasks/task-1-0.json\"}\n"
        );
    }

    #[test]
    fn an_inline_request_carries_the_envelope_its_file_would_hold() {
        let envelope = Envelope {
            spec: SessionSpec::default(),
            plan: "/s/tasks/stage-2.plan".into(),
            stage_id: 2,
            partition: 5,
            attempt: 1,
        };
        let request = ServeRequest::Inline {
            task: Box::new(envelope.clone()),
        };
        let line = request.to_line();
        assert!(line.starts_with("{\"task\":{"), "{line}");
        let parsed: ServeRequest = serde_json::from_str(line.trim()).unwrap();
        assert_eq!(parsed.envelope().unwrap(), envelope);
        // The file form still parses as the file form.
        let file: ServeRequest = serde_json::from_str("{\"envelope\": \"/s/t.json\"}").unwrap();
        assert_eq!(
            file,
            ServeRequest::File {
                envelope: "/s/t.json".into()
            }
        );
        // Neither form: refused.
        assert!(serde_json::from_str::<ServeRequest>("{\"task\": 3}").is_err());
    }
}
