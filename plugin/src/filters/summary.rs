//! The summary of a build stage's join keys one map publishes, and the
//! filter a probe task builds from the summaries of every map.
//!
//! ```text
//! build map:  each batch ──► key columns ──► min / max per column
//!                                       └──► 64-bit hash of each row's key
//!             end of map:  ≤ EXACT_KEYS distinct hashes: the sorted hashes
//!                          more: a Bloom filter sized to them
//!                          more than the limit: min / max only
//! probe task: a row is kept when its key's hash is in some map's set or
//!             Bloom filter (without sets: when its key is within every
//!             column's min and max)
//! ```
//!
//! A row whose key has a null in any column is left out of the build
//! summary and dropped on the probe side: the joins filtered here match no
//! null key ([`crate::planner::add_join_filters`] filters only joins where null equals
//! nothing). Hashes are DataFusion's own (`create_hashes`, the hash join's),
//! with a fixed seed, so equal keys of equal types hash alike in every
//! process; the planner filters only joins whose two sides' keys have the
//! same types. A hash set or Bloom filter only ever keeps too much (a
//! collision), never too little.

use std::cmp::Ordering;
use std::sync::Arc;

use base64::Engine;
use datafusion::arrow::array::{Array, ArrayRef, BooleanArray};
use datafusion::arrow::compute::kernels::boolean::and;
use datafusion::arrow::compute::{filter_record_batch, is_not_null};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::hash_utils::{RandomState, create_hashes};
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::functions_aggregate::min_max::{MaxAccumulator, MinAccumulator};
use datafusion::logical_expr::Accumulator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion_proto::protobuf;
use prost::Message;
use serde::{Deserialize, Serialize};

/// The seed of every key hash: fixed, so a build map and a probe task in
/// other processes hash a key alike.
const KEY_HASH_SEED: u64 = 0x6466_785f_6b65_7973;

/// Up to this many distinct key hashes a map publishes them exactly.
pub const EXACT_KEYS: usize = 4096;

/// The share of probe rows whose key no build map holds that the Bloom
/// filters of all maps together may keep.
const BLOOM_FALSE_POSITIVES: f64 = 0.01;

/// Bits of each map's Bloom filter per distinct key (before rounding up to
/// a power of two), when its stage has `maps` maps: a probe row is tested
/// against every map's filter, so each map's may keep
/// [`BLOOM_FALSE_POSITIVES`] / `maps` of them: 1.44 × log2 of the inverse
/// bits a key (10 for one map, 13 for four, 16 for sixteen).
fn bloom_bits_per_key(maps: usize) -> usize {
    let per_map = BLOOM_FALSE_POSITIVES / maps.max(1) as f64;
    (std::f64::consts::LOG2_E * (1.0 / per_map).log2()).ceil() as usize
}

/// Bits set and tested per key.
const BLOOM_PROBES: u32 = 7;

/// The most key hashes a map collects (8 bytes each while it runs); past it
/// the map publishes min and max only, and a Bloom filter of this many keys
/// would already be some megabytes, read by every probe task.
pub const MAX_HASHED_KEYS: u64 = 4 << 20;

/// The hash state of every key hash.
fn key_hash_state() -> RandomState {
    RandomState::with_seed(KEY_HASH_SEED)
}

/// The key values of one map: how many rows it published, each key column's
/// bounds, and which keys it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeySummary {
    /// Rows the map published (null keys included).
    pub rows: u64,
    /// Per key column: the smallest and largest non-null value, as
    /// datafusion-proto `ScalarValue` bytes in base64; `None` when the map
    /// holds no non-null key or the type has no order DataFusion can take.
    pub bounds: Vec<Option<Bounds>>,
    /// The keys (rows with a null key column left out), when few enough.
    pub keys: Option<KeySet>,
}

/// A column's smallest and largest value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bounds {
    /// The smallest value, encoded.
    pub min: String,
    /// The largest value, encoded.
    pub max: String,
}

/// The keys of a map: their hashes exactly, or a Bloom filter of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeySet {
    /// The distinct hashes, sorted.
    Exact(Vec<u64>),
    /// A Bloom filter: `bits` (a power of two of them, in base64, little
    /// endian words), each key setting [`BLOOM_PROBES`] of them.
    Bloom {
        /// The filter's bits.
        bits: String,
        /// How many bits (a power of two).
        len: u64,
    },
}

