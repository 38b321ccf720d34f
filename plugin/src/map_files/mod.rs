//! Each map task carries its own files: an encoded stage cut so that a
//! task's plan names only the file groups its map reads.
//!
//! A stage over a table of N files scans N file groups (one partition per
//! file), and map M runs partition M. Shipped whole, every task of the stage
//! would carry, vet and decode all N groups: N² for the stage. So the driver
//! cuts each encoded stage once ([`cut_stage`]) into
//!
//! ```text
//! shared part: the stage, each scan a map reads replaced by
//!     MapScanExec (map UNCUT, N partitions) ── the scan with no file group
//! per map M:   the file group of each such scan that map M reads
//!     (its "map files", a few hundred bytes for a one-file group)
//! ```
//!
//! and a worker puts its map's groups back in ([`stage_for_map`]): its plan
//! holds `MapScanExec (map M, N partitions, runs p) ── scan (group p)`,
//! which declares the N partitions of the scan it stands for, so every
//! operator above it runs as planned, and fails any partition but `p`
//! rather than read nothing.
//!
//! Which partition of a scan map M reads follows from the plan, node by
//! node from the writer down ([`Reads`]): most operators run partition p
//! from partition p of their inputs; a union runs it from one input, at an
//! offset; a collected build side, a merge or a repartition reads every
//! partition of its input, so a scan below one stays whole; and nothing
//! below a reader runs in the task at all (the stage it reads is published
//! already), so a scan there keeps its N partitions and no file. The cut
//! works on the encoded protobuf, not on a decoded plan: it moves file
//! groups and never decodes an expression, so no host function is needed.

mod scan;

use datafusion::common::Result;
use datafusion_proto::protobuf::physical_plan_node::PhysicalPlanType;
use datafusion_proto::protobuf::{
    self, FileGroup, FileScanExecConf, PhysicalExtensionNode, PhysicalPlanNode, partitioning,
};
use prost::Message;

pub use scan::{MapScanExec, MapScanPayload};

use crate::codec::{Cursor, PAYLOAD_MAGIC, Payload, fail, put_blob};
use crate::exchange::ReadMode;

/// The node's name, in plans and payloads.
pub const MAP_SCAN_NODE_NAME: &str = "MapScanExec";

/// The map of a [`MapScanExec`] in a stage's shared part: no map's files
/// are in it yet, and it refuses to decode.
pub const UNCUT_MAP: u64 = u64::MAX;

/// The map of a [`MapScanExec`] no map reads (below a reader): the same
/// in every map's plan.
pub const ANY_MAP: u64 = u64::MAX - 1;

/// The partition of a [`MapScanExec`] that runs none.
pub const NO_PARTITION: u64 = u64::MAX;

/// The slot of a [`MapScanExec`] no map's files fill.
pub const NO_SLOT: u32 = u32::MAX;

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

/// First bytes of a map's files.
pub const MAP_FILES_MAGIC: [u8; 4] = *b"DFXM";

/// Version of the map files' layout:
///
/// ```text
/// magic b"DFXM" | version u16 | map u64 | slots u32
/// | per slot: partition u64 (NO_PARTITION: none) | file group blob (datafusion-proto `FileGroup`)
/// ```
pub const MAP_FILES_VERSION: u16 = 1;

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

/// Which partition of a node one map task runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reads {
    /// Every partition, or partitions the cut cannot tell: left whole.
    All,
    /// None: the node does not run in the task.
    Nothing,
    /// Partition `map - offset` (none when that is out of range).
    Map { offset: u64 },
}

