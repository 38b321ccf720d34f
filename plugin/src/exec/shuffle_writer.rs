//! `ShuffleWriterExec`: the root of every stage.
//!
//! ```text
//!   execute(map m)
//!        │
//!   each partition of m's slice, at once:
//!   input.execute(p) ──► each batch: split into buckets with DataFusion's own
//!                        partitioner, coalesce per bucket; full batches
//!                        make a segment of about 1 MiB (`segment_bytes`),
//!                        encoded on the partition's own task (`cutter`),
//!                        staged until the map's input ends
//!   end of input: the rest of each bucket as a last segment, then the
//!   key summary when the input is a `KeySummaryExec`, then the commit
//!   marker (the index of the segments by bucket, and of the summary),
//!   then publish the file (rename)
//!   error or drop: the temp file removed, nothing published
//!   (an s3:// location: the map's object uploads as it is written and
//!   appears whole on completion; an error or drop aborts the upload, see
//!   `store`)
//!        │
//!   one summary batch: (bucket, rows, bytes) per bucket
//! ```
//!
//! Hash buckets use `BatchPartitioner`, the partitioner of `RepartitionExec`,
//! so bucket `b` of every map together hold exactly what partition `b` of
//! the repartition it replaces would: a join or aggregate above the exchange
//! sees the partitions it was planned for. Memory stays bounded: each bucket
//! of each partition holds one batch being coalesced and the batches of its
//! next segment (a partition's buckets together about `PENDING_BYTES`), and
//! staged segments spill to disk past their own bound.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::{DfxConfig, ShuffleCompression};
use crate::counters::LiveObject;
use crate::exchange::cutter::{BucketCutter, BucketSplit, SegmentStream};
use crate::exchange::dirs::prepare_stage_dir;
use crate::exchange::publish::{MapJob, SUMMARY_SCHEMA, Target};
use crate::exchange::staging::Staging;
use crate::exchange::store::{S3Options, ShuffleLocation, location_root, s3_store};
use crate::exec::common::exec_defaults;
use crate::exec::told_task::{StageShape, ToldTask};
use crate::paths::map_path;
use crate::read_settings::SplitParts;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics;
use datafusion::physical_plan::repartition::BatchPartitioner;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};

use crate::exec::driven;
use crate::exec::sealed_input::sealed_context;
use crate::exec::{KeySummaryExec, SealedInputExec};
use crate::filters::slot::SummarySlot;
use crate::isolation::{isolated_task_context, rebuilt_task_context};
use crate::wire::WRITER_NODE_NAME;
use futures::StreamExt;

/// The root of a stage: runs one input partition per map task and publishes
/// its rows split into buckets.
#[derive(Debug)]
pub struct ShuffleWriterExec {
    stage_id: u64,
    shuffle_dir: PathBuf,
    input: Arc<dyn ExecutionPlan>,
    partitioning: Partitioning,
    deps: Vec<u64>,
    /// Input partitions each map runs, at least one and at most all.
    partitions_per_map: usize,
    /// The deps the input reads partition by partition: none until the
    /// planner finds them in the input it built (or a payload carries
    /// them), kept when a host hands the writer other children (its own
    /// wrappers of the same operators).
    aligned_deps: Vec<u64>,
    properties: Arc<PlanProperties>,
    _live: LiveObject,
}

