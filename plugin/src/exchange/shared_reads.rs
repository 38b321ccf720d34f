//! Ranges the partitions of one task share: a task running a slice of
//! partitions `a..b` reads buckets `a..b` of every upstream map, side by
//! side in each map's file, so one GET of that whole range serves all its
//! partitions and the exchange costs one request per (reader task,
//! upstream map) instead of one per (reader partition, upstream map).
//!
//! ```text
//! map m's file:  … [bucket a][bucket a+1] … [bucket b-1] …
//!                  └──────── one GET, the slice's cover ───┘
//! partition a      takes its bucket ─┐
//! partition a+1    takes its bucket ─┼─ the same fetch, first asker starts it
//! …                                  ┘
//! ```
//!
//! A cover is taken once by each partition with rows in it (its `takers`),
//! then forgotten; its bytes live as long as a taker holds them. A cover a
//! partition never takes (its task failed first) is dropped once it is
//! older than [`STALE_AFTER`], so a serving worker holds nothing for long,
//! and one whose fetch failed is dropped at once, so a retry fetches anew.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use dfx_abi::{BucketRange, MapLayout};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;

use crate::exchange::io::{join, spawn};
use crate::exchange::reads::{Pinned, get_range_pinned};

/// How long a cover no partition took yet is kept.
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(60);

/// The range of one map's file holding a slice's buckets, and how many of
/// the slice's partitions read from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cover {
    /// Where the slice's first bucket starts.
    pub(crate) offset: u64,
    /// Up to the end of its last bucket.
    pub(crate) len: u64,
    /// The slice's partitions with rows in this map.
    pub(crate) takers: usize,
}

impl Cover {
    /// For each map of `maps`, the range holding buckets `slice` (a task's
    /// partitions), when at least two of them have rows there and it is no
    /// larger than `budget`: the one read the task's partitions share.
    pub(crate) fn of_slice(
        maps: &[MapLayout],
        slice: Range<usize>,
        budget: u64,
    ) -> Vec<Option<Self>> {
        maps.iter()
            .map(|layout| {
                let held: Vec<BucketRange> = slice
                    .clone()
                    .filter_map(|b| layout.bucket(b))
                    .filter(|range| range.rows > 0)
                    .collect();
                let offset = held.iter().map(|range| range.offset).min()?;
                let end = held.iter().map(|range| range.offset + range.bytes).max()?;
                (held.len() >= 2 && end - offset <= budget).then_some(Self {
                    offset,
                    len: end - offset,
                    takers: held.len(),
                })
            })
            .collect()
    }
}

/// Why a shared range could not be had.
#[derive(Debug, Clone)]
pub(crate) enum SharedFailure {
    /// No such object, or another one holds its key now.
    Lost,
    /// Anything else, said.
    Failed(String),
}

/// A cover's bytes and its object's whole size.
pub(crate) type Fetched = Result<(Arc<Vec<u8>>, u64), SharedFailure>;

type SharedGet = Shared<BoxFuture<'static, Fetched>>;

/// One object's range: its store (by address: a bucket's client, or one
/// worker's map server), its key, entity tag, offset and length.
type CoverKey = (usize, String, Option<String>, u64, u64);

struct Entry {
    get: SharedGet,
    takers_left: usize,
    since: Instant,
}

static COVERS: LazyLock<Mutex<HashMap<CoverKey, Entry>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The fetch of `cover` of object `key` (pinned to `e_tag` when given):
/// started by its first taker, the same for every other.
pub(crate) fn take(
    store: Arc<dyn ObjectStore>,
    key: ObjectPath,
    cover: Cover,
    e_tag: Option<String>,
) -> SharedGet {
    let store_id = Arc::as_ptr(&store).cast::<()>() as usize;
    let id: CoverKey = (
        store_id,
        key.to_string(),
        e_tag.clone(),
        cover.offset,
        cover.len,
    );
    let start = move || fetch(store, key, cover, e_tag);
    // A poisoned lock only means a taker panicked; the map is still whole.
    let mut covers = COVERS.lock().unwrap_or_else(|p| p.into_inner());
    let now = Instant::now();
    // Stale covers go, and so does one whose fetch failed: a retry of the
    // task in this process asks the store again.
    covers.retain(|_, entry| {
        now.duration_since(entry.since) < STALE_AFTER && !matches!(entry.get.peek(), Some(Err(_)))
    });
    let entry = covers.entry(id.clone()).or_insert_with(|| Entry {
        get: start(),
        takers_left: cover.takers.max(1),
        since: now,
    });
    let get = entry.get.clone();
    entry.takers_left -= 1;
    if entry.takers_left == 0 {
        covers.remove(&id);
    }
    get
}

/// Covers waiting for a taker, for a test.
#[cfg(test)]
pub(crate) fn waiting() -> usize {
    COVERS.lock().map_or(0, |covers| covers.len())
}

/// One GET of `cover`, on the I/O runtime from now on.
fn fetch(
    store: Arc<dyn ObjectStore>,
    key: ObjectPath,
    cover: Cover,
    e_tag: Option<String>,
) -> SharedGet {
    let handle = spawn(get_range_pinned(store, key, cover.offset, cover.len, e_tag));
    async move {
        let fetched = join(handle.map_err(SharedFailure::Failed)?)
            .await
            .map_err(SharedFailure::Failed)?
            .map_err(|e| SharedFailure::Failed(format!("cannot fetch: {e}")))?;
        match fetched {
            Pinned::Got(bytes, size) => Ok((Arc::new(bytes), size)),
            Pinned::Missing | Pinned::Replaced => Err(SharedFailure::Lost),
        }
    }
    .boxed()
    .shared()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::store::{S3Options, s3_store};

    #[test]
    fn a_cover_is_forgotten_once_each_taker_took_it() {
        let options = S3Options {
            endpoint: Some("http://127.0.0.1:9".into()),
            region: Some("us-east-1".into()),
            allow_http: true,
        };
        let store = s3_store("bucket", &options).unwrap();
        let key = ObjectPath::from("q/stage-1/0-map-0.arrow");
        let cover = Cover {
            offset: 10,
            len: 20,
            takers: 2,
        };
        let before = waiting();
        let first = take(Arc::clone(&store), key.clone(), cover, None);
        assert_eq!(waiting(), before + 1);
        let second = take(store, key, cover, None);
        assert_eq!(waiting(), before);
        // Both takers hold the one fetch.
        assert!(first.ptr_eq(&second));
    }
}
