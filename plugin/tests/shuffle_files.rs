//! The writer's and reader's file contract: what a map publishes, that a
//! failed or dropped map publishes nothing, and that every damaged output is
//! an error naming stage, map, bucket and file, never a recompute.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use datafusion::common::Result;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::physical_expr::Partitioning;
use datafusion::physical_expr::expressions::col;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::{SessionConfig, SessionContext};
use dfx_plugin::config::DfxConfig;
use dfx_plugin::exchange::staging::SPILL_BYTES;
use dfx_plugin::exec::SealedInputExec;
use dfx_plugin::{ReadMode, ShuffleReaderExec, ShuffleWriterExec};
use futures::StreamExt;

/// A hash writer of stage 3 over `maps` generated partitions, 4 buckets.
fn hash_writer(dir: &Path, maps: usize, fail_at: Option<usize>) -> Arc<ShuffleWriterExec> {
    let input = generated_plan(maps, 5, 100, fail_at);
    let key = col("k", &kv_schema()).unwrap();
    Arc::new(
        ShuffleWriterExec::try_new(
            3,
            dir.to_path_buf(),
            input,
            Partitioning::Hash(vec![key], 4),
            vec![],
            1,
        )
        .unwrap(),
    )
}

/// A hash writer of stage 3 over `maps` partitions of 600,000 rows each, 4
/// buckets: in batches of 1,000 rows, each bucket of each map is several
/// segments of about a MiB, each of many batches.
fn large_hash_writer(dir: &Path, maps: usize) -> Result<Arc<ShuffleWriterExec>> {
    hash_writer_of(dir, maps, 30)
}

/// [`large_hash_writer`] with `batches` batches of 20,000 rows per map.
fn hash_writer_of(dir: &Path, maps: usize, batches: usize) -> Result<Arc<ShuffleWriterExec>> {
    let input = generated_plan(maps, batches, 20_000, None);
    let key = col("k", &kv_schema())?;
    Ok(Arc::new(ShuffleWriterExec::try_new(
        3,
        dir.to_path_buf(),
        input,
        Partitioning::Hash(vec![key], 4),
        vec![],
        1,
    )?))
}

/// A task context whose writers compress with LZ4: the damaged-file tests
/// below need LZ4 frames (declared lengths, frame checks) to damage, and
/// the local default is uncompressed.
fn lz4_task_ctx() -> Arc<datafusion::execution::TaskContext> {
    let mut config = SessionConfig::new();
    let mut dfx = DfxConfig::default();
    dfx.shuffle_compression = "lz4".to_string();
    config.options_mut().extensions.insert(dfx);
    SessionContext::new_with_config(config).task_ctx()
}

async fn run_map(writer: &Arc<ShuffleWriterExec>, map: usize) -> Result<u64> {
    published_rows(writer, map, lz4_task_ctx()).await
}