impl ShuffleWriterExec {
    /// This node over `input` in place of its own input.
    fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        let writer = Self::try_new(
            self.stage_id,
            self.shuffle_dir.clone(),
            input,
            self.partitioning.clone(),
            self.deps.clone(),
            self.partitions_per_map,
        )?;
        Ok(Arc::new(
            writer.with_aligned_deps(self.aligned_deps.clone()),
        ))
    }

    /// A writer of stage `stage_id` over `input`, splitting each map's rows
    /// by `partitioning` (hash or round-robin, or one bucket for
    /// `UnknownPartitioning(1)`), publishing into `shuffle_dir`. `deps` are
    /// the ids of the stages `input` reads. Each map runs a slice of
    /// `partitions_per_map` of the input's partitions (bounded by 1 and by
    /// the partitions there are); under `UnknownPartitioning(1)` each
    /// partition of a slice is then a bucket of its own, so a reader still
    /// sees every partition as the input produced it.
    ///
    /// # Errors
    ///
    /// A partitioning with no bucket, or one the writer cannot split by.
    pub fn try_new(
        stage_id: u64,
        shuffle_dir: PathBuf,
        input: Arc<dyn ExecutionPlan>,
        partitioning: Partitioning,
        deps: Vec<u64>,
        partitions_per_map: usize,
    ) -> Result<Self> {
        let buckets = partitioning.partition_count();
        let supported = matches!(
            partitioning,
            Partitioning::Hash(_, _) | Partitioning::RoundRobinBatch(_)
        ) || keeps_partitions(&partitioning);
        if buckets == 0 || !supported {
            return Err(DataFusionError::Internal(format!(
                "dfx stage {stage_id}: a writer cannot split rows by {partitioning}"
            )));
        }
        let partitions = input.output_partitioning().partition_count();
        let partitions_per_map = partitions_per_map.clamp(1, partitions.max(1));
        let maps = StageShape {
            stage_id,
            partitions,
            partitions_per_map,
            keeps_partitions: keeps_partitions(&partitioning),
        }
        .maps();
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&SUMMARY_SCHEMA)),
            Partitioning::UnknownPartitioning(maps),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Ok(Self {
            stage_id,
            shuffle_dir,
            input,
            partitioning,
            deps,
            partitions_per_map,
            aligned_deps: Vec::new(),
            properties,
            _live: LiveObject::new(),
        })
    }

    /// The id the planner gave this stage.
    pub fn stage_id(&self) -> u64 {
        self.stage_id
    }

    /// The directory this stage publishes into.
    pub fn shuffle_dir(&self) -> &Path {
        &self.shuffle_dir
    }

    /// The stage's operators, below the writer.
    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }

    /// How each map's rows are split into buckets.
    pub fn partitioning(&self) -> &Partitioning {
        &self.partitioning
    }

    /// Ids of the stages this one reads.
    pub fn deps(&self) -> &[u64] {
        &self.deps
    }

    /// Map tasks: one per slice of the input's partitions.
    pub fn maps(&self) -> usize {
        self.properties.output_partitioning().partition_count()
    }

    /// The deps its input reads partition by partition: map `m` reads only
    /// the buckets of its own slice of them (see
    /// [`crate::exec::aligned_reads`]).
    pub fn aligned_deps(&self) -> &[u64] {
        &self.aligned_deps
    }

    /// This writer saying `aligned_deps` are read partition by partition
    /// (as a decoded payload says), whatever its input shows.
    pub fn with_aligned_deps(mut self, aligned_deps: Vec<u64>) -> Self {
        self.aligned_deps = aligned_deps;
        self
    }

    /// Input partitions each map runs (the last map may run fewer).
    pub fn partitions_per_map(&self) -> usize {
        self.partitions_per_map
    }

    /// The input partitions map `map` runs.
    pub fn slice(&self, map: usize) -> Range<usize> {
        self.shape().slice(map)
    }

    /// The facts of this stage a task's settings are checked against.
    fn shape(&self) -> StageShape {
        StageShape {
            stage_id: self.stage_id,
            partitions: self.input.output_partitioning().partition_count(),
            partitions_per_map: self.partitions_per_map,
            keeps_partitions: self.keeps_partitions(),
        }
    }

    /// Buckets per map: the partitioning's, or under one bucket a bucket per
    /// partition of a slice.
    pub fn buckets(&self) -> usize {
        match self.keeps_partitions() {
            true => self.partitions_per_map,
            false => self.partitioning.partition_count(),
        }
    }

    /// Whether each map keeps a bucket for every partition of its slice
    /// (under `UnknownPartitioning(1)`), rather than rows split by a
    /// partitioning whatever partition they come from.
    pub fn keeps_partitions(&self) -> bool {
        keeps_partitions(&self.partitioning)
    }

    /// The schema of the rows the stage publishes.
    pub fn data_schema(&self) -> SchemaRef {
        self.input.schema()
    }

    /// The partitioning for display: `hash([k@0], 4)`, `round_robin(4)` or
    /// `single`.
    pub fn partitioning_display(&self) -> String {
        match &self.partitioning {
            Partitioning::Hash(exprs, n) => {
                let exprs: Vec<String> = exprs.iter().map(|e| e.to_string()).collect();
                format!("hash([{}], {n})", exprs.join(", "))
            }
            Partitioning::RoundRobinBatch(n) => format!("round_robin({n})"),
            _ => "single".to_string(),
        }
    }

    fn error(&self, map: usize, message: impl fmt::Display) -> DataFusionError {
        DataFusionError::Execution(format!("dfx stage {} map {map}: {message}", self.stage_id))
    }

    /// How input partition `partition`, at `place` in its map's slice,
    /// splits its rows into buckets.
    fn bucket_split(&self, partition: usize, place: usize) -> Result<BucketSplit> {
        let timer = metrics::Time::new();
        Ok(match &self.partitioning {
            Partitioning::Hash(exprs, n) => BucketSplit::Rows(Box::new(
                BatchPartitioner::new_hash_partitioner(exprs.clone(), *n, timer)?,
            )),
            // Each partition starts its turns at a bucket of its own.
            Partitioning::RoundRobinBatch(n) => {
                let partitions = self.input.output_partitioning().partition_count();
                BucketSplit::Rows(Box::new(BatchPartitioner::new_round_robin_partitioner(
                    *n,
                    timer,
                    partition,
                    partitions.max(1),
                )))
            }
            // One bucket per partition of the slice, without hashing.
            _ => BucketSplit::Whole(place),
        })
    }

    /// Whether the partitions of `slice` run at once, each on a task of its
    /// own, rather than in turn on the task that polls the map.
    fn runs_at_once(slice: &Range<usize>) -> bool {
        slice.len() > 1
    }

    /// The input partitions of map `map`'s `slice`, each cut into its
    /// buckets' segments (see `crate::exchange::cutter`), and the slot of the
    /// map's key summary when the stage sums up its keys (see
    /// `crate::filters`).
    ///
    /// A partition, its key summary and its cutter are opened and polled
    /// together, on a task of the plugin's runtime when the slice's
    /// partitions run at once or the worker sealed the stage's input (every
    /// operator is then the plugin's; see `crate::exec::sealed_input`). So a
    /// slice splits and encodes on every core, and each batch crosses one
    /// channel. A partition split into `parts` runs once per part, each
    /// part's readers told its split read.
    fn cut_slice(
        &self,
        map: usize,
        slice: Range<usize>,
        parts: Option<SplitParts>,
        context: &Arc<TaskContext>,
        compression: ShuffleCompression,
    ) -> Result<(Vec<SegmentStream>, Option<SummarySlot>)> {
        let sealed = self.input.downcast_ref::<SealedInputExec>();
        let below = sealed.map_or(&self.input, |sealed| sealed.input());
        let summarize = below.downcast_ref::<KeySummaryExec>();
        let plan = summarize.map_or(below, |summarize| summarize.input());
        let slot = summarize
            .map(|summarize| summarize.new_slot(self.maps()))
            .transpose()?;
        let on_runtime = sealed.is_some() || Self::runs_at_once(&slice) || parts.is_some();
        let batch_size = context.session_config().batch_size();
        // One context for the whole slice, so under a memory limit its
        // partitions share one pool: the limit is the map task's, however
        // many partitions it runs.
        let context = match sealed {
            Some(_) => sealed_context(Arc::clone(context))?,
            None => Arc::clone(context),
        };
        // Each run of the slice: a partition with the context it runs in.
        let mut runs = Vec::with_capacity(slice.len());
        for (place, partition) in slice.enumerate() {
            match &parts {
                Some(parts) if parts.partition == partition => {
                    for read in parts.reads(map) {
                        let part = with_settings(&context, |dfx| dfx.split_read = read.format())?;
                        runs.push((place, partition, part));
                    }
                }
                _ => runs.push((place, partition, Arc::clone(&context))),
            }
        }
        let mut cut = Vec::with_capacity(runs.len());
        for (place, partition, context) in runs {
            let cutter = BucketCutter::new(
                self.stage_id,
                map,
                self.data_schema(),
                self.bucket_split(partition, place)?,
                self.buckets(),
                batch_size,
                compression,
            );
            let (plan, below, slot) = (Arc::clone(plan), Arc::clone(below), slot.clone());
            let open = move || {
                let stream = plan.execute(partition, context)?;
                let stream = match (below.downcast_ref::<KeySummaryExec>(), &slot) {
                    (Some(summarize), Some(slot)) => summarize.summarized(stream, slot),
                    _ => stream,
                };
                Ok(cutter.segments(stream))
            };
            cut.push(match on_runtime {
                true => driven::drive_stream(open, "a partition and its cutter")?,
                false => open()?,
            });
        }
        Ok((cut, slot))
    }
}

