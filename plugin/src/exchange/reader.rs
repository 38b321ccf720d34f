//! `ShuffleReaderExec`: how a consumer reads a stage's published output.
//!
//! Its only child is the writer of the stage it reads, so the plan stays one
//! tree; the reader never executes it. Three modes:
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
//! [`crate::failures`]), so the host knows which map to run again.
//!
//! From an `s3://` location the same checks run on the first poll rather
//! than in `execute`: each marker is a GET of the object's tail, and each
//! segment a ranged GET, decoded as a local one is. Requests run on the plugin's I/O runtime and
//! are awaited, never blocked on, from the host's poll. A segment is one
//! coalesced batch, so the bytes held at once stay small.

use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::fmt;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, ReplaceChildrenOptions,
};
use dfx_abi::FailureClass;
use futures::future::BoxFuture;
use futures::{FutureExt, Stream};
use object_store::ObjectStore;

use super::files::{decode_segment, describe_fields, same_fields};
use super::marker::{Located, MapFileRef, MapMarker, Segment, TAIL_GUESS};
use super::store::{
    ObjectKey, S3Location, S3Options, ShuffleLocation, get_range_if, get_tail_tagged,
    location_root, s3_store,
};
use super::writer::ShuffleWriterExec;
use crate::adaptive::{BroadcastRead, PartitionGroups, PartitionRole};
use crate::config::DfxConfig;
use crate::counters::LiveObject;
use crate::failures;
use crate::filters::KeySummary;
use crate::guard::{self, GuardedStream};
use crate::paths::map_path;

/// Name of the reader node.
pub const READER_NODE_NAME: &str = "ShuffleReaderExec";

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

/// Reads the published output of the stage below it.
#[derive(Debug)]
pub struct ShuffleReaderExec {
    mode: ReadMode,
    writer: Arc<dyn ExecutionPlan>,
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
            ReadMode::PassThrough | ReadMode::Broadcast if buckets != 1 => {
                return Err(DataFusionError::Internal(format!(
                    "dfx reader of stage {}: {} mode needs one bucket per map, the writer has \
                     {buckets}",
                    w.stage_id(),
                    mode.as_str()
                )));
            }
            // Map m's rows in the order the input produced them: everything
            // the input's partition m promised still holds.
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
            writer,
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

    /// The writer of that stage (never executed by the reader).
    pub fn writer(&self) -> &Arc<dyn ExecutionPlan> {
        &self.writer
    }

    fn partitions(&self) -> usize {
        match self.mode {
            ReadMode::Hash => self.buckets,
            ReadMode::PassThrough => self.maps,
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
    /// partitions read nothing (see [`crate::adaptive::groups`]).
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
            ReadMode::PassThrough => vec![(partition, 0)],
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
    fn name(&self) -> &str {
        READER_NODE_NAME
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.writer]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal(format!(
                "dfx reader of stage {}: takes one child, got {}",
                self.stage_id,
                children.len()
            )));
        }
        Ok(Arc::new(Self::try_new(self.mode, children.swap_remove(0))?))
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

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let place = format!(
            "{READER_NODE_NAME} stage {} partition {partition}",
            self.stage_id
        );
        let stream = guard::catch(format_args!("{place} execute"), || {
            self.open(partition, &context)
        })?;
        Ok(GuardedStream::wrap(place, stream))
    }
}

impl ShuffleReaderExec {
    /// `execute`'s body: check the markers, queue the partition's files
    /// (from an S3 location: a stream that does both on its first poll).
    fn open(
        &self,
        partition: usize,
        context: &Arc<TaskContext>,
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
        let mut stream = BucketStream {
            stage_id: self.stage_id,
            location: root.clone(),
            schema: Arc::clone(&self.schema),
            queue: VecDeque::new(),
            current: None,
            remote: None,
            _live: LiveObject::new(),
        };
        if let ShuffleLocation::S3(s3) = location {
            let store = s3_store(&s3.bucket, &S3Options::from_config(&config))
                .map_err(|e| self.error(partition, e))?;
            let markers = read_markers(
                Arc::clone(&store),
                s3.clone(),
                root,
                self.stage_id,
                self.buckets,
                pieces,
            )
            .boxed();
            stream.remote = Some(Remote {
                store,
                location: s3,
                markers: Some(markers),
                fetching: None,
            });
            return Ok(Box::pin(stream));
        }
        // Every marker first: a lost map fails the read before any row flows.
        let mut maps: BTreeMap<usize, (MapMarker, u64)> = BTreeMap::new();
        let mut pending: VecDeque<Pending> = pieces.into_iter().map(Pending::planned).collect();
        while let Some(Pending {
            map,
            bucket,
            planned,
        }) = pending.pop_front()
        {
            if let std::collections::btree_map::Entry::Vacant(slot) = maps.entry(map) {
                let path = map_path(&root, self.stage_id, map);
                slot.insert(MapMarker::read(&MapFileRef {
                    location: &root,
                    path: &path,
                    stage_id: self.stage_id,
                    map,
                    bucket,
                    buckets: self.buckets,
                })?);
            }
            let (marker, size) = &maps[&map];
            if let Some(piece) = Piece::of(marker, *size, &root, bucket) {
                stream.queue.push_back(piece);
            }
            if planned {
                Pending::companions(marker, bucket, &mut pending);
            }
        }
        Ok(Box::pin(stream))
    }
}

