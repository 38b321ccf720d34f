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
//!                  holding that partition's file group only (see [`crate::encoded`])
//! join filter (kind 8): body blob (JSON, see [`crate::codec::join_filter`]):
//!                  a build stage's key summary or a probe side's filter;
//!                  input: the node's child
//! ```
//!
//! A recursive query's work table is shared, in memory, between the query
//! node and the work table node below it. Decoding the query node links the
//! two again (`RecursiveQueryExec::try_new` hands its table to the one
//! `WorkTableExec` of its recursive term), which is why both are dfx's: the
//! whole recursive query then runs in the process that decoded it. Hosts
//! only meet the sealed form (see [`crate::planner`]).
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
use prost::Message;

use crate::counters::LiveObject;
use crate::error::Area;
use crate::error::fail;
use crate::exec::map_scan::MapScanExec;
use crate::exec::sealed_recursive_query::SealedRecursiveQueryExec;
use crate::exec::shuffle_reader::ShuffleReaderExec;
use crate::exec::shuffle_writer::ShuffleWriterExec;
use crate::exec::store_scan::StoreScanExec;
use crate::tables::with_table_stores_context;
use crate::wire::Payload;
use crate::wire::WriterPayload;
use crate::wire::encoded_node_names;
use crate::{counters, guard};

/// A schema as datafusion-proto bytes, for the recursive query `cte`.
fn encode_schema(schema: &Schema, cte: &str) -> Result<Vec<u8>> {
    let proto = protobuf::Schema::try_from(schema).map_err(|e| {
        fail(
            Area::Codec,
            format!("recursive query {cte:?}: cannot encode its schema: {e}"),
        )
    })?;
    Ok(proto.encode_to_vec())
}

/// The schema `bytes` encode, for the recursive query `cte`.
fn decode_schema(bytes: &[u8], cte: &str) -> Result<SchemaRef> {
    let proto = protobuf::Schema::decode(bytes).map_err(|e| {
        fail(
            Area::Codec,
            format!("recursive query {cte:?}: its schema is not valid protobuf: {e}"),
        )
    })?;
    let schema = Schema::try_from(&proto).map_err(|e| {
        fail(
            Area::Codec,
            format!("recursive query {cte:?}: its schema does not decode: {e}"),
        )
    })?;
    Ok(Arc::new(schema))
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
                fail(
                    Area::Codec,
                    format!("stage {stage}: partitioning is not valid protobuf: {e}"),
                )
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
            fail(
                Area::Codec,
                format!(
                    "stage {stage}: the partitioning does not decode against the stage's input: {e}"
                ),
            )
        })?
        .ok_or_else(|| {
            fail(
                Area::Codec,
                format!("stage {stage}: no partitioning in the payload"),
            )
        })?;
        let maps = input.output_partitioning().partition_count() as u64;
        if maps != payload.maps || partitioning.partition_count() as u64 != payload.buckets {
            return Err(fail(
                Area::Codec,
                format!(
                    "stage {stage}: the payload declares {} map(s) and {} bucket(s), the decoded \
                 plan has {maps} and {}",
                    payload.maps,
                    payload.buckets,
                    partitioning.partition_count()
                ),
            ));
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
            return Err(fail(
                Area::Codec,
                format!(
                    "a {} needs {} input(s), the plan gave {}",
                    payload.node_name(),
                    payload.inputs(),
                    inputs.len()
                ),
            ));
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
                        fail(
                            Area::Codec,
                            format!("the sealed recursive query does not decode: {e}"),
                        )
                    })?;
                Ok(Arc::new(SealedRecursiveQueryExec::new(query)))
            }
            Payload::StoreScan { plan } => {
                // Decoding a file scan looks its store up: the plugin's.
                let ctx = with_table_stores_context(ctx)?;
                let scan = physical_plan_from_bytes_with_extension_codec(&plan, &ctx, self)
                    .map_err(|e| {
                        fail(Area::Codec, format!("the store scan does not decode: {e}"))
                    })?;
                Ok(Arc::new(StoreScanExec::new(scan)))
            }
            Payload::MapScan(scan) => Ok(Arc::new(MapScanExec::try_new(
                scan,
                Arc::clone(&inputs[0]),
            )?)),
            Payload::JoinFilter { node } => crate::codec::join_filter::decode_node(
                &node,
                &inputs[0],
                ctx,
                self,
                proto_converter,
            ),
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
            // decoding a recursive query creates (see `crate::planner`).
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
        if let Some(body) = crate::codec::join_filter::encode_node(&node, self, proto_converter)? {
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
            // `planner::whole_work_tables`): a node cannot say which columns
            // it projects, so a projected one would decode reading them all.
            return Payload::WorkTable {
                name: work_table.name().to_string(),
                schema: encode_schema(&work_table.schema(), work_table.name())?,
            }
            .encode(buf);
        }
        let Some(writer) = node.downcast_ref::<ShuffleWriterExec>() else {
            return Err(DataFusionError::NotImplemented(format!(
                "dfx codec encodes only {}, not {}",
                encoded_node_names(),
                node.name()
            )));
        };
        let shuffle_dir = writer.shuffle_dir().to_str().ok_or_else(|| {
            fail(
                Area::Codec,
                format!(
                    "stage {} has a shuffle directory that is not UTF-8: {}",
                    writer.stage_id(),
                    writer.shuffle_dir().display()
                ),
            )
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
    use crate::wire::{
        MapScanPayload, PAYLOAD_MAGIC, PAYLOAD_VERSION, Payload, ReadMode, WriterPayload,
    };

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
