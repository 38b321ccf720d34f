//! `ShuffleReaderExec`: how a consumer reads a stage's published output.
//!
//! In the plan the planner makes, its only child is the writer of the stage
//! it reads, so the plan stays one tree; the reader never executes it.
//! Encoded, it has no child: it carries that stage as a blob and describes
//! what the stage promises, so a decoded reader (a stage's bytes carry only
//! the stage's own nodes) needs no writer below it (see [`crate::wire`]). A
//! host that wants the one tree back hands a decoded reader its writer
//! again (`with_new_children`). Three modes:
//!
//! ```text
//! hash          partition b = bucket b of every map        (replaces a RepartitionExec)
//! pass-through  partition m = map m's one bucket           (below a merge)
//! broadcast     partition 0 = every bucket of every map    (a CollectLeft build side)
//! ```
//!
//! Before streaming anything it reads and checks the commit marker (the
//! index closing the file) of every map it reads, and the file's size
//! against it. Then, for each map, it reads only its bucket's segments (byte
//! ranges of the map's file, listed by the marker): each segment's framing,
//! its fields against the stage's schema and its row count against the
//! marker's. Every error names stage, map, bucket and file. Reading never
//! computes: lost output is an error, not a rerun; the reader records it as
//! [`FailureClass::Lost`] of the missing map for its shuffle location (see
//! [`crate::error`]), so the host knows which map to run again.
//!
//! From an `s3://` location the same checks run on the first poll rather
//! than in `execute`: each marker is a GET of the object's tail, and each
//! segment a ranged GET, decoded as a local one is. Requests run on the plugin's I/O runtime and
//! are awaited, never blocked on, from the host's poll. A segment is one
//! coalesced batch, so the bytes held at once stay small.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning};
use datafusion::physical_plan::execution_plan::{
    Boundedness, EmissionType, ReplaceChildrenOptions,
};
use datafusion::physical_plan::proto::ExecutionPlanEncodeCtx;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use datafusion_proto::protobuf::PhysicalPlanNode;
use futures::FutureExt;
use prost::Message;

use crate::config::DfxConfig;
use crate::counters::LiveObject;
use crate::exchange::fetch::{Sources, copy_source, file_source, s3_source, served_source};
use crate::exchange::locate::{layouts_describe, locate_by_layouts, locate_local, read_markers};
use crate::exchange::shared_reads::Cover;
use crate::exchange::store::{S3Options, ShuffleLocation, location_root, s3_store};
use crate::exchange::stream::BucketStream;
use crate::exec::common::exec_defaults;
use crate::exec::shuffle_writer::ShuffleWriterExec;
use crate::read_settings::{BroadcastRead, PartitionGroups, PartitionRole};
use crate::wire::READER_NODE_NAME;
use crate::wire::ReadMode;

/// Reads the published output of the stage below it.
#[derive(Debug)]
pub struct ShuffleReaderExec {
    mode: ReadMode,
    /// The writer of the stage it reads, its child; none in a reader
    /// decoded from bytes.
    writer: Option<Arc<dyn ExecutionPlan>>,
    /// The stage it reads, encoded, while it travels with the reader.
    stage: Arc<[u8]>,
    stage_id: u64,
    shuffle_dir: PathBuf,
    maps: usize,
    buckets: usize,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    _live: LiveObject,
}

/// What still holds of `input`'s equivalences once its rows are shuffled
/// (hash) or gathered (broadcast): its equal columns and the constants of
/// every partition, not its orderings nor one partition's constants; as
/// DataFusion's `RepartitionExec` keeps them. Dropping them all would make
/// the plan above it, decoded in a worker, disagree with the plan the
/// planner checked: a window over `PARTITION BY a, b` with `b` filtered to a
/// constant was sorted on `a` only, and its decoded operator then refused to
/// run ("All partition by columns should have an ordering").
fn shuffled_equivalences(
    input: &Arc<dyn ExecutionPlan>,
    schema: &SchemaRef,
) -> EquivalenceProperties {
    if input.schema() != *schema {
        return EquivalenceProperties::new(Arc::clone(schema));
    }
    let mut equivalences = input.properties().equivalence_properties().clone();
    equivalences.clear_orderings();
    equivalences.clear_per_partition_constants();
    equivalences
}