/// A `(map, bucket)` piece whose marker is still to read.
struct Pending {
    map: usize,
    bucket: usize,
    /// One of the partition's own pieces, rather than a companion's: the
    /// only kind whose marker may name companions.
    planned: bool,
}

impl Pending {
    fn planned((map, bucket): (usize, usize)) -> Self {
        Self {
            map,
            bucket,
            planned: true,
        }
    }

    /// The same bucket of the maps `marker` names as its companions (the
    /// other parts of a split partition, see [`crate::adaptive::split`]),
    /// read next.
    fn companions(marker: &MapMarker, bucket: usize, pending: &mut VecDeque<Pending>) {
        for &companion in marker.companions.iter().rev() {
            pending.push_front(Pending {
                map: companion as usize,
                bucket,
                planned: false,
            });
        }
    }
}

/// The pieces of an S3 reader's partition, after reading (GET of each
/// object's tail) and checking the marker of every map it reads, as a local
/// reader does in `execute`.
async fn read_markers(
    store: Arc<dyn ObjectStore>,
    location: S3Location,
    root: PathBuf,
    stage_id: u64,
    buckets: usize,
    pieces: Vec<(usize, usize)>,
) -> Result<VecDeque<Piece>> {
    let mut maps: BTreeMap<usize, (MapMarker, u64, Option<String>)> = BTreeMap::new();
    let mut queue = VecDeque::new();
    let mut pending: VecDeque<Pending> = pieces.into_iter().map(Pending::planned).collect();
    while let Some(Pending {
        map,
        bucket,
        planned,
    }) = pending.pop_front()
    {
        if let std::collections::btree_map::Entry::Vacant(slot) = maps.entry(map) {
            let path = map_path(&root, stage_id, map);
            let at = MapFileRef {
                location: &root,
                path: &path,
                stage_id,
                map,
                bucket,
                buckets,
            };
            slot.insert(read_remote_marker(&store, &location, &at).await?);
        }
        let (marker, size, e_tag) = &maps[&map];
        if let Some(mut piece) = Piece::of(marker, *size, &root, bucket) {
            piece.e_tag = e_tag.clone();
            queue.push_back(piece);
        }
        if planned {
            Pending::companions(marker, bucket, &mut pending);
        }
    }
    Ok(queue)
}

/// The key summary map `map` of stage `stage_id` (of `buckets` buckets)
/// published into `shuffle_dir`, local or on S3: its marker read and
/// checked as a reader checks it, then the summary's byte range. `None`
/// when the map published none. A missing map is lost output, recorded for
/// the location as a reader records it.
///
/// # Errors
///
/// Those of [`MapMarker::read`], an S3 location that cannot be reached, a
/// map whose object changed in between, or a summary that is not one.
pub(crate) async fn read_map_keys(
    shuffle_dir: &Path,
    config: &DfxConfig,
    stage_id: u64,
    map: usize,
    buckets: usize,
) -> Result<Option<KeySummary>> {
    let location = ShuffleLocation::parse(shuffle_dir)
        .map_err(|e| DataFusionError::Execution(format!("dfx stage {stage_id} map {map}: {e}")))?;
    let root = location_root(&location);
    let path = map_path(&root, stage_id, map);
    let at = MapFileRef {
        location: &root,
        path: &path,
        stage_id,
        map,
        bucket: 0,
        buckets,
    };
    let fail = |what: String| at.error(format!("cannot read the key summary: {what}"));
    let bytes = match location {
        ShuffleLocation::Local(_) => {
            let (marker, _) = MapMarker::read(&at)?;
            let Some(keys) = marker.keys else {
                return Ok(None);
            };
            let file = File::open(&path).map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    at.lost()
                } else {
                    fail(e.to_string())
                }
            })?;
            read_range(&file, keys.offset, keys.bytes).map_err(|e| fail(e.to_string()))?
        }
        ShuffleLocation::S3(s3) => {
            let store =
                s3_store(&s3.bucket, &S3Options::from_config(config)).map_err(|e| at.error(e))?;
            let (marker, size, e_tag) = read_remote_marker(&store, &s3, &at).await?;
            let Some(keys) = marker.keys else {
                return Ok(None);
            };
            let key = s3.key(&path).map_err(|e| at.error(e))?;
            let (bytes, now) = get_range_if(store, key, keys.offset, keys.bytes, e_tag)
                .await
                .map_err(fail)?
                .ok_or_else(|| at.lost())?;
            if now != size {
                return Err(fail(format!(
                    "the map's object changed while it was read ({size} byte(s), then {now})"
                )));
            }
            bytes
        }
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| fail(format!("not a key summary: {e}")))
}

