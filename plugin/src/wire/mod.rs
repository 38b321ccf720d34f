//! The wire format of dfx's plan nodes: the framed payload each node
//! carries across a process boundary, the names the nodes go by, and the
//! small types both the nodes and the codec speak ([`ReadMode`],
//! [`MapScanPayload`]). The codec and the nodes both depend on this
//! module; it depends on neither.
//!
//! The payload is framed so that bytes from elsewhere are refused with a
//! reason instead of being misread (integers little endian, strings and
//! blobs prefixed by a u32 length):
//!
//! ```text
//! magic b"DFXS" | payload version u16 (PAYLOAD_VERSION) | node kind u8
//! writer (kind 1): stage id u64 | maps u64 | buckets u64 | partitions per map u64
//!                  | deps: u32 count, u64 each | aligned deps: u32 count, u64 each
//!                  | shuffle dir str | partitioning display str
//!                  | partitioning blob (datafusion-proto `Partitioning`)
//! reader (kind 2): read mode u8 | stage id u64 | maps u64 | buckets u64
//!                  | shuffle dir str | properties blob (JSON, see
//!                  [`crate::codec::reader`]: what the stage read promises)
//!                  | stage blob (datafusion-proto `PhysicalPlanNode` of the
//!                  stage read, its writer at the root; empty once cut out of
//!                  its plan, see [`crate::encoded::split_plan`]); no inputs
//! recursive query (kind 3): distinct u8 | CTE name str | output schema blob
//!                  (datafusion-proto `Schema`); inputs: static term, recursive term
//! work table (kind 4): CTE name str | schema blob (datafusion-proto `Schema`)
//! sealed recursive query (kind 5): plan blob (datafusion-proto
//!                  `PhysicalPlanNode` of the whole recursive query, the codec
//!                  for kinds 3 and 4); no inputs
//! store scan (kind 6): plan blob (datafusion-proto `PhysicalPlanNode` of
//!                  the scan of a table on an object store); no inputs
//! sealed input (kind 9): plan blob (datafusion-proto `PhysicalPlanNode` of
//!                  a writer's input, every dfx payload in it unframed, the
//!                  codec for them); no inputs (see [`crate::exec::sealed_input`])
//! map scan (kind 7): map u64 (UNCUT_MAP: a stage's shared part; ANY_MAP:
//!                  every map) | partitions u64 | partition u64 (NO_PARTITION:
//!                  none) | slot u32 (NO_SLOT: none); input: the file scan,
//!                  holding that partition's file group only (see [`crate::encoded`])
//! join filter (kind 8): body blob (JSON, see [`crate::codec::join_filter`]):
//!                  a build stage's key summary or a probe side's filter;
//!                  input: the node's child
//! ```
//!
//! Everything a driver needs to schedule a stage sits in the writer's payload,
//! so a host that cannot decode a plan (or must not yet) reads it from the
//! encoded bytes alone ([`read_encoded_stage`]).
//!
//! Stages do not nest as messages: a reader carries the stage it reads as
//! a blob, so a decoder meets each stage's nodes in a message of its own,
//! and an encoded plan nests no deeper than its deepest stage (a host's
//! protobuf decoder may stop at 100 nested messages).

use datafusion::common::Result;
use datafusion_proto::protobuf::PhysicalPlanNode;
use datafusion_proto::protobuf::physical_plan_node::PhysicalPlanType;
use prost::Message;

use crate::error::{Area, fail};

mod cursor;

pub(crate) use cursor::{Cursor, put_blob};

mod names;
pub use names::{
    ENCODED_NODE_NAMES, JOIN_FILTER_NODE_NAME, KEY_SUMMARY_NODE_NAME, MAP_SCAN_NODE_NAME,
    READER_NODE_NAME, RECURSIVE_QUERY_NODE_NAME, SEALED_INPUT_NODE_NAME, SEALED_NODE_NAME,
    STORE_SCAN_NODE_NAME, WORK_TABLE_NODE_NAME, WRITER_NODE_NAME, encoded_node_names,
};

/// The codec's id, as hosts list it among their session's codecs: one id per
/// payload version, so a plan encoded by another version is refused by id
/// before a byte of it is read.
pub const CODEC_ID: &str = "dfx_engine.physical.v5";

/// First bytes of every dfx payload.
pub const PAYLOAD_MAGIC: [u8; 4] = *b"DFXS";

/// Version of the payload layout this plugin writes and reads.
pub const PAYLOAD_VERSION: u16 = 5;

