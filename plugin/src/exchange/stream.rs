//! The stream of one reader partition: the segments of each bucket it
//! reads, local (each message read from the map's file into a buffer of its
//! own) or remote (a ranged GET on the plugin's I/O runtime, awaited from
//! the host's poll, never blocked on), each checked against its marker
//! (framing, fields, rows) before its batch is handed on.
use std::collections::VecDeque;
use std::fmt;
use std::fs::File;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::RecordBatchStream;
use dfx_abi::FailureClass;
use futures::future::BoxFuture;
use futures::{FutureExt, Stream};
use object_store::ObjectStore;

use crate::counters::LiveObject;
use crate::error;
use crate::exchange::fetch::{FetchError, RangeFetcher, Source, fetch_order};
use crate::exchange::files::{decode_segments, describe_fields, read_segments, same_fields};
use crate::exchange::locate::Piece;
use crate::exchange::marker::Segment;
use crate::exchange::shared_reads::Cover;
use crate::exchange::store::{ObjectKey, S3Location, get_range_if};

/// A remote reader's requests: the markers (until read), then the segment
/// being fetched, from an S3 `bucket`; or, given its maps' layouts, every
/// range at once (from S3, or from the workers serving their files).
struct Remote {
    bucket: Option<(Arc<dyn ObjectStore>, S3Location)>,
    markers: Option<BoxFuture<'static, Result<VecDeque<Piece>>>>,
    fetching: Option<Fetch>,
    ranges: Option<RangeFetcher>,
}

/// A segment's byte range being fetched, with the object's size.
type Fetch = BoxFuture<'static, std::result::Result<Option<(Vec<u8>, u64)>, String>>;

/// The piece being read, and the batches of its current segment not yet
/// returned.
struct OpenPiece {
    piece: Piece,
    batches: VecDeque<RecordBatch>,
}

/// Streams a queue of pieces, one after the other, segment by segment.
pub(crate) struct BucketStream {
    stage_id: u64,
    /// The shuffle location read, which lost output is recorded for.
    location: PathBuf,
    schema: SchemaRef,
    queue: VecDeque<Piece>,
    current: Option<OpenPiece>,
    /// Set when the stage's output is in S3, or served by its workers.
    remote: Option<Remote>,
    /// Whether a piece with no owner is read from a local file.
    reads_files: bool,
    _live: LiveObject,
}

impl BucketStream {
    /// A stream of the located `pieces` of stage `stage_id`'s maps, read
    /// from the local directory `location`.
    pub(crate) fn local(
        stage_id: u64,
        location: PathBuf,
        schema: SchemaRef,
        pieces: VecDeque<Piece>,
    ) -> Self {
        Self {
            stage_id,
            location,
            schema,
            queue: pieces,
            current: None,
            remote: None,
            reads_files: true,
            _live: LiveObject::new(),
        }
    }

    /// A stream of stage `stage_id`'s maps in the S3 location `s3` (whose
    /// root is `location`), through `store`: its pieces are those `markers`
    /// locates on the first poll.
    pub(crate) fn remote(
        stage_id: u64,
        location: PathBuf,
        schema: SchemaRef,
        store: Arc<dyn ObjectStore>,
        s3: S3Location,
        markers: BoxFuture<'static, Result<VecDeque<Piece>>>,
    ) -> Self {
        Self {
            stage_id,
            location,
            schema,
            queue: VecDeque::new(),
            current: None,
            remote: Some(Remote {
                bucket: Some((store, s3)),
                markers: Some(markers),
                fetching: None,
                ranges: None,
            }),
            reads_files: false,
            _live: LiveObject::new(),
        }
    }