/// The marker of map `map` of stage `stage_id` (of `buckets` buckets)
/// published into `shuffle_dir`, local or on S3, read and checked as a
/// reader checks it. A missing map is lost output, recorded for the
/// location as a reader records it.
///
/// # Errors
///
/// Those of [`MapMarker::read`], or an S3 location that cannot be reached.
pub(crate) async fn read_map_marker(
    shuffle_dir: &Path,
    config: &DfxConfig,
    stage_id: u64,
    map: usize,
    buckets: usize,
) -> Result<MapMarker> {
    let location = ShuffleLocation::parse(shuffle_dir)
        .map_err(|e| DataFusionError::Execution(format!("dfx stage {stage_id} map {map}: {e}")))?;
    let root = location_root(&location);
    let path = map_path(&root, stage_id, map);
    let at = MapFileRef {
        location: &root,
        path: &path,
        stage_id,
        map,
        bucket: 0,
        buckets,
    };
    match location {
        ShuffleLocation::Local(_) => Ok(MapMarker::read(&at)?.0),
        ShuffleLocation::S3(s3) => {
            let store =
                s3_store(&s3.bucket, &S3Options::from_config(config)).map_err(|e| at.error(e))?;
            Ok(read_remote_marker(&store, &s3, &at).await?.0)
        }
    }
}

/// The marker closing the object at `path`: its tail, and, for an index
/// longer than the first guess, the rest of it; with the object's size and
/// entity tag, which every later fetch of its segments must match.
async fn read_remote_marker(
    store: &Arc<dyn ObjectStore>,
    location: &S3Location,
    at: &MapFileRef<'_>,
) -> Result<(MapMarker, u64, Option<String>)> {
    let fail = |what: String| at.error(what);
    let key = location.key(at.path).map_err(fail)?;
    let (tail, size, e_tag) = get_tail_tagged(Arc::clone(store), key.clone(), TAIL_GUESS)
        .await
        .map_err(|e| fail(format!("cannot fetch the commit marker: {e}")))?
        .ok_or_else(|| at.lost())?;
    let range = match MapMarker::locate(&tail, size, at)? {
        Located::InTail(index) => return Ok((MapMarker::check(index, size, at)?, size, e_tag)),
        Located::At(range) => range,
    };
    let (index, now) = get_range_if(
        Arc::clone(store),
        key,
        range.offset,
        range.len,
        e_tag.clone(),
    )
    .await
    .map_err(|e| fail(format!("cannot fetch the commit marker: {e}")))?
    .ok_or_else(|| at.lost())?;
    if now != size {
        return Err(fail(format!(
            "the map's object changed while it was read ({size} byte(s), then {now})"
        )));
    }
    Ok((MapMarker::check(&index, size, at)?, size, e_tag))
}

/// An S3 reader's requests: the markers (until read), then the segment
/// being fetched.
struct Remote {
    store: Arc<dyn ObjectStore>,
    location: S3Location,
    markers: Option<BoxFuture<'static, Result<VecDeque<Piece>>>>,
    fetching: Option<Fetch>,
}

/// A segment's byte range being fetched, with the object's size.
type Fetch = BoxFuture<'static, std::result::Result<Option<(Vec<u8>, u64)>, String>>;

