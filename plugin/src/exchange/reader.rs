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
//! Before streaming anything it checks the commit marker of every map it
//! reads; then each file's fields against the stage's schema, and each
//! file's row count against its marker. Every error names stage, map, bucket
//! and file. Reading never computes: lost output is an error, not a rerun.

use std::collections::VecDeque;
use std::fmt;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, ReplaceChildrenOptions,
};
use futures::Stream;

use super::files::{describe_fields, open_bucket, same_fields};
use super::ipc_check::check_stream;
use super::marker::MapMarker;
use super::writer::ShuffleWriterExec;
use crate::counters::LiveObject;
use crate::guard::{self, GuardedStream};
use crate::paths::{bucket_path, marker_path};

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
                    EquivalenceProperties::new(Arc::clone(&schema)),
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
                EquivalenceProperties::new(Arc::clone(&schema)),
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

    /// The `(map, bucket)` pieces of `partition`, in reading order.
    fn pieces(&self, partition: usize) -> Vec<(usize, usize)> {
        match self.mode {
            ReadMode::Hash => (0..self.maps).map(|m| (m, partition)).collect(),
            ReadMode::PassThrough => vec![(partition, 0)],
            ReadMode::Broadcast => (0..self.maps)
                .flat_map(|m| (0..self.buckets).map(move |b| (m, b)))
                .collect(),
        }
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
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let place = format!(
            "{READER_NODE_NAME} stage {} partition {partition}",
            self.stage_id
        );
        let stream = guard::catch(format_args!("{place} execute"), || self.open(partition))?;
        Ok(GuardedStream::wrap(place, stream))
    }
}

impl ShuffleReaderExec {
    /// `execute`'s body: check the markers, queue the partition's files.
    fn open(&self, partition: usize) -> Result<SendableRecordBatchStream> {
        let count = self.partitions();
        if partition >= count {
            return Err(self.error(
                partition,
                format!("out of range: the reader has {count} partition(s)"),
            ));
        }
        let pieces = self.pieces(partition);
        // Every marker first: a lost map fails the read before any row flows.
        let mut markers: Vec<Option<MapMarker>> = vec![None; self.maps];
        let mut queue = VecDeque::new();
        for (map, bucket) in pieces {
            if markers[map].is_none() {
                let path = marker_path(&self.shuffle_dir, self.stage_id, map);
                markers[map] = Some(MapMarker::read(&path, self.stage_id, map, self.buckets)?);
            }
            let (rows, bytes) = markers[map].as_ref().map_or((0, 0), |m| {
                (m.buckets[bucket].rows, m.buckets[bucket].bytes)
            });
            if rows > 0 {
                queue.push_back(Piece {
                    map,
                    bucket,
                    rows,
                    bytes,
                    path: bucket_path(&self.shuffle_dir, self.stage_id, map, bucket),
                });
            }
        }
        Ok(Box::pin(BucketStream {
            stage_id: self.stage_id,
            schema: Arc::clone(&self.schema),
            queue,
            current: None,
            _live: LiveObject::new(),
        }))
    }
}

/// One published bucket file to read, and the rows its marker promises.
struct Piece {
    map: usize,
    bucket: usize,
    rows: u64,
    /// The file's size, as its marker records it.
    bytes: u64,
    path: PathBuf,
}

struct OpenPiece {
    piece: Piece,
    reader: StreamReader<BufReader<File>>,
    rows_read: u64,
}

/// Streams a queue of bucket files, one after the other.
struct BucketStream {
    stage_id: u64,
    schema: SchemaRef,
    queue: VecDeque<Piece>,
    current: Option<OpenPiece>,
    _live: LiveObject,
}

impl BucketStream {
    fn error(&self, piece: &Piece, message: impl fmt::Display) -> DataFusionError {
        piece_error(self.stage_id, piece, message)
    }