    /// A stream of the `pieces` of stage `stage_id`'s maps under
    /// `location`, located by the layouts the driver handed the task: no
    /// marker is read, and the ranges of the pieces read remotely are
    /// fetched concurrently from where `source` says, up to `budget` bytes
    /// in flight (see [`super::fetch`]). With `reads_files`, a piece with
    /// no owner is read from its local file instead (a local location
    /// whose maps its workers serve).
    pub(crate) fn laid_out(
        stage_id: u64,
        location: PathBuf,
        schema: SchemaRef,
        (pieces, reads_files): (VecDeque<Piece>, bool),
        source: &dyn Fn(&Piece) -> Source,
        (budget, covers): (u64, &[Option<Cover>]),
    ) -> Self {
        let queue = fetch_order(pieces.into());
        let remote: VecDeque<Piece> = queue
            .iter()
            .filter(|p| !reads_files || p.owner.is_some())
            .map(Piece::clone_located)
            .collect();
        let ranges = RangeFetcher::new(source, &remote, budget, covers);
        Self {
            stage_id,
            location,
            schema,
            queue,
            current: None,
            remote: Some(Remote {
                bucket: None,
                markers: None,
                fetching: None,
                ranges: Some(ranges),
            }),
            reads_files,
            _live: LiveObject::new(),
        }
    }
}