/// One bucket of one map to read: the segments its marker lists.
struct Piece {
    map: usize,
    bucket: usize,
    rows: u64,
    segments: VecDeque<Segment>,
    path: PathBuf,
    /// The map file's whole size, as its marker was read from it.
    size: u64,
    /// The object's entity tag, as its marker was read from it (S3): each
    /// segment is fetched only from that object, never from another
    /// attempt's that replaced it.
    e_tag: Option<String>,
    /// The map's file, once open (when local).
    file: Option<File>,
}

impl Piece {
    /// Bucket `bucket` of the map `marker` describes (closing a file of
    /// `size` bytes), unless it is empty.
    fn of(marker: &MapMarker, size: u64, root: &Path, bucket: usize) -> Option<Self> {
        let entry = &marker.buckets[bucket];
        (entry.rows > 0).then(|| Piece {
            map: marker.map as usize,
            bucket,
            rows: entry.rows,
            segments: entry.segments.iter().copied().collect(),
            path: map_path(root, marker.stage_id, marker.map as usize),
            size,
            e_tag: None,
            file: None,
        })
    }
}

/// The piece being read, and the batches of its current segment not yet
/// returned.
struct OpenPiece {
    piece: Piece,
    batches: VecDeque<RecordBatch>,
}

/// Streams a queue of pieces, one after the other, segment by segment.
struct BucketStream {
    stage_id: u64,
    /// The shuffle location read, which lost output is recorded for.
    location: PathBuf,
    schema: SchemaRef,
    queue: VecDeque<Piece>,
    current: Option<OpenPiece>,
    /// Set when the stage's output is in S3.
    remote: Option<Remote>,
    _live: LiveObject,
}