/// Whether a writer splitting rows by `partitioning` keeps a bucket for
/// every partition of its slice instead.
fn keeps_partitions(partitioning: &Partitioning) -> bool {
    matches!(partitioning, Partitioning::UnknownPartitioning(1))
}

/// `context` telling the readers below which partitions the task runs, so
/// they share one read of each upstream map (see
/// `crate::exchange::shared_reads`).
fn slice_context(context: &Arc<TaskContext>, slice: &Range<usize>) -> Result<Arc<TaskContext>> {
    with_settings(context, |dfx| {
        dfx.task_partitions = format!("{}-{}", slice.start, slice.end.saturating_sub(1));
    })
}

/// `context` with its `dfx_engine` settings changed by `edit`; its
/// runtime (and so its memory pool) shared.
fn with_settings(
    context: &Arc<TaskContext>,
    edit: impl FnOnce(&mut DfxConfig),
) -> Result<Arc<TaskContext>> {
    let mut dfx = DfxConfig::from_config(context.session_config().options())?;
    edit(&mut dfx);
    let mut config = context.session_config().clone();
    config.options_mut().extensions.insert(dfx);
    Ok(Arc::new(rebuilt_task_context(
        context,
        config,
        context.runtime_env(),
    )))
}

impl DisplayAs for ShuffleWriterExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "{WRITER_NODE_NAME}: stage={}, maps={}, buckets={}, partitioning={}",
            self.stage_id,
            self.maps(),
            self.buckets(),
            self.partitioning_display()
        )?;
        if self.partitions_per_map > 1 {
            write!(f, ", partitions_per_map={}", self.partitions_per_map)?;
        }
        if matches!(t, DisplayFormatType::Verbose) {
            write!(f, ", shuffle_dir={}", self.shuffle_dir.display())?;
        }
        Ok(())
    }
}