/// Every file under `dir`, relative, sorted.
fn tree(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                out.push(path.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

async fn read_all(writer: &Arc<ShuffleWriterExec>, mode: ReadMode) -> Result<usize> {
    let reader = Arc::new(ShuffleReaderExec::try_new(
        mode,
        Arc::clone(writer) as Arc<dyn ExecutionPlan>,
    )?);
    let batches = collect(reader, SessionContext::new().task_ctx()).await?;
    Ok(batches.iter().map(|b| b.num_rows()).sum())
}

#[tokio::test]
async fn a_map_publishes_one_file_closed_by_its_marker() -> Result<()> {
    let dir = temp_dir();
    let writer = hash_writer(dir.path(), 2, None);
    assert_eq!(run_map(&writer, 0).await?, 500);
    assert_eq!(run_map(&writer, 1).await?, 500);
    let files = tree(dir.path());
    // One file per map, nothing else: no directory per map, no file per
    // bucket, no marker beside it, no temp file left.
    assert_eq!(
        files,
        ["stage-3/0-map-0.arrow", "stage-3/1-map-1.arrow"],
        "{files:?}"
    );
    // Hash: bucket b of both maps; every row lands in exactly one bucket.
    assert_eq!(read_all(&writer, ReadMode::Hash).await?, 1000);
    // The marker closing the file is JSON with rows per bucket summing to
    // the map's rows, and segments exactly filling the bytes before it.
    let (segments, marker) = split_map_file(&dir.path().join("stage-3/0-map-0.arrow"));
    assert_eq!(marker["bytes"], segments.len() as u64, "{marker}");
    assert_eq!(marker["stage_id"], 3, "{marker}");
    assert_eq!(marker["map"], 0, "{marker}");
    let rows: u64 = marker["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["rows"].as_u64().unwrap())
        .sum();
    assert_eq!(rows, 500);
    Ok(())
}

#[tokio::test]
async fn each_bucket_is_one_contiguous_range_and_the_summary_says_where() -> Result<()> {
    let dir = temp_dir();
    let writer = large_hash_writer(dir.path(), 1)?;
    // Every bucket has several segments, encoded interleaved.
    let ctx = SessionContext::new_with_config(SessionConfig::new().with_batch_size(1_000));
    let summary = collect(writer.clone(), ctx.task_ctx()).await?;
    let layout = dfx_abi::MapLayout::from_summary(&summary).expect("a laid-out summary");
    let path = dir.path().join("stage-3/0-map-0.arrow");
    assert_eq!(layout.size, std::fs::metadata(&path)?.len());
    assert_eq!(layout.e_tag, None);
    let (_, marker) = split_map_file(&path);
    let mut next = 0;
    for (b, bucket) in marker["buckets"].as_array().unwrap().iter().enumerate() {
        let segments = bucket["segments"].as_array().unwrap();
        assert!(segments.len() > 1, "bucket {b}: {bucket}");
        // Bucket by bucket, each segment right after the one before.
        assert_eq!(layout.offsets[b], next, "bucket {b}");
        for segment in segments {
            assert_eq!(segment["offset"].as_u64().unwrap(), next, "bucket {b}");
            next += segment["bytes"].as_u64().unwrap();
        }
        assert_eq!(layout.offsets[b] + layout.bytes[b], next, "bucket {b}");
        assert_eq!(
            layout.rows[b],
            bucket["rows"].as_u64().unwrap(),
            "bucket {b}"
        );
    }
    assert_eq!(layout.rows.iter().sum::<u64>(), 600_000);
    Ok(())
}

#[tokio::test]
async fn a_map_with_every_bucket_empty_publishes_its_marker_alone() -> Result<()> {
    let dir = temp_dir();
    let input = generated_plan(1, 0, 100, None);
    let key = col("k", &kv_schema())?;
    let writer = Arc::new(ShuffleWriterExec::try_new(
        3,
        dir.path().to_path_buf(),
        input,
        Partitioning::Hash(vec![key], 4),
        vec![],
        1,
    )?);
    assert_eq!(run_map(&writer, 0).await?, 0);
    let (segments, marker) = split_map_file(&dir.path().join("stage-3/0-map-0.arrow"));
    assert!(segments.is_empty());
    assert_eq!(marker["bytes"], 0, "{marker}");
    assert_eq!(marker["buckets"].as_array().unwrap().len(), 4, "{marker}");
    // An empty map reads as no rows; a lost one is an error.
    assert_eq!(read_all(&writer, ReadMode::Hash).await?, 0);
    std::fs::remove_file(dir.path().join("stage-3/0-map-0.arrow"))?;
    let err = read_all(&writer, ReadMode::Hash).await.unwrap_err();
    assert!(err.to_string().contains("lost output"), "{err}");
    Ok(())
}

#[tokio::test]
async fn a_failed_map_publishes_nothing() -> Result<()> {
    let dir = temp_dir();
    let writer = hash_writer(dir.path(), 1, Some(3));
    let err = run_map(&writer, 0).await.unwrap_err().to_string();
    assert!(err.contains("generated failure at batch 3"), "{err}");
    assert_eq!(tree(dir.path()), Vec::<String>::new());
    Ok(())
}

/// Yields `batches` batches, then never finishes.
#[derive(Debug)]
struct Stalling {
    batches: usize,
}

impl PartitionStream for Stalling {
    fn schema(&self) -> &datafusion::arrow::datatypes::SchemaRef {
        static SCHEMA: std::sync::LazyLock<datafusion::arrow::datatypes::SchemaRef> =
            std::sync::LazyLock::new(kv_schema);
        &SCHEMA
    }

    fn execute(&self, _ctx: Arc<datafusion::execution::TaskContext>) -> SendableRecordBatchStream {
        let ready =
            (0..self.batches).map(|i| Ok(kv_batch(&[i as i64, 100 + i as i64], &[1.0, 2.0])));
        let stream = futures::stream::iter(ready).chain(futures::stream::pending());
        Box::pin(RecordBatchStreamAdapter::new(kv_schema(), stream))
    }
}

#[tokio::test]
async fn a_map_dropped_half_way_publishes_nothing() -> Result<()> {
    let dir = temp_dir();
    let input = Arc::new(StreamingTableExec::try_new(
        kv_schema(),
        vec![Arc::new(Stalling { batches: 4 }) as Arc<dyn PartitionStream>],
        None,
        vec![],
        false,
        None,
    )?);
    let key = col("k", &kv_schema())?;
    let writer = ShuffleWriterExec::try_new(
        5,
        dir.path().to_path_buf(),
        input,
        Partitioning::Hash(vec![key], 2),
        vec![],
        1,
    )?;
    // One row per segment, so the four batches are written by now.
    let ctx = SessionContext::new_with_config(SessionConfig::new().with_batch_size(1));
    let mut stream = writer.execute(0, ctx.task_ctx())?;
    let polled = tokio::time::timeout(std::time::Duration::from_millis(200), stream.next()).await;
    assert!(polled.is_err(), "the stalled map cannot have finished");
    // Four segments are staged by now (held by bucket until the input
    // ends, so each bucket is contiguous in the file): nothing published.
    assert!(
        !tree(dir.path()).iter().any(|f| f.ends_with(".arrow")),
        "{:?}",
        tree(dir.path())
    );
    drop(stream);
    assert_eq!(tree(dir.path()), Vec::<String>::new());
    Ok(())
}

/// Publish both maps, damage the output with `damage`, then read: the error
/// must name stage, map, bucket (when one is involved) and the file, and
/// nothing may be published anew.
async fn damaged(damage: impl Fn(&Path), expect: &[&str]) -> Result<()> {
    let dir = temp_dir();
    let writer = hash_writer(dir.path(), 2, None);
    run_map(&writer, 0).await?;
    run_map(&writer, 1).await?;
    damage(dir.path());
    let before = tree(dir.path());
    let err = read_all(&writer, ReadMode::Hash)
        .await
        .unwrap_err()
        .to_string();
    for needle in expect {
        assert!(err.contains(needle), "{needle:?} not in {err}");
    }
    assert_eq!(tree(dir.path()), before, "reading must not recompute");
    Ok(())
}

#[tokio::test]
async fn a_missing_map_file_is_lost_output_of_that_map() -> Result<()> {
    damaged(
        |dir| std::fs::remove_file(dir.join("stage-3/1-map-1.arrow")).unwrap(),
        &[
            "dfx stage 3 map 1 bucket",
            "lost output: the map's file is missing",
            "stage-3/1-map-1.arrow",
        ],
    )
    .await
}

#[tokio::test]
async fn a_truncated_map_file_is_named() -> Result<()> {
    for keep in [0.5, 0.999] {
        damaged(
            |dir| {
                let path = dir.join("stage-3/1-map-1.arrow");
                let bytes = std::fs::read(&path).unwrap();
                let len = (bytes.len() as f64 * keep) as usize;
                std::fs::write(&path, &bytes[..len]).unwrap();
            },
            &[
                "dfx stage 3 map 1 bucket",
                "does not end with the commit marker's footer",
                "truncated",
                "stage-3/1-map-1.arrow",
            ],
        )
        .await?;
    }
    damaged(
        |dir| std::fs::write(dir.join("stage-3/1-map-1.arrow"), b"short").unwrap(),
        &[
            "dfx stage 3 map 1 bucket",
            "too few for the commit marker's footer",
            "stage-3/1-map-1.arrow",
        ],
    )
    .await
}

#[tokio::test]
async fn a_segment_with_foreign_fields_is_named() -> Result<()> {
    damaged(
        |dir| {
            // A valid Arrow IPC stream of another table in place of map 0's
            // segments, and a marker (otherwise valid) saying it is bucket 1.
            let path = dir.join("stage-3/0-map-0.arrow");
            let schema = Arc::new(datafusion::arrow::datatypes::Schema::new(vec![
                datafusion::arrow::datatypes::Field::new(
                    "other",
                    datafusion::arrow::datatypes::DataType::Utf8,
                    true,
                ),
            ]));
            let mut w =
                datafusion::arrow::ipc::writer::StreamWriter::try_new(Vec::new(), &schema).unwrap();
            w.finish().unwrap();
            let stream = w.into_inner().unwrap();
            let len = stream.len() as u64;
            let (_, mut json) = split_map_file(&path);
            json["bytes"] = len.into();
            for (bucket, entry) in json["buckets"]
                .as_array_mut()
                .unwrap()
                .iter_mut()
                .enumerate()
            {
                let rows: u64 = if bucket == 1 { 7 } else { 0 };
                entry["rows"] = rows.into();
                entry["bytes"] = (if bucket == 1 { len } else { 0 }).into();
                entry["segments"] = if bucket == 1 {
                    serde_json::json!([{ "offset": 0, "bytes": len, "rows": 7 }])
                } else {
                    serde_json::json!([])
                };
            }
            write_map_file(&path, &stream, &json);
        },
        &[
            "dfx stage 3 map 0 bucket 1",
            "other: Utf8",
            "stage-3/0-map-0.arrow",
        ],
    )
    .await
}

#[tokio::test]
async fn a_map_file_of_another_size_than_its_marker_records_is_refused_unread() -> Result<()> {
    damaged(
        |dir| {
            let path = dir.join("stage-3/1-map-1.arrow");
            let mut bytes = std::fs::read(&path).unwrap();
            bytes.extend_from_slice(b"appended later");
            std::fs::write(&path, bytes).unwrap();
        },
        &[
            "dfx stage 3 map 1 bucket",
            "does not end with the commit marker's footer",
            "stage-3/1-map-1.arrow",
        ],
    )
    .await?;
    // A whole marker after the segments, but not where its own count of
    // segment bytes says it starts.
    damaged(
        |dir| {
            let path = dir.join("stage-3/1-map-1.arrow");
            let (mut segments, json) = split_map_file(&path);
            segments.extend_from_slice(b"inserted later");
            write_map_file(&path, &segments, &json);
        },
        &[
            "dfx stage 3 map 1 bucket",
            "but its commit marker promises",
            "stage-3/1-map-1.arrow",
        ],
    )
    .await
}

#[tokio::test]
async fn a_marker_whose_segments_overrun_the_file_is_refused() -> Result<()> {
    damaged(
        |dir| {
            let path = dir.join("stage-3/1-map-1.arrow");
            let (segments, mut json) = split_map_file(&path);
            let half = segments.len() / 2;
            json["bytes"] = half.into();
            write_map_file(&path, &segments[..half], &json);
        },
        &[
            "dfx stage 3 map 1 bucket",
            "the commit marker is not valid",
            "beyond the segments'",
            "stage-3/1-map-1.arrow",
        ],
    )
    .await
}

#[tokio::test]
async fn a_marker_of_another_map_is_refused() -> Result<()> {
    damaged(
        |dir| {
            std::fs::copy(
                dir.join("stage-3/0-map-0.arrow"),
                dir.join("stage-3/1-map-1.arrow"),
            )
            .unwrap();
        },
        &[
            "dfx stage 3 map 1 bucket",
            "the commit marker belongs to stage 3 map 0",
            "stage-3/1-map-1.arrow",
        ],
    )
    .await
}

#[tokio::test]
async fn a_buffer_declaring_more_than_lz4_can_expand_is_refused_before_allocation() -> Result<()> {
    // Before the framing check, Arrow allocated the declared 145 TB: the
    // allocation failed and the process aborted (found by fuzzing).
    damaged(
        |dir| {
            let path = dir.join("stage-3/0-map-0.arrow");
            let mut bytes = std::fs::read(&path).unwrap();
            let lz4_magic = [0x04, 0x22, 0x4d, 0x18];
            let frame = bytes
                .windows(4)
                .position(|w| w == lz4_magic)
                .expect("an LZ4-compressed buffer");
            // The 8 bytes before a frame are its buffer's uncompressed length.
            bytes[frame - 8..frame].copy_from_slice(&0x8400_0000_0000u64.to_le_bytes());
            std::fs::write(&path, bytes).unwrap();
        },
        &[
            "dfx stage 3 map 0 bucket",
            "not a readable Arrow IPC stream",
            "145135534866432 uncompressed byte(s)",
        ],
    )
    .await
}

#[tokio::test]
async fn a_bucket_of_many_segments_reads_back_whole_and_in_order() -> Result<()> {
    // Each bucket of each map is several segments, staged interleaved with
    // the other buckets' and written bucket by bucket.
    let dir = temp_dir();
    let writer = large_hash_writer(dir.path(), 2)?;
    let mut config = SessionConfig::new().with_batch_size(1_000);
    config.options_mut().extensions.insert(DfxConfig::default());
    let ctx = SessionContext::new_with_config(config);
    for map in 0..2 {
        let mut stream = writer.execute(map, ctx.task_ctx())?;
        while let Some(batch) = stream.next().await {
            batch?;
        }
    }
    let marker = read_marker(&dir.path().join("stage-3/0-map-0.arrow"));
    let buckets = marker["buckets"].as_array().unwrap();
    let segments: Vec<usize> = buckets
        .iter()
        .map(|b| b["segments"].as_array().unwrap().len())
        .collect();
    assert!(segments.iter().all(|&n| n > 1), "{segments:?}");
    // Sized by bytes, not by batches: every segment but a bucket's last
    // holds many batches and about a MiB or more.
    for bucket in buckets {
        let segments = bucket["segments"].as_array().unwrap();
        for segment in &segments[..segments.len() - 1] {
            assert!(segment["rows"].as_u64().unwrap() > 10 * 1_000, "{segment}");
            assert!(
                segment["bytes"].as_u64().unwrap() >= 512 * 1024,
                "{segment}"
            );
        }
    }
    assert_every_row_reads_back(&writer, 2, &ctx).await
}

/// Every row `writer`'s maps `0..maps` were given is read back once, from
/// the bucket of its key, each map's rows in the order it produced them
/// (the generated keys ascend, so a bucket reads as at most `maps` runs).
async fn assert_every_row_reads_back(
    writer: &Arc<ShuffleWriterExec>,
    maps: usize,
    ctx: &SessionContext,
) -> Result<()> {
    // Each hash partition holds exactly its keys, every row once, and
    // within a map in the order the map produced them.
    let reader = Arc::new(ShuffleReaderExec::try_new(
        ReadMode::Hash,
        Arc::clone(writer) as Arc<dyn ExecutionPlan>,
    )?);
    let mut all = Vec::new();
    for partition in 0..4 {
        let batches =
            datafusion::physical_plan::common::collect(reader.execute(partition, ctx.task_ctx())?)
                .await?;
        let keys: Vec<i64> = batches
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<datafusion::arrow::array::Int64Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .collect();
        let descents = keys.windows(2).filter(|w| w[1] <= w[0]).count();
        assert!(descents < maps, "bucket {partition} is out of order");
        all.extend(keys);
    }
    all.sort_unstable();
    let mut expected: Vec<i64> = Vec::new();
    for map in 0..maps {
        let batches = datafusion::physical_plan::common::collect(
            writer.input().execute(map, ctx.task_ctx())?,
        )
        .await?;
        for b in &batches {
            expected.extend(
                b.column(0)
                    .as_any()
                    .downcast_ref::<datafusion::arrow::array::Int64Array>()
                    .unwrap()
                    .values()
                    .iter(),
            );
        }
    }
    expected.sort_unstable();
    assert_eq!(all, expected);
    Ok(())
}

#[tokio::test]
async fn a_map_past_its_staging_bound_spills_and_reads_back_whole_and_in_order() -> Result<()> {
    // 3,000,000 rows of 16 bytes: the staged segments pass the bound and
    // spill, and are copied from the spill file into the map's file.
    let dir = temp_dir();
    let writer = hash_writer_of(dir.path(), 1, 150)?;
    let mut config = SessionConfig::new().with_batch_size(20_000);
    config.options_mut().extensions.insert(DfxConfig::default());
    let ctx = SessionContext::new_with_config(config);
    let mut stream = writer.execute(0, ctx.task_ctx())?;
    while let Some(batch) = stream.next().await {
        batch?;
    }
    let file = dir.path().join("stage-3/0-map-0.arrow");
    let size = std::fs::metadata(&file)?.len();
    assert!(size > SPILL_BYTES, "{size} byte(s) would not spill");
    let marker = read_marker(&file);
    let mut next = 0;
    for bucket in marker["buckets"].as_array().unwrap() {
        for segment in bucket["segments"].as_array().unwrap() {
            assert_eq!(segment["offset"].as_u64().unwrap(), next, "{segment}");
            next += segment["bytes"].as_u64().unwrap();
        }
    }
    assert_every_row_reads_back(&writer, 1, &ctx).await
}

/// How many of this process's open files are under `dir`.
fn open_files_under(dir: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter(|target| target.starts_with(dir))
        .count()
}

#[tokio::test]
async fn a_reader_of_many_maps_holds_one_map_file_open_at_a_time() -> Result<()> {
    // A reader partition reads a bucket of every map: holding each map's
    // file from its marker's check to its segments would be one descriptor
    // per map, and the driver runs every partition of its readers at once.
    let dir = temp_dir();
    let maps = 24;
    let writer = hash_writer(dir.path(), maps, None);
    for map in 0..maps {
        run_map(&writer, map).await?;
    }
    let reader = Arc::new(ShuffleReaderExec::try_new(
        ReadMode::Hash,
        Arc::clone(&writer) as Arc<dyn ExecutionPlan>,
    )?);
    let mut stream = reader.execute(0, SessionContext::new().task_ctx())?;
    // Every marker is checked by now; no file is held for it.
    assert_eq!(open_files_under(dir.path()), 0);
    let mut rows = 0;
    while let Some(batch) = stream.next().await {
        rows += batch?.num_rows();
        assert!(open_files_under(dir.path()) <= 1);
    }
    assert!(rows > 0);
    Ok(())
}

/// Holds `bytes` of its task's memory pool from its start to its end, and
/// yields its one batch only once every partition of the slice holds theirs
/// (`all_held`), so the partitions hold their shares at the same time.
#[derive(Debug)]
struct Holding {
    bytes: usize,
    all_held: Arc<tokio::sync::Barrier>,
}

impl PartitionStream for Holding {
    fn schema(&self) -> &datafusion::arrow::datatypes::SchemaRef {
        static SCHEMA: std::sync::LazyLock<datafusion::arrow::datatypes::SchemaRef> =
            std::sync::LazyLock::new(kv_schema);
        &SCHEMA
    }

    fn execute(&self, ctx: Arc<datafusion::execution::TaskContext>) -> SendableRecordBatchStream {
        let reservation = MemoryConsumer::new("Holding").register(ctx.memory_pool());
        let held = reservation.try_grow(self.bytes);
        let all_held = Arc::clone(&self.all_held);
        let batch = futures::stream::once(async move {
            held?;
            all_held.wait().await;
            drop(reservation);
            Ok(kv_batch(&[1, 2], &[1.0, 2.0]))
        });
        Box::pin(RecordBatchStreamAdapter::new(kv_schema(), batch))
    }
}

/// Map 0 of a writer whose one map runs a slice of two partitions, each
/// holding 3 MiB at once, under a memory limit of `limit` bytes (0: none).
async fn run_slice_holding_3_mib_each(limit: u64) -> Result<u64> {
    let dir = temp_dir();
    let all_held = Arc::new(tokio::sync::Barrier::new(2));
    let partitions = (0..2)
        .map(|_| {
            Arc::new(Holding {
                bytes: 3 << 20,
                all_held: Arc::clone(&all_held),
            }) as Arc<dyn PartitionStream>
        })
        .collect();
    let input = StreamingTableExec::try_new(kv_schema(), partitions, None, vec![], false, None)?;
    // Sealed, as a worker seals a stage whose maps run slices: the plugin
    // runs the input itself, under the limit.
    let sealed = Arc::new(SealedInputExec::new(Arc::new(input)));
    let key = col("k", &kv_schema())?;
    let writer = Arc::new(ShuffleWriterExec::try_new(
        6,
        dir.path().to_path_buf(),
        sealed,
        Partitioning::Hash(vec![key], 2),
        vec![],
        2,
    )?);
    assert_eq!(writer.maps(), 1);
    let mut config = SessionConfig::new();
    let mut dfx = DfxConfig::default();
    dfx.memory_limit = limit;
    config.options_mut().extensions.insert(dfx);
    let ctx = SessionContext::new_with_config(config).task_ctx();
    let run = published_rows(&writer, 0, ctx);
    tokio::time::timeout(std::time::Duration::from_secs(60), run)
        .await
        .expect("the slice's partitions run at once, so neither waits for the other forever")
}

#[tokio::test]
async fn a_memory_limit_holds_for_a_map_task_whatever_the_partitions_of_its_slice() -> Result<()> {
    // Without a limit, and under one both partitions fit in, each publishes
    // its two rows.
    assert_eq!(run_slice_holding_3_mib_each(0).await?, 4);
    assert_eq!(run_slice_holding_3_mib_each(8 << 20).await?, 4);
    // 4 MiB holds one partition's 3 MiB, not both: the limit is the map
    // task's, not each partition's.
    let err = run_slice_holding_3_mib_each(4 << 20)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("Resources exhausted"), "{err}");
    assert!(err.contains("Holding"), "{err}");
    Ok(())
}
