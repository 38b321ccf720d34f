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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapLayout {
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

impl MapLayout {
    /// A map of `buckets` empty buckets in a file of `size` bytes: what a
    /// map a coalesced task covers publishes.
    pub fn empty(buckets: usize) -> Self {
        Self {
            offsets: vec![0; buckets],
            bytes: vec![0; buckets],
            rows: vec![0; buckets],
            size: 0,
            e_tag: None,
            keys: None,
            owner: None,
        }
    }

    /// Buckets described.
    pub fn buckets(&self) -> usize {
        self.offsets.len()
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
    fn layouts_round_trip_and_inconsistent_ones_are_refused() {
        let layout = MapLayout {
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
