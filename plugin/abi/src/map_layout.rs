//! Where each bucket of a published map file lies: the figures a map task
//! reports (its writer's summary, see `WorkerReport`) and the driver hands
//! the readers of its stage, so that a reader fetches a bucket's bytes
//! without first reading the file's commit marker.
//!
//! ```text
//! map file:  [bucket 0 ][bucket 1][bucket 2 ]...[key summary][marker][footer]
//!             offsets[0] offsets[1] ...            each bucket one contiguous range
//! ```
//!
//! Written once here, as serde types, for the three that speak it: the
//! plugin (which fills it from what it published and reads it back from
//! its stage settings), the runtime (which carries it in the report and
//! the stage settings) and the Python worker (through the runtime).

use std::collections::BTreeMap;

use datafusion::arrow::array::{Array, StringArray, UInt64Array};
use datafusion::arrow::record_batch::RecordBatch;
use serde::{Deserialize, Serialize};

/// The key (without the `dfx_engine.` prefix) by which the driver hands a
/// stage's tasks the layouts of every map of the stages they read.
pub const SHUFFLE_RANGES: &str = "shuffle_ranges";

/// One published map file: per bucket, where its bytes start, how many
/// there are and how many rows they hold (arrays, bucket by bucket: a
/// stage may have many buckets); the file's whole size; and, on S3, the
/// object's entity tag.
///
/// The arrays may describe a window of the buckets only, from
/// `first_bucket` on: what the driver hands a task that reads no other
/// bucket of the map ([`MapLayout::window`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapLayout {
    /// The bucket the arrays begin with (0: every bucket from the first).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub first_bucket: u64,
    /// Each bucket's first byte in the file.
    pub offsets: Vec<u64>,
    /// Each bucket's length in bytes (0: empty).
    pub bytes: Vec<u64>,
    /// Each bucket's rows.
    pub rows: Vec<u64>,
    /// The file's (or object's) whole size, so a reader can tell an
    /// overwritten file from the one described.
    pub size: u64,
    /// The object's entity tag (S3), which every ranged read must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e_tag: Option<String>,
    /// Where the key summary of a build stage's map lies: its first byte
    /// and length; `None` when the map has none or its worker did not say
    /// (a reader then finds it through the marker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<(u64, u64)>,
    /// The map server holding the file on its worker's disk
    /// (`http://host:port`), when its stage's maps are served rather than
    /// shared: a reader in another process streams its ranges from there.
    /// `None`: the file is read from the location itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Where one bucket lies in its map file, and its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketRange {
    /// The bucket's first byte in the file.
    pub offset: u64,
    /// Its length in bytes (0: empty).
    pub bytes: u64,
    /// Its rows.
    pub rows: u64,
}

impl MapLayout {
    /// A map of `buckets` empty buckets in a file of `size` bytes: what a
    /// map a coalesced task covers publishes.
    pub fn empty(buckets: usize) -> Self {
        Self {
            first_bucket: 0,
            offsets: vec![0; buckets],
            bytes: vec![0; buckets],
            rows: vec![0; buckets],
            size: 0,
            e_tag: None,
            keys: None,
            owner: None,
        }
    }

    /// Buckets described: those of the window, from `first_bucket` on.
    pub fn buckets(&self) -> usize {
        self.offsets.len()
    }

    /// The buckets described, as the map's bucket numbers.
    pub fn described(&self) -> std::ops::Range<usize> {
        let first = usize::try_from(self.first_bucket).unwrap_or(usize::MAX);
        first..first.saturating_add(self.buckets())
    }

    /// Where bucket `bucket` of the map lies; `None` outside the window.
    pub fn bucket(&self, bucket: usize) -> Option<BucketRange> {
        let at = bucket.checked_sub(usize::try_from(self.first_bucket).ok()?)?;
        Some(BucketRange {
            offset: *self.offsets.get(at)?,
            bytes: *self.bytes.get(at)?,
            rows: *self.rows.get(at)?,
        })
    }

