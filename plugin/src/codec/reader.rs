//! What a reader promises its consumer, as the properties blob of its
//! payload (see [`crate::wire`]): JSON with each expression as
//! datafusion-proto `PhysicalExprNode` bytes in base64, decoded against the
//! schema it carries.
//!
//! ```text
//! {"schema": <Schema>, "partitioning": <Partitioning>,
//!  "classes": [[expr, ...], ...],                       equal expressions
//!  "constants": [{"expr", "uniform", "value"}, ...],    value: <ScalarValue> | null
//!  "orderings": [[{"expr", "descending", "nulls_first"}, ...], ...]}
//! ```
//!
//! A reader decoded without the stage it reads (a stage's bytes carry only
//! its own nodes) must promise what the planner saw it promise: an operator
//! above it checks its input's partitioning, orderings and constants when
//! it is built (a window over `PARTITION BY a, b` with `b` a constant is
//! sorted on `a` only). An equivalence whose expression does not decode (a
//! function the decoding session lacks) is dropped, which promises less.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use datafusion::arrow::compute::SortOptions;
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::{Result, ScalarValue};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::equivalence::{AcrossPartitions, ConstExpr};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr, PhysicalSortExpr};
use datafusion::physical_plan::PlanProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion_proto::physical_plan::from_proto::parse_protobuf_partitioning;
use datafusion_proto::physical_plan::to_proto::serialize_partitioning;
use datafusion_proto::physical_plan::{
    PhysicalExtensionCodec, PhysicalPlanDecodeContext, PhysicalProtoConverterExtension,
};
use datafusion_proto::protobuf;
use prost::Message;
use serde::{Deserialize, Serialize};

