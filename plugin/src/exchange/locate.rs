//! Finding a map's output: its commit marker read and checked, locally or
//! from an `s3://` location, and the key summary it published for join
//! filters. Every error names stage, map, bucket and file; a missing map is
//! lost output, recorded for the location (see [`crate::error`]).
use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::common::{DataFusionError, Result};
use dfx_abi::MapLayout;
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;

use crate::config::DfxConfig;
use crate::exchange::files::read_range;
use crate::exchange::flight_store::owner_store;
use crate::exchange::marker::{Located, MapFileRef, MapMarker, Segment, TAIL_GUESS};
use crate::exchange::store::{
    ObjectKey, S3Location, S3Options, ShuffleLocation, canonical_location, get_range_if,
    get_tail_tagged, location_root, s3_store,
};
use crate::filters::summary::KeySummary;
use crate::paths::map_path;

/// A `(map, bucket)` piece whose marker is still to read.
struct Pending {
    map: usize,
    bucket: usize,
    /// One of the partition's own pieces, rather than a companion's: the
    /// only kind whose marker may name companions.
    planned: bool,
}

impl Pending {
    fn planned((map, bucket): (usize, usize)) -> Self {
        Self {
            map,
            bucket,
            planned: true,
        }
    }

    /// The same bucket of the maps `marker` names as its companions (the
    /// other parts of a split partition, see [`crate::adapt::skew_split`]),
    /// read next.
    fn companions(marker: &MapMarker, bucket: usize, pending: &mut VecDeque<Pending>) {
        for &companion in marker.companions.iter().rev() {
            pending.push_front(Pending {
                map: companion as usize,
                bucket,
                planned: false,
            });
        }
    }
}

/// The pieces of an S3 reader's partition, after reading (GET of each
/// object's tail) and checking the marker of every map it reads, as a local
/// reader does in `execute`.
pub(crate) async fn read_markers(
    store: Arc<dyn ObjectStore>,
    location: S3Location,
    root: PathBuf,
    stage_id: u64,
    buckets: usize,
    pieces: Vec<(usize, usize)>,
) -> Result<VecDeque<Piece>> {
    let mut maps: BTreeMap<usize, (MapMarker, u64, Option<String>)> = BTreeMap::new();
    let mut queue = VecDeque::new();
    let mut pending: VecDeque<Pending> = pieces.into_iter().map(Pending::planned).collect();
    while let Some(Pending {
        map,
        bucket,
        planned,
    }) = pending.pop_front()
    {
        if let std::collections::btree_map::Entry::Vacant(slot) = maps.entry(map) {
            let path = map_path(&root, stage_id, map);
            let at = MapFileRef {
                location: &root,
                path: &path,
                stage_id,
                map,
                bucket,
                buckets,
            };
            slot.insert(read_remote_marker(&store, &location, &at).await?);
        }
        let (marker, size, e_tag) = &maps[&map];
        if let Some(mut piece) = Piece::of(marker, *size, &root, bucket) {
            piece.e_tag = e_tag.clone();
            queue.push_back(piece);
        }
        if planned {
            Pending::companions(marker, bucket, &mut pending);
        }
    }
    Ok(queue)
}

