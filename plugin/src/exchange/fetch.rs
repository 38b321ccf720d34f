//! A remote reader's byte ranges, fetched few, large and at once: the
//! buckets it reads of each map object, adjacent ones merged into one
//! ranged GET, every object's GET in flight together up to a bound of
//! bytes requested and not yet decoded (`dfx_engine.read_bytes_in_flight`).
//!
//! ```text
//! pieces (map, bucket) ─► sorted by map, then offset
//!   map 0: [b2][b3]  → one GET of both      in flight at once while the
//!   map 1: [b2]      → one GET               bytes requested and not yet
//!   map 2: [b2][b3]  → one GET               decoded stay within the bound
//! ```
//!
//! Used only when the driver handed the reader its maps' layouts, so each
//! piece is one contiguous range and no marker is read. A partition of a
//! task running a slice takes its range out of the slice's cover of the
//! map, fetched once for the whole task (see `crate::exchange::shared_reads`). Each GET is pinned
//! to the object's entity tag when the layout has one, and the object's
//! size is checked against the layout's before any byte is decoded.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;
use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;

use crate::exchange::flight_store::owner_store;
use crate::exchange::io::{join, spawn};
use crate::exchange::locate::Piece;
use crate::exchange::shared_reads::{self, Cover, SharedFailure};
use crate::exchange::store::{ObjectKey, Pinned, S3Location, canonical_location, get_range_pinned};

/// Why a range could not be had.
pub(crate) enum FetchError {
    /// The object is gone, or another object than the one its map reported
    /// holds its key (two attempts both completed a multipart upload): the
    /// output the reader was handed is lost, and a rerun of the map reports
    /// the object that is there.
    Lost,
    /// Anything else, said.
    Failed(String),
}

/// Where a piece's file is read: the store that holds it and its key
/// there (an S3 bucket, or the map server of the worker that wrote it),
/// and where else when that store has lost it (the location's file, when
/// the worker's is a copy).
pub(crate) struct Route {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) key: ObjectPath,
    pub(crate) fallback: Option<(Arc<dyn ObjectStore>, ObjectPath)>,
    /// `store` holds a copy of the map's file (a worker's, of a map also in
    /// the location): the entity tag its map reported is the location's
    /// object's, so a read there is not pinned to it.
    pub(crate) copy: bool,
}

/// A piece's [`Route`], or why it has none.
pub(crate) type Source = Result<Route, String>;

/// What routes each piece of a reader: a location, or its workers' servers.
pub(crate) type Sources = Box<dyn Fn(&Piece) -> Source + Send>;

/// One GET: consecutive pieces of one object, adjacent in it.
struct Request {
    path: PathBuf,
    source: Source,
    offset: u64,
    len: u64,
    /// The object's size and entity tag, as its map reported them.
    size: u64,
    e_tag: Option<String>,
    /// Each piece's length, in order.
    parts: Vec<u64>,
    /// The cover of the reading task's slice holding this range, when the
    /// task's partitions share one GET of it.
    cover: Option<Cover>,
}

type InFlight = BoxFuture<'static, Result<Vec<Vec<u8>>, FetchError>>;

/// The ranges of one reader partition (see the module doc).
pub(crate) struct RangeFetcher {
    pending: VecDeque<Request>,
    in_flight: FuturesOrdered<InFlight>,
    /// The length of each request in flight, in order.
    lengths: VecDeque<u64>,
    bytes_in_flight: u64,
    budget: u64,
    /// Fetched pieces not yet taken, in order.
    ready: VecDeque<Vec<u8>>,
}

/// Each piece of the S3 location `s3` read from `store`, by its key there.
pub(crate) fn s3_source(store: Arc<dyn ObjectStore>, s3: S3Location) -> impl Fn(&Piece) -> Source {
    move |piece| {
        Ok(Route {
            store: Arc::clone(&store),
            key: s3.key(&piece.path)?,
            fallback: None,
            copy: false,
        })
    }
}

