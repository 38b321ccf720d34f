//! Cutting an encoded stage once into its shared part and each map's files
//! (see [`crate::encoded`]).

use datafusion::common::Result;
use datafusion_proto::protobuf::physical_plan_node::PhysicalPlanType;
use datafusion_proto::protobuf::{PhysicalExtensionNode, PhysicalPlanNode, partitioning};
use prost::Message;

use crate::encoded::map_files::{Slot, map_files};
use crate::encoded::walk::{Reads, child_reads, children_mut, find_payload};
use crate::encoded::walk::{conf_partitions, declare_partitions, scan_conf};
use crate::error::{Area, fail};
use crate::wire::{ANY_MAP, MapScanPayload, NO_PARTITION, NO_SLOT, Payload, UNCUT_MAP};

/// The fewest file groups the scans a stage's maps read must hold in all
/// for the stage to be cut for its maps; a stage of fewer ships them whole.
///
/// A serving worker decodes a stage once and runs its next maps from the
/// same plan (a broadcast build side is hashed once per worker); plans cut
/// per map lose that. With a few files per table the whole plan is small
/// and the loss is what shows: TPC-H at 8 files per table ran about a tenth
/// slower cut (debug build); at 1,000 files a task's whole plan costs 40
/// times its cut one.
pub const MIN_GROUPS_TO_CUT: usize = 64;

/// An encoded stage cut for its maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutStage {
    /// The stage with its map-read scans emptied. When `maps` is empty it
    /// is a whole plan every map runs as it is (only scans no map reads were
    /// emptied, if any); otherwise it needs a map's files
    /// ([`stage_for_map`]).
    pub shared: Vec<u8>,
    /// Each map's files, map 0 first; empty when no scan is read by a map.
    pub maps: Vec<Vec<u8>>,
}

#[derive(Default)]
struct Cutter {
    slots: Vec<Slot>,
    /// Scans replaced, read by a map or not.
    replaced: usize,
    /// Whether the scans a map reads are cut (those no map reads always are).
    map_scans: bool,
}

/// Cut the encoded stage `plan_bytes` (a writer at its root) for its maps
/// (see the module doc). Linear in the stage's size: every file is moved
/// once, into the files of the one map that reads it.
///
/// # Errors
///
/// Bytes that are not an encoded stage, or a payload inside that does not
/// parse.
pub fn cut_stage(plan_bytes: &[u8]) -> Result<CutStage> {
    // A map running a slice reads the groups of several partitions: its
    // scans stay whole (its stage has a few maps, so few copies of them).
    if crate::wire::read_encoded_stage(plan_bytes)?.runs_slices() {
        return cut_with(plan_bytes, false)?.finish(plan_bytes);
    }
    let cut = cut_with(plan_bytes, true)?;
    let moved: usize = cut.slots.iter().map(|slot| slot.groups.len()).sum();
    if moved == 0 || moved >= MIN_GROUPS_TO_CUT {
        return cut.finish(plan_bytes);
    }
    // Too few files to be worth a plan per map: the maps' scans stay whole
    // (a scan no map reads is still emptied, the same for every map).
    cut_with(plan_bytes, false)?.finish(plan_bytes)
}

/// A stage's plan after the cut, with the groups taken out of it.
pub(super) struct Cut {
    root: PhysicalPlanNode,
    maps: u64,
    slots: Vec<Slot>,
    replaced: usize,
}

impl Cut {
    fn finish(self, plan_bytes: &[u8]) -> Result<CutStage> {
        if self.replaced == 0 {
            return Ok(CutStage {
                shared: plan_bytes.to_vec(),
                maps: Vec::new(),
            });
        }
        let shared = self.root.encode_to_vec();
        if self.slots.is_empty() {
            return Ok(CutStage {
                shared,
                maps: Vec::new(),
            });
        }
        let maps = (0..self.maps)
            .map(|map| map_files(map, &self.slots))
            .collect::<Result<Vec<_>>>()?;
        Ok(CutStage { shared, maps })
    }
}

/// [`cut_stage`]'s walk; the scans a map reads are cut only with `map_scans`.
pub(super) fn cut_with(plan_bytes: &[u8], map_scans: bool) -> Result<Cut> {
    let mut root = PhysicalPlanNode::decode(plan_bytes)
        .map_err(|e| fail(Area::Codec, format!("not an encoded physical plan: {e}")))?;
    let Some(PhysicalPlanType::Extension(writer)) = root.physical_plan_type.as_mut() else {
        return Err(fail(
            Area::Codec,
            "the encoded plan's root is not an extension node, so not a dfx stage",
        ));
    };
    let (start, maps) = match find_payload(&writer.node) {
        Some((start, Payload::Writer(payload))) => (start, payload.maps),
        _ => {
            return Err(fail(
                Area::Codec,
                "the encoded plan's root is not a stage's writer",
            ));
        }
    };
    // The host's codec chain framed the writer's payload; a map scan is
    // framed alike, so the same chain hands it to this codec.
    let frame = writer.node[..start].to_vec();
    let mut cutter = Cutter {
        map_scans,
        ..Cutter::default()
    };
    for input in &mut writer.inputs {
        cut(input, Reads::Map { offset: 0 }, &frame, &mut cutter)?;
    }
    Ok(Cut {
        root,
        maps,
        slots: cutter.slots,
        replaced: cutter.replaced,
    })
}

