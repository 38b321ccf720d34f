//! The shuffle-file reader: a real `ShuffleReaderExec` reading a stage
//! directory in which part of the one map file (`stage-1/0-map-0.arrow`) is
//! the fuzzer's input: either the commit marker closing it (the file's
//! segments stay as the real writer published them, the footer gives the
//! input's length), or its one segment (closed by a marker promising it).
//! Seeds are what the real writer published, LZ4-compressed and
//! uncompressed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, BooleanArray, Float64Array, Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::Result;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::Partitioning;
use datafusion::physical_expr::expressions::col;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::prelude::{SessionConfig, SessionContext};
use dfx_plugin::exchange::marker::{BucketEntry, FOOTER_MAGIC, MapMarker, Segment};
use dfx_plugin::paths::map_path;
use dfx_plugin::{DfxConfig, ReadMode, ShuffleReaderExec, ShuffleWriterExec};
use futures::StreamExt;

use super::json_dictionary;
use crate::{Outcome, Target};

const STAGE: u64 = 1;
const ROWS: usize = 100;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Float64, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("b", DataType::Boolean, true),
    ]))
}

/// The rows every seed holds: nulls, empty and multi-byte strings.
fn batch() -> RecordBatch {
    let k: ArrayRef = Arc::new(Int64Array::from_iter_values(0..ROWS as i64));
    let v: ArrayRef = Arc::new(Float64Array::from_iter(
        (0..ROWS).map(|i| (i % 7 != 0).then_some(i as f64 * 0.25)),
    ));
    let s: ArrayRef = Arc::new(StringArray::from_iter((0..ROWS).map(|i| match i % 5 {
        0 => None,
        1 => Some(String::new()),
        2 => Some(format!("straße-{i}")),
        _ => Some(format!("row {i}")),
    })));
    let b: ArrayRef = Arc::new(BooleanArray::from_iter(
        (0..ROWS).map(|i| (i % 3 != 0).then_some(i % 2 == 0)),
    ));
    RecordBatch::try_new(schema(), vec![k, v, s, b]).expect("the columns match the schema")
}

/// One partition streaming [`batch`].
#[derive(Debug)]
struct Rows;

impl PartitionStream for Rows {
    fn schema(&self) -> &SchemaRef {
        static SCHEMA: std::sync::LazyLock<SchemaRef> = std::sync::LazyLock::new(schema);
        &SCHEMA
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        Box::pin(RecordBatchStreamAdapter::new(
            schema(),
            futures::stream::iter([Ok(batch())]),
        ))
    }
}

/// A writer of stage 1 over one partition of [`batch`], publishing into `dir`.
fn writer(dir: &Path, partitioning: Partitioning) -> Result<Arc<ShuffleWriterExec>> {
    let input: Arc<dyn ExecutionPlan> = Arc::new(StreamingTableExec::try_new(
        schema(),
        vec![Arc::new(Rows)],
        None,
        vec![],
        false,
        None,
    )?);
    Ok(Arc::new(ShuffleWriterExec::try_new(
        STAGE,
        dir.to_path_buf(),
        input,
        partitioning,
        vec![],
        1,
    )?))
}

/// Run map 0 of `writer` as a worker would, with batches of `batch_size`
/// rows (each full batch of a bucket is a segment of its own) and the given
/// compression (`lz4` or `none`).
fn publish(writer: &Arc<ShuffleWriterExec>, compression: &str, batch_size: usize) -> Result<()> {
    let mut dfx = DfxConfig::default();
    dfx.shuffle_compression = compression.to_string();
    let mut config = SessionConfig::new().with_batch_size(batch_size);
    config.options_mut().extensions.insert(dfx);
    let ctx = SessionContext::new_with_config(config);
    futures::executor::block_on(async {
        let mut summary = writer.execute(0, ctx.task_ctx())?;
        while let Some(batch) = summary.next().await {
            batch?;
        }
        Ok(())
    })
}

