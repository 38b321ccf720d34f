//! The plugin codec's payload (`dfx_engine.physical.v5`) and the stage
//! description read from encoded plan bytes (the ABI's `encoded_stage_info`).
//! Seeds are what the codec itself encoded for real writers and readers.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::Partitioning;
use datafusion::physical_expr::expressions::col;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion_proto::bytes::physical_plan_to_bytes_with_extension_codec;
use datafusion_proto::physical_plan::{
    ComposedPhysicalExtensionCodec, DefaultPhysicalExtensionCodec, DefaultPhysicalProtoConverter,
    PhysicalExtensionCodec,
};
use datafusion_proto::protobuf::PhysicalPlanNode;
use datafusion_proto::protobuf::physical_plan_node::PhysicalPlanType;
use dfx_plugin::wire::{PAYLOAD_MAGIC, PAYLOAD_VERSION, Payload, read_encoded_stage};
use dfx_plugin::{DfxPhysicalCodec, ReadMode, ShuffleReaderExec, ShuffleWriterExec};
use prost::Message;

use crate::{Outcome, Target};

/// The shuffle location of every seed's writers, as one query's are.
const SHUFFLE_DIR: &str = "/tmp/shuffle-ä/q";

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Float64, true),
        Field::new("s", DataType::Utf8, true),
    ]))
}

/// The plan every payload is decoded against: two partitions of [`schema`].
fn input() -> Arc<dyn ExecutionPlan> {
    Arc::new(EmptyExec::new(schema()).with_partitions(2))
}

fn fail(e: impl std::fmt::Display) -> String {
    format!("cannot make the seeds: {e}")
}

/// Writers of every partitioning the planner makes, over [`input`], and a
/// reader of each mode.
fn nodes() -> Result<Vec<Arc<dyn ExecutionPlan>>, String> {
    let schema = schema();
    let hash = |n| -> Result<Partitioning, String> {
        Ok(Partitioning::Hash(
            vec![
                col("k", &schema).map_err(fail)?,
                col("s", &schema).map_err(fail)?,
            ],
            n,
        ))
    };
    let writer = |id, partitioning, deps| -> Result<Arc<ShuffleWriterExec>, String> {
        ShuffleWriterExec::try_new(id, SHUFFLE_DIR.into(), input(), partitioning, deps, 1)
            .map(Arc::new)
            .map_err(fail)
    };
    let hashed = writer(2, hash(3)?, vec![3, 4])?;
    let single = writer(1, Partitioning::UnknownPartitioning(1), vec![])?;
    let round_robin = writer(7, Partitioning::RoundRobinBatch(4), vec![1])?;
    let mut nodes: Vec<Arc<dyn ExecutionPlan>> = vec![hashed.clone(), single.clone(), round_robin];
    for (mode, upstream) in [
        (ReadMode::Hash, hashed),
        (ReadMode::PassThrough, single.clone()),
        (ReadMode::Broadcast, single),
    ] {
        let reader = ShuffleReaderExec::try_new(mode, upstream).map_err(fail)?;
        nodes.push(Arc::new(reader));
    }
    Ok(nodes)
}

/// The codec's payload for `node`. A reader encodes itself without its
/// writer, carrying the stage as a blob: its payload is the one DataFusion's
/// encoder writes for it.
fn payload_of(node: Arc<dyn ExecutionPlan>, codec: &DfxPhysicalCodec) -> Result<Vec<u8>, String> {
    if node.downcast_ref::<ShuffleReaderExec>().is_none() {
        let mut buf = Vec::new();
        codec
            .try_encode(node, &mut buf, &DefaultPhysicalProtoConverter {})
            .map_err(fail)?;
        return Ok(buf);
    }
    let bytes = physical_plan_to_bytes_with_extension_codec(node, codec).map_err(fail)?;
    match PhysicalPlanNode::decode(bytes.as_ref())
        .map_err(fail)?
        .physical_plan_type
    {
        Some(PhysicalPlanType::Extension(extension)) => Ok(extension.node),
        _ => Err("a reader encoded as something else than an extension node".into()),
    }
}

/// `Payload::decode` and the codec's `try_decode`.
pub struct CodecPayload {
    codec: DfxPhysicalCodec,
    /// A writer's input.
    inputs: [Arc<dyn ExecutionPlan>; 1],
    ctx: TaskContext,
    seeds: Vec<Vec<u8>>,
}

impl CodecPayload {
    /// The target, its seeds encoded by the codec.
    ///
    /// # Errors
    ///
    /// When the codec cannot encode its own nodes.
    pub fn new() -> Result<Self, String> {
        let codec = DfxPhysicalCodec::default();
        let mut seeds = Vec::new();
        let nodes = nodes()?;
        let inputs = [input()];
        for node in nodes {
            seeds.push(payload_of(node, &codec)?);
        }
        Ok(Self {
            codec,
            inputs,
            ctx: TaskContext::default(),
            seeds,
        })
    }
}

