//! `ShuffleWriterExec`: the root of every stage.
//!
//! ```text
//!   execute(map m)
//!        │
//!   input.execute(m) ──► each batch: split into buckets with DataFusion's own
//!                        partitioner, coalesce per bucket; each full batch
//!                        is one segment appended to the map's temp file
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
//! sees the partitions it was planned for. Memory stays flat: each bucket
//! holds at most one batch being coalesced, and a segment is written as
//! soon as it is encoded.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{ArrayRef, UInt64Array};
use datafusion::arrow::compute::BatchCoalescer;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
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
    ReplaceChildrenOptions,
};
use futures::StreamExt;

use object_store::ObjectStore;

use super::dirs::prepare_stage_dir;
use super::files::{MapFile, encode_segment};
use super::marker::{BucketEntry, KeysRegion, MapMarker, Segment};
use super::store::{
    ObjectKey, ObjectMap, S3Location, S3Options, ShuffleLocation, location_root, s3_store,
};
use crate::config::{DfxConfig, ShuffleCompression};
use crate::counters::LiveObject;
use crate::filters::KeySummary;
use crate::filters::summarize::{self, KeySummaryExec, SummarySlot};
use crate::guard::{self, GuardedStream};
use crate::paths::map_path;
use crate::planner::isolated_task_context;

/// Name of the writer node, as hosts search for it.
pub const WRITER_NODE_NAME: &str = "ShuffleWriterExec";

/// Schema of the summary a map task returns: one row per bucket.
pub static SUMMARY_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("bucket", DataType::UInt64, false),
        Field::new("rows", DataType::UInt64, false),
        Field::new("bytes", DataType::UInt64, false),
    ]))
});

/// The root of a stage: runs one input partition per map task and publishes
/// its rows split into buckets.
#[derive(Debug)]
pub struct ShuffleWriterExec {
    stage_id: u64,
    shuffle_dir: PathBuf,
    input: Arc<dyn ExecutionPlan>,
    partitioning: Partitioning,
    deps: Vec<u64>,
    properties: Arc<PlanProperties>,
    _live: LiveObject,
}

impl ShuffleWriterExec {
    /// A writer of stage `stage_id` over `input`, splitting each map's rows
    /// by `partitioning` (hash or round-robin, or one bucket for
    /// `UnknownPartitioning(1)`), publishing into `shuffle_dir`. `deps` are
    /// the ids of the stages `input` reads.
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
    ) -> Result<Self> {
        let buckets = partitioning.partition_count();
        let supported = matches!(
            partitioning,
            Partitioning::Hash(_, _) | Partitioning::RoundRobinBatch(_)
        ) || matches!(partitioning, Partitioning::UnknownPartitioning(1));
        if buckets == 0 || !supported {
            return Err(DataFusionError::Internal(format!(
                "dfx stage {stage_id}: a writer cannot split rows by {partitioning}"
            )));
        }
        let maps = input.output_partitioning().partition_count();
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

    /// Map tasks: the input's partitions.
    pub fn maps(&self) -> usize {
        self.input.output_partitioning().partition_count()
    }

    /// Buckets per map.
    pub fn buckets(&self) -> usize {
        self.partitioning.partition_count()
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

    /// This writer with another id and deps (the planner renumbers stages
    /// in pre-order once every cut is made).
    pub fn renumbered(&self, stage_id: u64, deps: Vec<u64>) -> Result<Self> {
        Self::try_new(
            stage_id,
            self.shuffle_dir.clone(),
            Arc::clone(&self.input),
            self.partitioning.clone(),
            deps,
        )
    }

    fn error(&self, map: usize, message: impl fmt::Display) -> DataFusionError {
        DataFusionError::Execution(format!("dfx stage {} map {map}: {message}", self.stage_id))
    }

    fn partitioner(&self, map: usize) -> Result<BatchPartitioner> {
        let timer = metrics::Time::new();
        match &self.partitioning {
            Partitioning::Hash(exprs, n) => {
                BatchPartitioner::new_hash_partitioner(exprs.clone(), *n, timer)
            }
            Partitioning::RoundRobinBatch(n) => Ok(BatchPartitioner::new_round_robin_partitioner(
                *n,
                timer,
                map,
                self.maps().max(1),
            )),
            // One bucket: every row goes to bucket 0 without hashing.
            _ => Ok(BatchPartitioner::new_round_robin_partitioner(
                1, timer, 0, 1,
            )),
        }
    }
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
        if matches!(t, DisplayFormatType::Verbose) {
            write!(f, ", shuffle_dir={}", self.shuffle_dir.display())?;
        }
        Ok(())
    }
}