impl ShuffleReaderExec {
    /// This node over `children`: its writer, or none for a reader decoded
    /// from bytes.
    fn with_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match children.len() {
            0 if self.writer.is_none() => Ok(self),
            1 => Ok(Arc::new(Self::try_new(self.mode, children.swap_remove(0))?)),
            n => Err(DataFusionError::Internal(format!(
                "dfx reader of stage {}: takes its stage's writer as its one child, got {n} \
                 children",
                self.stage_id
            ))),
        }
    }

    /// A reader decoded from bytes: of stage `stage_id` in `shuffle_dir`,
    /// its `maps` and `buckets`, promising `properties` over `schema`, and
    /// carrying that stage `stage` as encoded (empty once cut out).
    #[allow(clippy::too_many_arguments)]
    pub fn decoded(
        mode: ReadMode,
        stage_id: u64,
        shuffle_dir: PathBuf,
        maps: usize,
        buckets: usize,
        schema: SchemaRef,
        properties: PlanProperties,
        stage: Vec<u8>,
    ) -> Self {
        Self {
            mode,
            writer: None,
            stage: Arc::from(stage),
            stage_id,
            shuffle_dir,
            maps,
            buckets,
            schema,
            properties: Arc::new(properties),
            _live: LiveObject::new(),
        }
    }

    /// This reader without its writer, carrying the stage as `stage`.
    fn detached(&self, stage: Vec<u8>) -> Self {
        Self::decoded(
            self.mode,
            self.stage_id,
            self.shuffle_dir.clone(),
            self.maps,
            self.buckets,
            Arc::clone(&self.schema),
            self.properties.as_ref().clone(),
            stage,
        )
    }

    /// A reader of `writer`'s stage in `mode`.
    ///
    /// # Errors
    ///
    /// When `writer` is not a dfx writer, or `mode` does not fit it (hash
    /// needs a hash or round-robin writer; pass-through and broadcast a
    /// single-bucket one).
    pub fn try_new(mode: ReadMode, writer: Arc<dyn ExecutionPlan>) -> Result<Self> {
        let Some(w) = writer.downcast_ref::<ShuffleWriterExec>() else {
            return Err(DataFusionError::Internal(format!(
                "dfx reader: its child must be a ShuffleWriterExec, not {}",
                writer.name()
            )));
        };
        let (maps, buckets, schema) = (w.maps(), w.buckets(), w.data_schema());
        let properties = match mode {
            ReadMode::Hash => {
                if matches!(w.partitioning(), Partitioning::UnknownPartitioning(_)) {
                    return Err(DataFusionError::Internal(format!(
                        "dfx reader of stage {}: hash mode needs a splitting writer",
                        w.stage_id()
                    )));
                }
                PlanProperties::new(
                    shuffled_equivalences(w.input(), &schema),
                    w.partitioning().clone(),
                    EmissionType::Incremental,
                    Boundedness::Bounded,
                )
            }
            ReadMode::PassThrough | ReadMode::Broadcast
                if !matches!(w.partitioning(), Partitioning::UnknownPartitioning(1)) =>
            {
                return Err(DataFusionError::Internal(format!(
                    "dfx reader of stage {}: {} mode needs a writer of one bucket per \
                     partition, not one split by {}",
                    w.stage_id(),
                    mode.as_str(),
                    w.partitioning_display()
                )));
            }
            // Partition p's rows in the order the input produced them, in
            // the bucket of its place in its map's slice: everything the
            // input's partition p promised still holds.
            ReadMode::PassThrough => {
                let input = w.input().properties();
                PlanProperties::new(
                    input.equivalence_properties().clone(),
                    input.output_partitioning().clone(),
                    EmissionType::Incremental,
                    Boundedness::Bounded,
                )
            }
            ReadMode::Broadcast => PlanProperties::new(
                shuffled_equivalences(w.input(), &schema),
                Partitioning::UnknownPartitioning(1),
                EmissionType::Incremental,
                Boundedness::Bounded,
            ),
        };
        Ok(Self {
            mode,
            stage_id: w.stage_id(),
            shuffle_dir: w.shuffle_dir().to_path_buf(),
            maps,
            buckets,
            schema,
            writer: Some(writer),
            stage: Arc::from(Vec::new()),
            properties: Arc::new(properties),
            _live: LiveObject::new(),
        })
    }

    /// How partitions map to buckets.
    pub fn mode(&self) -> ReadMode {
        self.mode
    }

    /// The stage this reader reads.
    pub fn stage_id(&self) -> u64 {
        self.stage_id
    }

    /// The directory the stage's output is read from.
    pub fn shuffle_dir(&self) -> &Path {
        &self.shuffle_dir
    }

    /// The writer of that stage (never executed by the reader); none in a
    /// reader decoded from bytes.
    pub fn writer(&self) -> Option<&Arc<dyn ExecutionPlan>> {
        self.writer.as_ref()
    }

    /// The writer of the planner's reader: every reader the planner makes
    /// has one.
    ///
    /// # Errors
    ///
    /// A reader decoded from bytes, which has none.
    pub fn planned_writer(&self) -> Result<&Arc<dyn ExecutionPlan>> {
        self.writer.as_ref().ok_or_else(|| {
            DataFusionError::Internal(format!(
                "dfx reader of stage {}: decoded from bytes, it holds no writer to plan with",
                self.stage_id
            ))
        })
    }

    /// The stage it reads, encoded, as a decoded reader carries it (empty
    /// once cut out of its plan, and in the planner's readers).
    pub fn encoded_stage(&self) -> &[u8] {
        &self.stage
    }

    /// Maps of the stage it reads.
    pub fn maps(&self) -> usize {
        self.maps
    }

    /// Buckets per map of the stage it reads.
    pub fn buckets(&self) -> usize {
        self.buckets
    }

    fn partitions(&self) -> usize {
        match self.mode {
            ReadMode::Hash => self.buckets,
            ReadMode::PassThrough => self.properties.output_partitioning().partition_count(),
            ReadMode::Broadcast => 1,
        }
    }

    fn error(&self, partition: usize, message: impl fmt::Display) -> DataFusionError {
        DataFusionError::Execution(format!(
            "dfx reader of stage {} partition {partition}: {message}",
            self.stage_id
        ))
    }

    /// The `(map, bucket)` pieces of `partition`, in reading order. In a
    /// task of a coalesced stage (`groups`), a hash partition heading a
    /// group reads the buckets of the whole group and the group's other
    /// partitions read nothing (see [`crate::read_settings`]).
    fn pieces(&self, partition: usize, groups: Option<&PartitionGroups>) -> Vec<(usize, usize)> {
        let maps = self.maps;
        match self.mode {
            ReadMode::Hash => match groups.map(|g| g.role(partition)) {
                None | Some(PartitionRole::Own) => (0..maps).map(|m| (m, partition)).collect(),
                Some(PartitionRole::Head(group)) => group
                    .filter(|&bucket| bucket < self.buckets)
                    .flat_map(|bucket| (0..maps).map(move |m| (m, bucket)))
                    .collect(),
                Some(PartitionRole::Member) => Vec::new(),
            },
            ReadMode::PassThrough => {
                let per_map = self.buckets.max(1);
                vec![(partition / per_map, partition % per_map)]
            }
            ReadMode::Broadcast => (0..self.maps)
                .flat_map(|m| (0..self.buckets).map(move |b| (m, b)))
                .collect(),
        }
    }

    /// The pieces of `partition` in a stage switched to a broadcast join
    /// (`read`), or `None` when this reader is not one it switched: a
    /// probe side reads every bucket of its partition's share of the maps,
    /// a build side every bucket of every map. In a coalesced task
    /// (`groups`), the group's head reads the shares of the whole group
    /// and the build side once, and the group's other partitions nothing.
    fn switched_pieces(
        &self,
        partition: usize,
        read: &BroadcastRead,
        groups: Option<&PartitionGroups>,
    ) -> Option<Vec<(usize, usize)>> {
        let probe = read.probe_stage == self.stage_id;
        if !probe && !read.build_stages.contains(&self.stage_id) {
            return None;
        }
        let (first, last) = match groups.map(|g| g.role(partition)) {
            None | Some(PartitionRole::Own) => (partition, partition),
            Some(PartitionRole::Head(group)) => (*group.start(), *group.end()),
            Some(PartitionRole::Member) => return Some(Vec::new()),
        };
        let maps = if probe {
            let start = BroadcastRead::probe_maps(first, self.buckets, self.maps).start;
            let end = BroadcastRead::probe_maps(last, self.buckets, self.maps).end;
            start..end
        } else {
            0..self.maps
        };
        let buckets = self.buckets;
        Some(
            maps.flat_map(|m| (0..buckets).map(move |b| (m, b)))
                .collect(),
        )
    }
}