use crate::error::{Area, fail};

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PropertiesWire {
    schema: String,
    partitioning: String,
    classes: Vec<Vec<String>>,
    constants: Vec<ConstWire>,
    orderings: Vec<Vec<SortWire>>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConstWire {
    expr: String,
    uniform: bool,
    value: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SortWire {
    expr: String,
    descending: bool,
    nulls_first: bool,
}

fn bad(stage: u64, what: impl std::fmt::Display) -> datafusion::common::DataFusionError {
    fail(
        Area::Codec,
        format!("the reader of stage {stage}: its properties {what}"),
    )
}

/// The properties blob of a reader of stage `stage` promising `properties`
/// over rows of `schema`.
///
/// # Errors
///
/// A schema, partitioning, expression or constant datafusion-proto cannot
/// encode.
pub fn encode_properties(
    stage: u64,
    schema: &Schema,
    properties: &PlanProperties,
    codec: &dyn PhysicalExtensionCodec,
    converter: &dyn PhysicalProtoConverterExtension,
) -> Result<Vec<u8>> {
    let expr = |e: &Arc<dyn PhysicalExpr>| -> Result<String> {
        Ok(STANDARD.encode(converter.physical_expr_to_proto(e, codec)?.encode_to_vec()))
    };
    let schema = protobuf::Schema::try_from(schema)
        .map_err(|e| bad(stage, format!("schema cannot be encoded: {e}")))?;
    let partitioning = serialize_partitioning(properties.output_partitioning(), codec, converter)?;
    let equivalences = properties.equivalence_properties();
    let classes = equivalences
        .eq_group()
        .iter()
        .filter(|class| class.len() > 1)
        .map(|class| class.iter().map(expr).collect::<Result<Vec<_>>>())
        .collect::<Result<Vec<_>>>()?;
    let constants = equivalences
        .constants()
        .iter()
        .map(|constant| {
            let (uniform, value) = match &constant.across_partitions {
                AcrossPartitions::Heterogeneous => (false, None),
                AcrossPartitions::Uniform(value) => (true, value.as_ref()),
            };
            let value = value
                .map(|v| {
                    protobuf::ScalarValue::try_from(v)
                        .map(|v| STANDARD.encode(v.encode_to_vec()))
                        .map_err(|e| bad(stage, format!("constant {v} cannot be encoded: {e}")))
                })
                .transpose()?;
            Ok(ConstWire {
                expr: expr(&constant.expr)?,
                uniform,
                value,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let orderings = equivalences
        .oeq_class()
        .iter()
        .map(|ordering| {
            ordering
                .iter()
                .map(|sort| {
                    Ok(SortWire {
                        expr: expr(&sort.expr)?,
                        descending: sort.options.descending,
                        nulls_first: sort.options.nulls_first,
                    })
                })
                .collect::<Result<Vec<_>>>()
        })
        .collect::<Result<Vec<_>>>()?;
    let wire = PropertiesWire {
        schema: STANDARD.encode(schema.encode_to_vec()),
        partitioning: STANDARD.encode(partitioning.encode_to_vec()),
        classes,
        constants,
        orderings,
    };
    serde_json::to_vec(&wire).map_err(|e| bad(stage, format!("cannot be written: {e}")))
}

/// The schema and properties a reader of stage `stage` promises, from its
/// properties blob.
///
/// # Errors
///
/// Bytes that are not a properties blob, or a schema or partitioning that
/// does not decode.
pub fn decode_properties(
    stage: u64,
    bytes: &[u8],
    ctx: &TaskContext,
    codec: &dyn PhysicalExtensionCodec,
    converter: &dyn PhysicalProtoConverterExtension,
) -> Result<(SchemaRef, PlanProperties)> {
    let wire: PropertiesWire =
        serde_json::from_slice(bytes).map_err(|e| bad(stage, format!("are not valid: {e}")))?;
    let raw = |what: &str, text: &str| -> Result<Vec<u8>> {
        STANDARD
            .decode(text)
            .map_err(|e| bad(stage, format!("hold a {what} that is not base64: {e}")))
    };
    let proto = protobuf::Schema::decode(raw("schema", &wire.schema)?.as_slice())
        .map_err(|e| bad(stage, format!("hold a schema that is not protobuf: {e}")))?;
    let schema: SchemaRef =
        Arc::new(Schema::try_from(&proto).map_err(|e| bad(stage, format!("schema: {e}")))?);
    let decode_ctx = PhysicalPlanDecodeContext::new(ctx, codec);
    let proto = protobuf::Partitioning::decode(raw("partitioning", &wire.partitioning)?.as_slice())
        .map_err(|e| bad(stage, format!("partitioning is not protobuf: {e}")))?;
    let partitioning = parse_protobuf_partitioning(Some(&proto), &decode_ctx, &schema, converter)
        .map_err(|e| bad(stage, format!("partitioning does not decode: {e}")))?
        .ok_or_else(|| bad(stage, "hold no partitioning"))?;
    // An equivalence is a promise the consumer may use, never one it needs:
    // one that does not decode here is left out.
    let expr = |text: &str| -> Option<Arc<dyn PhysicalExpr>> {
        let node =
            protobuf::PhysicalExprNode::decode(STANDARD.decode(text).ok()?.as_slice()).ok()?;
        converter
            .proto_to_physical_expr(&node, &schema, &decode_ctx)
            .ok()
    };
    let mut equivalences = EquivalenceProperties::new(Arc::clone(&schema));
    for class in &wire.classes {
        let members: Vec<_> = class.iter().filter_map(|e| expr(e)).collect();
        for pair in members.windows(2) {
            equivalences.add_equal_conditions(Arc::clone(&pair[0]), Arc::clone(&pair[1]))?;
        }
    }
    let constants = wire.constants.iter().filter_map(|constant| {
        let across = if constant.uniform {
            let value = match &constant.value {
                None => None,
                Some(text) => {
                    let proto =
                        protobuf::ScalarValue::decode(STANDARD.decode(text).ok()?.as_slice())
                            .ok()?;
                    Some(ScalarValue::try_from(&proto).ok()?)
                }
            };
            AcrossPartitions::Uniform(value)
        } else {
            AcrossPartitions::Heterogeneous
        };
        Some(ConstExpr::new(expr(&constant.expr)?, across))
    });
    let constants: Vec<_> = constants.collect();
    equivalences.add_constants(constants)?;
    let orderings = wire.orderings.iter().map(|ordering| {
        // An ordering holds up to its first member that does not decode.
        ordering
            .iter()
            .map_while(|sort| {
                Some(PhysicalSortExpr::new(
                    expr(&sort.expr)?,
                    SortOptions::new(sort.descending, sort.nulls_first),
                ))
            })
            .collect::<Vec<_>>()
    });
    equivalences.add_orderings(orderings);
    let properties = PlanProperties::new(
        equivalences,
        partitioning,
        EmissionType::Incremental,
        Boundedness::Bounded,
    );
    Ok((schema, properties))
}
