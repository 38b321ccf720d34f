//! The physical extension codec for `ShuffleWriterExec` and
//! `ShuffleReaderExec`, and for the two nodes of a recursive query that
//! datafusion-proto cannot encode (`RecursiveQueryExec`, `WorkTableExec`).
//!
//! Claims only those nodes; every other node belongs to the host's chain,
//! which also encodes each node's child (the codec sees the node, never its
//! subtree). The payload is framed so that bytes from elsewhere are refused
//! with a reason instead of being misread (integers little endian, strings
//! and blobs prefixed by a u32 length):
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
//!                  `PhysicalPlanNode` of the whole recursive query, this codec
//!                  for kinds 3 and 4); no inputs
//! store scan (kind 6): plan blob (datafusion-proto `PhysicalPlanNode` of
//!                  the scan of a table on an object store); no inputs
//! map scan (kind 7): map u64 (UNCUT_MAP: a stage's shared part; ANY_MAP:
//!                  every map) | partitions u64 | partition u64 (NO_PARTITION:
//!                  none) | slot u32 (NO_SLOT: none); input: the file scan,
//!                  holding that partition's file group only (see [`crate::map_files`])
//! join filter (kind 8): body blob (JSON, see [`crate::filters::payload`]):
//!                  a build stage's key summary or a probe side's filter;
//!                  input: the node's child
//! ```
//!
//! A recursive query's work table is shared, in memory, between the query
//! node and the work table node below it. Decoding the query node links the
//! two again (`RecursiveQueryExec::try_new` hands its table to the one
//! `WorkTableExec` of its recursive term), which is why both are dfx's: the
//! whole recursive query then runs in the process that decoded it. Hosts
//! only meet the sealed form (see [`crate::recursive`]).
//!
//! Everything a driver needs to schedule a stage sits in the writer's payload,
//! so a host that cannot decode a plan (or must not yet) reads it from the
//! encoded bytes alone ([`read_encoded_stage`]).

use std::path::PathBuf;
use std::sync::Arc;

use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::Partitioning;
use datafusion::physical_plan::recursive_query::RecursiveQueryExec;
use datafusion::physical_plan::work_table::WorkTableExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use datafusion_proto::bytes::{
    physical_plan_from_bytes_with_extension_codec, physical_plan_to_bytes_with_extension_codec,
};
use datafusion_proto::physical_plan::from_proto::parse_protobuf_partitioning;
use datafusion_proto::physical_plan::to_proto::serialize_partitioning;
use datafusion_proto::physical_plan::{
    PhysicalExtensionCodec, PhysicalPlanDecodeContext, PhysicalProtoConverterExtension,
};
use datafusion_proto::protobuf;
use datafusion_proto::protobuf::PhysicalPlanNode;
use datafusion_proto::protobuf::physical_plan_node::PhysicalPlanType;
use prost::Message;

use crate::counters::{self, LiveObject};
use crate::exchange::{ReadMode, ShuffleReaderExec, ShuffleWriterExec};
use crate::guard;
use crate::map_files::{MapScanExec, MapScanPayload};
use crate::recursive::{SEALED_NODE_NAME, SealedRecursiveQueryExec};
use crate::tables::{STORE_SCAN_NODE_NAME, StoreScanExec, with_table_stores_context};

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
        /// The node's body, as [`crate::filters::payload`] encodes it.
        node: Vec<u8>,
    },
}

pub(crate) fn fail(what: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Execution(format!("dfx codec: {what}"))
}

/// Reads a framed payload front to back; every short read is "truncated".
pub(crate) struct Cursor<'a> {
    pub(crate) buf: &'a [u8],
}

impl<'a> Cursor<'a> {
    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if self.buf.len() < n {
            return Err(fail(format!(
                "truncated payload: {what} needs {n} byte(s), {} left",
                self.buf.len()
            )));
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
            .map_err(|e| fail(format!("{what} is not UTF-8: {e}")))
    }
}