/// Each piece of the location `root` read from the map server of the
/// worker that wrote it (its owner), by its name under `root`; with
/// `location` (the location's own source) each piece its owner lost read
/// from `location`. A piece with no owner (one this process wrote) is read
/// from `own` (this process's copies), else from `location`.
pub(crate) fn served_source(
    root: PathBuf,
    location: Option<Sources>,
    own: Option<Sources>,
) -> impl Fn(&Piece) -> Source {
    let canonical = canonical_location(&root.to_string_lossy());
    move |piece| {
        let direct =
            || {
                location.as_ref().map(|read| read(piece)).unwrap_or_else(|| {
                Err(format!(
                    "{} is read from its worker's map server, but no owner was reported for it",
                    piece.path.display()
                ))
            })
            };
        let Some(owner) = piece.owner.as_deref() else {
            return match own.as_ref() {
                Some(read) => read(piece),
                None => direct(),
            };
        };
        let name = piece
            .path
            .strip_prefix(&root)
            .ok()
            .and_then(|name| name.to_str())
            .ok_or_else(|| format!("{} is not under {}", piece.path.display(), root.display()))?;
        let key = ObjectPath::parse(name).map_err(|e| {
            format!(
                "{}: not a name a map server takes: {e}",
                piece.path.display()
            )
        })?;
        let fallback = match location.as_ref() {
            Some(_) => direct().ok().map(|route| (route.store, route.key)),
            None => None,
        };
        Ok(Route {
            store: owner_store(owner, &canonical),
            key,
            fallback,
            copy: true,
        })
    }
}

/// Each piece read from this process's copy of its file in `copies` (the
/// map copy directory of a query whose maps are also in the location), by
/// its name under `root`, and from `location` when the copy is missing
/// (another process's map, or a copy its attempt did not publish).
///
/// # Errors
///
/// A directory object_store cannot root a store at.
pub(crate) fn copy_source(
    copies: PathBuf,
    root: PathBuf,
    location: Sources,
) -> Result<impl Fn(&Piece) -> Source + Send, String> {
    let store: Arc<dyn ObjectStore> = Arc::new(
        LocalFileSystem::new_with_prefix(&copies)
            .map_err(|e| format!("cannot read {} as a store: {e}", copies.display()))?,
    );
    Ok(move |piece: &Piece| {
        let there = location(piece)?;
        Ok(Route {
            store: Arc::clone(&store),
            key: name_under(&root, piece)?,
            fallback: Some((there.store, there.key)),
            copy: true,
        })
    })
}

/// Each piece of the local directory `root` read from its file there, as
/// an object of a store rooted at `root` (for a piece whose owner lost it).
///
/// # Errors
///
/// A directory object_store cannot root a store at.
pub(crate) fn file_source(root: PathBuf) -> Result<impl Fn(&Piece) -> Source + Send, String> {
    let store: Arc<dyn ObjectStore> = Arc::new(
        LocalFileSystem::new_with_prefix(&root)
            .map_err(|e| format!("cannot read {} as a store: {e}", root.display()))?,
    );
    Ok(move |piece: &Piece| {
        Ok(Route {
            store: Arc::clone(&store),
            key: name_under(&root, piece)?,
            fallback: None,
            copy: false,
        })
    })
}

/// The name of `piece`'s file under `root`, as a key.
fn name_under(root: &Path, piece: &Piece) -> Result<ObjectPath, String> {
    let name = piece
        .path
        .strip_prefix(root)
        .ok()
        .and_then(|name| name.to_str())
        .ok_or_else(|| format!("{} is not under {}", piece.path.display(), root.display()))?;
    ObjectPath::parse(name)
        .map_err(|e| format!("{}: not a name a store takes: {e}", piece.path.display()))
}

/// `pieces` in the order their ranges are fetched and read: by map, then
/// by offset, so a map's adjacent buckets are one GET.
pub(crate) fn fetch_order(mut pieces: Vec<Piece>) -> VecDeque<Piece> {
    pieces.sort_by_key(|p| (p.map, p.segments.front().map_or(0, |s| s.offset)));
    pieces.into()
}

