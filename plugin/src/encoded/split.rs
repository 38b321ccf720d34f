//! Cutting an encoded plan into its stages: each reader carries the stage
//! it reads as a blob (see [`crate::wire`]), so the stages are found in the
//! bytes without decoding a node.
//!
//! ```text
//! encoded plan:   head ── reader [stage 1: writer ── .. ── reader [stage 2: ..]]
//! split_plan:     [stage 1: writer ── .. ── reader [], stage 2: ..]
//! ```
//!
//! A stage comes out with its own readers emptied (their stages come out
//! beside it), so a task's plan holds its stage's nodes only, and stages
//! come out in pre-order: the order the planner numbered them in.

use datafusion::common::Result;
use datafusion_proto::protobuf::PhysicalPlanNode;
use datafusion_proto::protobuf::physical_plan_node::PhysicalPlanType;
use prost::Message;

use crate::encoded::walk::{children_mut, find_payload};
use crate::error::{Area, fail};
use crate::wire::{Payload, reframe};

/// The stages of the encoded plan `plan_bytes`, in pre-order, each an
/// encoded plan rooted at its writer whose readers no longer carry their
/// stages. A plan rooted at a writer is a stage itself, the first.
///
/// # Errors
///
/// Bytes that are not an encoded physical plan, or a stage inside that is
/// not one.
pub fn split_plan(plan_bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
    let mut root = decode(plan_bytes, "the plan")?;
    let mut stages = Vec::new();
    let rooted_at_writer = matches!(
        &root.physical_plan_type,
        Some(PhysicalPlanType::Extension(e))
            if matches!(find_payload(&e.node), Some((_, Payload::Writer(_))))
    );
    if rooted_at_writer {
        stages.push(Vec::new());
    }
    take_stages(&mut root, &mut stages)?;
    if rooted_at_writer {
        stages[0] = root.encode_to_vec();
    }
    Ok(stages)
}

fn decode(bytes: &[u8], what: &str) -> Result<PhysicalPlanNode> {
    PhysicalPlanNode::decode(bytes).map_err(|e| {
        fail(
            Area::Codec,
            format!("{what} is not an encoded physical plan: {e}"),
        )
    })
}

/// Move the stage of every reader in `node` into `out`, in pre-order.
fn take_stages(node: &mut PhysicalPlanNode, out: &mut Vec<Vec<u8>>) -> Result<()> {
    let Some(kind) = node.physical_plan_type.as_mut() else {
        return Ok(());
    };
    let PhysicalPlanType::Extension(extension) = kind else {
        for child in children_mut(kind) {
            take_stages(child, out)?;
        }
        return Ok(());
    };
    if let Some((start, Payload::Reader(mut reader))) = find_payload(&extension.node) {
        if reader.stage.is_empty() {
            return Ok(());
        }
        let mut stage = decode(
            &reader.stage,
            &format!("the stage {} a reader carries", reader.stage_id),
        )?;
        // Its place is before the stages it reads: pre-order.
        let at = out.len();
        out.push(Vec::new());
        take_stages(&mut stage, out)?;
        out[at] = stage.encode_to_vec();
        reader.stage.clear();
        // The frame a host's codec chain put before the payload stays.
        extension.node = reframe(&extension.node, start, &Payload::Reader(reader))?;
        return Ok(());
    }
    for input in &mut extension.inputs {
        take_stages(input, out)?;
    }
    Ok(())
}
