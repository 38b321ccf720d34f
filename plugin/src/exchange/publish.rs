//! Publishing one map: the segments its cutters encode (see
//! [`super::cutter`]) are held by bucket until the map's input ends (see
//! [`super::staging`]), then written bucket by bucket into the map's file
//! (local, or uploaded to S3), so each bucket is one contiguous byte range;
//! then the commit marker that closes it, and the summary the writer
//! answers with: per bucket its offset, bytes and rows, with the file's
//! size and entity tag, the figures the driver hands the stage's readers. A
//! map that publishes nothing still closes an empty file, so its readers
//! find every map they expect.
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{ArrayRef, StringArray, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::{DataFusionError, Result};
use futures::StreamExt;
use futures::stream::BoxStream;

use object_store::ObjectStore;

use crate::counters::LiveObject;
use crate::exchange::cutter::EncodedSegment;
use crate::exchange::dirs::prepare_stage_dir;
use crate::exchange::files::MapFile;
use crate::exchange::locate::read_published_marker;
use crate::exchange::marker::{BucketEntry, KeysRegion, MapMarker, Segment};
use crate::exchange::staging::{Staging, Taken};
use crate::exchange::store::{ObjectKey, ObjectMap, S3Location};
use crate::filters::slot::{self, SummarySlot};
use crate::filters::summary::KeySummary;
use crate::paths::map_path;

/// Schema of the summary a map task returns: one row per bucket, its rows,
/// its bytes and where they start in the map's file; and, the same in every
/// row, the file's size, its entity tag (S3's; null for a local file) and
/// where its key summary lies (null without one). A host reads these into
/// the report's [`dfx_abi::MapLayout`].
pub static SUMMARY_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    let [bucket, rows, bytes, offset, file_bytes, e_tag] = dfx_abi::SUMMARY_COLUMNS;
    let [keys_offset, keys_bytes] = dfx_abi::SUMMARY_KEYS_COLUMNS;
    Arc::new(Schema::new(vec![
        Field::new(bucket, DataType::UInt64, false),
        Field::new(rows, DataType::UInt64, false),
        Field::new(bytes, DataType::UInt64, false),
        Field::new(offset, DataType::UInt64, false),
        Field::new(file_bytes, DataType::UInt64, false),
        Field::new(e_tag, DataType::Utf8, true),
        Field::new(keys_offset, DataType::UInt64, true),
        Field::new(keys_bytes, DataType::UInt64, true),
    ]))
});

/// What publishing a map's file found: whether this attempt's file is the
/// one published (else another attempt's was kept), and the object's
/// entity tag when it is this attempt's (S3).
pub(crate) struct PublishedFile {
    pub(crate) ours: bool,
    pub(crate) e_tag: Option<String>,
}

/// Where a map task publishes.
pub(crate) enum Target {
    /// Files under a local directory.
    Local,
    /// Objects in an S3 bucket, through the plugin's I/O runtime.
    S3 {
        store: Arc<dyn ObjectStore>,
        location: S3Location,
    },
}

/// The map's one file while it is written, in the location.
pub(crate) enum MapMain {
    File(MapFile),
    Object(ObjectMap),
}

/// The map's file while it is written, and its copy on the worker's own
/// disk when the worker keeps one to serve (shuffle durability `both`):
/// the same bytes, published only when the location's file is this
/// attempt's.
pub(crate) struct MapSink {
    main: MapMain,
    copy: Option<(MapFile, PathBuf)>,
}

impl MapSink {
    fn len(&self) -> u64 {
        match &self.main {
            MapMain::File(file) => file.len(),
            MapMain::Object(object) => object.len(),
        }
    }

    async fn append(&mut self, segment: &[u8]) -> std::result::Result<(), String> {
        match &mut self.main {
            MapMain::File(file) => file.append(segment)?,
            MapMain::Object(object) => object.append(segment).await?,
        }
        if let Some((copy, _)) = self.copy.as_mut() {
            copy.append(segment)?;
        }
        Ok(())
    }

