//! A map task's commit marker: the index closing its file
//! `stage-<S>/<K>-map-<M>.arrow`.
//!
//! The file is the map's segments, then this index (JSON), then a footer of
//! 16 bytes: the index's length (u64, little-endian) and [`FOOTER_MAGIC`]
//! (both defined in `dfx_abi`, for whoever reads a shuffle by hand).
//! A segment is one self-contained Arrow IPC stream (schema, batch, end) at
//! a byte range of the file; a bucket's segments, read in order, are its
//! rows in the order the map produced them. The file is written under a
//! temp name and renamed into place whole, so the rename is the commit: a
//! file at the published name ends with its index. A map whose buckets are
//! all empty still publishes a file (the index alone), so a reader can tell
//! a lost map from an empty one, a truncated or overwritten file from a
//! complete one, and reads only its own bucket's bytes.
//!
//! The index once was a file of its own, written after the data; one file
//! per map halves the files a query creates, and creating a file is the
//! costly part of a local shuffle.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use datafusion::common::{DataFusionError, Result};
use dfx_abi::FailureClass;
use serde::{Deserialize, Serialize};

use crate::error;

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
    /// Bytes of the map's segments: where the index starts in the file.
    pub bytes: u64,
    /// One entry per bucket, in bucket order.
    pub buckets: Vec<BucketEntry>,
    /// Where the summary of the map's join keys is in the file, when its
    /// stage is the build side of a join whose probe side is filtered by it
    /// (see [`crate::filters`]). Written before the marker, so a published
    /// map always has its summary (both are committed at once), and apart
    /// from it, so a reader of the map's buckets never reads the summary
    /// (a Bloom filter of some hundred kilobytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<KeysRegion>,
    /// Maps of the same stage that hold the rest of this map's rows: the
    /// other tasks of a partition split among several (see
    /// [`crate::adapt::skew_split`]). Every reader of this map reads them
    /// too, so what a map means is the same with or without a split.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub companions: Vec<u64>,
}

/// The byte range of a map's key summary (JSON) in its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeysRegion {
    /// Where it starts in the file.
    pub offset: u64,
    /// Its length.
    pub bytes: u64,
}

/// The last 8 bytes of every map file.
pub use dfx_abi::MAP_FOOTER_MAGIC as FOOTER_MAGIC;

/// Bytes of the footer: the index's length, then [`FOOTER_MAGIC`].
pub use dfx_abi::MAP_FOOTER_BYTES as FOOTER_BYTES;

/// How many of a file's last bytes a remote reader asks for first: enough
/// for the footer and the index of any map with a few hundred segments, so
/// that one request usually finds both.
pub const TAIL_GUESS: u64 = 64 * 1024;

/// The same for a local file: one read, sized for the markers of a few
/// dozen segments, as a query's maps mostly have.
const LOCAL_TAIL_GUESS: u64 = 4096;

/// Where a map file's marker is, given the file's last bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Located<'a> {
    /// Whole within those bytes.
    InTail(&'a [u8]),
    /// Partly before them: these bytes of the file are to be read.
    At(IndexRange),
}

/// The map file a reader opens: where it is, which map of which stage it
/// must be, how many buckets it must have, and the bucket wanted from it
/// first. Every error names them.
#[derive(Debug, Clone, Copy)]
pub struct MapFileRef<'a> {
    /// The shuffle location the file is under, which a missing file's class
    /// is recorded for.
    pub location: &'a Path,
    /// The file (or object) name.
    pub path: &'a Path,
    /// The stage.
    pub stage_id: u64,
    /// The map.
    pub map: usize,
    /// The bucket the reader wants first.
    pub bucket: usize,
    /// Buckets per map of the stage.
    pub buckets: usize,
}

impl MapFileRef<'_> {
    /// An error about this map file, naming stage, map, bucket and file.
    pub fn error(&self, what: impl std::fmt::Display) -> DataFusionError {
        DataFusionError::Execution(format!(
            "dfx stage {} map {} bucket {}: {what} ({})",
            self.stage_id,
            self.map,
            self.bucket,
            self.path.display()
        ))
    }

    /// The error of this map file being missing: lost output ([`LOST`]),
    /// recorded as [`FailureClass::Lost`] of the map for the location, so
    /// the host runs the map again before this reader.
    pub fn lost(&self) -> DataFusionError {
        error::record(
            self.location,
            FailureClass::Lost([self.stage_id, self.map as u64]),
        );
        self.error(LOST)
    }
}

/// Where a map file's index is, as its footer says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexRange {
    /// Its first byte in the file.
    pub offset: u64,
    /// Its length.
    pub len: u64,
}