impl Target for CodecPayload {
    fn name(&self) -> &'static str {
        "codec-payload"
    }

    fn seeds(&self) -> Vec<Vec<u8>> {
        self.seeds.clone()
    }

    fn dictionary(&self) -> Vec<Vec<u8>> {
        vec![
            PAYLOAD_MAGIC.to_vec(),
            PAYLOAD_VERSION.to_le_bytes().to_vec(),
            vec![1],
            vec![2],
            vec![3],
        ]
    }

    fn run(&mut self, input: &[u8]) -> Result<Outcome, String> {
        let parsed = Payload::decode(input);
        match &parsed {
            Ok(payload) => {
                // The framing has no slack: what parses re-encodes exactly.
                let mut again = Vec::new();
                payload
                    .encode(&mut again)
                    .map_err(|e| format!("an accepted payload does not encode: {e}"))?;
                if again != input {
                    return Err(format!("{payload:?} re-encodes to other bytes"));
                }
            }
            Err(e) => require_dfx(&e.to_string())?,
        }
        // Each node decoded over an input it accepts, so decoding gets past
        // the payload into the partitioning and the node's checks.
        // A reader has no input: it carries its stage.
        let children = match &parsed {
            Ok(Payload::Reader(_)) => &[][..],
            _ => std::slice::from_ref(&self.inputs[0]),
        };
        let decoded = self.codec.try_decode(
            input,
            children,
            &self.ctx,
            &DefaultPhysicalProtoConverter {},
        );
        match decoded {
            Ok(_) if parsed.is_err() => Err("try_decode accepted what decode refused".into()),
            Ok(_) => Ok(Outcome::Accepted),
            Err(e) => require_dfx(&e.to_string()).map(|()| Outcome::Refused),
        }
    }
}

/// The design's promise: bad bytes are "a clear error naming dfx", and a
/// panic the plugin's guard caught is still a bug.
fn require_dfx(message: &str) -> Result<(), String> {
    if message.contains(dfx_plugin::guard::PANIC_PREFIX) {
        return Err(format!("the plugin's guard caught a panic: {message}"));
    }
    if !message.contains("dfx") {
        return Err(format!("an error that does not name dfx: {message}"));
    }
    Ok(())
}

/// `read_encoded_stage`: what `encoded_stage_info` reads from a driver's bytes.
pub struct StageInfo {
    seeds: Vec<Vec<u8>>,
}

impl StageInfo {
    /// The target, seeded with whole stages encoded through a host's chain.
    ///
    /// # Errors
    ///
    /// When the chain cannot encode a stage.
    pub fn new() -> Result<Self, String> {
        let chain = ComposedPhysicalExtensionCodec::new(vec![
            Arc::new(DefaultPhysicalExtensionCodec {}) as Arc<dyn PhysicalExtensionCodec>,
            Arc::new(DfxPhysicalCodec::default()),
        ]);
        let mut seeds = Vec::new();
        let nodes = nodes()?;
        // Writers alone, then a stage that reads another (a writer over a
        // reader over a writer): the nested bytes a driver ships.
        for node in nodes.iter().filter(|n| n.name() == "ShuffleWriterExec") {
            let bytes = physical_plan_to_bytes_with_extension_codec(Arc::clone(node), &chain)
                .map_err(fail)?;
            seeds.push(bytes.to_vec());
        }
        let reader = Arc::clone(&nodes[3]);
        let outer = ShuffleWriterExec::try_new(
            1,
            SHUFFLE_DIR.into(),
            reader,
            Partitioning::UnknownPartitioning(1),
            vec![2],
            1,
        )
        .map_err(fail)?;
        let bytes =
            physical_plan_to_bytes_with_extension_codec(Arc::new(outer), &chain).map_err(fail)?;
        seeds.push(bytes.to_vec());
        Ok(Self { seeds })
    }
}

impl Target for StageInfo {
    fn name(&self) -> &'static str {
        "stage-info"
    }

    fn seeds(&self) -> Vec<Vec<u8>> {
        self.seeds.clone()
    }

    fn dictionary(&self) -> Vec<Vec<u8>> {
        vec![PAYLOAD_MAGIC.to_vec(), 2u16.to_le_bytes().to_vec()]
    }

    fn run(&mut self, input: &[u8]) -> Result<Outcome, String> {
        match read_encoded_stage(input) {
            Ok(_) => Ok(Outcome::Accepted),
            Err(e) => require_dfx(&e.to_string()).map(|()| Outcome::Refused),
        }
    }
}

/// The worker's vetting of an encoded stage (the ABI's `vet_stage`): the
/// plan's protobuf walked as JSON, every extension payload decoded.
pub struct VetStage {
    seeds: Vec<Vec<u8>>,
    allowed: dfx_plugin::vet::Allowed,
}

impl VetStage {
    /// The target, seeded with the stages of [`StageInfo`]; the shuffle
    /// location they name is the allowed one, so every seed is accepted.
    ///
    /// # Errors
    ///
    /// When the chain cannot encode a stage.
    pub fn new() -> Result<Self, String> {
        Ok(Self {
            seeds: StageInfo::new()?.seeds,
            allowed: dfx_plugin::vet::Allowed {
                tables: vec!["/data".into()],
                shuffle_dir: SHUFFLE_DIR.into(),
                map: None,
            },
        })
    }
}

impl Target for VetStage {
    fn name(&self) -> &'static str {
        "vet-stage"
    }

    fn seeds(&self) -> Vec<Vec<u8>> {
        self.seeds.clone()
    }

    fn dictionary(&self) -> Vec<Vec<u8>> {
        vec![
            PAYLOAD_MAGIC.to_vec(),
            PAYLOAD_VERSION.to_le_bytes().to_vec(),
            SHUFFLE_DIR.as_bytes().to_vec(),
            b"/data/".to_vec(),
        ]
    }

    fn run(&mut self, input: &[u8]) -> Result<Outcome, String> {
        match dfx_plugin::vet::vet_encoded_stage(input, &self.allowed) {
            Ok(()) => Ok(Outcome::Accepted),
            // Every refusal says what it is: a plan that is not one, or the
            // stage refused with its findings.
            Err(e)
                if e.starts_with("refusing the stage: ")
                    || e.starts_with("not an encoded physical plan") =>
            {
                Ok(Outcome::Refused)
            }
            Err(e) => Err(format!("an unexplained refusal: {e}")),
        }
    }
}