pub(crate) fn put_blob(buf: &mut Vec<u8>, bytes: &[u8], what: &str) -> Result<()> {
    let len = u32::try_from(bytes.len()).map_err(|_| {
        fail(format!(
            "{what} of {} bytes is too long to encode",
            bytes.len()
        ))
    })?;
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(bytes);
    Ok(())
}

impl Payload {
    /// The name of the node this payload encodes.
    pub fn node_name(&self) -> &'static str {
        match self {
            Payload::Writer(_) => "ShuffleWriterExec",
            Payload::Reader(_) => "ShuffleReaderExec",
            Payload::Recursive { .. } => "RecursiveQueryExec",
            Payload::WorkTable { .. } => "WorkTableExec",
            Payload::Sealed { .. } => SEALED_NODE_NAME,
            Payload::StoreScan { .. } => STORE_SCAN_NODE_NAME,
            Payload::MapScan(_) => crate::map_files::MAP_SCAN_NODE_NAME,
            Payload::JoinFilter { .. } => crate::filters::JOIN_FILTER_NODE_NAME,
        }
    }

    /// How many inputs the node this payload encodes has.
    fn inputs(&self) -> usize {
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
                let deps =
                    u32::try_from(w.deps.len()).map_err(|_| fail("too many deps to encode"))?;
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
            return Err(fail(not_ours(buf)));
        }
        let mut cursor = Cursor { buf };
        cursor.take(4, "magic")?;
        let version = cursor.u16("payload version")?;
        if version != PAYLOAD_VERSION {
            return Err(fail(format!(
                "payload version {version} is not supported; this plugin reads version \
                 {PAYLOAD_VERSION} (was the plan encoded by another dfx?)"
            )));
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
                    return Err(fail(format!(
                        "truncated payload: {count} deps declared, {} bytes left",
                        cursor.buf.len()
                    )));
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
                        .ok_or_else(|| fail(format!("unknown read mode {code}")))?,
                )
            }
            KIND_RECURSIVE => {
                let distinct = match cursor.u8("distinct")? {
                    0 => false,
                    1 => true,
                    other => return Err(fail(format!("distinct is {other}, not 0 or 1"))),
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
            other => return Err(fail(format!("unknown node kind {other}"))),
        };
        if !cursor.buf.is_empty() {
            return Err(fail(format!(
                "{} trailing bytes after the payload",
                cursor.buf.len()
            )));
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
        .map_err(|e| fail(format!("not an encoded physical plan: {e}")))?;
    let Some(PhysicalPlanType::Extension(extension)) = root.physical_plan_type else {
        return Err(fail(
            "the encoded plan's root is not an extension node, so not a dfx stage",
        ));
    };
    let bytes = extension.node.as_slice();
    let mut last_error = None;
    for start in (0..bytes.len().saturating_sub(3)).filter(|&i| bytes[i..i + 4] == PAYLOAD_MAGIC) {
        match Payload::decode(&bytes[start..]) {
            Ok(Payload::Writer(writer)) => return Ok(writer),
            Ok(other) => {
                return Err(fail(format!(
                    "the encoded plan's root is a {}, not a stage's writer",
                    other.node_name()
                )));
            }
            Err(err) => last_error = Some(err),
        }
    }
    Err(last_error.unwrap_or_else(|| fail(not_ours(bytes))))
}

/// A schema as datafusion-proto bytes, for the recursive query `cte`.
fn encode_schema(schema: &Schema, cte: &str) -> Result<Vec<u8>> {
    let proto = protobuf::Schema::try_from(schema).map_err(|e| {
        fail(format!(
            "recursive query {cte:?}: cannot encode its schema: {e}"
        ))
    })?;
    Ok(proto.encode_to_vec())
}

/// The schema `bytes` encode, for the recursive query `cte`.
fn decode_schema(bytes: &[u8], cte: &str) -> Result<SchemaRef> {
    let proto = protobuf::Schema::decode(bytes).map_err(|e| {
        fail(format!(
            "recursive query {cte:?}: its schema is not valid protobuf: {e}"
        ))
    })?;
    let schema = Schema::try_from(&proto).map_err(|e| {
        fail(format!(
            "recursive query {cte:?}: its schema does not decode: {e}"
        ))
    })?;
    Ok(Arc::new(schema))
}

fn not_ours(buf: &[u8]) -> String {
    let shown = &buf[..buf.len().min(4)];
    format!("not a dfx payload: expected magic {PAYLOAD_MAGIC:02x?}, found {shown:02x?}")
}

/// Encodes and decodes dfx's writer and reader; refuses everything else.
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

impl DfxPhysicalCodec {
    fn decode_writer(
        &self,
        payload: WriterPayload,
        input: &Arc<dyn ExecutionPlan>,
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let stage = payload.stage_id;
        let proto =
            protobuf::Partitioning::decode(payload.partitioning.as_slice()).map_err(|e| {
                fail(format!(
                    "stage {stage}: partitioning is not valid protobuf: {e}"
                ))
            })?;
        let decode_ctx = PhysicalPlanDecodeContext::new(ctx, self);
        // DataFusion's own message says nothing of whose payload it was
        // (fuzzing found "Unexpected empty physical expression" bare).
        let partitioning = parse_protobuf_partitioning(
            Some(&proto),
            &decode_ctx,
            &input.schema(),
            proto_converter,
        )
        .map_err(|e| {
            fail(format!(
                "stage {stage}: the partitioning does not decode against the stage's input: {e}"
            ))
        })?
        .ok_or_else(|| fail(format!("stage {stage}: no partitioning in the payload")))?;
        let maps = input.output_partitioning().partition_count() as u64;
        if maps != payload.maps || partitioning.partition_count() as u64 != payload.buckets {
            return Err(fail(format!(
                "stage {stage}: the payload declares {} map(s) and {} bucket(s), the decoded \
                 plan has {maps} and {}",
                payload.maps,
                payload.buckets,
                partitioning.partition_count()
            )));
        }
        counters::stage_decoded();
        Ok(Arc::new(ShuffleWriterExec::try_new(
            stage,
            PathBuf::from(payload.shuffle_dir),
            Arc::clone(input),
            partitioning,
            payload.deps,
        )?))
    }
}

impl PhysicalExtensionCodec for DfxPhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        guard::catch("the physical codec's try_decode", || {
            self.decode(buf, inputs, ctx, proto_converter)
        })
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        guard::catch("the physical codec's try_encode", || {
            self.encode(node, buf, proto_converter)
        })
    }
}

