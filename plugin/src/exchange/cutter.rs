//! One input partition's rows cut into buckets and encoded as segments.
//!
//! A map that runs a slice of partitions runs one cutter per partition,
//! each on a task of its own, so splitting, coalescing and encoding use as
//! many cores as the slice has partitions; the map job only stages the
//! segments they hand it and writes the file (see [`super::publish`]).
//!
//! ```text
//!   partition 0 ──► cutter ──┐
//!   partition 1 ──► cutter ──┼──► segments (bucket, rows) ──► map job
//!   ...                      ┘
//! ```

use std::collections::VecDeque;
use std::sync::Arc;

use datafusion::arrow::compute::BatchCoalescer;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::repartition::BatchPartitioner;
use futures::StreamExt;
use futures::stream::BoxStream;

use crate::config::ShuffleCompression;
use crate::exchange::files::encode_segment;

/// The encoded size a segment is cut at: large enough that its IPC framing
/// (a schema per segment) and a marker's index entry are small beside it,
/// and a local reader's reads few.
pub const SEGMENT_BYTES: usize = 1024 * 1024;

/// Bytes all the buckets of one cutter may hold in batches waiting to make
/// a segment: with many buckets, each segment is cut smaller.
pub const PENDING_BYTES: usize = 64 * 1024 * 1024;

/// The size segments of `buckets` buckets are cut at: about
/// [`SEGMENT_BYTES`], less when the buckets together would hold more than
/// [`PENDING_BYTES`] (a segment is then about one batch).
pub fn segment_bytes(buckets: usize) -> usize {
    SEGMENT_BYTES.min(PENDING_BYTES / buckets.max(1))
}

/// How a cutter splits its rows into buckets.
pub(crate) enum BucketSplit {
    /// By each row's key (hash), or batch by batch in turn (round-robin).
    Rows(Box<BatchPartitioner>),
    /// Every row into one bucket: the partition's own, so a reader sees
    /// each partition of a slice as the input produced it.
    Whole(usize),
}

/// A partition's segments, in the order its cutter encoded them.
pub(crate) type SegmentStream = BoxStream<'static, Result<EncodedSegment>>;

/// One segment a cutter encoded: a bucket's next rows.
pub(crate) struct EncodedSegment {
    pub(crate) bucket: usize,
    pub(crate) rows: u64,
    /// Coalesced batches it holds.
    pub(crate) batches: u64,
    pub(crate) bytes: Vec<u8>,
}

/// One bucket while its partition runs: rows coalesce here into batches,
/// which wait until they make a segment of about [`segment_bytes`].
struct OpenBucket {
    coalescer: BatchCoalescer,
    pending: Vec<RecordBatch>,
    pending_bytes: usize,
}

/// Cuts one input partition's rows into the buckets of map `map` of stage
/// `stage_id`.
pub(crate) struct BucketCutter {
    stage_id: u64,
    map: usize,
    schema: SchemaRef,
    split: BucketSplit,
    /// One per bucket of the map, opened by its first rows.
    buckets: Vec<Option<OpenBucket>>,
    batch_size: usize,
    /// Where a bucket's waiting batches are encoded as one segment.
    segment_bytes: usize,
    compression: ShuffleCompression,
}

impl BucketCutter {
    /// A cutter of `buckets` buckets; the rest as the fields say.
    pub(crate) fn new(
        stage_id: u64,
        map: usize,
        schema: SchemaRef,
        split: BucketSplit,
        buckets: usize,
        batch_size: usize,
        compression: ShuffleCompression,
    ) -> Self {
        Self {
            stage_id,
            map,
            schema,
            split,
            buckets: (0..buckets).map(|_| None).collect(),
            batch_size,
            segment_bytes: segment_bytes(buckets),
            compression,
        }
    }

    fn error(&self, bucket: usize, message: impl std::fmt::Display) -> DataFusionError {
        DataFusionError::Execution(format!(
            "dfx stage {} map {} bucket {bucket}: {message}",
            self.stage_id, self.map
        ))
    }