impl DisplayAs for ShuffleReaderExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "{READER_NODE_NAME}: stage={}, mode={}, partitions={}",
            self.stage_id,
            self.mode.as_str(),
            self.partitions()
        )
    }
}

impl ExecutionPlan for ShuffleReaderExec {
    exec_defaults!(
        name = READER_NODE_NAME,
        guarded_execute = (open, place),
        properties = properties,
        no_expressions,
    );

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.writer.iter().collect()
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.with_children(children)
    }

    /// Encoded without its writer: the stage it reads goes inside its
    /// payload as a blob (encoded by the same encoder), so stages do not
    /// nest as messages.
    fn try_to_proto(&self, ctx: &ExecutionPlanEncodeCtx<'_>) -> Result<Option<PhysicalPlanNode>> {
        let Some(writer) = &self.writer else {
            return Ok(None);
        };
        let stage = ctx.encode_child(writer)?.encode_to_vec();
        let detached: Arc<dyn ExecutionPlan> = Arc::new(self.detached(stage));
        ctx.encode_child(&detached).map(Some)
    }
}

impl ShuffleReaderExec {
    /// How errors and panics name partition `partition` of this reader.
    fn place(&self, partition: usize) -> String {
        format!(
            "{READER_NODE_NAME} stage {} partition {partition}",
            self.stage_id
        )
    }

