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
//! writer (kind 1): stage id u64 | maps u64 | buckets u64 | deps: u32 count, u64 each
//!                  | shuffle dir str | partitioning display str
//!                  | partitioning blob (datafusion-proto `Partitioning`)
//! reader (kind 2): read mode u8
//! recursive query (kind 3): distinct u8 | CTE name str | output schema blob
//!                  (datafusion-proto `Schema`); inputs: static term, recursive term
//! work table (kind 4): CTE name str | schema blob (datafusion-proto `Schema`)
//! sealed recursive query (kind 5): plan blob (datafusion-proto
//!                  `PhysicalPlanNode` of the whole recursive query, the codec
//!                  for kinds 3 and 4); no inputs
//! store scan (kind 6): plan blob (datafusion-proto `PhysicalPlanNode` of
//!                  the scan of a table on an object store); no inputs
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

use datafusion::common::Result;
use datafusion_proto::protobuf::PhysicalPlanNode;
use datafusion_proto::protobuf::physical_plan_node::PhysicalPlanType;
use prost::Message;

use crate::error::{Area, fail};

/// Name of the stage writer node.
pub const WRITER_NODE_NAME: &str = "ShuffleWriterExec";

/// Name of the reader node.
pub const READER_NODE_NAME: &str = "ShuffleReaderExec";

/// Name of the node that carries a file scan cut for one map.
pub const MAP_SCAN_NODE_NAME: &str = "MapScanExec";

/// Name of the node that runs a whole recursive query in one process.
pub const SEALED_NODE_NAME: &str = "SealedRecursiveQueryExec";

/// Name of the node that scans a table on an object store through the
/// worker's stores.
pub const STORE_SCAN_NODE_NAME: &str = "StoreScanExec";

/// Name of the node that filters a probe side by a build stage's keys.
pub const JOIN_FILTER_NODE_NAME: &str = "JoinFilterExec";

/// Name of the node that summarizes a build side's join keys.
pub const KEY_SUMMARY_NODE_NAME: &str = "KeySummaryExec";

/// Name of DataFusion's recursive query node, which the codec carries.
pub const RECURSIVE_QUERY_NODE_NAME: &str = "RecursiveQueryExec";

/// Name of DataFusion's work table node, which the codec carries.
pub const WORK_TABLE_NODE_NAME: &str = "WorkTableExec";

/// Every node the codec encodes, in the order its refusal lists them.
pub const ENCODED_NODE_NAMES: [&str; 9] = [
    WRITER_NODE_NAME,
    READER_NODE_NAME,
    SEALED_NODE_NAME,
    STORE_SCAN_NODE_NAME,
    MAP_SCAN_NODE_NAME,
    KEY_SUMMARY_NODE_NAME,
    JOIN_FILTER_NODE_NAME,
    RECURSIVE_QUERY_NODE_NAME,
    WORK_TABLE_NODE_NAME,
];

/// [`ENCODED_NODE_NAMES`] as a sentence: `A, B and C`.
pub fn encoded_node_names() -> String {
    let last = ENCODED_NODE_NAMES.len() - 1;
    format!(
        "{} and {}",
        ENCODED_NODE_NAMES[..last].join(", "),
        ENCODED_NODE_NAMES[last]
    )
}

/// The codec's id, as hosts list it among their session's codecs: one id per
/// payload version, so a plan encoded by another version is refused by id
/// before a byte of it is read.
pub const CODEC_ID: &str = "dfx_engine.physical.v2";

/// First bytes of every dfx payload.
pub const PAYLOAD_MAGIC: [u8; 4] = *b"DFXS";

/// Version of the payload layout this plugin writes and reads.
pub const PAYLOAD_VERSION: u16 = 2;

const KIND_WRITER: u8 = 1;
const KIND_READER: u8 = 2;
const KIND_RECURSIVE: u8 = 3;
const KIND_WORK_TABLE: u8 = 4;
const KIND_SEALED: u8 = 5;
const KIND_STORE_SCAN: u8 = 6;
const KIND_MAP_SCAN: u8 = 7;
const KIND_JOIN_FILTER: u8 = 8;

/// What a writer carries across a process boundary: its stage's description
/// and how it splits rows (as encoded protobuf, decoded against its input).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterPayload {
    /// The stage's id.
    pub stage_id: u64,
    /// Map tasks (the input's partitions).
    pub maps: u64,
    /// Buckets per map.
    pub buckets: u64,
    /// Ids of the stages it reads.
    pub deps: Vec<u64>,
    /// The stage's shuffle directory.
    pub shuffle_dir: String,
    /// The partitioning, for display.
    pub partitioning_display: String,
    /// The partitioning as encoded datafusion-proto bytes.
    pub partitioning: Vec<u8>,
}