impl ExecutionPlan for ShuffleWriterExec {
    fn name(&self) -> &str {
        WRITER_NODE_NAME
    }

    /// One partition per map task; each returns its summary.
    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

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

    fn replace_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal(format!(
                "dfx stage {}: a writer takes one child, got {}",
                self.stage_id,
                children.len()
            )));
        }
        Ok(Arc::new(Self::try_new(
            self.stage_id,
            self.shuffle_dir.clone(),
            children.swap_remove(0),
            self.partitioning.clone(),
            self.deps.clone(),
        )?))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(
                datafusion::physical_plan::execution_plan::ChildrenPropertiesMode::Recompute,
            ),
        )
    }

    /// Runs behind [`crate::guard`]: a panic here, or in any poll of the
    /// summary stream (which drives the whole stage), becomes an error.
    fn execute(&self, map: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let place = format!("{WRITER_NODE_NAME} stage {} map {map}", self.stage_id);
        let stream = guard::catch(format_args!("{place} execute"), || self.start(map, context))?;
        Ok(GuardedStream::wrap(place, stream))
    }
}

impl ShuffleWriterExec {
    /// `execute`'s body: start the map task; its stream runs it.
    fn start(&self, map: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let maps = self.maps();
        let config = DfxConfig::from_config(context.session_config().options())
            .map_err(|e| self.error(map, e.to_string()))?;
        if map >= maps {
            return Err(self.error(map, format!("out of range: the stage has {maps} map(s)")));
        }
        // A part of a split partition runs that partition and publishes as
        // the map it is told, naming the other parts' maps if it is the
        // first (see `crate::adaptive::split`).
        let partition = map;
        let split = config.split_read().map_err(|e| self.error(map, e))?;
        let (map, companions) = match split {
            Some(split) if split.stage_id != self.stage_id || split.partition != partition => {
                return Err(self.error(
                    map,
                    format!(
                        "the task was told a part of partition {} of stage {}, not of this one",
                        split.partition, split.stage_id
                    ),
                ));
            }
            Some(split) if split.map < maps && split.map != partition => {
                return Err(self.error(
                    map,
                    format!(
                        "the task was told to publish as map {}, another planned map",
                        split.map
                    ),
                ));
            }
            Some(split) => (split.map, split.companions),
            None => (map, Vec::new()),
        };
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
        // In a coalesced stage's task, the partitions whose rows this map
        // reads publish their maps empty (see `crate::adaptive::groups`).
        let members = match config
            .coalesced_partitions()
            .map_err(|e| self.error(map, e))?
        {
            Some(groups) if groups.stage_id != self.stage_id => {
                return Err(self.error(
                    map,
                    format!(
                        "the task was told the coalesced partitions of stage {}, not of this one",
                        groups.stage_id
                    ),
                ));
            }
            Some(groups) => groups.members_of(map),
            None => Vec::new(),
        };
        let empty_summary = match self.input.downcast_ref::<KeySummaryExec>() {
            Some(summarize) if !members.is_empty() => Some(summarize.empty_summary()?),
            _ => None,
        };
        let task_context = isolated_task_context(&context);
        // A build stage of a filtered join sums up its keys as rows go by,
        // for the map's file (see `crate::filters`).
        let (input, summary) = match self.input.downcast_ref::<KeySummaryExec>() {
            Some(summarize) => {
                let (input, slot) = summarize.execute_summarized(partition, task_context)?;
                (input, Some(slot))
            }
            None => (self.input.execute(partition, task_context)?, None),
        };
        let batch_size = context.session_config().batch_size();
        // The worker's session decides (readers detect it per message).
        let compression = config
            .shuffle_compression(matches!(location, ShuffleLocation::Local(_)))
            .map_err(|e| self.error(map, e.to_string()))?;
        let job = MapJob {
            stage_id: self.stage_id,
            map,
            root: location_root(&location),
            target,
            schema: self.data_schema(),
            partitioner: self.partitioner(partition)?,
            buckets: (0..self.buckets()).map(|_| None).collect(),
            sink: None,
            batch_size,
            compression,
            batches_written: 0,
            summary,
            members,
            empty_summary,
            companions,
            _live: LiveObject::new(),
        };
        let summary = futures::stream::once(job.run(input));
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&SUMMARY_SCHEMA),
            summary,
        )))
    }
}

