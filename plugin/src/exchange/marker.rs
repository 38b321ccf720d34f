//! A map task's commit marker: `stage-<S>/map-<M>.json`, written last.
//!
//! Its presence means the map's file (`stage-<S>/map-<M>.arrow`) was
//! published whole. Its content is the file's index: its size, and for each
//! bucket the rows it holds and the segments that hold them. A segment is
//! one self-contained Arrow IPC stream (schema, batch, end) at a byte range
//! of the file; a bucket's segments, read in order, are its rows in the
//! order the map produced them. So a reader can tell a lost file from an
//! all-empty map and a truncated or overwritten file from a complete one,
//! and reads only its own bucket's bytes.

use std::path::Path;

use datafusion::common::{DataFusionError, Result};
use dfx_abi::IO_FAILURE;
use serde::{Deserialize, Serialize};

use super::files::publish_bytes;

/// One Arrow IPC stream inside a map's file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// Where it starts in the file.
    pub offset: u64,
    /// Its length.
    pub bytes: u64,
    /// The rows it holds.
    pub rows: u64,
}

/// Rows and bytes of one bucket of one map, and where they are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketEntry {
    /// The bucket.
    pub bucket: u64,
    /// Rows written into it (0: no segment).
    pub rows: u64,
    /// Bytes of its segments.
    pub bytes: u64,
    /// Its segments, in order.
    pub segments: Vec<Segment>,
}

/// What a map task published.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapMarker {
    /// The stage.
    pub stage_id: u64,
    /// The map task.
    pub map: u64,
    /// Which attempt of the map published this output (a retry overwrites).
    pub attempt: u64,
    /// Size of the map's file (0: every bucket is empty and there is no file).
    pub bytes: u64,
    /// One entry per bucket, in bucket order.
    pub buckets: Vec<BucketEntry>,
}

impl MapMarker {
    /// Publish the marker at `path` (temp file, then rename).
    pub fn publish(&self, path: &Path) -> Result<()> {
        let bytes = self.encode()?;
        publish_bytes(path, &bytes).map_err(|e| {
            DataFusionError::Execution(format!(
                "dfx stage {} map {}: {IO_FAILURE}: cannot publish the marker {}: {e}",
                self.stage_id,
                self.map,
                path.display()
            ))
        })
    }

    /// The marker's JSON.
    ///
    /// # Errors
    ///
    /// Never in practice (plain numbers); named by stage and map if it did.
    pub fn encode(&self) -> Result<Vec<u8>> {
        serde_json::to_vec(self).map_err(|e| {
            DataFusionError::Execution(format!(
                "dfx stage {} map {}: cannot encode the marker: {e}",
                self.stage_id, self.map
            ))
        })
    }

    /// Read and check the marker of map `map` of stage `stage_id` at `path`,
    /// which must describe `buckets` buckets.
    ///
    /// # Errors
    ///
    /// A missing marker (the map's output was never published or was lost),
    /// an unreadable one, or one describing another map or bucket count; each
    /// names the stage, the map and the file.
    pub fn read(path: &Path, stage_id: u64, map: usize, buckets: usize) -> Result<Self> {
        Self::check(std::fs::read(path), path, stage_id, map, buckets)
    }

    /// Check the marker whose bytes `read` returned (a local file or an
    /// object, named `path` in every error), as [`MapMarker::read`] does.
    ///
    /// # Errors
    ///
    /// Those of [`MapMarker::read`]; an `io::ErrorKind::NotFound` is lost output.
    pub fn check(
        read: std::io::Result<Vec<u8>>,
        path: &Path,
        stage_id: u64,
        map: usize,
        buckets: usize,
    ) -> Result<Self> {
        let fail = |what: String| {
            DataFusionError::Execution(format!(
                "dfx stage {stage_id} map {map}: {what} ({})",
                path.display()
            ))
        };
        let bytes = read.map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                fail(
                    "lost output: the map's commit marker is missing, so its output was never \
                     published or has been removed"
                        .to_string(),
                )
            } else {
                fail(format!("cannot read the commit marker: {e}"))
            }
        })?;
        let marker: MapMarker = serde_json::from_slice(&bytes)
            .map_err(|e| fail(format!("the commit marker is not valid: {e}")))?;
        if marker.stage_id != stage_id || marker.map != map as u64 {
            return Err(fail(format!(
                "the commit marker belongs to stage {} map {}",
                marker.stage_id, marker.map
            )));
        }
        if marker.buckets.len() != buckets
            || marker
                .buckets
                .iter()
                .enumerate()
                .any(|(i, entry)| entry.bucket != i as u64)
        {
            return Err(fail(format!(
                "the commit marker lists {} bucket(s), the reader expects {buckets}",
                marker.buckets.len()
            )));
        }
        for entry in &marker.buckets {
            let rows: u64 = entry.segments.iter().map(|s| s.rows).sum();
            let bytes: u64 = entry.segments.iter().map(|s| s.bytes).sum();
            let outside = entry.segments.iter().find(|s| {
                s.offset
                    .checked_add(s.bytes)
                    .is_none_or(|end| end > marker.bytes)
            });
            if rows != entry.rows || bytes != entry.bytes {
                return Err(fail(format!(
                    "the commit marker is not valid: bucket {} promises {} row(s) in {} byte(s), \
                     its segments hold {rows} in {bytes}",
                    entry.bucket, entry.rows, entry.bytes
                )));
            }
            if let Some(segment) = outside {
                return Err(fail(format!(
                    "the commit marker is not valid: bucket {} has a segment of {} byte(s) at \
                     {}, beyond the file's {}",
                    entry.bucket, segment.bytes, segment.offset, marker.bytes
                )));
            }
        }
        Ok(marker)
    }
}