impl RangeFetcher {
    /// The fetcher of `pieces` (in [`fetch_order`], one range each), each
    /// read where `source` says, up to `budget` bytes in flight (at least
    /// one request, however large); `covers` by map, when the reading
    /// task's partitions share them.
    pub(crate) fn new(
        source: &dyn Fn(&Piece) -> Source,
        pieces: &VecDeque<Piece>,
        budget: u64,
        covers: &[Option<Cover>],
    ) -> Self {
        let mut pending: VecDeque<Request> = VecDeque::new();
        for piece in pieces {
            let (offset, len) = piece
                .segments
                .iter()
                .fold((u64::MAX, 0), |(o, l), s| (o.min(s.offset), l + s.bytes));
            match pending.back_mut() {
                Some(last) if last.path == piece.path && last.offset + last.len == offset => {
                    last.len += len;
                    last.parts.push(len);
                }
                _ => pending.push_back(Request {
                    path: piece.path.clone(),
                    source: source(piece),
                    offset,
                    len,
                    size: piece.size,
                    e_tag: piece.e_tag.clone(),
                    parts: vec![len],
                    cover: covers.get(piece.map).copied().flatten(),
                }),
            }
        }
        // A cover serves only a request wholly inside it.
        for request in &mut pending {
            request.cover = request.cover.filter(|c| {
                request.offset >= c.offset && request.offset + request.len <= c.offset + c.len
            });
        }
        Self {
            pending,
            in_flight: FuturesOrdered::new(),
            lengths: VecDeque::new(),
            bytes_in_flight: 0,
            budget: budget.max(1),
            ready: VecDeque::new(),
        }
    }

    /// Requests to be made in all (for a test or a count).
    #[cfg(test)]
    pub(crate) fn requests(&self) -> usize {
        self.pending.len()
    }

    /// Start requests while the bound allows (one always, when none runs).
    fn top_up(&mut self) {
        while let Some(next) = self.pending.front() {
            if !self.in_flight.is_empty() && self.bytes_in_flight + next.len > self.budget {
                break;
            }
            let request = self.pending.pop_front().expect("peeked");
            self.bytes_in_flight += request.len;
            self.lengths.push_back(request.len);
            self.in_flight.push_back(self.start(request));
        }
    }

    /// Spawn `request` on the I/O runtime now (not at its first poll), so
    /// every request started is in flight together.
    fn start(&self, mut request: Request) -> InFlight {
        let source = std::mem::replace(&mut request.source, Err(String::new()));
        let Route {
            store,
            key,
            fallback,
            copy,
        } = match source {
            Ok(route) => route,
            Err(e) => return Box::pin(async move { Err(FetchError::Failed(e)) }),
        };
        let pinned = request.e_tag.clone();
        if copy {
            request.e_tag = None;
        }
        let Some((other, other_key)) = fallback else {
            return Self::get(store, key, request);
        };
        // Read from the other place only when the first has lost the file
        // (its worker is gone): its own range, not a slice's cover.
        let again = Request {
            path: request.path.clone(),
            source: Err(String::new()),
            cover: None,
            parts: request.parts.clone(),
            e_tag: pinned,
            ..request
        };
        let first = Self::get(store, key, request);
        Box::pin(async move {
            match first.await {
                Err(FetchError::Lost) => Self::get(other, other_key, again).await,
                fetched => fetched,
            }
        })
    }