impl ExecutionPlan for ShuffleWriterExec {
    exec_defaults!(
        name = WRITER_NODE_NAME,
        properties = properties,
        one_child = (input, with_input),
        guarded_execute = (start, place),
    );

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        if let Partitioning::Hash(exprs, _) = &self.partitioning {
            for expr in exprs {
                if f(expr)? == TreeNodeRecursion::Stop {
                    return Ok(TreeNodeRecursion::Stop);
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    }
}

impl ShuffleWriterExec {
    /// How errors and panics name map `map` of this stage.
    fn place(&self, map: usize) -> String {
        format!("{WRITER_NODE_NAME} stage {} map {map}", self.stage_id)
    }

    /// `execute`'s body: start the map task; its stream runs it.
    fn start(&self, map: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let maps = self.maps();
        let config = DfxConfig::from_config(context.session_config().options())
            .map_err(|e| self.error(map, e.to_string()))?;
        if map >= maps {
            return Err(self.error(map, format!("out of range: the stage has {maps} map(s)")));
        }
        let ToldTask {
            map,
            slice,
            companions,
            members,
            parts,
        } = self
            .shape()
            .told_task(map, &config)
            .map_err(|e| self.error(map, e))?;
        let location = ShuffleLocation::parse(&self.shuffle_dir).map_err(|e| self.error(map, e))?;
        let target = match &location {
            ShuffleLocation::Local(dir) => {
                // Private, and refused when another user controls a
                // directory on the way (see `dirs`).
                prepare_stage_dir(dir, self.stage_id).map_err(|e| {
                    self.error(map, format!("cannot prepare the stage's directory: {e}"))
                })?;
                Target::Local
            }
            // No directory to prepare: a key names an object whole.
            ShuffleLocation::S3(s3) => Target::S3 {
                store: s3_store(&s3.bucket, &S3Options::from_config(&config))
                    .map_err(|e| self.error(map, e))?,
                location: s3.clone(),
            },
        };
        let empty_summary = match self.input.downcast_ref::<KeySummaryExec>() {
            Some(summarize) if !members.is_empty() => Some(summarize.empty_summary()?),
            _ => None,
        };
        let mut task_context = isolated_task_context(&context);
        if Self::runs_at_once(&slice) {
            task_context = slice_context(&task_context, &slice)?;
        }
        // The worker's session decides (readers detect it per message).
        let compression = config
            .shuffle_compression(matches!(location, ShuffleLocation::Local(_)))
            .map_err(|e| self.error(map, e.to_string()))?;
        let (cut, summary) = self.cut_slice(map, slice, parts, &task_context, compression)?;
        // The spill file of a large map: beside its file for a local
        // location, in the system's temp directory for S3.
        let spill_near = match &location {
            ShuffleLocation::Local(_) => map_path(&location_root(&location), self.stage_id, map),
            ShuffleLocation::S3(_) => {
                std::env::temp_dir().join(format!("dfx-stage-{}-map-{map}.spill", self.stage_id))
            }
        };
        let job = MapJob {
            stage_id: self.stage_id,
            map,
            root: location_root(&location),
            target,
            copy_root: Some(config.map_copy_dir.trim())
                .filter(|dir| !dir.is_empty())
                .map(PathBuf::from),
            segment_rows: vec![Vec::new(); self.buckets()],
            staging: Staging::new(self.buckets(), spill_near),
            batches_written: 0,
            summary,
            members,
            empty_summary,
            companions,
            _live: LiveObject::new(),
        };
        let input = futures::stream::select_all(cut).boxed();
        let summary = futures::stream::once(job.run(input));
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&SUMMARY_SCHEMA),
            summary,
        )))
    }
}