/// Where a map task publishes.
enum Target {
    /// Files under a local directory.
    Local,
    /// Objects in an S3 bucket, through the plugin's I/O runtime.
    S3 {
        store: Arc<dyn ObjectStore>,
        location: S3Location,
    },
}

/// The map's one file while it is written.
enum MapSink {
    File(MapFile),
    Object(ObjectMap),
}

impl MapSink {
    fn len(&self) -> u64 {
        match self {
            MapSink::File(file) => file.len(),
            MapSink::Object(object) => object.len(),
        }
    }

    async fn append(&mut self, segment: &[u8]) -> std::result::Result<(), String> {
        match self {
            MapSink::File(file) => file.append(segment),
            MapSink::Object(object) => object.append(segment).await,
        }
    }

    async fn publish(self, path: &Path) -> std::result::Result<u64, String> {
        match self {
            MapSink::File(file) => file.publish(path),
            MapSink::Object(object) => object
                .publish()
                .await
                .map_err(|e| format!("{}: {e}", path.display())),
        }
    }
}

/// One bucket while its map runs: rows coalesce here before each segment
/// is written; the segments written so far.
struct OpenBucket {
    coalescer: BatchCoalescer,
    rows: u64,
    bytes: u64,
    segments: Vec<Segment>,
}

/// The work of one map task. Dropping it before `run` ends (an error, or the
/// caller dropping the stream) drops the open map file, which removes its
/// temp file (or aborts its upload): nothing is published.
struct MapJob {
    stage_id: u64,
    map: usize,
    /// The location's root, for the names of `paths`.
    root: PathBuf,
    target: Target,
    schema: SchemaRef,
    partitioner: BatchPartitioner,
    buckets: Vec<Option<OpenBucket>>,
    /// The map's file, created with its first segment.
    sink: Option<MapSink>,
    batch_size: usize,
    compression: ShuffleCompression,
    /// Segments written so far (for the test hooks).
    batches_written: u64,
    /// The key summary of a build stage's map, complete once the input ends.
    summary: Option<SummarySlot>,
    /// Maps of a coalesced stage whose rows this one read: published empty
    /// after it.
    members: Vec<usize>,
    /// Their key summary (no key), when the stage is a build stage.
    empty_summary: Option<KeySummary>,
    /// Maps holding the rest of a split partition's rows, named in this
    /// map's marker (see `crate::adaptive::split`).
    companions: Vec<usize>,
    _live: LiveObject,
}

impl MapJob {
    fn error(&self, message: impl fmt::Display) -> DataFusionError {
        DataFusionError::Execution(format!(
            "dfx stage {} map {}: {message}",
            self.stage_id, self.map
        ))
    }

    /// Split every input batch into buckets, then publish.
    async fn run(mut self, mut input: SendableRecordBatchStream) -> Result<RecordBatch> {
        while let Some(batch) = input.next().await {
            let batch = batch?;
            if batch.num_rows() == 0 {
                continue;
            }
            let mut pieces = Vec::new();
            self.partitioner.partition(batch, |bucket, piece| {
                pieces.push((bucket, piece));
                Ok(())
            })?;
            for (bucket, piece) in pieces {
                self.append(bucket, piece).await?;
            }
        }
        self.publish().await
    }