impl MapMarker {
    /// The bytes closing the map's file: the index, then the footer.
    ///
    /// # Errors
    ///
    /// Never in practice (plain numbers); named by stage and map if it did.
    pub fn trailer(&self) -> Result<Vec<u8>> {
        let mut bytes = serde_json::to_vec(self).map_err(|e| {
            DataFusionError::Execution(format!(
                "dfx stage {} map {}: cannot encode the commit marker: {e}",
                self.stage_id, self.map
            ))
        })?;
        let len = bytes.len() as u64;
        bytes.extend_from_slice(&len.to_le_bytes());
        bytes.extend_from_slice(FOOTER_MAGIC);
        Ok(bytes)
    }

    /// Read and check the marker closing the map file `at`; returns it and
    /// the file's size (which the reader checks again when it reopens the
    /// file for its segments: the file is closed in between, so that a
    /// reader of many maps holds one open file at a time, not one per map).
    ///
    /// # Errors
    ///
    /// A missing file (the map's output was never published or was lost),
    /// an unreadable or truncated one, or one describing another map or
    /// bucket count; each names the stage, the map and the file.
    /// A missing file is lost output ([`MapFileRef::lost`]).
    pub fn read(at: &MapFileRef<'_>) -> Result<(Self, u64)> {
        let fail = |what: String| at.error(what);
        let file = File::open(at.path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                at.lost()
            } else {
                fail(format!("cannot open the map's file: {e}"))
            }
        })?;
        let size = file
            .metadata()
            .map_err(|e| fail(format!("cannot stat the map's file: {e}")))?
            .len();
        let read_at = |offset: u64, len: u64| -> Result<Vec<u8>> {
            let mut bytes = vec![0; len as usize];
            file.read_exact_at(&mut bytes, offset)
                .map_err(|e| fail(format!("cannot read the commit marker: {e}")))?;
            Ok(bytes)
        };
        let tail_len = size.min(LOCAL_TAIL_GUESS);
        let tail = read_at(size - tail_len, tail_len)?;
        let marker = match Self::locate(&tail, size, at)? {
            Located::InTail(index) => Self::check(index, size, at)?,
            Located::At(range) => Self::check(&read_at(range.offset, range.len)?, size, at)?,
        };
        Ok((marker, size))
    }

    /// Where the marker is in a file of `size` bytes whose last bytes are
    /// `tail`: within them, or at a range still to be read.
    ///
    /// # Errors
    ///
    /// Those of [`MapMarker::index_range`].
    pub fn locate<'a>(tail: &'a [u8], size: u64, at: &MapFileRef<'_>) -> Result<Located<'a>> {
        let range = Self::index_range(tail, size, at)?;
        let in_tail = tail.len() as u64 - FOOTER_BYTES;
        Ok(if range.len <= in_tail {
            Located::InTail(&tail[(in_tail - range.len) as usize..in_tail as usize])
        } else {
            Located::At(range)
        })
    }

    /// Where the index is in a file of `size` bytes whose last bytes are
    /// `tail` (at least the footer).
    ///
    /// # Errors
    ///
    /// A tail shorter than the footer, a footer without the magic (a
    /// truncated file, or not a map file) or an index longer than the file.
    pub fn index_range(tail: &[u8], size: u64, at: &MapFileRef<'_>) -> Result<IndexRange> {
        let fail = |what: String| at.error(what);
        let footer_start = tail
            .len()
            .checked_sub(FOOTER_BYTES as usize)
            .ok_or_else(|| fail(short_file(size)))?;
        let footer = &tail[footer_start..];
        if &footer[8..] != FOOTER_MAGIC {
            return Err(fail(format!(
                "the map's file does not end with the commit marker's footer ({size} byte(s): \
                 truncated, or not a map file)"
            )));
        }
        let len = u64::from_le_bytes(footer[..8].try_into().expect("8 bytes"));
        let offset = size
            .checked_sub(FOOTER_BYTES)
            .and_then(|end| end.checked_sub(len))
            .ok_or_else(|| {
                fail(format!(
                    "the commit marker is not valid: its footer promises an index of {len} \
                     byte(s) in a file of {size}"
                ))
            })?;
        Ok(IndexRange { offset, len })
    }

    /// Check the marker `bytes` closing the map file (or object) `at` of
    /// `size` bytes, as [`MapMarker::read`] does.
    ///
    /// # Errors
    ///
    /// Those of [`MapMarker::read`].
    pub fn check(bytes: &[u8], size: u64, at: &MapFileRef<'_>) -> Result<Self> {
        let (stage_id, map, buckets) = (at.stage_id, at.map, at.buckets);
        let fail = |what: String| at.error(what);
        let marker: MapMarker = serde_json::from_slice(bytes)
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
        let expected = marker
            .bytes
            .checked_add(bytes.len() as u64)
            .and_then(|n| n.checked_add(FOOTER_BYTES));
        if expected != Some(size) {
            return Err(fail(format!(
                "the map's file holds {size} byte(s) but its commit marker promises {} of \
                 segments before it (truncated or overwritten?)",
                marker.bytes
            )));
        }
        if let Some(keys) = &marker.keys
            && keys
                .offset
                .checked_add(keys.bytes)
                .is_none_or(|end| end > marker.bytes)
        {
            return Err(fail(format!(
                "the commit marker is not valid: its key summary of {} byte(s) at {} lies \
                 beyond the segments' {}",
                keys.bytes, keys.offset, marker.bytes
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
                     {}, beyond the segments' {}",
                    entry.bucket, segment.bytes, segment.offset, marker.bytes
                )));
            }
        }
        Ok(marker)
    }
}

