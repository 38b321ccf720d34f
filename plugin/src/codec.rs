//! The physical extension codec for `ShuffleStageExec`.
//!
//! Claims only the stage node; every other node belongs to the host's chain,
//! which also encodes the stage's child (the codec sees the node, never its
//! subtree). The payload is framed so that bytes from elsewhere are refused
//! with a reason instead of being misread:
//!
//! ```text
//! offset  size  field
//! 0       4     magic  b"DFXS"
//! 4       2     payload version, little endian (PAYLOAD_VERSION)
//! 6       8     stage id, little endian
//! 14      4     shuffle dir length in bytes, little endian
//! 18      n     shuffle dir, UTF-8
//! ```

use std::path::PathBuf;
use std::sync::Arc;

use datafusion::common::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use datafusion_proto::protobuf::PhysicalPlanNode;
use datafusion_proto::protobuf::physical_plan_node::PhysicalPlanType;
use prost::Message;

use crate::counters::{self, LiveObject};
use crate::stage::ShuffleStageExec;

/// The codec's id, as hosts list it among their session's codecs.
pub const CODEC_ID: &str = "dfx_engine.physical.v1";

/// First bytes of every dfx payload.
pub const PAYLOAD_MAGIC: [u8; 4] = *b"DFXS";

/// Version of the payload layout this plugin writes and reads.
pub const PAYLOAD_VERSION: u16 = 1;

const HEADER_LEN: usize = 4 + 2 + 8 + 4;

/// What a stage node carries across a process boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagePayload {
    /// The stage's id.
    pub stage_id: u64,
    /// The stage's shuffle directory.
    pub shuffle_dir: String,
}

impl StagePayload {
    /// The framed bytes.
    pub fn encode(&self, buf: &mut Vec<u8>) -> Result<()> {
        let dir = self.shuffle_dir.as_bytes();
        let dir_len = u32::try_from(dir.len()).map_err(|_| {
            DataFusionError::Execution(format!(
                "dfx codec: shuffle directory of {} bytes is too long to encode",
                dir.len()
            ))
        })?;
        buf.extend_from_slice(&PAYLOAD_MAGIC);
        buf.extend_from_slice(&PAYLOAD_VERSION.to_le_bytes());
        buf.extend_from_slice(&self.stage_id.to_le_bytes());
        buf.extend_from_slice(&dir_len.to_le_bytes());
        buf.extend_from_slice(dir);
        Ok(())
    }

    /// Parse framed bytes.
    ///
    /// # Errors
    ///
    /// Bytes that are not a dfx payload, a payload of another version, a
    /// truncated payload or trailing bytes: each named in the message.
    pub fn decode(buf: &[u8]) -> Result<Self> {
        let fail = |what: String| DataFusionError::Execution(format!("dfx codec: {what}"));
        if buf.len() < HEADER_LEN {
            if buf.len() >= 4 && buf[..4] != PAYLOAD_MAGIC {
                return Err(fail(not_ours(buf)));
            }
            return Err(fail(format!(
                "truncated stage payload: {} bytes, the header alone is {HEADER_LEN}",
                buf.len()
            )));
        }
        if buf[..4] != PAYLOAD_MAGIC {
            return Err(fail(not_ours(buf)));
        }
        let version = u16::from_le_bytes([buf[4], buf[5]]);
        if version != PAYLOAD_VERSION {
            return Err(fail(format!(
                "stage payload version {version} is not supported; this plugin reads version \
                 {PAYLOAD_VERSION} (was the plan encoded by a newer dfx?)"
            )));
        }
        let stage_id = u64::from_le_bytes(buf[6..14].try_into().expect("8 bytes"));
        let dir_len = u32::from_le_bytes(buf[14..18].try_into().expect("4 bytes")) as usize;
        let body = &buf[HEADER_LEN..];
        if body.len() != dir_len {
            return Err(fail(format!(
                "stage payload declares a {dir_len}-byte shuffle directory but carries {} bytes \
                 ({})",
                body.len(),
                if body.len() < dir_len {
                    "truncated"
                } else {
                    "trailing bytes"
                }
            )));
        }
        let shuffle_dir = std::str::from_utf8(body)
            .map_err(|e| {
                fail(format!(
                    "stage payload's shuffle directory is not UTF-8: {e}"
                ))
            })?
            .to_string();
        Ok(Self {
            stage_id,
            shuffle_dir,
        })
    }
}