fn encode_scalar(value: &ScalarValue) -> Option<String> {
    let proto = protobuf::ScalarValue::try_from(value).ok()?;
    Some(base64::engine::general_purpose::STANDARD.encode(proto.encode_to_vec()))
}

fn decode_scalar(text: &str, what: &str) -> Result<ScalarValue> {
    let fail = |e: String| {
        DataFusionError::Execution(format!(
            "dfx join filter: the {what} bound is not valid: {e}"
        ))
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| fail(e.to_string()))?;
    let proto = protobuf::ScalarValue::decode(bytes.as_slice()).map_err(|e| fail(e.to_string()))?;
    ScalarValue::try_from(&proto).map_err(|e| fail(e.to_string()))
}

/// Bloom filter bit positions of `hash`: double hashing over two halves of
/// a remix, so the probes do not reuse the low bits the hash join used.
fn bloom_positions(hash: u64, len: u64) -> impl Iterator<Item = u64> {
    let mixed = splitmix(hash);
    let (h1, h2) = (mixed, (mixed >> 32) | 1);
    (0..u64::from(BLOOM_PROBES)).map(move |i| h1.wrapping_add(i.wrapping_mul(h2)) & (len - 1))
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The hash of each row's key and whether the row's key has no null (a row
/// with a null key column matches nothing).
fn key_hashes(columns: &[ArrayRef], rows: usize) -> Result<(Vec<u64>, Option<BooleanArray>)> {
    let mut hashes = vec![0u64; rows];
    create_hashes(columns, &key_hash_state(), &mut hashes)?;
    let mut valid: Option<BooleanArray> = None;
    for column in columns {
        if column.null_count() == 0 {
            continue;
        }
        let not_null = is_not_null(column)?;
        valid = Some(match valid {
            Some(v) => and(&v, &not_null)?,
            None => not_null,
        });
    }
    Ok((hashes, valid))
}

/// Builds one map's [`KeySummary`] as its rows go by.
#[derive(Debug)]
pub struct SummaryBuilder {
    rows: u64,
    mins: Vec<Option<MinAccumulator>>,
    maxs: Vec<Option<MaxAccumulator>>,
    /// Hashes so far; `None` once past `limit`.
    hashes: Option<Vec<u64>>,
    limit: u64,
    maps: usize,
}

impl SummaryBuilder {
    /// A builder for keys of these types, collecting at most `limit` hashes,
    /// for one map of a stage of `maps` maps.
    pub fn new(types: &[datafusion::arrow::datatypes::DataType], limit: u64, maps: usize) -> Self {
        Self {
            maps,
            rows: 0,
            mins: types
                .iter()
                .map(|t| MinAccumulator::try_new(t).ok())
                .collect(),
            maxs: types
                .iter()
                .map(|t| MaxAccumulator::try_new(t).ok())
                .collect(),
            hashes: Some(Vec::new()),
            limit: limit.min(MAX_HASHED_KEYS),
        }
    }

    /// Take the keys of `batch`, `keys` evaluated on it.
    ///
    /// # Errors
    ///
    /// A key expression that cannot be evaluated on the batch.
    pub fn update(&mut self, batch: &RecordBatch, keys: &[Arc<dyn PhysicalExpr>]) -> Result<()> {
        let rows = batch.num_rows();
        self.rows += rows as u64;
        if rows == 0 {
            return Ok(());
        }
        let columns = keys
            .iter()
            .map(|key| key.evaluate(batch)?.into_array(rows))
            .collect::<Result<Vec<_>>>()?;
        for (i, column) in columns.iter().enumerate() {
            // A type min/max cannot order leaves its column unbounded.
            if let Some(min) = &mut self.mins[i]
                && min.update_batch(std::slice::from_ref(column)).is_err()
            {
                self.mins[i] = None;
            }
            if let Some(max) = &mut self.maxs[i]
                && max.update_batch(std::slice::from_ref(column)).is_err()
            {
                self.maxs[i] = None;
            }
        }
        if self.rows > self.limit {
            self.hashes = None;
        }
        let Some(kept) = self.hashes.as_mut() else {
            return Ok(());
        };
        let (hashes, valid) = key_hashes(&columns, rows)?;
        match valid {
            None => kept.extend_from_slice(&hashes),
            Some(valid) => kept.extend(
                hashes
                    .iter()
                    .zip(valid.iter())
                    .filter(|(_, v)| *v == Some(true))
                    .map(|(h, _)| *h),
            ),
        }
        Ok(())
    }

    /// The summary of every row taken.
    pub fn finish(mut self) -> KeySummary {
        let bounds = self
            .mins
            .iter_mut()
            .zip(self.maxs.iter_mut())
            .map(|(min, max)| {
                let min = min.as_mut()?.evaluate().ok()?;
                let max = max.as_mut()?.evaluate().ok()?;
                if min.is_null() || max.is_null() {
                    return None;
                }
                Some(Bounds {
                    min: encode_scalar(&min)?,
                    max: encode_scalar(&max)?,
                })
            })
            .collect();
        let keys = self.hashes.take().map(|mut hashes| {
            hashes.sort_unstable();
            hashes.dedup();
            if hashes.len() <= EXACT_KEYS {
                return KeySet::Exact(hashes);
            }
            let len = (hashes.len() * bloom_bits_per_key(self.maps))
                .next_power_of_two()
                .max(64) as u64;
            let mut words = vec![0u64; (len / 64) as usize];
            for hash in hashes {
                for bit in bloom_positions(hash, len) {
                    words[(bit / 64) as usize] |= 1 << (bit % 64);
                }
            }
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            KeySet::Bloom {
                bits: base64::engine::general_purpose::STANDARD.encode(bytes),
                len,
            }
        });
        KeySummary {
            rows: self.rows,
            bounds,
            keys,
        }
    }
}

/// One map's keys, decoded for probing.
#[derive(Debug)]
enum Probe {
    Exact(Vec<u64>),
    Bloom { words: Vec<u64>, len: u64 },
}

impl Probe {
    fn contains(&self, hash: u64) -> bool {
        match self {
            Probe::Exact(sorted) => sorted.binary_search(&hash).is_ok(),
            Probe::Bloom { words, len } => bloom_positions(hash, *len)
                .all(|bit| words[(bit / 64) as usize] & (1 << (bit % 64)) != 0),
        }
    }
}

/// The keys of every map of a build stage, as a probe task tests its rows
/// against them.
#[derive(Debug)]
pub struct KeyFilter {
    /// Per key column: the smallest and largest value of any map, `None`
    /// when some map has no bounds for it (or no map has a key at all).
    pub bounds: Vec<Option<(ScalarValue, ScalarValue)>>,
    /// Whether no map holds a row with a non-null key: nothing can match.
    pub empty: bool,
    /// Every map's keys, when every map published them: one exact set and
    /// each map's Bloom filter (see [`merged`]).
    probes: Option<Vec<Probe>>,
}

/// The probes of every map, the exact sets merged into one. The Bloom
/// filters stay apart: OR-ed into one of a map's size, the keys of every
/// map would share the bits sized for one map's (at four maps of TPC-H
/// q5's orders, a fifth of lineitem's other rows passed), where each map's
/// filter is sized for its share of the false positives
/// ([`bloom_bits_per_key`]).
fn merged(probes: Vec<Probe>) -> Vec<Probe> {
    let mut exact: Vec<u64> = Vec::new();
    let mut blooms: Vec<(Vec<u64>, u64)> = Vec::new();
    for probe in probes {
        match probe {
            Probe::Exact(hashes) => exact.extend(hashes),
            Probe::Bloom { words, len } => blooms.push((words, len)),
        }
    }
    let mut merged = Vec::new();
    if !exact.is_empty() {
        exact.sort_unstable();
        exact.dedup();
        merged.push(Probe::Exact(exact));
    }
    merged.extend(
        blooms
            .into_iter()
            .map(|(words, len)| Probe::Bloom { words, len }),
    );
    merged
}

impl KeyFilter {
    /// The filter of the summaries of every map of the build stage.
    ///
    /// # Errors
    ///
    /// A summary whose bounds or Bloom filter do not decode, or one with
    /// another number of key columns than `columns`.
    pub fn from_summaries(summaries: &[KeySummary], columns: usize) -> Result<Self> {
        let mut bounds: Vec<Option<(ScalarValue, ScalarValue)>> = vec![None; columns];
        let mut bounded = vec![true; columns];
        let mut probes = Some(Vec::with_capacity(summaries.len()));
        let mut empty = true;
        for summary in summaries {
            if summary.bounds.len() != columns {
                return Err(DataFusionError::Execution(format!(
                    "dfx join filter: a build map's summary has {} key column(s), the filter {columns}",
                    summary.bounds.len()
                )));
            }
            match &summary.keys {
                Some(KeySet::Exact(hashes)) => {
                    empty &= hashes.is_empty();
                    if let Some(p) = probes.as_mut() {
                        p.push(Probe::Exact(hashes.clone()));
                    }
                }
                Some(KeySet::Bloom { bits, len }) => {
                    empty = false;
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(bits)
                        .map_err(|e| {
                            DataFusionError::Execution(format!(
                                "dfx join filter: a build map's Bloom filter is not valid: {e}"
                            ))
                        })?;
                    if !len.is_power_of_two() || bytes.len() as u64 * 8 != *len {
                        return Err(DataFusionError::Execution(format!(
                            "dfx join filter: a build map's Bloom filter holds {} byte(s) for \
                             {len} bit(s)",
                            bytes.len()
                        )));
                    }
                    let words = bytes
                        .chunks_exact(8)
                        .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
                        .collect();
                    if let Some(p) = probes.as_mut() {
                        p.push(Probe::Bloom { words, len: *len });
                    }
                }
                None => {
                    // Without its keys, a map may hold any key within bounds.
                    empty &= summary.rows == 0;
                    probes = None;
                }
            }
            for (i, b) in summary.bounds.iter().enumerate() {
                let Some(b) = b else {
                    // A map with rows but no bounds leaves the column open;
                    // an empty map (or all-null keys) adds nothing to it.
                    if summary.rows > 0 && summary.keys.as_ref().is_none_or(|k| !k.is_empty()) {
                        bounded[i] = false;
                    }
                    continue;
                };
                let (min, max) = (decode_scalar(&b.min, "min")?, decode_scalar(&b.max, "max")?);
                bounds[i] = Some(match bounds[i].take() {
                    None => (min, max),
                    Some((lo, hi)) => (smaller(lo, min), larger(hi, max)),
                });
            }
        }
        for (i, open) in bounded.iter().enumerate() {
            if !open {
                bounds[i] = None;
            }
        }
        Ok(Self {
            bounds,
            empty,
            probes: probes.map(merged),
        })
    }

    /// Whether the filter can drop rows by their key's hash.
    pub fn has_keys(&self) -> bool {
        self.probes.is_some()
    }

    /// `batch` without the rows whose key (`keys` evaluated on it) no build
    /// map holds.
    ///
    /// # Errors
    ///
    /// A key that cannot be evaluated on the batch.
    pub fn filter(
        &self,
        batch: &RecordBatch,
        keys: &[Arc<dyn PhysicalExpr>],
    ) -> Result<RecordBatch> {
        let Some(probes) = &self.probes else {
            return Ok(batch.clone());
        };
        let rows = batch.num_rows();
        if rows == 0 {
            return Ok(batch.clone());
        }
        let columns = keys
            .iter()
            .map(|key| key.evaluate(batch)?.into_array(rows))
            .collect::<Result<Vec<_>>>()?;
        let (hashes, valid) = key_hashes(&columns, rows)?;
        let keep: BooleanArray = hashes
            .iter()
            .enumerate()
            .map(|(row, hash)| {
                let valid = valid.as_ref().is_none_or(|v| v.value(row));
                Some(valid && probes.iter().any(|p| p.contains(*hash)))
            })
            .collect();
        Ok(filter_record_batch(batch, &keep)?)
    }
}

impl KeySet {
    fn is_empty(&self) -> bool {
        matches!(self, KeySet::Exact(h) if h.is_empty())
    }
}

fn smaller(a: ScalarValue, b: ScalarValue) -> ScalarValue {
    match a.partial_cmp(&b) {
        Some(Ordering::Greater) => b,
        _ => a,
    }
}

fn larger(a: ScalarValue, b: ScalarValue) -> ScalarValue {
    match a.partial_cmp(&b) {
        Some(Ordering::Less) => b,
        _ => a,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_expr::expressions::Column;

    fn batch(a: Vec<Option<i64>>, b: Vec<Option<&str>>) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("b", DataType::Utf8, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(a)),
                Arc::new(StringArray::from(b)),
            ],
        )
        .unwrap()
    }

    fn keys() -> Vec<Arc<dyn PhysicalExpr>> {
        vec![Arc::new(Column::new("a", 0)), Arc::new(Column::new("b", 1))]
    }

    fn summary(batch: &RecordBatch, limit: u64) -> KeySummary {
        let mut builder = SummaryBuilder::new(&[DataType::Int64, DataType::Utf8], limit, 1);
        builder.update(batch, &keys()).unwrap();
        builder.finish()
    }

    fn kept(filter: &KeyFilter, probe: &RecordBatch) -> Vec<Option<i64>> {
        let out = filter.filter(probe, &keys()).unwrap();
        let a = out.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        a.iter().collect()
    }

    #[test]
    fn a_probe_row_is_kept_exactly_when_its_whole_key_was_built() {
        let build = batch(
            vec![Some(1), Some(2), None, Some(4)],
            vec![Some("x"), Some("y"), Some("z"), None],
        );
        let s = summary(&build, u64::MAX);
        assert!(matches!(&s.keys, Some(KeySet::Exact(h)) if h.len() == 2));
        let filter = KeyFilter::from_summaries(&[s], 2).unwrap();
        // (1,x) and (2,y) match; (1,y) is a key of neither; nulls match nothing.
        let probe = batch(
            vec![Some(1), Some(1), Some(2), None, Some(4), Some(9)],
            vec![Some("x"), Some("y"), Some("y"), Some("z"), None, Some("x")],
        );
        assert_eq!(kept(&filter, &probe), vec![Some(1), Some(2)]);
        let (lo, hi) = filter.bounds[0].clone().unwrap();
        assert_eq!(
            (lo, hi),
            (ScalarValue::Int64(Some(1)), ScalarValue::Int64(Some(4)))
        );
    }

    #[test]
    fn a_bloom_filter_keeps_every_built_key() {
        let n = (EXACT_KEYS * 3) as i64;
        let values: Vec<Option<i64>> = (0..n).map(|i| Some(i * 7)).collect();
        let names: Vec<Option<&str>> = (0..n).map(|_| Some("k")).collect();
        let build = batch(values.clone(), names.clone());
        let s = summary(&build, u64::MAX);
        assert!(matches!(s.keys, Some(KeySet::Bloom { .. })));
        let json = serde_json::to_string(&s).unwrap();
        let s: KeySummary = serde_json::from_str(&json).unwrap();
        let filter = KeyFilter::from_summaries(&[s], 2).unwrap();
        assert_eq!(kept(&filter, &build).len(), n as usize);
        // Keys never built: nearly all dropped.
        let others: Vec<Option<i64>> = (0..n).map(|i| Some(i * 7 + 3)).collect();
        let passed = kept(&filter, &batch(others, names)).len();
        assert!(passed < n as usize / 20, "{passed} of {n} false positives");
    }

    #[test]
    fn more_maps_more_bits_per_key() {
        assert_eq!(bloom_bits_per_key(1), 10);
        assert_eq!(bloom_bits_per_key(4), 13);
        assert_eq!(bloom_bits_per_key(16), 16);
    }

    #[test]
    fn an_empty_build_or_one_past_the_limit() {
        let empty = summary(&batch(vec![], vec![]), u64::MAX);
        let filter = KeyFilter::from_summaries(&[empty.clone(), empty], 2).unwrap();
        assert!(filter.empty && filter.has_keys());
        let build = batch(vec![Some(5), Some(6)], vec![Some("a"), Some("b")]);
        let past = summary(&build, 1);
        assert!(past.keys.is_none());
        let filter = KeyFilter::from_summaries(&[past], 2).unwrap();
        assert!(!filter.empty && !filter.has_keys());
        let probe = batch(vec![Some(7)], vec![Some("c")]);
        assert_eq!(kept(&filter, &probe), vec![Some(7)]);
        let (lo, hi) = filter.bounds[0].clone().unwrap();
        assert_eq!(
            (lo, hi),
            (ScalarValue::Int64(Some(5)), ScalarValue::Int64(Some(6)))
        );
    }
}