/// The key summary map `map` of stage `stage_id` (of `buckets` buckets)
/// published into `shuffle_dir`, local or on S3: read from where `laid_out`
/// (the driver's layout of the map) says it lies, else found through its
/// marker, read and checked as a reader checks it. `None` when the map
/// published none. A missing map is lost output, recorded for the location
/// as a reader records it.
///
/// # Errors
///
/// Those of [`MapMarker::read`], an S3 location that cannot be reached, a
/// map whose file is not the one its layout describes or whose object
/// changed in between, or a summary that is not one.
pub(crate) async fn read_map_keys(
    shuffle_dir: &Path,
    config: &DfxConfig,
    (stage_id, map, buckets): (u64, usize, usize),
    laid_out: Option<&MapLayout>,
) -> Result<Option<KeySummary>> {
    let location = ShuffleLocation::parse(shuffle_dir)
        .map_err(|e| DataFusionError::Execution(format!("dfx stage {stage_id} map {map}: {e}")))?;
    let root = location_root(&location);
    let path = map_path(&root, stage_id, map);
    let at = MapFileRef {
        location: &root,
        path: &path,
        stage_id,
        map,
        bucket: 0,
        buckets,
    };
    let fail = |what: String| at.error(format!("cannot read the key summary: {what}"));
    let parse = |bytes: Vec<u8>| {
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| fail(format!("not a key summary: {e}")))
    };
    // A map served by the worker that wrote it (and not this process):
    // from its map server, and under `both` from the location when the
    // worker is gone.
    if let Some(layout) = laid_out
        && let Some(owner) = layout.owner.as_deref()
        && Some(owner) != config.own_map_server()
    {
        // A serving worker always reports the summary's region.
        let Some((offset, length)) = layout.keys else {
            return Ok(None);
        };
        let name = map_path(Path::new(""), stage_id, map);
        let key = ObjectPath::parse(name.to_string_lossy().as_ref())
            .map_err(|e| fail(format!("not a name a map server takes: {e}")))?;
        let store = owner_store(owner, &canonical_location(&root.to_string_lossy()));
        match get_range_if(store, key, offset, length, None)
            .await
            .map_err(fail)?
        {
            Some((bytes, size)) if size == layout.size => return parse(bytes),
            Some((_, size)) => {
                return Err(fail(format!(
                    "the map's file on {owner} is {size} byte(s), not the {} its layout \
                     describes",
                    layout.size
                )));
            }
            None if !config.reads_location_when_owner_lost()? => return Err(at.lost()),
            // `both`: the location's copy, below.
            None => {}
        }
    }
    // A map this process wrote under `both`: from its own copy, when it
    // kept one of the file its map reported, rather than the location.
    let copies = config.map_copy_dir.trim();
    if let Some(layout) = laid_out
        && let Some((offset, length)) = layout.keys
        && layout.owner.is_some()
        && layout.owner.as_deref() == config.own_map_server()
        && !copies.is_empty()
        && let Ok(file) = File::open(map_path(Path::new(copies), stage_id, map))
        && file.metadata().is_ok_and(|meta| meta.len() == layout.size)
    {
        return parse(read_range(&file, offset, length).map_err(|e| fail(e.to_string()))?);
    }
    // Where the layout says, without the marker; a layout without the
    // region (a worker that did not say) leaves the marker to tell.
    let known = laid_out.and_then(|l| l.keys.map(|keys| (keys, l.size, l.e_tag.clone())));
    let bytes = match location {
        ShuffleLocation::Local(_) => {
            let ((offset, length), size) = match known {
                Some((keys, size, _)) => (keys, Some(size)),
                None if config.maps_only_on_workers()? => {
                    return Err(fail(
                        "the map stays on the disk of the worker that wrote it (shuffle \
                         durability local), but no layout naming its owner and the summary's \
                         region was handed to this task"
                            .to_string(),
                    ));
                }
                None => {
                    let (marker, _) = MapMarker::read(&at)?;
                    let Some(keys) = marker.keys else {
                        return Ok(None);
                    };
                    ((keys.offset, keys.bytes), None)
                }
            };
            let file = File::open(&path).map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    at.lost()
                } else {
                    fail(e.to_string())
                }
            })?;
            if let Some(size) = size {
                let now = file.metadata().map_err(|e| fail(e.to_string()))?.len();
                if now != size {
                    return Err(fail(format!(
                        "the map's file is {now} byte(s), not the {size} its layout describes"
                    )));
                }
            }
            read_range(&file, offset, length).map_err(|e| fail(e.to_string()))?
        }
        ShuffleLocation::S3(s3) => {
            let store =
                s3_store(&s3.bucket, &S3Options::from_config(config)).map_err(|e| at.error(e))?;
            let ((offset, length), size, e_tag) = match known {
                Some(known) => known,
                None => {
                    let (marker, size, e_tag) = read_remote_marker(&store, &s3, &at).await?;
                    let Some(keys) = marker.keys else {
                        return Ok(None);
                    };
                    ((keys.offset, keys.bytes), size, e_tag)
                }
            };
            let key = s3.key(&path).map_err(|e| at.error(e))?;
            let (bytes, now) = get_range_if(store, key, offset, length, e_tag)
                .await
                .map_err(fail)?
                .ok_or_else(|| at.lost())?;
            if now != size {
                return Err(fail(format!(
                    "the map's object changed while it was read ({size} byte(s), then {now})"
                )));
            }
            bytes
        }
    };
    parse(bytes)
}