const KIND_WRITER: u8 = 1;
const KIND_READER: u8 = 2;
const KIND_RECURSIVE: u8 = 3;
const KIND_WORK_TABLE: u8 = 4;
const KIND_SEALED: u8 = 5;
const KIND_STORE_SCAN: u8 = 6;
const KIND_MAP_SCAN: u8 = 7;
const KIND_JOIN_FILTER: u8 = 8;
const KIND_SEALED_INPUT: u8 = 9;

/// What a writer carries across a process boundary: its stage's description
/// and how it splits rows (as encoded protobuf, decoded against its input).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterPayload {
    /// The stage's id.
    pub stage_id: u64,
    /// Map tasks: the input's partitions, a slice of them per map.
    pub maps: u64,
    /// Buckets per map.
    pub buckets: u64,
    /// Input partitions each map runs (the last map may run fewer).
    pub partitions_per_map: u64,
    /// Ids of the stages it reads.
    pub deps: Vec<u64>,
    /// Those of them its input reads partition by partition (see
    /// [`crate::exec::aligned_reads`]).
    pub aligned_deps: Vec<u64>,
    /// The stage's shuffle directory.
    pub shuffle_dir: String,
    /// The partitioning, for display.
    pub partitioning_display: String,
    /// The partitioning as encoded datafusion-proto bytes.
    pub partitioning: Vec<u8>,
}

impl WriterPayload {
    /// Whether each map runs a slice of several of its input's partitions
    /// (at once, on the plugin's runtime).
    pub fn runs_slices(&self) -> bool {
        self.partitions_per_map > 1
    }
}

/// What a reader carries across a process boundary: the stage it reads, as
/// a description and (until the plan is cut into stages) as encoded bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaderPayload {
    /// Which published buckets make up each of its partitions.
    pub mode: ReadMode,
    /// The stage it reads.
    pub stage_id: u64,
    /// That stage's maps.
    pub maps: u64,
    /// That stage's buckets per map.
    pub buckets: u64,
    /// That stage's shuffle directory.
    pub shuffle_dir: String,
    /// What its output promises (schema, partitioning, equivalences), as
    /// [`crate::codec::reader`] encodes it.
    pub properties: Vec<u8>,
    /// The stage read, as an encoded plan rooted at its writer; empty once
    /// the plan is cut into stages.
    pub stage: Vec<u8>,
}

/// A decoded dfx payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// A `ShuffleWriterExec`.
    Writer(WriterPayload),
    /// A `ShuffleReaderExec`.
    Reader(ReaderPayload),
    /// A `RecursiveQueryExec`; its inputs are the static and the recursive term.
    Recursive {
        /// The CTE's name, which its work table shares.
        name: String,
        /// `UNION` rather than `UNION ALL`.
        distinct: bool,
        /// The output schema, as encoded datafusion-proto bytes.
        schema: Vec<u8>,
    },
    /// A `WorkTableExec` reading the whole work table (no projection).
    WorkTable {
        /// The CTE's name.
        name: String,
        /// The work table's schema, as encoded datafusion-proto bytes.
        schema: Vec<u8>,
    },
    /// A `SealedRecursiveQueryExec`: its recursive query as encoded
    /// datafusion-proto bytes.
    Sealed {
        /// The `PhysicalPlanNode` of the sealed query.
        plan: Vec<u8>,
    },
    /// A `SealedInputExec`: a writer's input as encoded datafusion-proto
    /// bytes, every dfx payload in it unframed (see [`crate::encoded`]).
    SealedInput {
        /// The `PhysicalPlanNode` of the writer's input.
        plan: Vec<u8>,
    },
    /// A `StoreScanExec`: its scan as encoded datafusion-proto bytes.
    StoreScan {
        /// The `PhysicalPlanNode` of the scan.
        plan: Vec<u8>,
    },
    /// A `MapScanExec`: a file scan cut to the file group one map reads.
    MapScan(MapScanPayload),
    /// A `KeySummaryExec` or `JoinFilterExec` (see [`crate::filters`]).
    JoinFilter {
        /// The node's body, as [`crate::codec::join_filter`] encodes it.
        node: Vec<u8>,
    },
}

