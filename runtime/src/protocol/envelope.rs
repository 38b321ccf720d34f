//! The task envelope: which stage, which map, and the session to run it in.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};

use crate::error::{Result, RuntimeError};
use crate::spec::SessionSpec;

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
    /// For a map an adaptive decision added past the stage's planned maps
    /// (a part of a split partition): the planned map it was made from,
    /// whose part of a stage file it reads. `None` for a planned map.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub added_from: Option<usize>,
}

/// The spec may arrive as an object or as a JSON string holding one (a
/// driver that serialized the spec first and embedded the text): `T` read
/// from either, a whole [`SessionSpec`] or only some of its fields.
pub(crate) fn spec_object_or_string<'de, D: Deserializer<'de>, T: DeserializeOwned>(
    d: D,
) -> std::result::Result<T, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either<T> {
        Object(Box<T>),
        Text(String),
    }
    match Either::<T>::deserialize(d)? {
        Either::Object(spec) => Ok(*spec),
        Either::Text(text) => serde_json::from_str(&text).map_err(serde::de::Error::custom),
    }
}

impl Envelope {
    /// The planned map whose part of the stage's plan this task reads: its
    /// own, or the one an added map was made from.
    pub fn planned_map(&self) -> usize {
        self.added_from.unwrap_or(self.partition)
    }

    /// Read an envelope file.
    ///
    /// # Errors
    ///
    /// A file that cannot be read or does not parse, named in the message.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| RuntimeError::io("cannot read envelope", path, e))?;
        serde_json::from_str(&text).map_err(|source| RuntimeError::Json {
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
        std::fs::write(path, text).map_err(|e| RuntimeError::io("cannot write envelope", path, e))
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