    fn open(&self, piece: Piece) -> Result<OpenPiece> {
        // The size first: a truncated or overwritten file is refused before
        // a decoder sees it.
        match std::fs::metadata(&piece.path) {
            Ok(meta) if meta.len() != piece.bytes => {
                return Err(self.error(
                    &piece,
                    format!(
                        "holds {} byte(s) but its marker promises {} (truncated or overwritten?)",
                        meta.len(),
                        piece.bytes
                    ),
                ));
            }
            // Every size the stream declares fits in the file, before Arrow
            // allocates it (see `ipc_check`).
            Ok(_) => check_stream(&piece.path, piece.bytes).map_err(|why| {
                self.error(&piece, format!("not a readable Arrow IPC stream: {why}"))
            })?,
            // A missing file is reported by the open below.
            Err(_) => {}
        }
        // Arrow's IPC reader panics on some corrupt streams instead of
        // failing (fuzzing found a buffer offset beyond the message body):
        // that is a corrupt file, reported as one, naming it.
        let opened = guard::catch_decoder(|| open_bucket(&piece.path)).map_err(|panic| {
            self.error(
                &piece,
                format!("not a readable Arrow IPC stream: the decoder failed on it ({panic})"),
            )
        })?;
        let reader = match opened {
            Ok(Ok(reader)) => reader,
            Ok(Err(e)) => {
                return Err(self.error(&piece, format!("not a readable Arrow IPC stream: {e}")));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(self.error(
                    &piece,
                    format!(
                        "lost output: the marker promises {} row(s) but the file is missing",
                        piece.rows
                    ),
                ));
            }
            Err(e) => return Err(self.error(&piece, format!("cannot open: {e}"))),
        };
        if !same_fields(reader.schema().fields(), self.schema.fields()) {
            return Err(self.error(
                &piece,
                format!(
                    "holds fields [{}] but the stage publishes [{}]",
                    describe_fields(reader.schema().fields()),
                    describe_fields(self.schema.fields())
                ),
            ));
        }
        Ok(OpenPiece {
            piece,
            reader,
            rows_read: 0,
        })
    }

    fn next_batch(&mut self) -> Option<Result<RecordBatch>> {
        loop {
            if self.current.is_none() {
                let piece = self.queue.pop_front()?;
                match self.open(piece) {
                    Ok(open) => self.current = Some(open),
                    Err(e) => {
                        self.queue.clear();
                        return Some(Err(e));
                    }
                }
            }
            let open = self.current.as_mut().expect("opened above");
            let next = match guard::catch_decoder(|| open.reader.next()) {
                Ok(next) => next,
                // See `open`: a panic of the decoder is a corrupt file.
                Err(panic) => Some(Err(ArrowError::IpcError(format!(
                    "the decoder failed on corrupt bytes ({panic})"
                )))),
            };
            match next {
                Some(Ok(batch)) => {
                    open.rows_read += batch.num_rows() as u64;
                    // Same fields as the stage's (checked at open): relabel
                    // with the stage's schema to keep its metadata.
                    // The row count travels explicitly: a batch may have no
                    // column at all (`count(*)` above a join).
                    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
                    let relabelled = RecordBatch::try_new_with_options(
                        Arc::clone(&self.schema),
                        batch.columns().to_vec(),
                        &options,
                    )
                    .map_err(|e| piece_error(self.stage_id, &open.piece, format!("{e}")));
                    return Some(relabelled);
                }
                Some(Err(e)) => {
                    let err = piece_error(self.stage_id, &open.piece, format!("cannot read: {e}"));
                    self.current = None;
                    self.queue.clear();
                    return Some(Err(err));
                }
                None => {
                    let open = self.current.take().expect("checked above");
                    if open.rows_read != open.piece.rows {
                        self.queue.clear();
                        return Some(Err(piece_error(
                            self.stage_id,
                            &open.piece,
                            format!(
                                "holds {} row(s) but its marker promises {} (truncated?)",
                                open.rows_read, open.piece.rows
                            ),
                        )));
                    }
                }
            }
        }
    }
}

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

    fn poll_next(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Poll::Ready(self.next_batch())
    }
}

impl RecordBatchStream for BucketStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}