    /// `execute`'s body: check the markers, queue the partition's files
    /// (from an S3 location: a stream that does both on its first poll).
    fn open(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let count = self.partitions();
        if partition >= count {
            return Err(self.error(
                partition,
                format!("out of range: the reader has {count} partition(s)"),
            ));
        }
        let location =
            ShuffleLocation::parse(&self.shuffle_dir).map_err(|e| self.error(partition, e))?;
        let root = location_root(&location);
        let config = DfxConfig::from_config(context.session_config().options())
            .map_err(|e| self.error(partition, e))?;
        let groups = config
            .coalesced_partitions()
            .map_err(|e| self.error(partition, e))?;
        let split = config.split_read().map_err(|e| self.error(partition, e))?;
        let switched = config
            .broadcast_read()
            .map_err(|e| self.error(partition, e))?
            .filter(|_| self.mode == ReadMode::Hash);
        let switched =
            switched.and_then(|read| self.switched_pieces(partition, &read, groups.as_ref()));
        let pieces = match (split, switched) {
            // A switched join's probe or build side.
            (_, Some(pieces)) => pieces,
            // The probe side of a part of a split partition: its maps only.
            (Some(split), _)
                if self.mode == ReadMode::Hash
                    && split.probe_stage == self.stage_id
                    && split.partition == partition =>
            {
                split
                    .maps
                    .filter(|&m| m < self.maps)
                    .map(|m| (m, partition))
                    .collect()
            }
            _ => self.pieces(partition, groups.as_ref()),
        };
        // The driver's layouts of this stage's maps, when it handed them and
        // they describe every planned map and every bucket this partition
        // reads (a stage with maps added by a skew split is read by its
        // markers, which name them).
        let layouts = config
            .shuffle_ranges()
            .map_err(|e| self.error(partition, e))?;
        let own_server = config.own_map_server();
        let laid_out = layouts
            .as_ref()
            .and_then(|l| l.stages.get(&self.stage_id))
            .filter(|maps| layouts_describe(maps, self.maps, self.buckets, &pieces))
            .map(|maps| locate_by_layouts(&root, self.stage_id, maps, pieces.clone(), own_server));
        // A hash partition of a task running a slice shares each map's read
        // with the slice's other partitions.
        let slice = config
            .task_partitions()
            .map_err(|e| self.error(partition, e))?;
        let covers = match (slice, layouts.as_ref()) {
            (Some(slice), Some(layouts))
                if self.mode == ReadMode::Hash && slice.contains(&partition) =>
            {
                layouts
                    .stages
                    .get(&self.stage_id)
                    .map(|maps| Cover::of_slice(maps, slice, config.read_bytes_in_flight))
            }
            _ => None,
        }
        .unwrap_or_default();
        let budget = (config.read_bytes_in_flight, covers.as_slice());
        let fall_back = config
            .reads_location_when_owner_lost()
            .map_err(|e| self.error(partition, e))?;
        // Whether the stage's maps are served by their workers: its layouts
        // name owners (this process among them, whose own pieces have none).
        let served = laid_out.is_some()
            && layouts
                .as_ref()
                .and_then(|l| l.stages.get(&self.stage_id))
                .is_some_and(|maps| maps.iter().any(|map| map.owner.is_some()));
        if let ShuffleLocation::S3(s3) = location {
            let store = s3_store(&s3.bucket, &S3Options::from_config(&config))
                .map_err(|e| self.error(partition, e))?;
            if let Some(located) = laid_out {
                // Maps served by their workers (`both`: each also in the
                // bucket, read when its worker is gone, and this process's
                // own read from its copies).
                let source: Sources = if served {
                    let bucket: Sources = Box::new(s3_source(Arc::clone(&store), s3.clone()));
                    let own: Option<Sources> = match config.map_copy_dir.trim() {
                        "" => None,
                        copies => Some(Box::new(
                            copy_source(PathBuf::from(copies), root.clone(), bucket)
                                .map_err(|e| self.error(partition, e))?,
                        )),
                    };
                    let location: Sources = Box::new(s3_source(store, s3));
                    Box::new(served_source(
                        root.clone(),
                        fall_back.then_some(location),
                        own,
                    ))
                } else {
                    Box::new(s3_source(store, s3))
                };
                let stream = BucketStream::laid_out(
                    self.stage_id,
                    root,
                    Arc::clone(&self.schema),
                    (located, false),
                    source.as_ref(),
                    budget,
                );
                return Ok(Box::pin(stream));
            }
            let markers = read_markers(
                Arc::clone(&store),
                s3.clone(),
                root.clone(),
                self.stage_id,
                self.buckets,
                pieces,
            )
            .boxed();
            let stream = BucketStream::remote(
                self.stage_id,
                root,
                Arc::clone(&self.schema),
                store,
                s3,
                markers,
            );
            return Ok(Box::pin(stream));
        }
        // Maps served by the workers that wrote them: each read from its
        // owner, or from disk when this process wrote it (`both`: also
        // when its owner is gone).
        if served && let Some(located) = laid_out {
            let files: Option<Sources> = if fall_back {
                let files = file_source(root.clone()).map_err(|e| self.error(partition, e))?;
                Some(Box::new(files))
            } else {
                None
            };
            let stream = BucketStream::laid_out(
                self.stage_id,
                root.clone(),
                Arc::clone(&self.schema),
                (located, true),
                &served_source(root, files, None),
                budget,
            );
            return Ok(Box::pin(stream));
        }
        let located = match laid_out {
            Some(located) => located,
            // Under `local`, this node's copy of the location need not hold
            // the map: it is read only from its owner, by its layout.
            None if config.maps_only_on_workers()? => {
                return Err(self.error(
                    partition,
                    format!(
                        "stage {}'s maps stay on the disks of the workers that wrote them \
                         (shuffle durability local), but this task was handed no layout \
                         naming their owners; expected one for each of its {} map(s)",
                        self.stage_id, self.maps
                    ),
                ));
            }
            None => locate_local(&root, self.stage_id, self.buckets, pieces)?,
        };
        let stream = BucketStream::local(self.stage_id, root, Arc::clone(&self.schema), located);
        Ok(Box::pin(stream))
    }
}