/// The marker of map `map` of stage `stage_id` (of `buckets` buckets)
/// published into `shuffle_dir`, local or on S3, read and checked as a
/// reader checks it. A missing map is lost output, recorded for the
/// location as a reader records it.
///
/// # Errors
///
/// Those of [`MapMarker::read`], or an S3 location that cannot be reached.
pub(crate) async fn read_map_marker(
    shuffle_dir: &Path,
    config: &DfxConfig,
    stage_id: u64,
    map: usize,
    buckets: usize,
) -> Result<MapMarker> {
    let location = ShuffleLocation::parse(shuffle_dir)
        .map_err(|e| DataFusionError::Execution(format!("dfx stage {stage_id} map {map}: {e}")))?;
    let root = location_root(&location);
    let path = map_path(&root, stage_id, map);
    let at = MapFileRef {
        location: &root,
        path: &path,
        stage_id,
        map,
        bucket: 0,
        buckets,
    };
    match location {
        ShuffleLocation::Local(_) => Ok(MapMarker::read(&at)?.0),
        ShuffleLocation::S3(s3) => {
            let store =
                s3_store(&s3.bucket, &S3Options::from_config(config)).map_err(|e| at.error(e))?;
            Ok(read_remote_marker(&store, &s3, &at).await?.0)
        }
    }
}

/// The marker of map `map` of stage `stage_id` (of `buckets` buckets) as
/// published under `root`, locally or (`s3`) in an S3 location, with the
/// file's size and the object's entity tag: what a map attempt reports when
/// another attempt's file was kept in place of its own.
///
/// # Errors
///
/// Those of [`MapMarker::read`].
pub(crate) async fn read_published_marker(
    root: &Path,
    s3: Option<(&Arc<dyn ObjectStore>, &S3Location)>,
    stage_id: u64,
    map: usize,
    buckets: usize,
) -> Result<(MapMarker, u64, Option<String>)> {
    let path = map_path(root, stage_id, map);
    let at = MapFileRef {
        location: root,
        path: &path,
        stage_id,
        map,
        bucket: 0,
        buckets,
    };
    match s3 {
        None => MapMarker::read(&at).map(|(marker, size)| (marker, size, None)),
        Some((store, location)) => read_remote_marker(store, location, &at).await,
    }
}

/// The marker closing the object at `path`: its tail, and, for an index
/// longer than the first guess, the rest of it; with the object's size and
/// entity tag, which every later fetch of its segments must match.
async fn read_remote_marker(
    store: &Arc<dyn ObjectStore>,
    location: &S3Location,
    at: &MapFileRef<'_>,
) -> Result<(MapMarker, u64, Option<String>)> {
    let fail = |what: String| at.error(what);
    let key = location.key(at.path).map_err(fail)?;
    let (tail, size, e_tag) = get_tail_tagged(Arc::clone(store), key.clone(), TAIL_GUESS)
        .await
        .map_err(|e| fail(format!("cannot fetch the commit marker: {e}")))?
        .ok_or_else(|| at.lost())?;
    let range = match MapMarker::locate(&tail, size, at)? {
        Located::InTail(index) => return Ok((MapMarker::check(index, size, at)?, size, e_tag)),
        Located::At(range) => range,
    };
    let (index, now) = get_range_if(
        Arc::clone(store),
        key,
        range.offset,
        range.len,
        e_tag.clone(),
    )
    .await
    .map_err(|e| fail(format!("cannot fetch the commit marker: {e}")))?
    .ok_or_else(|| at.lost())?;
    if now != size {
        return Err(fail(format!(
            "the map's object changed while it was read ({size} byte(s), then {now})"
        )));
    }
    Ok((MapMarker::check(&index, size, at)?, size, e_tag))
}