/// A scratch directory, in memory when the machine has `/dev/shm`: every
/// input is written to a file.
fn scratch() -> Result<tempfile::TempDir, String> {
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::Builder::new().prefix("dfx-fuzz-").tempdir_in(shm)
    } else {
        tempfile::Builder::new().prefix("dfx-fuzz-").tempdir()
    };
    dir.map_err(|e| format!("cannot make a scratch directory: {e}"))
}

fn fail(e: impl std::fmt::Display) -> String {
    format!("cannot make the seeds: {e}")
}

/// Execute every partition of `reader` to the end.
fn read_all(reader: &ShuffleReaderExec, ctx: &Arc<TaskContext>) -> Result<usize> {
    let partitions = reader.properties().output_partitioning().partition_count();
    futures::executor::block_on(async {
        let mut rows = 0;
        for partition in 0..partitions {
            let mut stream = reader.execute(partition, Arc::clone(ctx))?;
            while let Some(batch) = stream.next().await {
                rows += batch?.num_rows();
            }
        }
        Ok(rows)
    })
}

/// The reader's promise: a bad file is an error naming the stage, never a
/// panic (not even one the plugin's guard turned into an error).
fn judge(result: Result<usize>) -> Result<Outcome, String> {
    match result {
        Ok(_) => Ok(Outcome::Accepted),
        Err(e) => {
            let message = e.to_string();
            if message.contains(dfx_plugin::guard::PANIC_PREFIX) {
                return Err(format!("the plugin's guard caught a panic: {message}"));
            }
            if !message.contains(&format!("stage {STAGE}")) {
                return Err(format!("an error that does not name the stage: {message}"));
            }
            Ok(Outcome::Refused)
        }
    }
}

/// A map file of `segments` closed by the marker `marker`, as the writer
/// lays it out.
fn map_file(segments: &[u8], marker: &[u8]) -> Vec<u8> {
    let mut bytes = segments.to_vec();
    bytes.extend_from_slice(marker);
    bytes.extend_from_slice(&(marker.len() as u64).to_le_bytes());
    bytes.extend_from_slice(FOOTER_MAGIC);
    bytes
}

/// A published map file's segments and the marker closing them.
fn split_map_file(file: &[u8]) -> Result<(&[u8], Vec<u8>), String> {
    let range = dfx_abi::map_marker_range(file)
        .ok_or_else(|| fail("the published map file does not end with a marker"))?;
    Ok((&file[..range.start], file[range].to_vec()))
}

/// A hash stage of one map and two buckets whose marker is the input.
pub struct MarkerTarget {
    _dir: tempfile::TempDir,
    /// The map file.
    path: PathBuf,
    /// The segments the real writer published before its marker.
    segments: Vec<u8>,
    reader: ShuffleReaderExec,
    ctx: Arc<TaskContext>,
    seeds: Vec<Vec<u8>>,
}

impl MarkerTarget {
    /// Publish the stage with the real writer; its marker is the seed.
    ///
    /// # Errors
    ///
    /// When the stage cannot be published.
    pub fn new() -> Result<Self, String> {
        let dir = scratch()?;
        let partitioning = Partitioning::Hash(vec![col("k", &schema()).map_err(fail)?], 2);
        let writer = writer(dir.path(), partitioning).map_err(fail)?;
        // Small batches: the marker indexes several segments per bucket.
        publish(&writer, "lz4", 32).map_err(fail)?;
        let path = map_path(dir.path(), STAGE, 0);
        let file = std::fs::read(&path).map_err(fail)?;
        let (segments, seed) = split_map_file(&file)?;
        let reader = ShuffleReaderExec::try_new(ReadMode::Hash, writer).map_err(fail)?;
        Ok(Self {
            _dir: dir,
            path,
            segments: segments.to_vec(),
            reader,
            ctx: SessionContext::new().task_ctx(),
            seeds: vec![seed],
        })
    }
}

