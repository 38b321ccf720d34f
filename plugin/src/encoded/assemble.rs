//! Putting a map's files back into its stage's shared part, in the worker
//! that runs the map (see [`crate::encoded`]).

use datafusion::common::Result;
use datafusion_proto::protobuf::PhysicalPlanNode;
use datafusion_proto::protobuf::physical_plan_node::PhysicalPlanType;
use prost::Message;

use crate::encoded::map_files::{MapSlot, read_map_files};
use crate::encoded::walk::{children_mut, find_payload};
use crate::encoded::walk::{declare_partitions, scan_conf};
use crate::error::{Area, fail};
use crate::wire::{NO_SLOT, Payload};

/// The stage map `map` runs: the shared part of [`cut_stage`] with map
/// `map`'s files put back in. Its size does not grow with the files of the
/// stage's scans, only with those of its own groups.
///
/// # Errors
///
/// Bytes that are not a shared part, files of another map, or files whose
/// slots do not match the shared part's scans.
pub fn stage_for_map(shared: &[u8], files: &[u8], map: u64) -> Result<Vec<u8>> {
    let slots = read_map_files(files, map)?;
    let mut root = PhysicalPlanNode::decode(shared)
        .map_err(|e| fail(Area::Codec, format!("not an encoded physical plan: {e}")))?;
    let mut filled = 0;
    fill(&mut root, map, &slots, &mut filled)?;
    if filled != slots.len() {
        return Err(fail(
            Area::Codec,
            format!(
                "map {map}'s files hold {} slot(s), the stage cut {filled} scan(s) a map reads",
                slots.len()
            ),
        ));
    }
    Ok(root.encode_to_vec())
}

/// Put map `map`'s groups into every map scan of `node` that has a slot.
fn fill(
    node: &mut PhysicalPlanNode,
    map: u64,
    slots: &[MapSlot],
    filled: &mut usize,
) -> Result<()> {
    let Some(kind) = node.physical_plan_type.as_mut() else {
        return Ok(());
    };
    let PhysicalPlanType::Extension(extension) = kind else {
        for child in children_mut(kind) {
            fill(child, map, slots, filled)?;
        }
        return Ok(());
    };
    match find_payload(&extension.node) {
        Some((start, Payload::MapScan(mut payload))) if payload.slot != NO_SLOT => {
            let slot = slots.get(payload.slot as usize).ok_or_else(|| {
                fail(
                    Area::Codec,
                    format!(
                        "map {map}'s files hold {} slot(s); the stage's scan wants slot {}",
                        slots.len(),
                        payload.slot
                    ),
                )
            })?;
            let [scan] = extension.inputs.as_mut_slice() else {
                return Err(fail(Area::Codec, "a map scan has one input"));
            };
            let conf = scan
                .physical_plan_type
                .as_mut()
                .and_then(scan_conf)
                .ok_or_else(|| fail(Area::Codec, "a map scan's input is not a file scan"))?;
            if let Some(group) = &slot.group {
                conf.file_groups = vec![group.clone()];
                declare_partitions(conf, 1);
            }
            payload.map = map;
            payload.partition = slot.partition;
            let mut bytes = extension.node[..start].to_vec();
            Payload::MapScan(payload).encode(&mut bytes)?;
            extension.node = bytes;
            *filled += 1;
        }
        Some((start, Payload::StoreScan { plan })) => {
            let mut inner = PhysicalPlanNode::decode(plan.as_slice()).map_err(|e| {
                fail(
                    Area::Codec,
                    format!("a store scan's plan is not valid protobuf: {e}"),
                )
            })?;
            let before = *filled;
            fill(&mut inner, map, slots, filled)?;
            if *filled != before {
                let mut bytes = extension.node[..start].to_vec();
                Payload::StoreScan {
                    plan: inner.encode_to_vec(),
                }
                .encode(&mut bytes)?;
                extension.node = bytes;
            }
        }
        _ => {
            for child in &mut extension.inputs {
                fill(child, map, slots, filled)?;
            }
        }
    }
    Ok(())
}