impl Payload {
    /// The name of the node this payload encodes.
    pub fn node_name(&self) -> &'static str {
        match self {
            Payload::Writer(_) => WRITER_NODE_NAME,
            Payload::Reader(_) => READER_NODE_NAME,
            Payload::Recursive { .. } => RECURSIVE_QUERY_NODE_NAME,
            Payload::WorkTable { .. } => WORK_TABLE_NODE_NAME,
            Payload::Sealed { .. } => SEALED_NODE_NAME,
            Payload::SealedInput { .. } => SEALED_INPUT_NODE_NAME,
            Payload::StoreScan { .. } => STORE_SCAN_NODE_NAME,
            Payload::MapScan(_) => MAP_SCAN_NODE_NAME,
            Payload::JoinFilter { .. } => JOIN_FILTER_NODE_NAME,
        }
    }

    /// How many inputs the node this payload encodes has.
    pub fn inputs(&self) -> usize {
        match self {
            Payload::Writer(_) | Payload::MapScan(_) | Payload::JoinFilter { .. } => 1,
            Payload::Recursive { .. } => 2,
            Payload::Reader(_)
            | Payload::WorkTable { .. }
            | Payload::Sealed { .. }
            | Payload::SealedInput { .. }
            | Payload::StoreScan { .. } => 0,
        }
    }

    /// Append the framed bytes to `buf`.
    pub fn encode(&self, buf: &mut Vec<u8>) -> Result<()> {
        buf.extend_from_slice(&PAYLOAD_MAGIC);
        buf.extend_from_slice(&PAYLOAD_VERSION.to_le_bytes());
        match self {
            Payload::Writer(w) => {
                buf.push(KIND_WRITER);
                buf.extend_from_slice(&w.stage_id.to_le_bytes());
                buf.extend_from_slice(&w.maps.to_le_bytes());
                buf.extend_from_slice(&w.buckets.to_le_bytes());
                buf.extend_from_slice(&w.partitions_per_map.to_le_bytes());
                for ids in [&w.deps, &w.aligned_deps] {
                    let count = u32::try_from(ids.len())
                        .map_err(|_| fail(Area::Codec, "too many deps to encode"))?;
                    buf.extend_from_slice(&count.to_le_bytes());
                    for dep in ids {
                        buf.extend_from_slice(&dep.to_le_bytes());
                    }
                }
                put_blob(buf, w.shuffle_dir.as_bytes(), "shuffle directory")?;
                put_blob(
                    buf,
                    w.partitioning_display.as_bytes(),
                    "partitioning display",
                )?;
                put_blob(buf, &w.partitioning, "partitioning")?;
            }
            Payload::Reader(r) => {
                buf.push(KIND_READER);
                buf.push(r.mode.code());
                for n in [r.stage_id, r.maps, r.buckets] {
                    buf.extend_from_slice(&n.to_le_bytes());
                }
                put_blob(buf, r.shuffle_dir.as_bytes(), "shuffle directory")?;
                put_blob(buf, &r.properties, "reader properties")?;
                put_blob(buf, &r.stage, "stage read")?;
            }
            Payload::Recursive {
                name,
                distinct,
                schema,
            } => {
                buf.push(KIND_RECURSIVE);
                buf.push(u8::from(*distinct));
                put_blob(buf, name.as_bytes(), "CTE name")?;
                put_blob(buf, schema, "schema")?;
            }
            Payload::WorkTable { name, schema } => {
                buf.push(KIND_WORK_TABLE);
                put_blob(buf, name.as_bytes(), "CTE name")?;
                put_blob(buf, schema, "schema")?;
            }
            Payload::Sealed { plan } => {
                buf.push(KIND_SEALED);
                put_blob(buf, plan, "sealed plan")?;
            }
            Payload::SealedInput { plan } => {
                buf.push(KIND_SEALED_INPUT);
                put_blob(buf, plan, "sealed input")?;
            }
            Payload::StoreScan { plan } => {
                buf.push(KIND_STORE_SCAN);
                put_blob(buf, plan, "store scan")?;
            }
            Payload::MapScan(scan) => {
                buf.push(KIND_MAP_SCAN);
                buf.extend_from_slice(&scan.map.to_le_bytes());
                buf.extend_from_slice(&scan.partitions.to_le_bytes());
                buf.extend_from_slice(&scan.partition.to_le_bytes());
                buf.extend_from_slice(&scan.slot.to_le_bytes());
            }
            Payload::JoinFilter { node } => {
                buf.push(KIND_JOIN_FILTER);
                put_blob(buf, node, "join filter")?;
            }
        }
        Ok(())
    }

    /// Parse framed bytes.
    ///
    /// # Errors
    ///
    /// Bytes that are not a dfx payload, a payload of another version or
    /// kind, a truncated payload or trailing bytes: each named in the message.
    pub fn decode(buf: &[u8]) -> Result<Self> {
        if buf.len() >= 4 && buf[..4] != PAYLOAD_MAGIC {
            return Err(fail(Area::Codec, not_ours(buf)));
        }
        let mut cursor = Cursor { buf };
        cursor.take(4, "magic")?;
        let version = cursor.u16("payload version")?;
        if version != PAYLOAD_VERSION {
            return Err(fail(
                Area::Codec,
                format!(
                    "payload version {version} is not supported; this plugin reads version \
                 {PAYLOAD_VERSION} (was the plan encoded by another dfx? version 2 nested \
                 each stage inside its reader's inputs, version 3 carries it as a blob, \
                 version 4 runs a slice of partitions per map, version 5 names the \
                 stages each reads partition by partition)"
                ),
            ));
        }
        let payload = match cursor.u8("node kind")? {
            KIND_WRITER => {
                let stage_id = cursor.u64("stage id")?;
                let maps = cursor.u64("maps")?;
                let buckets = cursor.u64("buckets")?;
                let partitions_per_map = cursor.u64("partitions per map")?;
                let deps = cursor.ids("deps")?;
                let aligned_deps = cursor.ids("aligned deps")?;
                Payload::Writer(WriterPayload {
                    stage_id,
                    maps,
                    buckets,
                    partitions_per_map,
                    deps,
                    aligned_deps,
                    shuffle_dir: cursor.string("shuffle directory")?,
                    partitioning_display: cursor.string("partitioning display")?,
                    partitioning: cursor.blob("partitioning")?.to_vec(),
                })
            }
            KIND_READER => {
                let code = cursor.u8("read mode")?;
                Payload::Reader(ReaderPayload {
                    mode: ReadMode::from_code(code)
                        .ok_or_else(|| fail(Area::Codec, format!("unknown read mode {code}")))?,
                    stage_id: cursor.u64("stage id")?,
                    maps: cursor.u64("maps")?,
                    buckets: cursor.u64("buckets")?,
                    shuffle_dir: cursor.string("shuffle directory")?,
                    properties: cursor.blob("reader properties")?.to_vec(),
                    stage: cursor.blob("stage read")?.to_vec(),
                })
            }
            KIND_RECURSIVE => {
                let distinct = match cursor.u8("distinct")? {
                    0 => false,
                    1 => true,
                    other => {
                        return Err(fail(
                            Area::Codec,
                            format!("distinct is {other}, not 0 or 1"),
                        ));
                    }
                };
                Payload::Recursive {
                    distinct,
                    name: cursor.string("CTE name")?,
                    schema: cursor.blob("schema")?.to_vec(),
                }
            }
            KIND_WORK_TABLE => Payload::WorkTable {
                name: cursor.string("CTE name")?,
                schema: cursor.blob("schema")?.to_vec(),
            },
            KIND_SEALED => Payload::Sealed {
                plan: cursor.blob("sealed plan")?.to_vec(),
            },
            KIND_SEALED_INPUT => Payload::SealedInput {
                plan: cursor.blob("sealed input")?.to_vec(),
            },
            KIND_STORE_SCAN => Payload::StoreScan {
                plan: cursor.blob("store scan")?.to_vec(),
            },
            KIND_MAP_SCAN => Payload::MapScan(MapScanPayload {
                map: cursor.u64("map")?,
                partitions: cursor.u64("partitions")?,
                partition: cursor.u64("partition")?,
                slot: cursor.u32("slot")?,
            }),
            KIND_JOIN_FILTER => Payload::JoinFilter {
                node: cursor.blob("join filter")?.to_vec(),
            },
            other => return Err(fail(Area::Codec, format!("unknown node kind {other}"))),
        };
        if !cursor.buf.is_empty() {
            return Err(fail(
                Area::Codec,
                format!("{} trailing bytes after the payload", cursor.buf.len()),
            ));
        }
        Ok(payload)
    }
}