    /// Add `piece` to `bucket`, writing a segment for each full batch.
    async fn append(&mut self, bucket: usize, piece: RecordBatch) -> Result<()> {
        if piece.num_rows() == 0 {
            return Ok(());
        }
        let open = self.buckets[bucket].get_or_insert_with(|| OpenBucket {
            coalescer: BatchCoalescer::new(Arc::clone(&self.schema), self.batch_size),
            rows: 0,
            bytes: 0,
            segments: Vec::new(),
        });
        open.coalescer.push_batch(piece).map_err(|e| {
            DataFusionError::Execution(format!(
                "dfx stage {} map {} bucket {bucket}: cannot coalesce: {e}",
                self.stage_id, self.map
            ))
        })?;
        while let Some(full) = self.buckets[bucket]
            .as_mut()
            .and_then(|open| open.coalescer.next_completed_batch())
        {
            self.write_segment(bucket, &full).await?;
        }
        Ok(())
    }

    /// Encode `batch` and append it to the map's file as a segment of
    /// `bucket` (creating the file with the first one).
    async fn write_segment(&mut self, bucket: usize, batch: &RecordBatch) -> Result<()> {
        let (stage_id, map) = (self.stage_id, self.map);
        let fail = |e: String| {
            DataFusionError::Execution(format!(
                "dfx stage {stage_id} map {map} bucket {bucket}: {e}"
            ))
        };
        let segment = encode_segment(&self.schema, batch, self.compression).map_err(fail)?;
        if self.sink.is_none() {
            self.sink = Some(self.create_sink(self.map)?);
        }
        let sink = self.sink.as_mut().expect("created above");
        let offset = sink.len();
        sink.append(&segment).await.map_err(fail)?;
        let open = self.buckets[bucket].as_mut().expect("opened by append");
        let rows = batch.num_rows() as u64;
        open.rows += rows;
        open.bytes += segment.len() as u64;
        open.segments.push(Segment {
            offset,
            bytes: segment.len() as u64,
            rows,
        });
        self.batches_written += 1;
        crate::test_hooks::batch_written(self.batches_written);
        Ok(())
    }

    /// Start map `map`'s file (a temp file, or an upload).
    fn create_sink(&self, map: usize) -> Result<MapSink> {
        let path = map_path(&self.root, self.stage_id, map);
        match &self.target {
            Target::Local => MapFile::create(&self.root, &path).map(MapSink::File),
            Target::S3 { store, location } => location
                .key(&path)
                .map(|key| MapSink::Object(ObjectMap::create(Arc::clone(store), location, key))),
        }
        .map_err(|e| self.error(e))
    }