    /// This layout describing only the buckets of `buckets` it describes:
    /// what a task that reads no other bucket of the map is handed.
    pub fn window(&self, buckets: std::ops::Range<usize>) -> Self {
        let described = self.described();
        let start = buckets.start.clamp(described.start, described.end);
        let end = buckets.end.clamp(start, described.end);
        let part = |values: &[u64]| {
            let at = start - described.start..end - described.start;
            values.get(at).unwrap_or_default().to_vec()
        };
        Self {
            first_bucket: start as u64,
            offsets: part(&self.offsets),
            bytes: part(&self.bytes),
            rows: part(&self.rows),
            size: self.size,
            e_tag: self.e_tag.clone(),
            keys: self.keys,
            owner: self.owner.clone(),
        }
    }

    /// Whether the arrays agree in length and every bucket (and the key
    /// summary) lies inside the file.
    pub fn is_consistent(&self) -> bool {
        let n = self.offsets.len();
        let inside = |offset: u64, bytes: u64| {
            offset
                .checked_add(bytes)
                .is_some_and(|end| end <= self.size)
        };
        self.keys
            .is_none_or(|(offset, bytes)| inside(offset, bytes))
            && self.bytes.len() == n
            && self.rows.len() == n
            && self
                .offsets
                .iter()
                .zip(&self.bytes)
                .all(|(&o, &b)| inside(o, b))
    }
}

/// Columns of a writer's summary (one row per bucket) that the layout is
/// read from: the bucket, its rows, bytes and first byte; the same in
/// every row, the file's size and its entity tag (Utf8, null when local).
pub const SUMMARY_COLUMNS: [&str; 6] = ["bucket", "rows", "bytes", "offset", "file_bytes", "e_tag"];

/// Columns of a build stage writer's summary, the same in every row: where
/// the map's key summary starts and its length (UInt64, null when none).
/// A summary without them describes a map whose key summary, if any, is
/// found through its marker.
pub const SUMMARY_KEYS_COLUMNS: [&str; 2] = ["keys_offset", "keys_bytes"];

impl MapLayout {
    /// The layout a writer's summary batches describe; `None` when they
    /// lack a column of [`SUMMARY_COLUMNS`] (a writer of another contract),
    /// or name a bucket out of order.
    pub fn from_summary(batches: &[RecordBatch]) -> Option<Self> {
        let mut layout = Self::default();
        for batch in batches {
            let column = |name: &str| -> Option<&UInt64Array> {
                batch
                    .column_by_name(name)?
                    .as_any()
                    .downcast_ref::<UInt64Array>()
            };
            let [bucket, rows, bytes, offset, file_bytes, e_tag] = SUMMARY_COLUMNS;
            let (bucket, rows, bytes) = (column(bucket)?, column(rows)?, column(bytes)?);
            let (offset, file_bytes) = (column(offset)?, column(file_bytes)?);
            let e_tag = batch
                .column_by_name(e_tag)?
                .as_any()
                .downcast_ref::<StringArray>()?;
            let [keys_offset, keys_bytes] = SUMMARY_KEYS_COLUMNS;
            let keys = column(keys_offset).zip(column(keys_bytes));
            for row in 0..batch.num_rows() {
                if bucket.value(row) != layout.offsets.len() as u64 {
                    return None;
                }
                layout.offsets.push(offset.value(row));
                layout.bytes.push(bytes.value(row));
                layout.rows.push(rows.value(row));
                layout.size = file_bytes.value(row);
                layout.e_tag = e_tag.is_valid(row).then(|| e_tag.value(row).to_string());
                layout.keys = keys
                    .filter(|(offset, bytes)| offset.is_valid(row) && bytes.is_valid(row))
                    .map(|(offset, bytes)| (offset.value(row), bytes.value(row)));
            }
        }
        Some(layout)
    }
}

/// The value of [`SHUFFLE_RANGES`]: the layout of every map of each stage
/// a stage's tasks read, by stage id, maps in order. A stage absent from it
/// is read by its markers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageLayouts {
    /// Per upstream stage, one layout per map.
    pub stages: BTreeMap<u64, Vec<MapLayout>>,
}