/// A scan a map reads, cut out of the shared part.
struct Slot {
    /// Map `m` reads partition `m - offset`.
    offset: u64,
    /// Its file groups, partition 0 first.
    groups: Vec<FileGroup>,
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
struct Cut {
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
fn cut_with(plan_bytes: &[u8], map_scans: bool) -> Result<Cut> {
    let mut root = PhysicalPlanNode::decode(plan_bytes)
        .map_err(|e| fail(format!("not an encoded physical plan: {e}")))?;
    let Some(PhysicalPlanType::Extension(writer)) = root.physical_plan_type.as_mut() else {
        return Err(fail(
            "the encoded plan's root is not an extension node, so not a dfx stage",
        ));
    };
    let (start, maps) = match find_payload(&writer.node) {
        Some((start, Payload::Writer(payload))) => (start, payload.maps),
        _ => return Err(fail("the encoded plan's root is not a stage's writer")),
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

/// The files of map `map`: for each slot, the group of the partition it reads.
fn map_files(map: u64, slots: &[Slot]) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    buf.extend_from_slice(&MAP_FILES_MAGIC);
    buf.extend_from_slice(&MAP_FILES_VERSION.to_le_bytes());
    buf.extend_from_slice(&map.to_le_bytes());
    let count = u32::try_from(slots.len()).map_err(|_| fail("too many scans to cut"))?;
    buf.extend_from_slice(&count.to_le_bytes());
    for slot in slots {
        let partition = map
            .checked_sub(slot.offset)
            .filter(|p| (*p as usize) < slot.groups.len());
        match partition {
            Some(p) => {
                buf.extend_from_slice(&p.to_le_bytes());
                put_blob(
                    &mut buf,
                    &slot.groups[p as usize].encode_to_vec(),
                    "file group",
                )?;
            }
            None => {
                buf.extend_from_slice(&NO_PARTITION.to_le_bytes());
                put_blob(&mut buf, &[], "file group")?;
            }
        }
    }
    Ok(buf)
}

/// One slot of a map's files.
struct MapSlot {
    partition: u64,
    group: Option<FileGroup>,
}

/// Parse map files, checking they are map `map`'s.
fn read_map_files(bytes: &[u8], map: u64) -> Result<Vec<MapSlot>> {
    if bytes.len() >= 4 && bytes[..4] != MAP_FILES_MAGIC {
        return Err(fail(format!(
            "not a map's files: expected magic {MAP_FILES_MAGIC:02x?}, found {:02x?}",
            &bytes[..4]
        )));
    }
    let mut cursor = Cursor { buf: bytes };
    cursor.take(4, "magic")?;
    let version = cursor.u16("map files version")?;
    if version != MAP_FILES_VERSION {
        return Err(fail(format!(
            "map files version {version} is not supported; this plugin reads version \
             {MAP_FILES_VERSION}"
        )));
    }
    let found = cursor.u64("map")?;
    if found != map {
        return Err(fail(format!(
            "the files are map {found}'s, not map {map}'s"
        )));
    }
    let count = cursor.u32("slots")? as usize;
    // Bounded by the bytes present (12 per slot at least), so a corrupt
    // count cannot make us allocate.
    if count > cursor.buf.len() / 12 {
        return Err(fail(format!(
            "truncated map files: {count} slots declared, {} bytes left",
            cursor.buf.len()
        )));
    }
    let mut slots = Vec::with_capacity(count);
    for _ in 0..count {
        let partition = cursor.u64("partition")?;
        let blob = cursor.blob("file group")?;
        let group = match partition {
            NO_PARTITION => None,
            _ => Some(FileGroup::decode(blob).map_err(|e| {
                fail(format!(
                    "map {map}: the file group of partition {partition} is not valid protobuf: {e}"
                ))
            })?),
        };
        slots.push(MapSlot { partition, group });
    }
    if !cursor.buf.is_empty() {
        return Err(fail(format!(
            "{} trailing bytes after map {map}'s files",
            cursor.buf.len()
        )));
    }
    Ok(slots)
}

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
        .map_err(|e| fail(format!("not an encoded physical plan: {e}")))?;
    let mut filled = 0;
    fill(&mut root, map, &slots, &mut filled)?;
    if filled != slots.len() {
        return Err(fail(format!(
            "map {map}'s files hold {} slot(s), the stage cut {filled} scan(s) a map reads",
            slots.len()
        )));
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
                fail(format!(
                    "map {map}'s files hold {} slot(s); the stage's scan wants slot {}",
                    slots.len(),
                    payload.slot
                ))
            })?;
            let [scan] = extension.inputs.as_mut_slice() else {
                return Err(fail("a map scan has one input"));
            };
            let conf = scan
                .physical_plan_type
                .as_mut()
                .and_then(scan_conf)
                .ok_or_else(|| fail("a map scan's input is not a file scan"))?;
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
            let mut inner = PhysicalPlanNode::decode(plan.as_slice())
                .map_err(|e| fail(format!("a store scan's plan is not valid protobuf: {e}")))?;
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

fn conf_partitions(conf: &FileScanExecConf) -> u64 {
    conf.file_groups.len() as u64
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
                .ok_or_else(|| fail("too many scans to cut"))?;
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

/// A dfx node: a reader's upstream does not run in the task; a store
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
            let mut inner = PhysicalPlanNode::decode(plan.as_slice())
                .map_err(|e| fail(format!("a store scan's plan is not valid protobuf: {e}")))?;
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

/// Whether the node is a file scan (Parquet, CSV, JSON, Avro, Arrow).
pub(crate) fn is_file_scan(kind: &mut PhysicalPlanType) -> bool {
    scan_conf(kind).is_some()
}

/// The file scan configuration of a file scan node.
fn scan_conf(kind: &mut PhysicalPlanType) -> Option<&mut FileScanExecConf> {
    match kind {
        PhysicalPlanType::ParquetScan(scan) => scan.base_conf.as_mut(),
        PhysicalPlanType::CsvScan(scan) => scan.base_conf.as_mut(),
        PhysicalPlanType::JsonScan(scan) => scan.base_conf.as_mut(),
        PhysicalPlanType::AvroScan(scan) => scan.base_conf.as_mut(),
        PhysicalPlanType::ArrowScan(scan) => scan.base_conf.as_mut(),
        _ => None,
    }
}

/// Restate a declared partitioning for `count` file groups (DataFusion
/// drops a declaration whose count differs from the groups').
fn declare_partitions(conf: &mut FileScanExecConf, count: u64) {
    let Some(method) = conf
        .output_partitioning
        .as_mut()
        .and_then(|p| p.partition_method.as_mut())
    else {
        return;
    };
    match method {
        partitioning::PartitionMethod::RoundRobin(n)
        | partitioning::PartitionMethod::Unknown(n) => {
            *n = count;
        }
        partitioning::PartitionMethod::Hash(hash) => hash.partition_count = count,
        partitioning::PartitionMethod::Range(_) => {}
    }
}

/// The dfx payload in an extension node's bytes and where it starts (a
/// host's codec chain may frame it).
pub(crate) fn find_payload(bytes: &[u8]) -> Option<(usize, Payload)> {
    (0..bytes.len().saturating_sub(3))
        .filter(|&i| bytes[i..i + 4] == PAYLOAD_MAGIC)
        .find_map(|start| Payload::decode(&bytes[start..]).ok().map(|p| (start, p)))
}

/// The inputs of a node that is not an extension, in a fixed order.
pub(crate) fn children_mut(kind: &mut PhysicalPlanType) -> Vec<&mut PhysicalPlanNode> {
    use PhysicalPlanType as T;
    match kind {
        T::Projection(n) => one(&mut n.input),
        T::GlobalLimit(n) => one(&mut n.input),
        T::LocalLimit(n) => one(&mut n.input),
        T::Aggregate(n) => one(&mut n.input),
        T::Sort(n) => one(&mut n.input),
        T::CoalesceBatches(n) => one(&mut n.input),
        T::Filter(n) => one(&mut n.input),
        T::Merge(n) => one(&mut n.input),
        T::Repartition(n) => one(&mut n.input),
        T::Window(n) => one(&mut n.input),
        T::SortPreservingMerge(n) => one(&mut n.input),
        T::Analyze(n) => one(&mut n.input),
        T::JsonSink(n) => one(&mut n.input),
        T::CsvSink(n) => one(&mut n.input),
        T::ParquetSink(n) => one(&mut n.input),
        T::Unnest(n) => one(&mut n.input),
        T::Cooperative(n) => one(&mut n.input),
        T::AsyncFunc(n) => one(&mut n.input),
        T::Buffer(n) => one(&mut n.input),
        T::HashJoin(n) => pair(&mut n.left, &mut n.right),
        T::CrossJoin(n) => pair(&mut n.left, &mut n.right),
        T::NestedLoopJoin(n) => pair(&mut n.left, &mut n.right),
        T::SymmetricHashJoin(n) => pair(&mut n.left, &mut n.right),
        T::SortMergeJoin(n) => pair(&mut n.left, &mut n.right),
        T::Union(n) => n.inputs.iter_mut().collect(),
        T::Interleave(n) => n.inputs.iter_mut().collect(),
        T::ScalarSubquery(n) => {
            let mut children = one(&mut n.input);
            children.extend(n.subqueries.iter_mut());
            children
        }
        T::Extension(n) => n.inputs.iter_mut().collect(),
        T::ParquetScan(_)
        | T::CsvScan(_)
        | T::Empty(_)
        | T::AvroScan(_)
        | T::Explain(_)
        | T::PlaceholderRow(_)
        | T::JsonScan(_)
        | T::GenerateSeries(_)
        | T::MemoryScan(_)
        | T::ArrowScan(_) => Vec::new(),
    }
}

fn one(input: &mut Option<Box<PhysicalPlanNode>>) -> Vec<&mut PhysicalPlanNode> {
    input.as_deref_mut().into_iter().collect()
}

fn pair<'a>(
    left: &'a mut Option<Box<PhysicalPlanNode>>,
    right: &'a mut Option<Box<PhysicalPlanNode>>,
) -> Vec<&'a mut PhysicalPlanNode> {
    left.as_deref_mut()
        .into_iter()
        .chain(right.as_deref_mut())
        .collect()
}

/// What the task runs of each input of a node it runs `reads` of, in the
/// order of [`children_mut`]. The rule for each kind of node:
///
/// | node | its partition p runs |
/// | --- | --- |
/// | projection, filter, limits, aggregate, sort, window, unnest, batching | partition p of its input |
/// | partitioned hash join, sort-merge join, symmetric hash join, interleave | partition p of every input |
/// | collected hash join, cross join, nested-loop join | every partition of the left (built once), partition p of the right |
/// | union | partition p - offset of the input holding it, nothing of the others |
/// | merge, sort-preserving merge, repartition, analyze, sink | every partition of its input |
/// | scalar subquery | partition p of its input, every partition of each subquery |
pub(crate) fn child_reads(kind: &PhysicalPlanType, reads: Reads) -> Vec<Reads> {
    use PhysicalPlanType as T;
    let inputs = |kind: &PhysicalPlanType| -> usize {
        match kind {
            T::Union(n) => n.inputs.len(),
            T::Interleave(n) => n.inputs.len(),
            T::ScalarSubquery(n) => usize::from(n.input.is_some()) + n.subqueries.len(),
            T::HashJoin(_)
            | T::CrossJoin(_)
            | T::NestedLoopJoin(_)
            | T::SymmetricHashJoin(_)
            | T::SortMergeJoin(_) => 2,
            _ => 1,
        }
    };
    let all = |n: usize| vec![Reads::All; n];
    if !matches!(reads, Reads::Map { .. }) {
        // All and Nothing pass down unchanged.
        return vec![reads; inputs(kind)];
    }
    match kind {
        T::Projection(_)
        | T::GlobalLimit(_)
        | T::LocalLimit(_)
        | T::Aggregate(_)
        | T::Sort(_)
        | T::CoalesceBatches(_)
        | T::Filter(_)
        | T::Window(_)
        | T::Unnest(_)
        | T::Cooperative(_)
        | T::AsyncFunc(_)
        | T::Buffer(_) => vec![reads],
        T::HashJoin(join) => {
            if join.partition_mode == protobuf::PartitionMode::Partitioned as i32 {
                vec![reads, reads]
            } else if join.partition_mode == protobuf::PartitionMode::CollectLeft as i32 {
                vec![Reads::All, reads]
            } else {
                all(2)
            }
        }
        T::SortMergeJoin(_) | T::SymmetricHashJoin(_) => vec![reads, reads],
        T::CrossJoin(_) | T::NestedLoopJoin(_) => vec![Reads::All, reads],
        T::Interleave(n) => vec![reads; n.inputs.len()],
        T::Union(n) => union_reads(&n.inputs, reads),
        T::ScalarSubquery(n) => {
            let mut reads = vec![reads; usize::from(n.input.is_some())];
            reads.extend(all(n.subqueries.len()));
            reads
        }
        _ => all(inputs(kind)),
    }
}

/// A union's partitions are its inputs' in turn: input i holds partitions
/// `offset_i .. offset_i + count_i`. When an input's count cannot be told
/// from the encoded plan, every input is left whole.
fn union_reads(inputs: &[PhysicalPlanNode], reads: Reads) -> Vec<Reads> {
    let Reads::Map { offset } = reads else {
        return vec![reads; inputs.len()];
    };
    let mut at = offset;
    let mut out = Vec::with_capacity(inputs.len());
    for input in inputs {
        match partitions(input) {
            Some(count) => {
                out.push(Reads::Map { offset: at });
                at += count;
            }
            None => return vec![Reads::All; inputs.len()],
        }
    }
    out
}

/// The output partitions of an encoded node, where the plan alone tells.
fn partitions(node: &PhysicalPlanNode) -> Option<u64> {
    use PhysicalPlanType as T;
    let input = |n: &Option<Box<PhysicalPlanNode>>| n.as_deref().and_then(partitions);
    match node.physical_plan_type.as_ref()? {
        T::ParquetScan(n) => n.base_conf.as_ref().map(conf_partitions),
        T::CsvScan(n) => n.base_conf.as_ref().map(conf_partitions),
        T::JsonScan(n) => n.base_conf.as_ref().map(conf_partitions),
        T::AvroScan(n) => n.base_conf.as_ref().map(conf_partitions),
        T::ArrowScan(n) => n.base_conf.as_ref().map(conf_partitions),
        T::Projection(n) => input(&n.input),
        T::Filter(n) => input(&n.input),
        T::CoalesceBatches(n) => input(&n.input),
        T::LocalLimit(n) => input(&n.input),
        T::Aggregate(n) => input(&n.input),
        T::Window(n) => input(&n.input),
        T::Unnest(n) => input(&n.input),
        T::Cooperative(n) => input(&n.input),
        T::AsyncFunc(n) => input(&n.input),
        T::Buffer(n) => input(&n.input),
        T::Sort(n) if n.preserve_partitioning => input(&n.input),
        T::Sort(_) | T::Merge(_) | T::SortPreservingMerge(_) | T::GlobalLimit(_) => Some(1),
        T::Repartition(n) => match n.partitioning.as_ref()?.partition_method.as_ref()? {
            partitioning::PartitionMethod::RoundRobin(count)
            | partitioning::PartitionMethod::Unknown(count) => Some(*count),
            partitioning::PartitionMethod::Hash(hash) => Some(hash.partition_count),
            partitioning::PartitionMethod::Range(_) => None,
        },
        T::HashJoin(n) if n.partition_mode == protobuf::PartitionMode::Partitioned as i32 => {
            input(&n.left)
        }
        T::HashJoin(_) | T::CrossJoin(_) | T::NestedLoopJoin(_) => {
            n_right(node).and_then(partitions)
        }
        T::SymmetricHashJoin(n) => input(&n.left),
        T::SortMergeJoin(n) => input(&n.left),
        T::Union(n) => n.inputs.iter().map(partitions).sum(),
        T::Interleave(n) => n.inputs.first().and_then(partitions),
        T::Extension(n) => match find_payload(&n.node)? {
            (_, Payload::Writer(writer)) => Some(writer.maps),
            (_, Payload::MapScan(scan)) => Some(scan.partitions),
            (_, Payload::JoinFilter { .. }) => n.inputs.first().and_then(partitions),
            (_, Payload::Reader(mode)) => {
                let Some(T::Extension(writer)) = n.inputs.first()?.physical_plan_type.as_ref()
                else {
                    return None;
                };
                let (_, Payload::Writer(writer)) = find_payload(&writer.node)? else {
                    return None;
                };
                match mode {
                    ReadMode::Hash => Some(writer.buckets),
                    ReadMode::PassThrough => Some(writer.maps),
                    ReadMode::Broadcast => Some(1),
                }
            }
            (_, Payload::StoreScan { plan }) => {
                partitions(&PhysicalPlanNode::decode(plan.as_slice()).ok()?)
            }
            _ => None,
        },
        _ => None,
    }
}

/// The right input of a collected join (its partitions are the join's).
fn n_right(node: &PhysicalPlanNode) -> Option<&PhysicalPlanNode> {
    match node.physical_plan_type.as_ref()? {
        PhysicalPlanType::HashJoin(n) => n.right.as_deref(),
        PhysicalPlanType::CrossJoin(n) => n.right.as_deref(),
        PhysicalPlanType::NestedLoopJoin(n) => n.right.as_deref(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use datafusion_proto::protobuf::{ParquetScanExecNode, PartitionedFile, UnionExecNode};

    use super::*;
    use crate::codec::WriterPayload;

    fn scan(files: &[&str]) -> PhysicalPlanNode {
        let file_groups = files
            .iter()
            .map(|path| FileGroup {
                files: vec![PartitionedFile {
                    path: path.to_string(),
                    ..Default::default()
                }],
            })
            .collect();
        PhysicalPlanNode {
            physical_plan_type: Some(PhysicalPlanType::ParquetScan(ParquetScanExecNode {
                base_conf: Some(FileScanExecConf {
                    file_groups,
                    ..Default::default()
                }),
                ..Default::default()
            })),
        }
    }

    /// A stage of `maps` maps over `input`, its writer framed as a host's
    /// chain frames it.
    fn stage(maps: u64, input: PhysicalPlanNode) -> Vec<u8> {
        let mut node = b"frame:".to_vec();
        Payload::Writer(WriterPayload {
            stage_id: 1,
            maps,
            buckets: 1,
            deps: Vec::new(),
            shuffle_dir: "/s".into(),
            partitioning_display: "single".into(),
            partitioning: Vec::new(),
        })
        .encode(&mut node)
        .unwrap();
        PhysicalPlanNode {
            physical_plan_type: Some(PhysicalPlanType::Extension(PhysicalExtensionNode {
                node,
                inputs: vec![input],
            })),
        }
        .encode_to_vec()
    }

    /// Every map scan of `bytes`: (map, partition, the files it holds).
    fn map_scans(bytes: &[u8]) -> Vec<(u64, u64, Vec<String>)> {
        fn walk(node: &mut PhysicalPlanNode, out: &mut Vec<(u64, u64, Vec<String>)>) {
            let Some(kind) = node.physical_plan_type.as_mut() else {
                return;
            };
            if let PhysicalPlanType::Extension(extension) = kind
                && let Some((start, Payload::MapScan(payload))) = find_payload(&extension.node)
            {
                assert!(
                    extension.node.starts_with(b"frame:"),
                    "framed as the writer"
                );
                assert_eq!(start, 6);
                let conf = extension.inputs[0]
                    .physical_plan_type
                    .as_mut()
                    .and_then(scan_conf)
                    .unwrap();
                let files = conf
                    .file_groups
                    .iter()
                    .flat_map(|g| g.files.iter().map(|f| f.path.clone()))
                    .collect();
                out.push((payload.map, payload.partition, files));
                return;
            }
            for child in children_mut(kind) {
                walk(child, out);
            }
        }
        let mut root = PhysicalPlanNode::decode(bytes).unwrap();
        let mut out = Vec::new();
        walk(&mut root, &mut out);
        out
    }

    /// `count` file names `<table>/<n>`.
    fn names(table: &str, count: usize) -> Vec<String> {
        (0..count).map(|n| format!("{table}/{n}")).collect()
    }

    fn refs(names: &[String]) -> Vec<&str> {
        names.iter().map(String::as_str).collect()
    }

    #[test]
    fn a_union_gives_each_map_the_group_of_the_input_holding_its_partition() {
        let t = names("t", MIN_GROUPS_TO_CUT);
        let union = PhysicalPlanNode {
            physical_plan_type: Some(PhysicalPlanType::Union(UnionExecNode {
                inputs: vec![scan(&refs(&t)), scan(&["u/0"])],
            })),
        };
        let maps = MIN_GROUPS_TO_CUT as u64 + 1;
        let cut = cut_stage(&stage(maps, union)).unwrap();
        assert_eq!(cut.maps.len() as u64, maps);
        assert!(
            map_scans(&cut.shared)
                .iter()
                .all(|(map, _, files)| *map == UNCUT_MAP && files.is_empty())
        );
        let last = maps - 1;
        let expected = [
            (
                0,
                [(0, 0, vec!["t/0".to_string()]), (0, NO_PARTITION, vec![])],
            ),
            (
                last - 1,
                [
                    (last - 1, last - 1, vec![format!("t/{}", last - 1)]),
                    (last - 1, NO_PARTITION, vec![]),
                ],
            ),
            (
                last,
                [
                    (last, NO_PARTITION, vec![]),
                    (last, 0, vec!["u/0".to_string()]),
                ],
            ),
        ];
        for (map, expected) in expected {
            let plan = stage_for_map(&cut.shared, &cut.maps[map as usize], map).unwrap();
            assert_eq!(map_scans(&plan), expected.to_vec(), "map {map}");
        }
        // Files of one map are refused for another.
        let err = stage_for_map(&cut.shared, &cut.maps[1], 2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("the files are map 1's, not map 2's"), "{err}");
    }

    #[test]
    fn a_scan_below_a_collected_build_side_stays_whole() {
        let t = names("t", MIN_GROUPS_TO_CUT);
        let join = PhysicalPlanNode {
            physical_plan_type: Some(PhysicalPlanType::CrossJoin(Box::new(
                protobuf::CrossJoinExecNode {
                    left: Some(Box::new(scan(&["d/0", "d/1"]))),
                    right: Some(Box::new(scan(&refs(&t)))),
                },
            ))),
        };
        let cut = cut_stage(&stage(t.len() as u64, join)).unwrap();
        let plan = stage_for_map(&cut.shared, &cut.maps[1], 1).unwrap();
        // The left, built whole by every map, keeps both files; the right
        // is map 1's file only.
        assert_eq!(map_scans(&plan), vec![(1, 1, vec!["t/1".to_string()])]);
        let text = String::from_utf8_lossy(&plan);
        assert!(text.contains("d/0") && text.contains("d/1"), "{text}");
        assert!(!text.contains("t/0"), "{text}");
    }

    #[test]
    fn a_stage_of_few_files_is_shipped_whole() {
        let t = names("t", MIN_GROUPS_TO_CUT - 1);
        let bytes = stage(t.len() as u64, scan(&refs(&t)));
        let cut = cut_stage(&bytes).unwrap();
        assert!(cut.maps.is_empty());
        assert_eq!(cut.shared, bytes);
    }

    #[test]
    fn map_files_that_are_truncated_are_refused() {
        let slots = [Slot {
            offset: 0,
            groups: vec![FileGroup::default(); 2],
        }];
        let files = map_files(1, &slots).unwrap();
        assert_eq!(read_map_files(&files, 1).unwrap()[0].partition, 1);
        for len in 0..files.len() {
            assert!(read_map_files(&files[..len], 1).is_err(), "{len} bytes");
        }
    }
}