/// The writer payload at the root of an encoded stage (the bytes a driver
/// ships), read without decoding the plan.
///
/// A host's codec chain may wrap the payload in a frame of its own naming the
/// codec that wrote it; the payload is always the frame's tail, so it is
/// found by its magic and must then parse to the end.
///
/// # Errors
///
/// Bytes that are not a protobuf physical plan, a root that is not an
/// extension node, or an extension node carrying no dfx writer payload.
pub fn read_encoded_stage(plan_bytes: &[u8]) -> Result<WriterPayload> {
    let root = PhysicalPlanNode::decode(plan_bytes)
        .map_err(|e| fail(Area::Codec, format!("not an encoded physical plan: {e}")))?;
    let Some(PhysicalPlanType::Extension(extension)) = root.physical_plan_type else {
        return Err(fail(
            Area::Codec,
            "the encoded plan's root is not an extension node, so not a dfx stage",
        ));
    };
    let bytes = extension.node.as_slice();
    let mut last_error = None;
    for start in (0..bytes.len().saturating_sub(3)).filter(|&i| bytes[i..i + 4] == PAYLOAD_MAGIC) {
        match Payload::decode(&bytes[start..]) {
            Ok(Payload::Writer(writer)) => return Ok(writer),
            Ok(other) => {
                return Err(fail(
                    Area::Codec,
                    format!(
                        "the encoded plan's root is a {}, not a stage's writer",
                        other.node_name()
                    ),
                ));
            }
            Err(err) => last_error = Some(err),
        }
    }
    Err(last_error.unwrap_or_else(|| fail(Area::Codec, not_ours(bytes))))
}

