//! The physical extension codec for `ShuffleWriterExec` and
//! `ShuffleReaderExec`, and for the two nodes of a recursive query that
//! datafusion-proto cannot encode (`RecursiveQueryExec`, `WorkTableExec`).
//!
//! Claims only those nodes; every other node belongs to the host's chain,
//! which also encodes each node's child (the codec sees the node, never its
//! subtree). The payloads and their framing are [`crate::wire`]'s. A reader
//! is the one node encoded without its child: it carries the stage it reads
//! as a blob ([`ShuffleReaderExec`]'s `try_to_proto`), so the codec meets
//! readers without writers only, and decodes them so.
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
//! encoded bytes alone ([`crate::wire::read_encoded_stage`]).

use std::path::PathBuf;
use std::sync::Arc;

use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::Partitioning;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::recursive_query::RecursiveQueryExec;
use datafusion::physical_plan::work_table::WorkTableExec;
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

use crate::codec::reader::{decode_properties, encode_properties};
use crate::counters::LiveObject;
use crate::error::Area;
use crate::error::fail;
use crate::exec::map_scan::MapScanExec;
use crate::exec::sealed_input::SealedInputExec;
use crate::exec::sealed_recursive_query::SealedRecursiveQueryExec;
use crate::exec::shuffle_reader::ShuffleReaderExec;
use crate::exec::shuffle_writer::ShuffleWriterExec;
use crate::exec::store_scan::StoreScanExec;
use crate::isolation::with_plugin_functions;
use crate::tables::with_table_stores_context;
use crate::wire::Payload;
use crate::wire::ReaderPayload;
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
        let partitions_per_map =
            usize::try_from(payload.partitions_per_map).map_err(|_| too_many(stage))?;
        let declared = (payload.maps, payload.buckets, payload.partitions_per_map);
        let writer = ShuffleWriterExec::try_new(
            stage,
            PathBuf::from(payload.shuffle_dir),
            Arc::clone(input),
            partitioning,
            payload.deps,
            partitions_per_map,
        )?
        .with_aligned_deps(payload.aligned_deps);
        let decoded = (
            writer.maps() as u64,
            writer.buckets() as u64,
            writer.partitions_per_map() as u64,
        );
        if decoded != declared {
            return Err(fail(
                Area::Codec,
                format!(
                    "stage {stage}: the payload declares {} map(s) of {} bucket(s) and {} \
                     partition(s) each, the decoded plan has {} of {} and {}",
                    declared.0, declared.1, declared.2, decoded.0, decoded.1, decoded.2
                ),
            ));
        }
        counters::stage_decoded();
        Ok(Arc::new(writer))
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
            Payload::Reader(reader) => {
                let (schema, properties) = decode_properties(
                    reader.stage_id,
                    &reader.properties,
                    ctx,
                    self,
                    proto_converter,
                )?;
                Ok(Arc::new(ShuffleReaderExec::decoded(
                    reader.mode,
                    reader.stage_id,
                    PathBuf::from(reader.shuffle_dir),
                    usize::try_from(reader.maps).map_err(|_| too_many(reader.stage_id))?,
                    usize::try_from(reader.buckets).map_err(|_| too_many(reader.stage_id))?,
                    schema,
                    properties,
                    reader.stage,
                )))
            }
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
            Payload::SealedInput { plan } => {
                // The plugin's own functions, not the host's foreign ones:
                // the plugin runs every operator of it.
                let ctx = with_plugin_functions(ctx);
                let input = physical_plan_from_bytes_with_extension_codec(&plan, &ctx, self)
                    .map_err(|e| {
                        fail(
                            Area::Codec,
                            format!(
                                "the stage's sealed input does not decode (under a memory \
                                 limit the plugin decodes the stage alone: it finds the \
                                 session's registered functions, never one carried by \
                                 value): {e}"
                            ),
                        )
                    })?;
                Ok(Arc::new(SealedInputExec::new(input)))
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
            return encode_reader(reader, self, proto_converter, buf);
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
        if let Some(sealed) = node.downcast_ref::<SealedInputExec>() {
            let plan =
                physical_plan_to_bytes_with_extension_codec(Arc::clone(sealed.input()), self)?;
            return Payload::SealedInput {
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
            partitions_per_map: writer.partitions_per_map() as u64,
            deps: writer.deps().to_vec(),
            aligned_deps: writer.aligned_deps().to_vec(),
            shuffle_dir: shuffle_dir.to_string(),
            partitioning_display: writer.partitioning_display(),
            partitioning: proto.encode_to_vec(),
        })
        .encode(buf)?;
        counters::stage_encoded();
        Ok(())
    }
}

fn too_many(stage: u64) -> DataFusionError {
    fail(
        Area::Codec,
        format!("the reader of stage {stage}: more maps or buckets than this machine counts"),
    )
}

/// A reader's payload: the stage it reads described, what it promises, and
/// the stage itself as it travels with the reader.
fn encode_reader(
    reader: &ShuffleReaderExec,
    codec: &DfxPhysicalCodec,
    proto_converter: &dyn PhysicalProtoConverterExtension,
    buf: &mut Vec<u8>,
) -> Result<()> {
    let stage = reader.stage_id();
    if reader.writer().is_some() {
        // DataFusion would nest the writer below the payload: stages would
        // nest as messages again. The plugin's encoder never gets here (the
        // reader encodes itself detached); a host does after handing a
        // decoded reader its writer back.
        return Err(fail(
            Area::Codec,
            format!(
                "the reader of stage {stage} holds its stage's writer as a child: encode the \
                 plan as the planner handed it over (each reader carrying its stage), or a \
                 stage cut from it, not a plan whose readers were given their writers back"
            ),
        ));
    }
    let shuffle_dir = reader.shuffle_dir().to_str().ok_or_else(|| {
        fail(
            Area::Codec,
            format!(
                "the reader of stage {stage} has a shuffle directory that is not UTF-8: {}",
                reader.shuffle_dir().display()
            ),
        )
    })?;
    let properties = encode_properties(
        stage,
        &reader.schema(),
        reader.properties(),
        codec,
        proto_converter,
    )?;
    Payload::Reader(ReaderPayload {
        mode: reader.mode(),
        stage_id: stage,
        maps: reader.maps() as u64,
        buckets: reader.buckets() as u64,
        shuffle_dir: shuffle_dir.to_string(),
        properties,
        stage: reader.encoded_stage().to_vec(),
    })
    .encode(buf)
}

#[cfg(test)]
#[path = "physical_tests.rs"]
mod tests;