/// A decoded dfx payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// A `ShuffleWriterExec`.
    Writer(WriterPayload),
    /// A `ShuffleReaderExec` in this mode.
    Reader(ReadMode),
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

/// Reads a framed payload front to back; every short read is "truncated".
pub(crate) struct Cursor<'a> {
    pub(crate) buf: &'a [u8],
}

impl<'a> Cursor<'a> {
    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if self.buf.len() < n {
            return Err(fail(
                Area::Codec,
                format!(
                    "truncated payload: {what} needs {n} byte(s), {} left",
                    self.buf.len()
                ),
            ));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    pub(crate) fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }

    pub(crate) fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(
            self.take(2, what)?.try_into().expect("2 bytes"),
        ))
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4, what)?.try_into().expect("4 bytes"),
        ))
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().expect("8 bytes"),
        ))
    }

    pub(crate) fn blob(&mut self, what: &str) -> Result<&'a [u8]> {
        let len = self.u32(what)? as usize;
        self.take(len, what)
    }

    pub(crate) fn string(&mut self, what: &str) -> Result<String> {
        let bytes = self.blob(what)?;
        std::str::from_utf8(bytes)
            .map(str::to_string)
            .map_err(|e| fail(Area::Codec, format!("{what} is not UTF-8: {e}")))
    }
}

pub(crate) fn put_blob(buf: &mut Vec<u8>, bytes: &[u8], what: &str) -> Result<()> {
    let len = u32::try_from(bytes.len()).map_err(|_| {
        fail(
            Area::Codec,
            format!("{what} of {} bytes is too long to encode", bytes.len()),
        )
    })?;
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(bytes);
    Ok(())
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
            Payload::StoreScan { .. } => STORE_SCAN_NODE_NAME,
            Payload::MapScan(_) => MAP_SCAN_NODE_NAME,
            Payload::JoinFilter { .. } => JOIN_FILTER_NODE_NAME,
        }
    }

    /// How many inputs the node this payload encodes has.
    pub fn inputs(&self) -> usize {
        match self {
            Payload::Writer(_)
            | Payload::Reader(_)
            | Payload::MapScan(_)
            | Payload::JoinFilter { .. } => 1,
            Payload::Recursive { .. } => 2,
            Payload::WorkTable { .. } | Payload::Sealed { .. } | Payload::StoreScan { .. } => 0,
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
                let deps = u32::try_from(w.deps.len())
                    .map_err(|_| fail(Area::Codec, "too many deps to encode"))?;
                buf.extend_from_slice(&deps.to_le_bytes());
                for dep in &w.deps {
                    buf.extend_from_slice(&dep.to_le_bytes());
                }
                put_blob(buf, w.shuffle_dir.as_bytes(), "shuffle directory")?;
                put_blob(
                    buf,
                    w.partitioning_display.as_bytes(),
                    "partitioning display",
                )?;
                put_blob(buf, &w.partitioning, "partitioning")?;
            }
            Payload::Reader(mode) => {
                buf.push(KIND_READER);
                buf.push(mode.code());
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
                 {PAYLOAD_VERSION} (was the plan encoded by another dfx?)"
                ),
            ));
        }
        let payload = match cursor.u8("node kind")? {
            KIND_WRITER => {
                let stage_id = cursor.u64("stage id")?;
                let maps = cursor.u64("maps")?;
                let buckets = cursor.u64("buckets")?;
                let count = cursor.u32("deps")? as usize;
                // Bounded by the bytes present, so a corrupt count cannot
                // make us allocate.
                if count > cursor.buf.len() / 8 {
                    return Err(fail(
                        Area::Codec,
                        format!(
                            "truncated payload: {count} deps declared, {} bytes left",
                            cursor.buf.len()
                        ),
                    ));
                }
                let deps = (0..count)
                    .map(|_| cursor.u64("dep"))
                    .collect::<Result<Vec<_>>>()?;
                Payload::Writer(WriterPayload {
                    stage_id,
                    maps,
                    buckets,
                    deps,
                    shuffle_dir: cursor.string("shuffle directory")?,
                    partitioning_display: cursor.string("partitioning display")?,
                    partitioning: cursor.blob("partitioning")?.to_vec(),
                })
            }
            KIND_READER => {
                let code = cursor.u8("read mode")?;
                Payload::Reader(
                    ReadMode::from_code(code)
                        .ok_or_else(|| fail(Area::Codec, format!("unknown read mode {code}")))?,
                )
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

fn not_ours(buf: &[u8]) -> String {
    let shown = &buf[..buf.len().min(4)];
    format!("not a dfx payload: expected magic {PAYLOAD_MAGIC:02x?}, found {shown:02x?}")
}

/// Which published buckets make up each partition of a reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    /// Partition `b` is bucket `b` of every map.
    Hash,
    /// Partition `m` is map `m`'s only bucket.
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