impl StageLayouts {
    /// The setting's text (JSON).
    pub fn format(&self) -> String {
        // Cannot fail: numbers and strings.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The layouts a setting names; `None` for an empty setting.
    ///
    /// # Errors
    ///
    /// Text that is not such JSON, or a layout whose arrays disagree or
    /// reach past its file, said with the stage and map.
    pub fn parse(text: &str) -> Result<Option<Self>, String> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(None);
        }
        let layouts: Self = serde_json::from_str(text).map_err(|e| {
            format!("`dfx_engine.{SHUFFLE_RANGES}` is not the driver's map layouts: {e}")
        })?;
        for (stage, maps) in &layouts.stages {
            if let Some(map) = maps.iter().position(|m| !m.is_consistent()) {
                return Err(format!(
                    "`dfx_engine.{SHUFFLE_RANGES}`: stage {stage} map {map}: its offsets, \
                     bytes and rows disagree in length or reach past the file's size"
                ));
            }
        }
        Ok(Some(layouts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_describes_its_buckets_by_their_numbers_in_the_map() {
        let whole = MapLayout {
            first_bucket: 0,
            offsets: vec![0, 10, 15, 15],
            bytes: vec![10, 5, 0, 7],
            rows: vec![3, 1, 0, 2],
            size: 40,
            e_tag: Some("\"t\"".into()),
            keys: Some((22, 4)),
            owner: None,
        };
        let window = whole.window(1..3);
        assert_eq!(window.described(), 1..3);
        assert_eq!(window.bucket(0), None, "before the window");
        assert_eq!(window.bucket(3), None, "after the window");
        for bucket in 1..3 {
            assert_eq!(
                window.bucket(bucket),
                whole.bucket(bucket),
                "bucket {bucket}"
            );
        }
        assert_eq!(
            (window.size, &window.e_tag, window.keys),
            (40, &whole.e_tag, whole.keys)
        );
        assert!(window.is_consistent());
        // A window of a window, and one reaching past the map, keep to what
        // is described.
        assert_eq!(window.window(2..9).described(), 2..3);
        assert_eq!(whole.window(3..9).bucket(3).map(|b| b.rows), Some(2));
        assert_eq!(whole.window(6..9).buckets(), 0);
        // The whole map's text is unchanged: the window's start is written
        // only when it is not the first bucket.
        assert!(
            !serde_json::to_string(&whole)
                .unwrap()
                .contains("first_bucket")
        );
        let text = serde_json::to_string(&window).unwrap();
        assert_eq!(serde_json::from_str::<MapLayout>(&text).unwrap(), window);
    }

    #[test]
    fn layouts_round_trip_and_inconsistent_ones_are_refused() {
        let layout = MapLayout {
            first_bucket: 0,
            offsets: vec![0, 10],
            bytes: vec![10, 5],
            rows: vec![3, 1],
            size: 40,
            e_tag: Some("\"abc\"".into()),
            keys: Some((15, 20)),
            owner: Some("http://127.0.0.1:4000".into()),
        };
        let layouts = StageLayouts {
            stages: BTreeMap::from([(2, vec![layout.clone(), MapLayout::empty(2)])]),
        };
        assert_eq!(StageLayouts::parse(&layouts.format()), Ok(Some(layouts)));
        assert_eq!(StageLayouts::parse(" "), Ok(None));
        let past = MapLayout {
            size: 14,
            ..layout.clone()
        };
        let bad = StageLayouts {
            stages: BTreeMap::from([(2, vec![past])]),
        };
        let err = StageLayouts::parse(&bad.format()).unwrap_err();
        assert!(err.contains("stage 2 map 0"), "{err}");
        let keys_past = MapLayout {
            keys: Some((30, 11)),
            ..layout
        };
        let bad = StageLayouts {
            stages: BTreeMap::from([(2, vec![keys_past])]),
        };
        assert!(StageLayouts::parse(&bad.format()).is_err());
    }
}
