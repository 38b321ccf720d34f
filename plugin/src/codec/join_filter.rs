//! How the two filter nodes cross a process boundary: the body of the
//! codec's join filter payload (kind 7, see [`crate::codec`]), JSON with
//! each key as datafusion-proto `PhysicalExprNode` bytes in base64,
//! decoded against the node's input schema.
//!
//! ```text
//! {"node": "summary", "keys": [...], "max_rows": N}
//! {"node": "filter", "keys": [...], "max_rows": N,
//!  "build": {"stage_id": S, "maps": M, "buckets": B, "shuffle_dir": "..."}}
//! ```
//!
//! A filter that only prunes its scan (its rows tested higher in its
//! stage) is `"node": "bounds"`, with the same fields.

use std::path::PathBuf;
use std::sync::Arc;

use base64::Engine;
use datafusion::common::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::physical_plan::{
    PhysicalExtensionCodec, PhysicalPlanDecodeContext, PhysicalProtoConverterExtension,
};
use datafusion_proto::protobuf::PhysicalExprNode;
use prost::Message;
use serde::{Deserialize, Serialize};

use crate::error::Area;
use crate::error::fail;
use crate::exec::join_filter::{BuildStage, JoinFilterExec};
use crate::exec::key_summary::KeySummaryExec;

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Role {
    Summary,
    Filter,
    Bounds,
}

#[derive(Debug, Serialize, Deserialize)]
struct BuildWire {
    stage_id: u64,
    maps: u64,
    buckets: u64,
    shuffle_dir: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeWire {
    node: Role,
    keys: Vec<String>,
    max_rows: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    build: Option<BuildWire>,
}

fn encode_keys(
    keys: &[Arc<dyn PhysicalExpr>],
    codec: &dyn PhysicalExtensionCodec,
    converter: &dyn PhysicalProtoConverterExtension,
) -> Result<Vec<String>> {
    keys.iter()
        .map(|key| {
            let node = converter.physical_expr_to_proto(key, codec)?;
            Ok(base64::engine::general_purpose::STANDARD.encode(node.encode_to_vec()))
        })
        .collect()
}

/// The payload body of `node` when it is one of the filter nodes.
///
/// # Errors
///
/// A key datafusion-proto cannot encode, or a shuffle directory that is not
/// UTF-8.
pub fn encode_node(
    node: &Arc<dyn ExecutionPlan>,
    codec: &dyn PhysicalExtensionCodec,
    converter: &dyn PhysicalProtoConverterExtension,
) -> Result<Option<Vec<u8>>> {
    let wire = if let Some(summary) = node.downcast_ref::<KeySummaryExec>() {
        NodeWire {
            node: Role::Summary,
            keys: encode_keys(summary.keys(), codec, converter)?,
            max_rows: summary.max_rows(),
            build: None,
        }
    } else if let Some(filter) = node.downcast_ref::<JoinFilterExec>() {
        let build = filter.build();
        let shuffle_dir = build.shuffle_dir.to_str().ok_or_else(|| {
            fail(
                Area::JoinFilterCodec,
                format!(
                    "build stage {} has a shuffle directory that is not UTF-8: {}",
                    build.stage_id,
                    build.shuffle_dir.display()
                ),
            )
        })?;
        NodeWire {
            node: if filter.tests_rows() {
                Role::Filter
            } else {
                Role::Bounds
            },
            keys: encode_keys(filter.keys(), codec, converter)?,
            max_rows: filter.max_build_rows(),
            build: Some(BuildWire {
                stage_id: build.stage_id,
                maps: build.maps as u64,
                buckets: build.buckets as u64,
                shuffle_dir: shuffle_dir.to_string(),
            }),
        }
    } else {
        return Ok(None);
    };
    serde_json::to_vec(&wire)
        .map(Some)
        .map_err(|e| fail(Area::JoinFilterCodec, format!("cannot encode: {e}")))
}

fn parse(bytes: &[u8]) -> Result<NodeWire> {
    serde_json::from_slice(bytes)
        .map_err(|e| fail(Area::JoinFilterCodec, format!("not a valid payload: {e}")))
}

/// The shuffle location a filter node reads its build stage from (`None`
/// for a summary node, or bytes that are not a payload), for a worker's
/// checks.
pub fn read_location(bytes: &[u8]) -> Option<String> {
    parse(bytes).ok()?.build.map(|build| build.shuffle_dir)
}

/// The node a payload body encodes, over `input`.
///
/// # Errors
///
/// Bytes that are not a payload, a filter without its build stage, or a key
/// that does not decode against the input's schema.
pub fn decode_node(
    bytes: &[u8],
    input: &Arc<dyn ExecutionPlan>,
    ctx: &TaskContext,
    codec: &dyn PhysicalExtensionCodec,
    converter: &dyn PhysicalProtoConverterExtension,
) -> Result<Arc<dyn ExecutionPlan>> {
    let wire = parse(bytes)?;
    let schema = input.schema();
    let decode_ctx = PhysicalPlanDecodeContext::new(ctx, codec);
    let keys = wire
        .keys
        .iter()
        .map(|key| {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(key)
                .map_err(|e| fail(Area::JoinFilterCodec, format!("a key is not base64: {e}")))?;
            let node = PhysicalExprNode::decode(bytes.as_slice()).map_err(|e| {
                fail(
                    Area::JoinFilterCodec,
                    format!("a key is not valid protobuf: {e}"),
                )
            })?;
            converter
                .proto_to_physical_expr(&node, &schema, &decode_ctx)
                .map_err(|e| {
                    fail(
                        Area::JoinFilterCodec,
                        format!("a key does not decode against the input: {e}"),
                    )
                })
        })
        .collect::<Result<Vec<_>>>()?;
    if keys.is_empty() {
        return Err(fail(Area::JoinFilterCodec, "a node without keys"));
    }
    match (wire.node, wire.build) {
        (Role::Summary, None) => Ok(Arc::new(KeySummaryExec::new(
            Arc::clone(input),
            keys,
            wire.max_rows,
        ))),
        (role @ (Role::Filter | Role::Bounds), Some(build)) => {
            let filter = JoinFilterExec::new(
                Arc::clone(input),
                keys,
                BuildStage {
                    stage_id: build.stage_id,
                    maps: build.maps as usize,
                    buckets: build.buckets as usize,
                    shuffle_dir: PathBuf::from(build.shuffle_dir),
                },
                wire.max_rows,
            );
            Ok(Arc::new(match role {
                Role::Bounds => filter.bounds_only(),
                _ => filter,
            }))
        }
        (Role::Summary, Some(_)) => Err(fail(
            Area::JoinFilterCodec,
            "a summary node names a build stage",
        )),
        (Role::Filter | Role::Bounds, None) => Err(fail(
            Area::JoinFilterCodec,
            "a filter node names no build stage",
        )),
    }
}
