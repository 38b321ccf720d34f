//! The targets: each owns its seeds, its dictionary and its property.
//!
//! | target | what it runs | property beyond "no panic" |
//! | --- | --- | --- |
//! | `codec-payload` | the plugin codec's payload parser and `try_decode` | an accepted payload re-encodes to the same bytes; every error names dfx |
//! | `stage-info` | reading a stage description from encoded plan bytes (`encoded_stage_info`) | every error names dfx |
//! | `vet-stage` | a worker's check of an encoded stage (`vet_stage`: protobuf walked as JSON) | every refusal says what it refuses |
//! | `envelope` | the task envelope (serde) | an accepted envelope survives write and read unchanged |
//! | `worker-report` | a worker's response, report or classified error (`Response::parse_last`) | an accepted response survives `to_line` and `parse_last` |
//! | `marker` | a `ShuffleReaderExec` reading a map file closed by the input as its commit marker | every error names the stage; no panic caught by the plugin's guard |
//! | `bucket` | a `ShuffleReaderExec` reading a map file whose one segment is the input | the same |

mod codec;
mod envelope;
mod shuffle;

use crate::Target;

pub use codec::{CodecPayload, StageInfo, VetStage};
pub use envelope::{EnvelopeTarget, WorkerReportTarget};
pub use shuffle::{BucketTarget, MarkerTarget};

/// Every target's name, in the order `--target all` runs them.
pub const NAMES: [&str; 7] = [
    "codec-payload",
    "stage-info",
    "vet-stage",
    "envelope",
    "worker-report",
    "marker",
    "bucket",
];

/// The target called `name`.
///
/// # Errors
///
/// An unknown name, or a target whose seeds cannot be made (the shuffle
/// targets write real files).
pub fn by_name(name: &str) -> Result<Box<dyn Target>, String> {
    Ok(match name {
        "codec-payload" => Box::new(CodecPayload::new()?),
        "stage-info" => Box::new(StageInfo::new()?),
        "vet-stage" => Box::new(VetStage::new()?),
        "envelope" => Box::new(EnvelopeTarget),
        "worker-report" => Box::new(WorkerReportTarget),
        "marker" => Box::new(MarkerTarget::new()?),
        "bucket" => Box::new(BucketTarget::new()?),
        other => {
            return Err(format!(
                "unknown target {other:?}; the targets are {} (or all)",
                NAMES.join(", ")
            ));
        }
    })
}

/// JSON punctuation and edge values, for the JSON targets.
pub(crate) fn json_dictionary() -> Vec<Vec<u8>> {
    [
        "{",
        "}",
        "[",
        "]",
        ":",
        ",",
        "\"",
        "\\",
        "\\u0000",
        "\\ud800",
        "null",
        "true",
        "false",
        "0",
        "-1",
        "-0",
        "1e999",
        "1.5",
        "18446744073709551615",
        "18446744073709551616",
        "-9223372036854775809",
        "\"\"",
        "{}",
        "[]",
        "\n",
        " ",
    ]
    .iter()
    .map(|token| token.as_bytes().to_vec())
    .collect()
}
