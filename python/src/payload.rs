//! What an encoded stage says about itself, read without decoding it.
//!
//! A worker must refuse a stage whose shuffle directory differs from its
//! spec before running it, and a decoded stage is a foreign node whose
//! display carries only its name. So the worker reads the stage's payload
//! from the plan bytes instead:
//!
//! ```text
//! PhysicalPlanNode (root = the stage)
//!   └─ Extension.node = [datafusion-python envelope]  dfx payload
//!        envelope:  b"DFPYCHN" | version u8 | id length u32 LE | codec id
//!        payload:   b"DFXS" | version u16 LE | stage id u64 LE | dir length u32 LE | dir
//! ```
//!
//! The envelope is datafusion-python's framing of a chained codec's payload
//! (present when a Python session encoded the stage); the payload layout is
//! the plugin's (`plugin/src/codec.rs`). This reader is a stopgap until the
//! plugin exports a payload reader of its own; it checks the plugin's codec
//! id and the payload version, and refuses anything else by name.

use datafusion_proto::protobuf::PhysicalPlanNode;
use datafusion_proto::protobuf::physical_plan_node::PhysicalPlanType;
use prost::Message;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::plugin::plugin;

/// datafusion-python's envelope around a chained codec's payload.
const PYTHON_ENVELOPE_MAGIC: &[u8] = b"DFPYCHN";
const PYTHON_ENVELOPE_VERSION: u8 = 1;
/// The plugin's stage payload (see `plugin/src/codec.rs`).
const STAGE_PAYLOAD_MAGIC: &[u8] = b"DFXS";
const STAGE_PAYLOAD_VERSION: u16 = 1;

/// `(stage_id, shuffle_dir)` of the stage at the root of `plan` (bytes of an
/// encoded stage, as the driver writes them).
///
/// # Errors
///
/// `ValueError` naming what is wrong: not a plan, a root that is not an
/// extension node, another codec's payload, a truncated or unknown payload.
#[pyfunction]
pub fn stage_payload(py: Python<'_>, plan: &[u8]) -> PyResult<(u64, String)> {
    let codec_id = plugin(py)?.codec_id();
    let fail = |what: String| PyValueError::new_err(format!("dfx_engine: encoded stage: {what}"));
    let node = PhysicalPlanNode::decode(plan)
        .map_err(|err| fail(format!("not a physical plan ({} bytes): {err}", plan.len())))?;
    let Some(PhysicalPlanType::Extension(extension)) = node.physical_plan_type else {
        return Err(fail(
            "the root node is not an extension node, so not a stage".into(),
        ));
    };
    let payload = strip_python_envelope(&extension.node, codec_id).map_err(&fail)?;
    parse_stage_payload(payload).map_err(fail)
}

fn strip_python_envelope<'a>(buf: &'a [u8], codec_id: &str) -> Result<&'a [u8], String> {
    let Some(rest) = buf.strip_prefix(PYTHON_ENVELOPE_MAGIC) else {
        return Ok(buf);
    };
    let (&version, rest) = rest.split_first().ok_or("truncated codec envelope")?;
    if version != PYTHON_ENVELOPE_VERSION {
        return Err(format!(
            "codec envelope version {version}, expected {PYTHON_ENVELOPE_VERSION}"
        ));
    }
    let (len, rest) = rest.split_at_checked(4).ok_or("truncated codec envelope")?;
    let len = u32::from_le_bytes(len.try_into().map_err(|_| "truncated codec envelope")?) as usize;
    let (id, rest) = rest
        .split_at_checked(len)
        .ok_or("truncated codec envelope")?;
    if id != codec_id.as_bytes() {
        return Err(format!(
            "the root node was encoded by codec {:?}, not {codec_id:?}",
            String::from_utf8_lossy(id)
        ));
    }
    Ok(rest)
}

fn parse_stage_payload(buf: &[u8]) -> Result<(u64, String), String> {
    let rest = buf
        .strip_prefix(STAGE_PAYLOAD_MAGIC)
        .ok_or("the root node's payload is not a dfx stage payload")?;
    let (version, rest) = rest.split_at_checked(2).ok_or("truncated stage payload")?;
    let version = u16::from_le_bytes([version[0], version[1]]);
    if version != STAGE_PAYLOAD_VERSION {
        return Err(format!(
            "stage payload version {version}, this module reads {STAGE_PAYLOAD_VERSION}"
        ));
    }
    let (stage, rest) = rest.split_at_checked(8).ok_or("truncated stage payload")?;
    let stage = u64::from_le_bytes(stage.try_into().map_err(|_| "truncated stage payload")?);
    let (len, dir) = rest.split_at_checked(4).ok_or("truncated stage payload")?;
    let len = u32::from_le_bytes(len.try_into().map_err(|_| "truncated stage payload")?) as usize;
    if dir.len() != len {
        return Err(format!(
            "stage payload declares a {len}-byte directory but carries {} bytes",
            dir.len()
        ));
    }
    let dir =
        std::str::from_utf8(dir).map_err(|err| format!("shuffle directory is not UTF-8: {err}"))?;
    Ok((stage, dir.to_string()))
}