/// An extension node's bytes with its dfx payload (which starts at `start`,
/// after whatever frame a host's codec chain put first) replaced by
/// `payload`. A frame that states the length of what follows it (a
/// protobuf length field, as DataFusion's composed codec writes) is
/// restated for the payload's length; one that does not (datafusion-python's
/// and the Rust host's) is kept as it is.
///
/// # Errors
///
/// A payload that does not encode.
pub(crate) fn reframe(node: &[u8], start: usize, payload: &Payload) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    payload.encode(&mut body)?;
    let prefix = &node[..start.min(node.len())];
    let mut framed = Vec::with_capacity(prefix.len() + body.len());
    let mut at = 0;
    while at < prefix.len() {
        // A varint here that counts every byte after it to the node's end
        // is the length of a field enclosing the payload.
        let (value, width) = read_varint(&prefix[at..]);
        if width > 0 && value == (node.len() - at - width) as u64 {
            let after = node.len() - at - width - (node.len() - start) + body.len();
            write_varint(&mut framed, after as u64);
            at += width;
            continue;
        }
        framed.push(prefix[at]);
        at += 1;
    }
    framed.extend_from_slice(&body);
    Ok(framed)
}

/// The protobuf varint at the start of `bytes` and its width (0: none).
fn read_varint(bytes: &[u8]) -> (u64, usize) {
    let mut value = 0u64;
    for (i, byte) in bytes.iter().take(10).enumerate() {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return (value, i + 1);
        }
    }
    (0, 0)
}

fn write_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn not_ours(buf: &[u8]) -> String {
    let shown = &buf[..buf.len().min(4)];
    format!("not a dfx payload: expected magic {PAYLOAD_MAGIC:02x?}, found {shown:02x?}")
}

/// Which published buckets make up each partition of a reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    /// Partition `b` is bucket `b` of every map.
    Hash,
    /// Partition `p` is bucket `p mod b` of map `p div b`, with `b` buckets
    /// per map: one per partition of a map's slice.
    PassThrough,
    /// One partition: every bucket of every map.
    Broadcast,
}

impl ReadMode {
    /// The mode's name in displays and payloads.
    pub fn as_str(self) -> &'static str {
        match self {
            ReadMode::Hash => "hash",
            ReadMode::PassThrough => "pass-through",
            ReadMode::Broadcast => "broadcast",
        }
    }

    /// The code of the mode in a codec payload.
    pub fn code(self) -> u8 {
        match self {
            ReadMode::Hash => 1,
            ReadMode::PassThrough => 2,
            ReadMode::Broadcast => 3,
        }
    }

    /// The mode with payload code `code`.
    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(ReadMode::Hash),
            2 => Some(ReadMode::PassThrough),
            3 => Some(ReadMode::Broadcast),
            _ => None,
        }
    }
}

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

/// What a [`MapScanExec`] carries across a process boundary besides its
/// scan (its input).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapScanPayload {
    /// The map the scan was cut for; [`UNCUT_MAP`] in a stage's shared part
    /// (no map's files filled in yet), [`ANY_MAP`] where no map reads it.
    pub map: u64,
    /// Partitions of the scan it was cut from: the partitions it declares.
    pub partitions: u64,
    /// The one partition it can run (its scan's only file group), or
    /// [`NO_PARTITION`].
    pub partition: u64,
    /// Which cut scan of its stage it is, in the order the cut met them.
    pub slot: u32,
}