    /// Append a segment taken back out of the staging: a spilled one is
    /// copied from the spill file into a local file without passing through
    /// memory; an upload needs its bytes.
    async fn append_taken(
        &mut self,
        taken: Taken<'_>,
        spill_near: &Path,
    ) -> std::result::Result<u64, String> {
        match (taken, &mut self.main) {
            (Taken::Spilled(from, offset, len), MapMain::File(file)) => {
                file.append_range(from, offset, len)?;
                if let Some((copy, _)) = self.copy.as_mut() {
                    copy.append_range(from, offset, len)?;
                }
                Ok(len)
            }
            (taken, _) => {
                let bytes = taken.bytes(spill_near)?;
                self.append(&bytes).await?;
                Ok(bytes.len() as u64)
            }
        }
    }

    async fn publish(self, path: &Path) -> std::result::Result<PublishedFile, String> {
        let published = match self.main {
            MapMain::File(file) => file
                .publish(path)
                .map(|ours| PublishedFile { ours, e_tag: None })?,
            MapMain::Object(object) => object
                .publish()
                .await
                .map(|(ours, e_tag)| PublishedFile { ours, e_tag })
                .map_err(|e| format!("{}: {e}", path.display()))?,
        };
        // Another attempt's file is the map's: this copy is dropped, its
        // temp file with it, and the worker serves nothing for the map.
        if let Some((copy, copy_path)) = self.copy
            && published.ours
        {
            copy.publish(&copy_path)?;
        }
        Ok(published)
    }
}

/// The work of one map task. Dropping it before `run` ends (an error, or the
/// caller dropping the stream) drops the open map file, which removes its
/// temp file (or aborts its upload): nothing is published.
pub(crate) struct MapJob {
    pub(crate) stage_id: u64,
    pub(crate) map: usize,
    /// The location's root, for the names of `paths`.
    pub(crate) root: PathBuf,
    pub(crate) target: Target,
    /// Where the worker keeps a copy of each map file it publishes, to
    /// serve it (shuffle durability `both`); `None`: no copy.
    pub(crate) copy_root: Option<PathBuf>,
    /// The rows of each segment staged so far, by bucket.
    pub(crate) segment_rows: Vec<Vec<u64>>,
    /// The encoded segments, held by bucket until the map publishes.
    pub(crate) staging: Staging,
    /// Batches staged so far (for the test hooks).
    pub(crate) batches_written: u64,
    /// The key summary of a build stage's map, complete once the input ends.
    pub(crate) summary: Option<SummarySlot>,
    /// Maps of a coalesced stage whose rows this one read: published empty
    /// after it.
    pub(crate) members: Vec<usize>,
    /// Their key summary (no key), when the stage is a build stage.
    pub(crate) empty_summary: Option<KeySummary>,
    /// Maps holding the rest of a split partition's rows, named in this
    /// map's marker (see `crate::adapt::skew_split`).
    pub(crate) companions: Vec<usize>,
    pub(crate) _live: LiveObject,
}

impl MapJob {
    fn error(&self, message: impl fmt::Display) -> DataFusionError {
        DataFusionError::Execution(format!(
            "dfx stage {} map {}: {message}",
            self.stage_id, self.map
        ))
    }

    /// Stage every segment the map's cutters encode, then publish.
    pub(crate) async fn run(
        mut self,
        mut segments: BoxStream<'static, Result<EncodedSegment>>,
    ) -> Result<RecordBatch> {
        while let Some(segment) = segments.next().await {
            let segment = segment?;
            let bucket = segment.bucket;
            self.segment_rows[bucket].push(segment.rows);
            self.staging.push(bucket, segment.bytes).map_err(|e| {
                DataFusionError::Execution(format!(
                    "dfx stage {} map {} bucket {bucket}: {}",
                    self.stage_id,
                    self.map,
                    crate::error::io_failure(&self.root, e)
                ))
            })?;
            for _ in 0..segment.batches {
                self.batches_written += 1;
                crate::test_hooks::batch_written(self.batches_written);
            }
        }
        self.publish().await
    }