    /// `request`'s range of `key` in `store`, or of its cover.
    fn get(store: Arc<dyn ObjectStore>, key: ObjectPath, request: Request) -> InFlight {
        if let Some(cover) = request.cover {
            let shared = shared_reads::take(store, key, cover, request.e_tag.clone());
            return Box::pin(async move {
                let (bytes, size) = shared.await.map_err(|failure| match failure {
                    SharedFailure::Lost => FetchError::Lost,
                    SharedFailure::Failed(e) => FetchError::Failed(e),
                })?;
                let start = (request.offset - cover.offset) as usize;
                let range = bytes.get(start..start + request.len as usize);
                match range {
                    Some(range) if size == request.size && bytes.len() as u64 == cover.len => {
                        Ok(split_parts(range, &request.parts))
                    }
                    _ => Err(FetchError::Failed(format!(
                        "holds {size} byte(s) but its map reported {} (overwritten?)",
                        request.size
                    ))),
                }
            });
        }
        let get = get_range_pinned(
            store,
            key,
            request.offset,
            request.len,
            request.e_tag.clone(),
        );
        let handle = spawn(get);
        Box::pin(async move {
            let fetched = join(handle.map_err(FetchError::Failed)?)
                .await
                .map_err(FetchError::Failed)?
                .map_err(|e| FetchError::Failed(format!("cannot fetch: {e}")))?;
            let (bytes, size) = match fetched {
                Pinned::Got(bytes, size) => (bytes, size),
                Pinned::Missing | Pinned::Replaced => return Err(FetchError::Lost),
            };
            if size != request.size || bytes.len() as u64 != request.len {
                return Err(FetchError::Failed(format!(
                    "holds {size} byte(s) but its map reported {} (overwritten?)",
                    request.size
                )));
            }
            Ok(split_parts(&bytes, &request.parts))
        })
    }

    /// The next piece's bytes, in order.
    pub(crate) fn poll_next_piece(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Vec<u8>, FetchError>> {
        loop {
            if let Some(bytes) = self.ready.pop_front() {
                // Room freed by the piece before: start what now fits.
                self.top_up();
                return Poll::Ready(Ok(bytes));
            }
            self.top_up();
            match futures::ready!(self.in_flight.poll_next_unpin(cx)) {
                None => {
                    return Poll::Ready(Err(FetchError::Failed(
                        "no range is left to fetch for this piece".to_string(),
                    )));
                }
                Some(fetched) => {
                    self.bytes_in_flight -= self.lengths.pop_front().unwrap_or(0);
                    self.ready.extend(fetched?);
                }
            }
        }
    }
}

/// `bytes` cut into pieces of lengths `parts`, each a buffer of its own.
fn split_parts(bytes: &[u8], parts: &[u64]) -> Vec<Vec<u8>> {
    let mut out = Vec::with_capacity(parts.len());
    let mut at = 0usize;
    for len in parts {
        let end = at + *len as usize;
        out.push(bytes[at..end].to_vec());
        at = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use dfx_abi::MapLayout;

    use super::*;
    use crate::exchange::locate::locate_by_layouts;
    use crate::exchange::store::{S3Options, ShuffleLocation, s3_store};

    #[test]
    fn a_maps_adjacent_buckets_are_one_request_and_each_map_its_own() {
        // Bucket 2 is empty: buckets 1 and 3 are adjacent around it.
        let layout = MapLayout {
            first_bucket: 0,
            offsets: vec![0, 10, 30, 30],
            bytes: vec![10, 20, 0, 5],
            rows: vec![1, 2, 0, 1],
            size: 100,
            e_tag: None,
            keys: None,
            owner: None,
        };
        let root = Path::new("s3://bucket/q");
        let Ok(ShuffleLocation::S3(s3)) = ShuffleLocation::parse(root) else {
            panic!("an S3 location");
        };
        let options = S3Options {
            endpoint: Some("http://127.0.0.1:9".into()),
            region: Some("us-east-1".into()),
            allow_http: true,
        };
        let store = s3_store("bucket", &options).unwrap();
        // Bucket-major, as a coalesced task's head lists them.
        let wanted = vec![(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (0, 3)];
        let pieces = locate_by_layouts(root, 2, &[layout.clone(), layout], wanted, None);
        let ordered = fetch_order(pieces.into());
        let order: Vec<(usize, usize)> = ordered.iter().map(|p| (p.map, p.bucket)).collect();
        assert_eq!(order, [(0, 0), (0, 1), (0, 3), (1, 0), (1, 1)]);
        let fetcher = RangeFetcher::new(&s3_source(store, s3), &ordered, 64, &[]);
        assert_eq!(fetcher.requests(), 2);
    }
}
