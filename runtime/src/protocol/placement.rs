//! What a foreign executor places a task by, read from its envelope: which
//! task it is, the shuffle location it writes under, and how much of its
//! input each map server holds (from the layouts the driver handed it, the
//! [`dfx_abi::SHUFFLE_RANGES`] stage option).
//!
//! An executor whose workers serve their map files (Ray's dfx actors)
//! prefers the worker holding most of a task's input, and remembers the
//! locations its tasks wrote under, to remove them when their query is done.
//! Only the fields it needs are decoded, not the whole spec.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use dfx_abi::{SHUFFLE_RANGES, StageLayouts};
use serde::Deserialize;

use crate::error::{Result, RuntimeError};
use crate::protocol::envelope::spec_object_or_string;

/// Where a task writes, and where its input lies (module doc).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// The task's stage.
    pub stage_id: u64,
    /// The task's map (the envelope's `partition`).
    pub map: usize,
    /// The attempt (0 for the first).
    pub attempt: u32,
    /// The spec's shuffle location (`shuffle_dir`), empty when it names none.
    pub location: String,
    /// Bytes of the task's input each map server holds, by its address. Maps
    /// without an owner (read from the location) are not counted.
    pub input_by_owner: BTreeMap<String, u64>,
}

impl Placement {
    /// The placement of the task whose envelope is `envelope_json`.
    ///
    /// # Errors
    ///
    /// An envelope that is not JSON with a `spec`, or layouts that are not
    /// the driver's, said so.
    pub fn of(envelope_json: &str) -> Result<Self> {
        let envelope: PlacedEnvelope = serde_json::from_str(envelope_json)
            .map_err(|e| RuntimeError::Invalid(format!("task envelope: {e}")))?;
        let spec = &envelope.spec;
        let mut input_by_owner = BTreeMap::new();
        if let Some(text) = spec.stage_options.get(SHUFFLE_RANGES) {
            let layouts = StageLayouts::parse(text).map_err(RuntimeError::Invalid)?;
            for layout in layouts.iter().flat_map(|l| l.stages.values().flatten()) {
                if let Some(owner) = &layout.owner {
                    *input_by_owner.entry(owner.clone()).or_default() +=
                        layout.bytes.iter().sum::<u64>();
                }
            }
        }
        Ok(Self {
            stage_id: envelope.stage_id,
            map: envelope.partition,
            attempt: envelope.attempt,
            location: spec
                .shuffle_dir
                .as_ref()
                .map(|d| d.to_string_lossy().into_owned())
                .unwrap_or_default(),
            input_by_owner,
        })
    }
}

/// The envelope, as far as placement reads it.
#[derive(Deserialize)]
struct PlacedEnvelope {
    #[serde(deserialize_with = "spec_object_or_string")]
    spec: PlacedSpec,
    stage_id: u64,
    partition: usize,
    #[serde(default)]
    attempt: u32,
}

/// The spec, as far as placement reads it.
#[derive(Deserialize)]
struct PlacedSpec {
    #[serde(default)]
    shuffle_dir: Option<PathBuf>,
    #[serde(default)]
    stage_options: HashMap<String, String>,
}

#[cfg(test)]
mod tests {
    use dfx_abi::MapLayout;
    use serde_json::json;

    use super::*;

    fn layout(owner: Option<&str>, bytes: Vec<u64>) -> MapLayout {
        let size = bytes.iter().sum();
        let mut offsets = Vec::new();
        let mut at = 0;
        for b in &bytes {
            offsets.push(at);
            at += b;
        }
        MapLayout {
            first_bucket: 0,
            offsets,
            rows: vec![1; bytes.len()],
            bytes,
            size,
            owner: owner.map(str::to_string),
            ..MapLayout::default()
        }
    }

    #[test]
    fn input_is_summed_per_owner_over_every_upstream_stage() {
        let layouts = StageLayouts {
            stages: BTreeMap::from([
                (
                    1,
                    vec![
                        layout(Some("http://10.0.0.2:7000"), vec![100, 20]),
                        layout(Some("http://10.0.0.3:7000"), vec![5, 5]),
                    ],
                ),
                (
                    2,
                    vec![
                        layout(Some("http://10.0.0.2:7000"), vec![7]),
                        layout(None, vec![1000]),
                    ],
                ),
            ]),
        };
        let spec = json!({
            "shuffle_dir": "s3://bucket/q1",
            "stage_options": {SHUFFLE_RANGES: layouts.format()},
            "target_partitions": 4,
        });
        for spec in [spec.clone(), json!(spec.to_string())] {
            let envelope = json!({
                "spec": spec, "plan": "p", "stage_id": 3, "partition": 5, "attempt": 2,
            });
            let placement = Placement::of(&envelope.to_string()).unwrap();
            assert_eq!(
                (placement.stage_id, placement.map, placement.attempt),
                (3, 5, 2)
            );
            assert_eq!(placement.location, "s3://bucket/q1");
            assert_eq!(
                placement.input_by_owner,
                BTreeMap::from([
                    ("http://10.0.0.2:7000".into(), 127),
                    ("http://10.0.0.3:7000".into(), 10)
                ])
            );
        }
    }

    #[test]
    fn a_task_reading_no_layouts_holds_nothing_anywhere() {
        let envelope = json!({"spec": {}, "plan": "p", "stage_id": 1, "partition": 4});
        let placement = Placement::of(&envelope.to_string()).unwrap();
        assert_eq!(
            (placement.stage_id, placement.map, placement.attempt),
            (1, 4, 0)
        );
        assert_eq!(placement.location, "");
        assert!(placement.input_by_owner.is_empty());
    }

    #[test]
    fn a_broken_envelope_or_layout_is_refused_saying_which() {
        let err = Placement::of("{\"plan\": 1}").unwrap_err().to_string();
        assert!(
            err.contains("task envelope") && err.contains("spec"),
            "{err}"
        );
        let envelope = json!({
            "spec": {"stage_options": {SHUFFLE_RANGES: "[1"}}, "stage_id": 1, "partition": 0,
        });
        let err = Placement::of(&envelope.to_string())
            .unwrap_err()
            .to_string();
        assert!(err.contains(SHUFFLE_RANGES), "{err}");
    }
}