/// Cut `node`, of which the task runs `reads`; `frame` is what precedes a
/// dfx payload in an extension node here.
fn cut(node: &mut PhysicalPlanNode, reads: Reads, frame: &[u8], cutter: &mut Cutter) -> Result<()> {
    let scanned = node
        .physical_plan_type
        .as_mut()
        .and_then(scan_conf)
        .map(|conf| conf_partitions(conf));
    if let Some(partitions) = scanned {
        return cut_scan(node, partitions, reads, frame, cutter);
    }
    let Some(kind) = node.physical_plan_type.as_mut() else {
        return Ok(());
    };
    if let PhysicalPlanType::Extension(extension) = kind {
        return cut_extension(extension, reads, frame, cutter);
    }
    let reads = child_reads(kind, reads);
    for (child, reads) in children_mut(kind).into_iter().zip(reads) {
        cut(child, reads, frame, cutter)?;
    }
    Ok(())
}

/// Replace the file scan `node` by a map scan over it, its groups moved
/// into a slot when a map reads it, dropped when none does.
fn cut_scan(
    node: &mut PhysicalPlanNode,
    partitions: u64,
    reads: Reads,
    frame: &[u8],
    cutter: &mut Cutter,
) -> Result<()> {
    if reads == Reads::All || (matches!(reads, Reads::Map { .. }) && !cutter.map_scans) {
        return Ok(());
    }
    let Some(conf) = node.physical_plan_type.as_mut().and_then(scan_conf) else {
        return Ok(());
    };
    // A range partitioning names its bounds per partition: not restated.
    if let Some(partitioning::PartitionMethod::Range(_)) = conf
        .output_partitioning
        .as_ref()
        .and_then(|p| p.partition_method.as_ref())
    {
        return Ok(());
    }
    let groups = std::mem::take(&mut conf.file_groups);
    declare_partitions(conf, 0);
    let payload = match reads {
        Reads::Map { offset } => {
            let slot = u32::try_from(cutter.slots.len())
                .ok()
                .filter(|slot| *slot != NO_SLOT)
                .ok_or_else(|| fail(Area::Codec, "too many scans to cut"))?;
            cutter.slots.push(Slot { offset, groups });
            MapScanPayload {
                map: UNCUT_MAP,
                partitions,
                partition: NO_PARTITION,
                slot,
            }
        }
        Reads::Nothing | Reads::All => MapScanPayload {
            map: ANY_MAP,
            partitions,
            partition: NO_PARTITION,
            slot: NO_SLOT,
        },
    };
    let mut bytes = frame.to_vec();
    Payload::MapScan(payload).encode(&mut bytes)?;
    let scan = std::mem::take(node);
    node.physical_plan_type = Some(PhysicalPlanType::Extension(PhysicalExtensionNode {
        node: bytes,
        inputs: vec![scan],
    }));
    cutter.replaced += 1;
    Ok(())
}

/// A dfx node: a reader has no input (its stage is cut out); a store
/// scan's own scan is cut inside its payload; anything else is left whole
/// (a sealed recursive query runs its own plan; an extension that is not
/// dfx's is refused by the vet).
fn cut_extension(
    extension: &mut PhysicalExtensionNode,
    reads: Reads,
    frame: &[u8],
    cutter: &mut Cutter,
) -> Result<()> {
    match find_payload(&extension.node) {
        // A join filter and a key summary run partition p from their
        // input's partition p, as the writer does.
        Some((_, Payload::Writer(_) | Payload::JoinFilter { .. })) => {
            for input in &mut extension.inputs {
                cut(input, reads, frame, cutter)?;
            }
        }
        Some((_, Payload::Reader(_))) => {
            for input in &mut extension.inputs {
                cut(input, Reads::Nothing, frame, cutter)?;
            }
        }
        Some((start, Payload::StoreScan { plan })) => {
            let mut inner = PhysicalPlanNode::decode(plan.as_slice()).map_err(|e| {
                fail(
                    Area::Codec,
                    format!("a store scan's plan is not valid protobuf: {e}"),
                )
            })?;
            let before = cutter.replaced;
            // Decoded by this codec alone, unframed (see `crate::codec`).
            cut(&mut inner, reads, &[], cutter)?;
            if cutter.replaced != before {
                let mut bytes = extension.node[..start].to_vec();
                Payload::StoreScan {
                    plan: inner.encode_to_vec(),
                }
                .encode(&mut bytes)?;
                extension.node = bytes;
            }
        }
        // Whatever else has inputs runs them as the cut cannot tell: whole
        // (a reader further down still runs nothing of its upstream).
        _ => {
            for input in &mut extension.inputs {
                cut(input, Reads::All, frame, cutter)?;
            }
        }
    }
    Ok(())
}