impl BucketStream {
    /// Open a local piece's file, refused when it is gone or of another
    /// size than when its marker was read (overwritten) before any byte of
    /// it is decoded.
    fn open_local(&self, piece: &Piece) -> Result<File> {
        let fail = |message: String| piece_error(self.stage_id, piece, message);
        let file = File::open(&piece.path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                self.lost(piece, "file")
            } else {
                fail(format!("cannot open: {e}"))
            }
        })?;
        let size = file
            .metadata()
            .map_err(|e| fail(format!("cannot stat: {e}")))?
            .len();
        if size != piece.size {
            return Err(fail(format!(
                "holds {size} byte(s) but its marker promised {} (overwritten?)",
                piece.size
            )));
        }
        Ok(file)
    }

    /// The error of `piece`'s map file (`what`: file or object) being gone
    /// after its marker was read: lost output, recorded as
    /// [`FailureClass::Lost`] of its map for the location read.
    fn lost(&self, piece: &Piece, what: &str) -> DataFusionError {
        failures::record(
            &self.location,
            FailureClass::Lost([self.stage_id, piece.map as u64]),
        );
        piece_error(
            self.stage_id,
            piece,
            format!(
                "lost output: the marker promised {} row(s) but the {what} is gone",
                piece.rows
            ),
        )
    }

    /// Decode `segment`'s bytes into the open piece's batches, checking
    /// their fields and their row count against the marker.
    fn decode(&mut self, segment: Segment, bytes: Vec<u8>) -> Result<()> {
        let stage_id = self.stage_id;
        let expected = Arc::clone(&self.schema);
        let open = self.current.as_mut().expect("a piece is open");
        let fail = |message: String| {
            piece_error(
                stage_id,
                &open.piece,
                format!("segment at byte {}: {message}", segment.offset),
            )
        };
        let (schema, batches) = decode_segment(bytes).map_err(fail)?;
        if !same_fields(schema.fields(), expected.fields()) {
            return Err(fail(format!(
                "holds fields [{}] but the stage publishes [{}]",
                describe_fields(schema.fields()),
                describe_fields(expected.fields())
            )));
        }
        let rows: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
        if rows != segment.rows {
            return Err(fail(format!(
                "holds {rows} row(s) but its marker promises {} (truncated?)",
                segment.rows
            )));
        }
        // Same fields as the stage's: relabel with the stage's schema to
        // keep its metadata. The row count travels explicitly: a batch may
        // have no column at all (`count(*)` above a join).
        for batch in batches {
            let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
            let relabelled = RecordBatch::try_new_with_options(
                Arc::clone(&expected),
                batch.columns().to_vec(),
                &options,
            )
            .map_err(|e| fail(e.to_string()))?;
            open.batches.push_back(relabelled);
        }
        Ok(())
    }

    /// The next batch: from the open piece's decoded segment, else by
    /// reading its next segment, else by opening the next piece.
    /// `Ready(None)`: the queue is done.
    fn poll_step(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<RecordBatch>>> {
        loop {
            if let Some(open) = self.current.as_mut() {
                if let Some(batch) = open.batches.pop_front() {
                    return Poll::Ready(Some(Ok(batch)));
                }
                if open.piece.segments.is_empty() {
                    self.current = None;
                    continue;
                }
            } else {
                if let Some(remote) = self.remote.as_mut()
                    && let Some(markers) = remote.markers.as_mut()
                {
                    let ready = futures::ready!(markers.poll_unpin(cx));
                    remote.markers = None;
                    self.queue = ready?;
                }
                let Some(mut piece) = self.queue.pop_front() else {
                    return Poll::Ready(None);
                };
                if self.remote.is_none() {
                    piece.file = Some(self.open_local(&piece)?);
                }
                self.current = Some(OpenPiece {
                    piece,
                    batches: VecDeque::new(),
                });
                continue;
            }
            let bytes = futures::ready!(self.poll_segment(cx))?;
            let open = self.current.as_mut().expect("a piece is open");
            let segment = open.piece.segments.pop_front().expect("checked above");
            self.decode(segment, bytes)?;
        }
    }

    /// The bytes of the open piece's next segment: read from its file, or
    /// fetched from its object (checking the object's size first).
    fn poll_segment(&mut self, cx: &mut Context<'_>) -> Poll<Result<Vec<u8>>> {
        let stage_id = self.stage_id;
        let open = self.current.as_mut().expect("a piece is open");
        let segment = *open.piece.segments.front().expect("a segment is left");
        let fail = |piece: &Piece, message: String| {
            piece_error(
                stage_id,
                piece,
                format!("segment at byte {}: {message}", segment.offset),
            )
        };
        if let Some(file) = &open.piece.file {
            return Poll::Ready(
                read_range(file, segment.offset, segment.bytes)
                    .map_err(|e| fail(&open.piece, format!("cannot read: {e}"))),
            );
        }
        let remote = self.remote.as_mut().expect("a remote piece");
        if remote.fetching.is_none() {
            let key = remote
                .location
                .key(&open.piece.path)
                .map_err(|e| fail(&open.piece, e))?;
            let fetch = get_range_if(
                Arc::clone(&remote.store),
                key,
                segment.offset,
                segment.bytes,
                open.piece.e_tag.clone(),
            )
            .boxed();
            remote.fetching = Some(fetch);
        }
        let fetch = remote.fetching.as_mut().expect("set above");
        let fetched = futures::ready!(fetch.poll_unpin(cx));
        remote.fetching = None;
        let fetched = fetched.map_err(|e| fail(&open.piece, format!("cannot fetch: {e}")))?;
        let Some((bytes, size)) = fetched else {
            let open = self.current.as_ref().expect("a piece is open");
            return Poll::Ready(Err(self.lost(&open.piece, "object")));
        };
        if size != open.piece.size || bytes.len() as u64 != segment.bytes {
            return Poll::Ready(Err(piece_error(
                stage_id,
                &open.piece,
                format!(
                    "holds {size} byte(s) but its marker promised {} (overwritten?)",
                    open.piece.size
                ),
            )));
        }
        Poll::Ready(Ok(bytes))
    }

    fn poll_batch(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<RecordBatch>>> {
        let polled = self.poll_step(cx);
        if let Poll::Ready(Some(Err(_))) = &polled {
            // An error ends the stream: nothing after it is read.
            self.current = None;
            self.queue.clear();
            self.remote = None;
        }
        polled
    }
}

/// `len` bytes of `file` from `offset`, into a buffer that is not zeroed
/// first (the read fills it).
fn read_range(mut file: &File, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(len as usize);
    file.seek(SeekFrom::Start(offset))?;
    file.take(len).read_to_end(&mut bytes)?;
    if bytes.len() as u64 != len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("the file ends {} byte(s) into the segment", bytes.len()),
        ));
    }
    Ok(bytes)
}

/// An error about `piece`, naming stage, map, bucket and file.
fn piece_error(stage_id: u64, piece: &Piece, message: impl fmt::Display) -> DataFusionError {
    DataFusionError::Execution(format!(
        "dfx stage {stage_id} map {} bucket {}: {message} ({})",
        piece.map,
        piece.bucket,
        piece.path.display()
    ))
}

impl Stream for BucketStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.poll_batch(cx)
    }
}

impl RecordBatchStream for BucketStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}