impl BucketStream {
    /// Open a local piece's file, refused when it is gone or of another
    /// size than when its marker was read (overwritten) before any byte of
    /// it is decoded.
    fn open_local(&self, piece: &Piece) -> Result<File> {
        let fail = |message: String| piece_error(self.stage_id, piece, message);
        let file = File::open(&piece.path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                self.lost(piece, "file")
            } else {
                fail(format!("cannot open: {e}"))
            }
        })?;
        let size = file
            .metadata()
            .map_err(|e| fail(format!("cannot stat: {e}")))?
            .len();
        if size != piece.size {
            return Err(fail(format!(
                "holds {size} byte(s) but its marker promised {} (overwritten?)",
                piece.size
            )));
        }
        Ok(file)
    }

    /// The error of `piece`'s map file (`what`: file or object) being gone
    /// after its marker was read: lost output, recorded as
    /// [`FailureClass::Lost`] of its map for the location read.
    fn lost(&self, piece: &Piece, what: &str) -> DataFusionError {
        error::record(
            &self.location,
            FailureClass::Lost([self.stage_id, piece.map as u64]),
        );
        piece_error(
            self.stage_id,
            piece,
            format!(
                "lost output: the marker promised {} row(s) but the {what} is gone",
                piece.rows
            ),
        )
    }

    /// Take `segment`'s decoded streams into the open piece's batches,
    /// checking their fields and their row count against the marker.
    fn decode(
        &mut self,
        segment: Segment,
        streams: std::result::Result<Vec<(SchemaRef, Vec<RecordBatch>)>, String>,
    ) -> Result<()> {
        let stage_id = self.stage_id;
        let expected = Arc::clone(&self.schema);
        let open = self.current.as_mut().expect("a piece is open");
        let fail = |message: String| {
            piece_error(
                stage_id,
                &open.piece,
                format!("segment at byte {}: {message}", segment.offset),
            )
        };
        // One segment, or a bucket's segments read as one range.
        let streams = streams.map_err(fail)?;
        for (schema, _) in &streams {
            if !same_fields(schema.fields(), expected.fields()) {
                return Err(fail(format!(
                    "holds fields [{}] but the stage publishes [{}]",
                    describe_fields(schema.fields()),
                    describe_fields(expected.fields())
                )));
            }
        }
        let batches: Vec<RecordBatch> = streams.into_iter().flat_map(|(_, b)| b).collect();
        let rows: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
        if rows != segment.rows {
            return Err(fail(format!(
                "holds {rows} row(s) but its marker promises {} (truncated?)",
                segment.rows
            )));
        }
        // Same fields as the stage's: relabel with the stage's schema to
        // keep its metadata. The row count travels explicitly: a batch may
        // have no column at all (`count(*)` above a join).
        for batch in batches {
            let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
            let relabelled = RecordBatch::try_new_with_options(
                Arc::clone(&expected),
                batch.columns().to_vec(),
                &options,
            )
            .map_err(|e| fail(e.to_string()))?;
            open.batches.push_back(relabelled);
        }
        Ok(())
    }

    /// The next batch: from the open piece's decoded segment, else by
    /// reading its next segment, else by opening the next piece.
    /// `Ready(None)`: the queue is done.
    fn poll_step(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<RecordBatch>>> {
        loop {
            if let Some(open) = self.current.as_mut() {
                if let Some(batch) = open.batches.pop_front() {
                    return Poll::Ready(Some(Ok(batch)));
                }
                if open.piece.segments.is_empty() {
                    self.current = None;
                    continue;
                }
            } else {
                if let Some(remote) = self.remote.as_mut()
                    && let Some(markers) = remote.markers.as_mut()
                {
                    let ready = futures::ready!(markers.poll_unpin(cx));
                    remote.markers = None;
                    self.queue = ready?;
                }
                let Some(mut piece) = self.queue.pop_front() else {
                    return Poll::Ready(None);
                };
                if self.reads_files && piece.owner.is_none() {
                    piece.file = Some(self.open_local(&piece)?);
                }
                self.current = Some(OpenPiece {
                    piece,
                    batches: VecDeque::new(),
                });
                continue;
            }
            let open = self.current.as_ref().expect("a piece is open");
            let streams = match &open.piece.file {
                // Read message by message: no buffer the size of the range.
                Some(file) => {
                    let segment = open.piece.segments.front().expect("checked above");
                    read_segments(file, segment.offset, segment.bytes)
                }
                None => decode_segments(futures::ready!(self.poll_segment(cx))?),
            };
            let open = self.current.as_mut().expect("a piece is open");
            let segment = open.piece.segments.pop_front().expect("checked above");
            self.decode(segment, streams)?;
        }
    }

    /// The bytes of the open piece's next segment, fetched from its object
    /// (checking the object's size first).
    fn poll_segment(&mut self, cx: &mut Context<'_>) -> Poll<Result<Vec<u8>>> {
        let stage_id = self.stage_id;
        let open = self.current.as_mut().expect("a piece is open");
        let segment = *open.piece.segments.front().expect("a segment is left");
        let fail = |piece: &Piece, message: String| {
            piece_error(
                stage_id,
                piece,
                format!("segment at byte {}: {message}", segment.offset),
            )
        };
        let remote = self.remote.as_mut().expect("a remote piece");
        if let Some(ranges) = remote.ranges.as_mut() {
            return match futures::ready!(ranges.poll_next_piece(cx)) {
                Ok(bytes) => Poll::Ready(Ok(bytes)),
                Err(FetchError::Failed(why)) => Poll::Ready(Err(fail(&open.piece, why))),
                Err(FetchError::Lost) => {
                    let open = self.current.as_ref().expect("a piece is open");
                    let what = match open.piece.owner {
                        Some(_) => "file on its worker",
                        None => "object",
                    };
                    Poll::Ready(Err(self.lost(&open.piece, what)))
                }
            };
        }
        let Some((store, bucket)) = remote.bucket.as_ref() else {
            return Poll::Ready(Err(fail(
                &open.piece,
                "no range is left to fetch for this piece".to_string(),
            )));
        };
        if remote.fetching.is_none() {
            let key = bucket
                .key(&open.piece.path)
                .map_err(|e| fail(&open.piece, e))?;
            let fetch = get_range_if(
                Arc::clone(store),
                key,
                segment.offset,
                segment.bytes,
                open.piece.e_tag.clone(),
            )
            .boxed();
            remote.fetching = Some(fetch);
        }
        let fetch = remote.fetching.as_mut().expect("set above");
        let fetched = futures::ready!(fetch.poll_unpin(cx));
        remote.fetching = None;
        let fetched = fetched.map_err(|e| fail(&open.piece, format!("cannot fetch: {e}")))?;
        let Some((bytes, size)) = fetched else {
            let open = self.current.as_ref().expect("a piece is open");
            return Poll::Ready(Err(self.lost(&open.piece, "object")));
        };
        if size != open.piece.size || bytes.len() as u64 != segment.bytes {
            return Poll::Ready(Err(piece_error(
                stage_id,
                &open.piece,
                format!(
                    "holds {size} byte(s) but its marker promised {} (overwritten?)",
                    open.piece.size
                ),
            )));
        }
        Poll::Ready(Ok(bytes))
    }

    fn poll_batch(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<RecordBatch>>> {
        let polled = self.poll_step(cx);
        if let Poll::Ready(Some(Err(_))) = &polled {
            // An error ends the stream: nothing after it is read.
            self.current = None;
            self.queue.clear();
            self.remote = None;
        }
        polled
    }
}

/// An error about `piece`, naming stage, map, bucket and file.
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

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.poll_batch(cx)
    }
}

impl RecordBatchStream for BucketStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}