impl DfxPhysicalCodec {
    fn decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let payload = Payload::decode(buf)?;
        if inputs.len() != payload.inputs() {
            return Err(fail(format!(
                "a {} needs {} input(s), the plan gave {}",
                payload.node_name(),
                payload.inputs(),
                inputs.len()
            )));
        }
        match payload {
            Payload::Writer(writer) => self.decode_writer(writer, &inputs[0], ctx, proto_converter),
            Payload::Reader(mode) => Ok(Arc::new(ShuffleReaderExec::try_new(
                mode,
                Arc::clone(&inputs[0]),
            )?)),
            Payload::Recursive {
                name,
                distinct,
                schema,
            } => {
                let schema = decode_schema(&schema, &name)?;
                Ok(Arc::new(RecursiveQueryExec::try_new(
                    name,
                    schema,
                    Arc::clone(&inputs[0]),
                    Arc::clone(&inputs[1]),
                    distinct,
                )?))
            }
            Payload::WorkTable { name, schema } => {
                let schema = decode_schema(&schema, &name)?;
                Ok(Arc::new(WorkTableExec::new(name, schema, None)?))
            }
            Payload::Sealed { plan } => {
                let query = physical_plan_from_bytes_with_extension_codec(&plan, ctx, self)
                    .map_err(|e| {
                        fail(format!("the sealed recursive query does not decode: {e}"))
                    })?;
                Ok(Arc::new(SealedRecursiveQueryExec::new(query)))
            }
            Payload::StoreScan { plan } => {
                // Decoding a file scan looks its store up: the plugin's.
                let ctx = with_table_stores_context(ctx)?;
                let scan = physical_plan_from_bytes_with_extension_codec(&plan, &ctx, self)
                    .map_err(|e| fail(format!("the store scan does not decode: {e}")))?;
                Ok(Arc::new(StoreScanExec::new(scan)))
            }
            Payload::MapScan(scan) => Ok(Arc::new(MapScanExec::try_new(
                scan,
                Arc::clone(&inputs[0]),
            )?)),
            Payload::JoinFilter { node } => {
                crate::filters::payload::decode_node(&node, &inputs[0], ctx, self, proto_converter)
            }
        }
    }

    fn encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        if let Some(reader) = node.downcast_ref::<ShuffleReaderExec>() {
            return Payload::Reader(reader.mode()).encode(buf);
        }
        if let Some(sealed) = node.downcast_ref::<SealedRecursiveQueryExec>() {
            // Encoded here, by the plugin, so that no host meets the nodes
            // decoding a recursive query creates (see `crate::recursive`).
            let plan =
                physical_plan_to_bytes_with_extension_codec(Arc::clone(sealed.query()), self)?;
            return Payload::Sealed {
                plan: plan.to_vec(),
            }
            .encode(buf);
        }
        if let Some(scan) = node.downcast_ref::<StoreScanExec>() {
            let plan = physical_plan_to_bytes_with_extension_codec(Arc::clone(scan.scan()), self)?;
            return Payload::StoreScan {
                plan: plan.to_vec(),
            }
            .encode(buf);
        }
        if let Some(scan) = node.downcast_ref::<MapScanExec>() {
            return Payload::MapScan(scan.payload()).encode(buf);
        }
        if let Some(body) = crate::filters::payload::encode_node(&node, self, proto_converter)? {
            return Payload::JoinFilter { node: body }.encode(buf);
        }
        if let Some(query) = node.downcast_ref::<RecursiveQueryExec>() {
            return Payload::Recursive {
                name: query.name().to_string(),
                distinct: query.is_distinct(),
                schema: encode_schema(&query.schema(), query.name())?,
            }
            .encode(buf);
        }
        if let Some(work_table) = node.downcast_ref::<WorkTableExec>() {
            // The planner gave every work table read its whole table (see
            // `recursive::whole_work_tables`): a node cannot say which columns
            // it projects, so a projected one would decode reading them all.
            return Payload::WorkTable {
                name: work_table.name().to_string(),
                schema: encode_schema(&work_table.schema(), work_table.name())?,
            }
            .encode(buf);
        }
        let Some(writer) = node.downcast_ref::<ShuffleWriterExec>() else {
            return Err(DataFusionError::NotImplemented(format!(
                "dfx codec encodes only ShuffleWriterExec, ShuffleReaderExec, \
                 {SEALED_NODE_NAME}, {STORE_SCAN_NODE_NAME}, {}, {}, {}, RecursiveQueryExec \
                 and WorkTableExec, not {}",
                crate::map_files::MAP_SCAN_NODE_NAME,
                crate::filters::KEY_SUMMARY_NODE_NAME,
                crate::filters::JOIN_FILTER_NODE_NAME,
                node.name()
            )));
        };
        let shuffle_dir = writer.shuffle_dir().to_str().ok_or_else(|| {
            fail(format!(
                "stage {} has a shuffle directory that is not UTF-8: {}",
                writer.stage_id(),
                writer.shuffle_dir().display()
            ))
        })?;
        let partitioning: Partitioning = writer.partitioning().clone();
        let proto = serialize_partitioning(&partitioning, self, proto_converter)?;
        Payload::Writer(WriterPayload {
            stage_id: writer.stage_id(),
            maps: writer.maps() as u64,
            buckets: writer.buckets() as u64,
            deps: writer.deps().to_vec(),
            shuffle_dir: shuffle_dir.to_string(),
            partitioning_display: writer.partitioning_display(),
            partitioning: proto.encode_to_vec(),
        })
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
        Payload::Writer(WriterPayload {
            stage_id: 7,
            maps: 4,
            buckets: 3,
            deps: vec![8, 9],
            shuffle_dir: "/tmp/shuffle-ä".into(),
            partitioning_display: "hash([k@0], 3)".into(),
            partitioning: vec![1, 2, 3],
        })
        .encode(&mut buf)
        .unwrap();
        buf
    }

    #[test]
    fn the_recursive_query_and_map_scan_kinds_round_trip_and_refuse_truncation() {
        let payloads = [
            Payload::Recursive {
                name: "r".into(),
                distinct: true,
                schema: vec![1, 2, 3],
            },
            Payload::WorkTable {
                name: "r".into(),
                schema: vec![4, 5],
            },
            Payload::Sealed { plan: vec![9; 7] },
            Payload::MapScan(MapScanPayload {
                map: 3,
                partitions: 10,
                partition: 3,
                slot: 1,
            }),
        ];
        for payload in payloads {
            let mut buf = Vec::new();
            payload.encode(&mut buf).unwrap();
            assert_eq!(Payload::decode(&buf).unwrap(), payload);
            for len in 0..buf.len() {
                let err = Payload::decode(&buf[..len]).unwrap_err().to_string();
                assert!(err.contains("truncated payload"), "{len}: {err}");
            }
        }
        // Only 0 and 1 say whether a recursive query is distinct.
        let mut buf = Vec::new();
        Payload::Recursive {
            name: "r".into(),
            distinct: false,
            schema: Vec::new(),
        }
        .encode(&mut buf)
        .unwrap();
        buf[7] = 2;
        let err = Payload::decode(&buf).unwrap_err().to_string();
        assert!(err.contains("distinct is 2"), "{err}");
    }

    #[test]
    fn round_trip() {
        let Payload::Writer(payload) = Payload::decode(&sample()).unwrap() else {
            panic!("a writer");
        };
        assert_eq!(payload.stage_id, 7);
        assert_eq!((payload.maps, payload.buckets), (4, 3));
        assert_eq!(payload.deps, vec![8, 9]);
        assert_eq!(payload.shuffle_dir, "/tmp/shuffle-ä");
        let mut buf = Vec::new();
        Payload::Reader(ReadMode::Broadcast)
            .encode(&mut buf)
            .unwrap();
        assert_eq!(
            Payload::decode(&buf).unwrap(),
            Payload::Reader(ReadMode::Broadcast)
        );
    }

    #[test]
    fn every_truncation_is_an_error_naming_dfx() {
        let buf = sample();
        for len in 0..buf.len() {
            let err = Payload::decode(&buf[..len]).unwrap_err().to_string();
            assert!(err.contains("dfx codec"), "len {len}: {err}");
            assert!(err.contains("truncated"), "len {len}: {err}");
        }
    }

    #[test]
    fn trailing_bytes_are_an_error() {
        let mut buf = sample();
        buf.push(0);
        let err = Payload::decode(&buf).unwrap_err().to_string();
        assert!(err.contains("trailing bytes"), "{err}");
    }

    #[test]
    fn unknown_version_is_named() {
        let mut buf = sample();
        buf[4..6].copy_from_slice(&1u16.to_le_bytes());
        let err = Payload::decode(&buf).unwrap_err().to_string();
        assert!(err.contains("version 1"), "{err}");
        assert!(err.contains("dfx codec"), "{err}");
    }

    #[test]
    fn random_bytes_never_panic() {
        // A small deterministic generator: the property is "no panic, an
        // error naming dfx", whatever the bytes (with and without the magic).
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for round in 0..4000 {
            let len = round % 96;
            let mut bytes: Vec<u8> = (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            if round % 2 == 0 && bytes.len() >= 7 {
                bytes[..4].copy_from_slice(&PAYLOAD_MAGIC);
                bytes[4..6].copy_from_slice(&PAYLOAD_VERSION.to_le_bytes());
                bytes[6] = 1 + (round % 3) as u8;
            }
            if let Err(err) = Payload::decode(&bytes) {
                assert!(err.to_string().contains("dfx codec"), "{err}");
            }
        }
    }

    #[test]
    fn foreign_magic_is_not_ours() {
        let err = Payload::decode(b"PAR1 and then some more bytes")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a dfx payload"), "{err}");
    }
}