/// One bucket of one map to read: the segments its marker lists.
pub(crate) struct Piece {
    pub(crate) map: usize,
    pub(crate) bucket: usize,
    pub(crate) rows: u64,
    pub(crate) segments: VecDeque<Segment>,
    pub(crate) path: PathBuf,
    /// The map file's whole size, as its marker was read from it.
    pub(crate) size: u64,
    /// The object's entity tag, as its marker was read from it (S3): each
    /// segment is fetched only from that object, never from another
    /// attempt's that replaced it.
    pub(crate) e_tag: Option<String>,
    /// The map's file, once open (when local).
    pub(crate) file: Option<File>,
    /// The map server holding the map's file on its worker's disk, when
    /// it is read from there rather than from the location.
    pub(crate) owner: Option<String>,
}

impl Piece {
    /// The piece as located, without its open file: what a fetcher plans
    /// its requests by.
    pub(crate) fn clone_located(&self) -> Self {
        Self {
            map: self.map,
            bucket: self.bucket,
            rows: self.rows,
            segments: self.segments.clone(),
            path: self.path.clone(),
            size: self.size,
            e_tag: self.e_tag.clone(),
            file: None,
            owner: self.owner.clone(),
        }
    }

    /// Bucket `bucket` of the map `marker` describes (closing a file of
    /// `size` bytes), unless it is empty.
    pub(crate) fn of(marker: &MapMarker, size: u64, root: &Path, bucket: usize) -> Option<Self> {
        let entry = &marker.buckets[bucket];
        (entry.rows > 0).then(|| Piece {
            map: marker.map as usize,
            bucket,
            rows: entry.rows,
            segments: entry.segments.iter().copied().collect(),
            path: map_path(root, marker.stage_id, marker.map as usize),
            size,
            e_tag: None,
            file: None,
            owner: None,
        })
    }
}

/// The pieces of bucket-of-map pairs `pieces` of stage `stage_id` under
/// `root`, from the layouts the driver handed the task (`maps`, one per
/// map, from the maps' reports): no marker is read. Each bucket is one
/// contiguous range of its file, read as one piece of one "segment" (its
/// segments, decoded one after the other); an empty bucket is skipped.
/// The caller has checked that `maps` describes every piece's map and
/// bucket (see [`layouts_describe`]). A map whose
/// layout names an owner other than `own_server` (the reading process's
/// own map server) is read from that owner.
/// Whether `maps`, the layouts a task was handed of a stage of `planned`
/// maps of `buckets` buckets, describe every piece it reads: one layout a
/// map, none reaching past the stage's buckets, and each piece's bucket in
/// its map's window. A task handed less reads by the markers.
pub(crate) fn layouts_describe(
    maps: &[MapLayout],
    planned: usize,
    buckets: usize,
    pieces: &[(usize, usize)],
) -> bool {
    maps.len() == planned
        && maps.iter().all(|m| m.described().end <= buckets)
        && pieces
            .iter()
            .all(|&(map, bucket)| maps[map].described().contains(&bucket))
}