    /// The segments `input` makes, in the order each bucket's rows came;
    /// after its last batch, the rest of each bucket.
    pub(crate) fn segments(self, input: SendableRecordBatchStream) -> SegmentStream {
        let state = (self, input, VecDeque::new(), false);
        futures::stream::try_unfold(
            state,
            |(mut cutter, mut input, mut ready, mut ended)| async move {
                loop {
                    if let Some(segment) = ready.pop_front() {
                        return Ok(Some((segment, (cutter, input, ready, ended))));
                    }
                    if ended {
                        return Ok(None);
                    }
                    match input.next().await {
                        Some(batch) => cutter.push(batch?, &mut ready)?,
                        None => {
                            cutter.finish(&mut ready)?;
                            ended = true;
                        }
                    }
                }
            },
        )
        .boxed()
    }

    /// Split `batch` into its buckets; the segments it completes into `ready`.
    fn push(&mut self, batch: RecordBatch, ready: &mut VecDeque<EncodedSegment>) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let mut pieces = Vec::new();
        match &mut self.split {
            BucketSplit::Rows(partitioner) => partitioner.partition(batch, |bucket, piece| {
                pieces.push((bucket, piece));
                Ok(())
            })?,
            BucketSplit::Whole(bucket) => pieces.push((*bucket, batch)),
        }
        for (bucket, piece) in pieces {
            self.append(bucket, piece, ready)?;
        }
        Ok(())
    }

    /// Add `piece` to `bucket`, encoding a segment whenever its full batches
    /// reach the segment size.
    fn append(
        &mut self,
        bucket: usize,
        piece: RecordBatch,
        ready: &mut VecDeque<EncodedSegment>,
    ) -> Result<()> {
        if piece.num_rows() == 0 {
            return Ok(());
        }
        let open = self.buckets[bucket].get_or_insert_with(|| OpenBucket {
            coalescer: BatchCoalescer::new(Arc::clone(&self.schema), self.batch_size),
            pending: Vec::new(),
            pending_bytes: 0,
        });
        if let Err(e) = open.coalescer.push_batch(piece) {
            return Err(self.error(bucket, format!("cannot coalesce: {e}")));
        }
        self.take_completed(bucket, ready)
    }

    /// Move `bucket`'s completed batches to its waiting ones, encoding them
    /// as a segment once they reach the segment size.
    fn take_completed(
        &mut self,
        bucket: usize,
        ready: &mut VecDeque<EncodedSegment>,
    ) -> Result<()> {
        loop {
            let Some(open) = self.buckets[bucket].as_mut() else {
                return Ok(());
            };
            let Some(full) = open.coalescer.next_completed_batch() else {
                return Ok(());
            };
            open.pending_bytes += full.get_array_memory_size();
            open.pending.push(full);
            if open.pending_bytes >= self.segment_bytes {
                ready.extend(self.encode(bucket)?);
            }
        }
    }

    /// `bucket`'s waiting batches encoded as one segment, if it has any.
    fn encode(&mut self, bucket: usize) -> Result<Option<EncodedSegment>> {
        let Some(open) = self.buckets[bucket].as_mut() else {
            return Ok(None);
        };
        let batches = std::mem::take(&mut open.pending);
        open.pending_bytes = 0;
        if batches.is_empty() {
            return Ok(None);
        }
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        let bytes = encode_segment(&self.schema, &batches, self.compression)
            .map_err(|e| self.error(bucket, e))?;
        Ok(Some(EncodedSegment {
            bucket,
            rows: rows as u64,
            batches: batches.len() as u64,
            bytes,
        }))
    }

    /// The rest of every bucket, each as its last segment.
    fn finish(&mut self, ready: &mut VecDeque<EncodedSegment>) -> Result<()> {
        for bucket in 0..self.buckets.len() {
            let Some(open) = self.buckets[bucket].as_mut() else {
                continue;
            };
            if let Err(e) = open.coalescer.finish_buffered_batch() {
                return Err(self.error(bucket, format!("cannot coalesce: {e}")));
            }
            self.take_completed(bucket, ready)?;
            ready.extend(self.encode(bucket)?);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::files::decode_segment;
    use datafusion::arrow::array::{Array, Int64Array};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_expr::expressions::col;
    use datafusion::physical_plan::metrics;
    use datafusion::physical_plan::stream::RecordBatchStreamAdapter;

    fn values(batch: &RecordBatch) -> Vec<i64> {
        let column = batch.column(0).as_any().downcast_ref::<Int64Array>();
        column.expect("an Int64 column").values().to_vec()
    }

    /// Cuts `rows` values, arriving in batches of 7, into 3 hash buckets with
    /// batches of `batch_size` and segments of `segment_bytes`.
    fn cut(rows: i64, batch_size: usize, segment_bytes: usize) -> Vec<EncodedSegment> {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let batches: Vec<Result<RecordBatch>> = (0..rows)
            .collect::<Vec<_>>()
            .chunks(7)
            .map(|chunk| {
                let column = Arc::new(Int64Array::from(chunk.to_vec()));
                Ok(RecordBatch::try_new(Arc::clone(&schema), vec![column])?)
            })
            .collect();
        let input = Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&schema),
            futures::stream::iter(batches),
        ));
        let exprs = vec![col("k", &schema).expect("column k")];
        let partitioner = BatchPartitioner::new_hash_partitioner(exprs, 3, metrics::Time::new());
        let split = BucketSplit::Rows(Box::new(partitioner.expect("a hash partitioner")));
        let mut cutter = BucketCutter::new(
            1,
            0,
            Arc::clone(&schema),
            split,
            3,
            batch_size,
            ShuffleCompression::None,
        );
        cutter.segment_bytes = segment_bytes;
        let segments = futures::executor::block_on(cutter.segments(input).collect::<Vec<_>>());
        segments
            .into_iter()
            .collect::<Result<_>>()
            .expect("every segment")
    }

    #[test]
    fn every_row_lands_in_exactly_one_segment_of_its_bucket() {
        let segments = cut(1000, 16, 1);
        let mut seen = Vec::new();
        let mut bucket_of = std::collections::BTreeMap::new();
        for segment in &segments {
            let (_, batches) = decode_segment(segment.bytes.clone()).expect("a segment");
            let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
            assert_eq!(rows as u64, segment.rows, "bucket {}", segment.bucket);
            assert_eq!(batches.len() as u64, segment.batches);
            for value in batches.iter().flat_map(values) {
                // A key's rows all go to one bucket.
                assert_eq!(
                    *bucket_of.entry(value).or_insert(segment.bucket),
                    segment.bucket
                );
                seen.push(value);
            }
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..1000).collect::<Vec<_>>());
        // A segment of one byte is cut at every full batch: each bucket's
        // segments hold one coalesced batch of 16 rows but the last.
        for bucket in 0..3 {
            let rows: Vec<u64> = segments
                .iter()
                .filter(|s| s.bucket == bucket)
                .map(|s| s.rows)
                .collect();
            let (last, full) = rows.split_last().expect("rows in every bucket");
            assert!(full.iter().all(|&r| r == 16), "bucket {bucket}: {rows:?}");
            assert!((1..=16).contains(last), "bucket {bucket}: {rows:?}");
        }
    }

    #[test]
    fn a_partition_under_the_segment_size_makes_one_segment_per_bucket() {
        let segments = cut(1000, 16, SEGMENT_BYTES);
        let mut buckets: Vec<usize> = segments.iter().map(|s| s.bucket).collect();
        buckets.sort_unstable();
        assert_eq!(buckets, vec![0, 1, 2]);
        assert_eq!(segments.iter().map(|s| s.rows).sum::<u64>(), 1000);
    }
}