impl Target for MarkerTarget {
    fn name(&self) -> &'static str {
        "marker"
    }

    fn seeds(&self) -> Vec<Vec<u8>> {
        self.seeds.clone()
    }

    fn dictionary(&self) -> Vec<Vec<u8>> {
        let mut tokens = json_dictionary();
        for key in [
            "\"stage_id\"",
            "\"map\"",
            "\"attempt\"",
            "\"buckets\"",
            "\"bucket\"",
            "\"rows\"",
            "\"bytes\"",
            "\"segments\"",
            "\"offset\"",
            "{\"bucket\":1,\"rows\":0,\"bytes\":0,\"segments\":[]}",
        ] {
            tokens.push(key.as_bytes().to_vec());
        }
        tokens
    }

    fn run(&mut self, input: &[u8]) -> Result<Outcome, String> {
        std::fs::write(&self.path, map_file(&self.segments, input))
            .map_err(|e| format!("cannot write the input: {e}"))?;
        judge(read_all(&self.reader, &self.ctx))
    }
}

/// A one-bucket stage whose map file's one segment is the input. The
/// marker closing it promises the seed's rows in one segment of the input's
/// size, so the reader's size checks pass and the input reaches the Arrow
/// IPC decoder.
pub struct BucketTarget {
    _dir: tempfile::TempDir,
    bucket: PathBuf,
    reader: ShuffleReaderExec,
    ctx: Arc<TaskContext>,
    seeds: Vec<Vec<u8>>,
}

impl BucketTarget {
    /// Publish the stage twice with the real writer (LZ4, then
    /// uncompressed); both map files (one segment each) are seeds.
    ///
    /// # Errors
    ///
    /// When the stage cannot be published.
    pub fn new() -> Result<Self, String> {
        let dir = scratch()?;
        let writer = writer(dir.path(), Partitioning::UnknownPartitioning(1)).map_err(fail)?;
        let bucket = map_path(dir.path(), STAGE, 0);
        let mut seeds = Vec::new();
        for compression in ["none", "lz4"] {
            // Batches larger than the rows: the map file is one segment,
            // as the marker written for each input says.
            publish(&writer, compression, 2 * ROWS).map_err(fail)?;
            let file = std::fs::read(&bucket).map_err(fail)?;
            seeds.push(split_map_file(&file)?.0.to_vec());
            // A publish never replaces a map file: the next one needs its
            // name free.
            std::fs::remove_file(&bucket).map_err(fail)?;
        }
        if seeds[0] == seeds[1] {
            return Err(fail("compression made no difference to the map file"));
        }
        let reader = ShuffleReaderExec::try_new(ReadMode::PassThrough, writer).map_err(fail)?;
        Ok(Self {
            _dir: dir,
            bucket,
            reader,
            ctx: SessionContext::new().task_ctx(),
            seeds,
        })
    }
}

impl Target for BucketTarget {
    fn name(&self) -> &'static str {
        "bucket"
    }

    fn seeds(&self) -> Vec<Vec<u8>> {
        self.seeds.clone()
    }

    fn dictionary(&self) -> Vec<Vec<u8>> {
        vec![
            // The IPC continuation marker and an end-of-stream.
            vec![0xff, 0xff, 0xff, 0xff],
            vec![0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0],
            // The LZ4 frame magic, and an uncompressed-length prefix of -1.
            vec![0x04, 0x22, 0x4d, 0x18],
            vec![0xff; 8],
        ]
    }

    fn run(&mut self, input: &[u8]) -> Result<Outcome, String> {
        let marker = MapMarker {
            stage_id: STAGE,
            map: 0,
            attempt: 0,
            bytes: input.len() as u64,
            buckets: vec![BucketEntry {
                bucket: 0,
                rows: ROWS as u64,
                bytes: input.len() as u64,
                segments: vec![Segment {
                    offset: 0,
                    bytes: input.len() as u64,
                    rows: ROWS as u64,
                }],
            }],
            keys: None,
            companions: Vec::new(),
        };
        let marker = serde_json::to_vec(&marker).map_err(|e| format!("marker: {e}"))?;
        std::fs::write(&self.bucket, map_file(input, &marker))
            .map_err(|e| format!("cannot write the input: {e}"))?;
        judge(read_all(&self.reader, &self.ctx))
    }
}