    /// Start map `map`'s file (a temp file, or an upload), and its copy.
    fn create_sink(&self, map: usize) -> Result<MapSink> {
        let path = map_path(&self.root, self.stage_id, map);
        let main = match &self.target {
            Target::Local => MapFile::create(&self.root, &path).map(MapMain::File),
            Target::S3 { store, location } => location
                .key(&path)
                .map(|key| MapMain::Object(ObjectMap::create(Arc::clone(store), location, key))),
        }
        .map_err(|e| self.error(e))?;
        let copy = match &self.copy_root {
            Some(dir) => {
                prepare_stage_dir(dir, self.stage_id).map_err(|e| {
                    self.error(format!(
                        "cannot prepare the directory of the worker's copies: {e}"
                    ))
                })?;
                let copy_path = map_path(dir, self.stage_id, map);
                let file = MapFile::create(dir, &copy_path).map_err(|e| self.error(e))?;
                Some((file, copy_path))
            }
            None => None,
        };
        Ok(MapSink { main, copy })
    }

    /// Write every bucket's segments, close the map's file with its marker,
    /// publish it.
    async fn publish(mut self) -> Result<RecordBatch> {
        // Bucket by bucket, so each is one contiguous range of the file.
        let mut sink = self.create_sink(self.map)?;
        let spill_near = map_path(&self.root, self.stage_id, self.map);
        let mut buckets = Vec::with_capacity(self.segment_rows.len());
        for (bucket, rows) in std::mem::take(&mut self.segment_rows)
            .into_iter()
            .enumerate()
        {
            let mut entry = BucketEntry {
                bucket: bucket as u64,
                rows: 0,
                bytes: 0,
                segments: Vec::new(),
            };
            let (stage_id, map) = (self.stage_id, self.map);
            let fail = |e: String| {
                DataFusionError::Execution(format!(
                    "dfx stage {stage_id} map {map} bucket {bucket}: {e}"
                ))
            };
            for (taken, rows) in self.staging.take(bucket).into_iter().zip(rows) {
                let offset = sink.len();
                let bytes = sink.append_taken(taken, &spill_near).await.map_err(fail)?;
                entry.rows += rows;
                entry.bytes += bytes;
                entry.segments.push(Segment {
                    offset,
                    bytes,
                    rows,
                });
            }
            buckets.push(entry);
        }
        // Complete: `run` read the input to its end before publishing.
        let keys = match self.summary.as_ref().and_then(slot::finish) {
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
        let size = sink.len();
        let published = sink.publish(&path).await.map_err(|e| self.error(e))?;
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
        if published.ours {
            return summary_batch(&marker, size, published.e_tag.as_deref());
        }
        // Another attempt of this map published first and its file was
        // kept: the summary describes that file, the one readers will read
        // (its layout may differ from this attempt's).
        let s3 = match &self.target {
            Target::Local => None,
            Target::S3 { store, location } => Some((store, location)),
        };
        let (kept, size, e_tag) = read_published_marker(
            &self.root,
            s3,
            self.stage_id,
            self.map,
            marker.buckets.len(),
        )
        .await?;
        summary_batch(&kept, size, e_tag.as_deref())
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

/// The summary of a map file of `size` bytes (entity tag `e_tag`) closed
/// by `marker`: a bucket's offset is its first segment's (its segments are
/// contiguous), 0 for an empty one; the key summary's region, if any.
fn summary_batch(marker: &MapMarker, size: u64, e_tag: Option<&str>) -> Result<RecordBatch> {
    let entries = &marker.buckets;
    let column = |f: &dyn Fn(&BucketEntry) -> u64| -> ArrayRef {
        Arc::new(UInt64Array::from_iter_values(entries.iter().map(f)))
    };
    let keys = |f: &dyn Fn(&KeysRegion) -> u64| -> ArrayRef {
        let value = marker.keys.as_ref().map(f);
        Arc::new(UInt64Array::from_iter(entries.iter().map(|_| value)))
    };
    Ok(RecordBatch::try_new(
        Arc::clone(&SUMMARY_SCHEMA),
        vec![
            column(&|e| e.bucket),
            column(&|e| e.rows),
            column(&|e| e.bytes),
            column(&|e| e.segments.first().map_or(0, |s| s.offset)),
            column(&|_| size),
            Arc::new(StringArray::from_iter(entries.iter().map(|_| e_tag))),
            keys(&|k| k.offset),
            keys(&|k| k.bytes),
        ],
    )?)
}