/// Why a missing map file is lost output, for people: hosts take the class
/// the reader records with it ([`MapFileRef::lost`]), not these words.
///
/// The second sentence is for the one way a user meets it outside a run: a
/// plan of a session with a shuffle location collected directly (a
/// DataFrame's `collect()`), whose stages no driver ran.
pub const LOST: &str = "lost output: the map's file is missing, so its output was never \
                        published or has been removed. Stage output is published only when \
                        a driver runs the plan's stages: run a query of a session with a \
                        shuffle location with run_distributed (or `dfx run`), not collect()";

fn short_file(size: u64) -> String {
    format!(
        "the map's file holds {size} byte(s), too few for the commit marker's footer \
         (truncated?)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marker() -> MapMarker {
        MapMarker {
            stage_id: 2,
            map: 1,
            attempt: 0,
            bytes: 10,
            companions: Vec::new(),
            buckets: vec![
                BucketEntry {
                    bucket: 0,
                    rows: 3,
                    bytes: 10,
                    segments: vec![Segment {
                        offset: 0,
                        bytes: 10,
                        rows: 3,
                    }],
                },
                BucketEntry {
                    bucket: 1,
                    rows: 0,
                    bytes: 0,
                    segments: vec![],
                },
            ],
            keys: None,
        }
    }

    fn at(path: &Path) -> MapFileRef<'_> {
        MapFileRef {
            location: Path::new("/s"),
            path,
            stage_id: 2,
            map: 1,
            bucket: 0,
            buckets: 2,
        }
    }

    #[test]
    fn a_trailer_reads_back_from_the_tail_of_its_file() {
        let path = Path::new("/s/stage-2/1-map-1.arrow");
        let mut file = vec![7u8; 10];
        file.extend(marker().trailer().unwrap());
        let size = file.len() as u64;
        let range = MapMarker::index_range(&file[file.len() - 16..], size, &at(path)).unwrap();
        assert_eq!(range.offset, 10);
        assert_eq!(range.offset + range.len + FOOTER_BYTES, size);
        let index = &file[range.offset as usize..(range.offset + range.len) as usize];
        assert_eq!(MapMarker::check(index, size, &at(path)).unwrap(), marker());
        // The same bytes in a file one byte longer do not add up.
        let err = MapMarker::check(index, size + 1, &at(path)).unwrap_err();
        assert!(
            err.to_string().contains("truncated or overwritten"),
            "{err}"
        );
    }

    #[test]
    fn a_key_summary_beyond_the_segments_is_refused() {
        let path = Path::new("/s/stage-2/1-map-1.arrow");
        let mut inside = marker();
        inside.keys = Some(KeysRegion {
            offset: 4,
            bytes: 6,
        });
        let mut beyond = inside.clone();
        beyond.keys = Some(KeysRegion {
            offset: 4,
            bytes: 7,
        });
        for (marker, ok) in [(inside, true), (beyond, false)] {
            let index = serde_json::to_vec(&marker).unwrap();
            let size = 10 + index.len() as u64 + FOOTER_BYTES;
            let checked = MapMarker::check(&index, size, &at(path));
            assert_eq!(checked.is_ok(), ok, "{checked:?}");
        }
    }

    #[test]
    fn a_footer_that_is_not_one_is_named() {
        let path = Path::new("/s/stage-2/1-map-1.arrow");
        let err = MapMarker::index_range(&[0; 16], 16, &at(path)).unwrap_err();
        let message = err.to_string();
        for part in [
            "dfx stage 2 map 1 bucket 0",
            "footer",
            "/s/stage-2/1-map-1.arrow",
        ] {
            assert!(message.contains(part), "{part:?} not in {message}");
        }
        let err = MapMarker::index_range(&[0; 3], 3, &at(path)).unwrap_err();
        assert!(err.to_string().contains("too few"), "{err}");
        let mut footer = 100u64.to_le_bytes().to_vec();
        footer.extend_from_slice(FOOTER_MAGIC);
        let err = MapMarker::index_range(&footer, 20, &at(path)).unwrap_err();
        assert!(err.to_string().contains("index of 100 byte(s)"), "{err}");
    }
}
