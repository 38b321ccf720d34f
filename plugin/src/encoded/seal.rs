//! Sealing an encoded stage's input, in the worker that runs it, so the
//! plugin decodes and runs every operator of the stage itself (see
//! [`crate::exec::sealed_input`]).

use datafusion::common::Result;
use datafusion_proto::protobuf::physical_plan_node::PhysicalPlanType;
use datafusion_proto::protobuf::{PhysicalExtensionNode, PhysicalPlanNode};
use prost::Message;

use crate::encoded::walk::{children_mut, find_payload};
use crate::error::{Area, fail};
use crate::wire::Payload;

/// `stage` (an encoded stage, as a worker runs it) with its writer's one
/// input replaced by a sealed input holding it: the writer's own bytes,
/// framed as the host's chain framed them, over one node the plugin's codec
/// decodes into the whole input. Every dfx payload inside is unframed,
/// since the plugin alone decodes them there.
///
/// # Errors
///
/// Bytes that are not an encoded plan, or a plan whose root is not a
/// writer with one input.
pub fn seal_stage_input(stage: &[u8]) -> Result<Vec<u8>> {
    let mut root = PhysicalPlanNode::decode(stage)
        .map_err(|e| fail(Area::Codec, format!("not an encoded physical plan: {e}")))?;
    let Some(PhysicalPlanType::Extension(writer)) = root.physical_plan_type.as_mut() else {
        return Err(fail(Area::Codec, "the stage's root is not a writer"));
    };
    let Some((start, Payload::Writer(payload))) = find_payload(&writer.node) else {
        return Err(fail(Area::Codec, "the stage's root is not a writer"));
    };
    let [input] = writer.inputs.as_mut_slice() else {
        return Err(fail(
            Area::Codec,
            format!(
                "stage {}: a writer has one input, this one {}",
                payload.stage_id,
                writer.inputs.len()
            ),
        ));
    };
    unframe(input);
    let mut node = writer.node[..start].to_vec();
    Payload::SealedInput {
        plan: input.encode_to_vec(),
    }
    .encode(&mut node)?;
    *input = PhysicalPlanNode {
        physical_plan_type: Some(PhysicalPlanType::Extension(PhysicalExtensionNode {
            node,
            inputs: Vec::new(),
        })),
    };
    Ok(root.encode_to_vec())
}

/// Strip a host's frame from every dfx payload in `node`'s subtree.
fn unframe(node: &mut PhysicalPlanNode) {
    let Some(kind) = node.physical_plan_type.as_mut() else {
        return;
    };
    if let PhysicalPlanType::Extension(extension) = kind
        && let Some((start, _)) = find_payload(&extension.node)
    {
        extension.node.drain(..start);
    }
    for child in children_mut(kind) {
        unframe(child);
    }
}