/// The stage payload inside an encoded stage plan (the bytes a driver ships),
/// read without decoding the plan: the root node must be the stage.
///
/// A host's codec chain may wrap the payload in a frame of its own naming the
/// codec that wrote it; the payload is always the frame's tail, so it is
/// found by its magic and must then parse to the end.
///
/// # Errors
///
/// Bytes that are not a protobuf physical plan, a root that is not an
/// extension node, or an extension node carrying no dfx payload.
pub fn read_encoded_stage(plan_bytes: &[u8]) -> Result<StagePayload> {
    let fail = |what: String| DataFusionError::Execution(format!("dfx codec: {what}"));
    let root = PhysicalPlanNode::decode(plan_bytes)
        .map_err(|e| fail(format!("not an encoded physical plan: {e}")))?;
    let Some(PhysicalPlanType::Extension(extension)) = root.physical_plan_type else {
        return Err(fail(
            "the encoded plan's root is not an extension node, so not a dfx stage".to_string(),
        ));
    };
    let bytes = extension.node.as_slice();
    let mut last_error = None;
    for start in (0..bytes.len().saturating_sub(3)).filter(|&i| bytes[i..i + 4] == PAYLOAD_MAGIC) {
        match StagePayload::decode(&bytes[start..]) {
            Ok(payload) => return Ok(payload),
            Err(err) => last_error = Some(err),
        }
    }
    Err(last_error.unwrap_or_else(|| fail(not_ours(bytes))))
}

fn not_ours(buf: &[u8]) -> String {
    let shown = &buf[..buf.len().min(4)];
    format!("not a dfx stage payload: expected magic {PAYLOAD_MAGIC:02x?}, found {shown:02x?}")
}

/// Encodes and decodes `ShuffleStageExec`; refuses everything else.
#[derive(Debug)]
pub struct DfxPhysicalCodec {
    _live: LiveObject,
}

impl Default for DfxPhysicalCodec {
    fn default() -> Self {
        Self {
            _live: LiveObject::new(),
        }
    }
}

impl PhysicalExtensionCodec for DfxPhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        _ctx: &TaskContext,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let payload = StagePayload::decode(buf)?;
        let [input] = inputs else {
            return Err(DataFusionError::Execution(format!(
                "dfx codec: stage {} needs exactly one input, the plan gave {}",
                payload.stage_id,
                inputs.len()
            )));
        };
        counters::stage_decoded();
        Ok(Arc::new(ShuffleStageExec::new(
            payload.stage_id,
            PathBuf::from(payload.shuffle_dir),
            Arc::clone(input),
        )))
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        let Some(stage) = node.downcast_ref::<ShuffleStageExec>() else {
            return Err(DataFusionError::NotImplemented(format!(
                "dfx codec encodes only ShuffleStageExec, not {}",
                node.name()
            )));
        };
        let shuffle_dir = stage.shuffle_dir().to_str().ok_or_else(|| {
            DataFusionError::Execution(format!(
                "dfx codec: stage {} has a shuffle directory that is not UTF-8: {}",
                stage.stage_id(),
                stage.shuffle_dir().display()
            ))
        })?;
        StagePayload {
            stage_id: stage.stage_id(),
            shuffle_dir: shuffle_dir.to_string(),
        }
        .encode(buf)?;
        counters::stage_encoded();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut buf = Vec::new();
        StagePayload {
            stage_id: 7,
            shuffle_dir: "/tmp/shuffle-ä".into(),
        }
        .encode(&mut buf)
        .unwrap();
        buf
    }

    #[test]
    fn round_trip() {
        let payload = StagePayload::decode(&sample()).unwrap();
        assert_eq!(payload.stage_id, 7);
        assert_eq!(payload.shuffle_dir, "/tmp/shuffle-ä");
    }

    #[test]
    fn every_truncation_is_an_error_naming_dfx() {
        let buf = sample();
        for len in 0..buf.len() {
            let err = StagePayload::decode(&buf[..len]).unwrap_err().to_string();
            assert!(err.contains("dfx codec"), "len {len}: {err}");
            assert!(err.contains("truncated"), "len {len}: {err}");
        }
    }

    #[test]
    fn trailing_bytes_are_an_error() {
        let mut buf = sample();
        buf.push(0);
        let err = StagePayload::decode(&buf).unwrap_err().to_string();
        assert!(err.contains("trailing bytes"), "{err}");
    }

    #[test]
    fn unknown_version_is_named() {
        let mut buf = sample();
        buf[4..6].copy_from_slice(&(PAYLOAD_VERSION + 1).to_le_bytes());
        let err = StagePayload::decode(&buf).unwrap_err().to_string();
        assert!(
            err.contains(&format!("version {}", PAYLOAD_VERSION + 1)),
            "{err}"
        );
        assert!(err.contains("dfx codec"), "{err}");
    }

    #[test]
    fn random_bytes_never_panic() {
        // A small deterministic generator: the property is "no panic, an
        // error naming dfx", whatever the bytes.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for round in 0..2000 {
            let len = round % 64;
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            if let Err(err) = StagePayload::decode(&bytes) {
                assert!(err.to_string().contains("dfx codec"), "{err}");
            }
        }
    }

    #[test]
    fn foreign_magic_is_not_ours() {
        let err = StagePayload::decode(b"PAR1 and then some more bytes")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a dfx stage payload"), "{err}");
    }
}