pub(crate) fn locate_by_layouts(
    root: &Path,
    stage_id: u64,
    maps: &[MapLayout],
    pieces: Vec<(usize, usize)>,
    own_server: Option<&str>,
) -> VecDeque<Piece> {
    pieces
        .into_iter()
        .filter_map(|(map, bucket)| {
            let layout = maps.get(map)?;
            let range = layout.bucket(bucket)?;
            let rows = range.rows;
            (rows > 0).then(|| Piece {
                map,
                bucket,
                rows,
                segments: VecDeque::from([Segment {
                    offset: range.offset,
                    bytes: range.bytes,
                    rows,
                }]),
                path: map_path(root, stage_id, map),
                size: layout.size,
                e_tag: layout.e_tag.clone(),
                file: None,
                // A map this process wrote is read from its own disk.
                owner: layout
                    .owner
                    .clone()
                    .filter(|owner| Some(owner.as_str()) != own_server),
            })
        })
        .collect()
}

/// The pieces of bucket-of-map pairs `pieces` of stage `stage_id` (of
/// `buckets` buckets) in the local directory `root`: every marker read and
/// checked first, so a lost map fails the read before any row flows; the
/// companions of a split map read with it.
///
/// # Errors
///
/// Those of [`MapMarker::read`]: a missing or torn map, recorded as lost.
pub(crate) fn locate_local(
    root: &Path,
    stage_id: u64,
    buckets: usize,
    pieces: Vec<(usize, usize)>,
) -> Result<VecDeque<Piece>> {
    let mut located = VecDeque::new();
    let mut maps: BTreeMap<usize, (MapMarker, u64)> = BTreeMap::new();
    let mut pending: VecDeque<Pending> = pieces.into_iter().map(Pending::planned).collect();
    while let Some(Pending {
        map,
        bucket,
        planned,
    }) = pending.pop_front()
    {
        if let std::collections::btree_map::Entry::Vacant(slot) = maps.entry(map) {
            let path = map_path(root, stage_id, map);
            slot.insert(MapMarker::read(&MapFileRef {
                location: root,
                path: &path,
                stage_id,
                map,
                bucket,
                buckets,
            })?);
        }
        let (marker, size) = &maps[&map];
        if let Some(piece) = Piece::of(marker, *size, root, bucket) {
            located.push_back(piece);
        }
        if planned {
            Pending::companions(marker, bucket, &mut pending);
        }
    }
    Ok(located)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn four_buckets() -> MapLayout {
        MapLayout {
            first_bucket: 0,
            offsets: vec![0, 10, 20, 30],
            bytes: vec![10; 4],
            rows: vec![1, 2, 3, 4],
            size: 40,
            e_tag: None,
            keys: None,
            owner: None,
        }
    }

    #[test]
    fn a_task_uses_its_layouts_only_when_they_describe_every_bucket_it_reads() {
        let whole = vec![four_buckets(), four_buckets()];
        let window: Vec<MapLayout> = whole.iter().map(|m| m.window(2..4)).collect();
        let slice = [(0, 2), (0, 3), (1, 2), (1, 3)];
        assert!(layouts_describe(&whole, 2, 4, &slice));
        assert!(layouts_describe(&window, 2, 4, &slice));
        // A bucket outside the window, a map missing, or a stage of fewer
        // buckets than the layouts name: read by the markers instead.
        assert!(!layouts_describe(&window, 2, 4, &[(0, 1)]));
        assert!(!layouts_describe(&window[..1], 2, 4, &slice));
        assert!(!layouts_describe(&whole, 2, 3, &[(0, 0)]));
        // The pieces a window describes lie where the whole layout says.
        let located = locate_by_layouts(Path::new("/s"), 2, &window, slice.to_vec(), None);
        let at: Vec<(usize, u64, u64)> = located
            .iter()
            .map(|p| (p.bucket, p.segments[0].offset, p.rows))
            .collect();
        assert_eq!(at, [(2, 20, 3), (3, 30, 4), (2, 20, 3), (3, 30, 4)]);
    }
}
