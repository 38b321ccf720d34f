//! What travels between driver and worker: the task envelope and the report.
//!
//! ```text
//! driver ── <shuffle_dir>/tasks/task-S-P.json ──► dfx worker     (Envelope)
//! driver ◄── last non-empty stdout line ───────── dfx worker     (WorkerReport)
//! ```
//!
//! Both are JSON so the Python host's driver and workers can exchange them
//! with this one.

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

/// The file the encoded stage `stage_id` is written to.
pub fn plan_path(task_dir: &Path, stage_id: u64) -> PathBuf {
    task_dir.join(format!("stage-{stage_id}.plan"))
}

/// What a worker prints as its last line of stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerReport {
    /// The stage the worker ran.
    pub stage_id: u64,
    /// The map it ran (the envelope's `partition`).
    pub partition: usize,
    /// Rows it published, over all of its buckets.
    pub rows: usize,
}

impl WorkerReport {
    /// The report as one JSON line (no newline).
    pub fn to_line(&self) -> String {
        // Cannot fail: three integers.
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
                rows: 7
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
}