    /// Flush every bucket, close the map's file with its marker, publish it.
    async fn publish(mut self) -> Result<RecordBatch> {
        for bucket in 0..self.buckets.len() {
            let Some(open) = self.buckets[bucket].as_mut() else {
                continue;
            };
            open.coalescer.finish_buffered_batch().map_err(|e| {
                DataFusionError::Execution(format!(
                    "dfx stage {} map {} bucket {bucket}: cannot coalesce: {e}",
                    self.stage_id, self.map
                ))
            })?;
            while let Some(rest) = self.buckets[bucket]
                .as_mut()
                .and_then(|open| open.coalescer.next_completed_batch())
            {
                self.write_segment(bucket, &rest).await?;
            }
        }
        let buckets = std::mem::take(&mut self.buckets)
            .into_iter()
            .enumerate()
            .map(|(bucket, open)| match open {
                Some(open) => BucketEntry {
                    bucket: bucket as u64,
                    rows: open.rows,
                    bytes: open.bytes,
                    segments: open.segments,
                },
                None => BucketEntry {
                    bucket: bucket as u64,
                    rows: 0,
                    bytes: 0,
                    segments: Vec::new(),
                },
            })
            .collect();
        let mut sink = match self.sink.take() {
            Some(sink) => sink,
            // Every bucket is empty: the file is the marker alone.
            None => self.create_sink(self.map)?,
        };
        // Complete: `run` read the input to its end before publishing.
        let keys = match self.summary.as_ref().and_then(summarize::finish) {
            Some(summary) => {
                let bytes = serde_json::to_vec(&summary)
                    .map_err(|e| self.error(format!("cannot encode the key summary: {e}")))?;
                let offset = sink.len();
                sink.append(&bytes).await.map_err(|e| self.error(e))?;
                Some(KeysRegion {
                    offset,
                    bytes: bytes.len() as u64,
                })
            }
            None => None,
        };
        let marker = MapMarker {
            stage_id: self.stage_id,
            map: self.map as u64,
            attempt: 0,
            bytes: sink.len(),
            buckets,
            keys,
            companions: self.companions.iter().map(|&c| c as u64).collect(),
        };
        // Last: the file is published (renamed, or its upload completed)
        // only once it ends with the marker, so its presence is the commit.
        sink.append(&marker.trailer()?)
            .await
            .map_err(|e| self.error(e))?;
        let path = map_path(&self.root, self.stage_id, self.map);
        sink.publish(&path).await.map_err(|e| self.error(e))?;
        for member in self.members.clone() {
            let empty = EmptyMap {
                stage_id: self.stage_id,
                head: self.map,
                map: member,
                buckets: marker.buckets.len(),
                path: map_path(&self.root, self.stage_id, member),
            };
            let sink = self.create_sink(member)?;
            empty.publish(sink, self.empty_summary.clone()).await?;
        }
        summary_batch(&marker.buckets)
    }
}

/// A map of a coalesced stage whose rows its group's head read.
struct EmptyMap {
    stage_id: u64,
    head: usize,
    map: usize,
    buckets: usize,
    path: PathBuf,
}

impl EmptyMap {
    /// Publish it into `sink` with no rows: the marker alone, after an
    /// empty key summary for a build stage. Another attempt's publish of it
    /// is kept.
    async fn publish(self, mut sink: MapSink, summary: Option<KeySummary>) -> Result<()> {
        let (stage_id, map, head) = (self.stage_id, self.map, self.head);
        let fail = |e: String| {
            DataFusionError::Execution(format!(
                "dfx stage {stage_id} map {map} (coalesced into map {head}): {e}"
            ))
        };
        let buckets = self.buckets;
        let keys = match &summary {
            Some(summary) => {
                let bytes = serde_json::to_vec(summary)
                    .map_err(|e| fail(format!("cannot encode the key summary: {e}")))?;
                sink.append(&bytes).await.map_err(fail)?;
                Some(KeysRegion {
                    offset: 0,
                    bytes: bytes.len() as u64,
                })
            }
            None => None,
        };
        let marker = MapMarker {
            stage_id,
            map: map as u64,
            attempt: 0,
            bytes: sink.len(),
            buckets: (0..buckets as u64)
                .map(|bucket| BucketEntry {
                    bucket,
                    rows: 0,
                    bytes: 0,
                    segments: Vec::new(),
                })
                .collect(),
            keys,
            companions: Vec::new(),
        };
        sink.append(&marker.trailer()?).await.map_err(fail)?;
        sink.publish(&self.path).await.map_err(fail)?;
        Ok(())
    }
}

fn summary_batch(entries: &[BucketEntry]) -> Result<RecordBatch> {
    let column = |f: fn(&BucketEntry) -> u64| -> ArrayRef {
        Arc::new(UInt64Array::from_iter_values(entries.iter().map(f)))
    };
    Ok(RecordBatch::try_new(
        Arc::clone(&SUMMARY_SCHEMA),
        vec![
            column(|e| e.bucket),
            column(|e| e.rows),
            column(|e| e.bytes),
        ],
    )?)
}
