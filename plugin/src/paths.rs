//! Where stage output lives: stage ids, map files, the glob, temp names.
//!
//! The one definition of these conventions. Hosts never re-spell them: they
//! call the plugin's exported functions, which call these.
//!
//! ```text
//! <dir>/stage-<S>/<K>-map-<M>.arrow   every bucket of map M, as segments,
//!                                     closed by its commit marker (which byte
//!                                     ranges hold which bucket); published
//!                                     whole, by rename; K = M mod KEY_PREFIXES
//! ```
//!
//! One file per map, marker included, rather than one per bucket and a
//! marker beside them: creating a file is the costly part of a local shuffle
//! (a stage of N maps and N buckets made N² files and N directories, then
//! 2N; it now makes N), and on S3 each object is a request.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Id of the first stage in pre-order; the n-th stage has `FIRST_STAGE_ID + n`.
pub const FIRST_STAGE_ID: u64 = 1;

/// Glob, relative to a shuffle directory, matching every stage output entry.
pub const PARTITION_GLOB: &str = "stage-*";

/// How many key prefixes a stage's map files are spread over.
///
/// An object store serves a fixed request rate per prefix (S3: 5,500 GET
/// and 3,500 PUT a second), and a stage's tasks read and write its maps all
/// at once: with every key under `stage-<S>/map-`, 64 machine-sized tasks
/// with eight requests in flight each ask one prefix for more than it
/// serves. Leading each map's name with `M mod KEY_PREFIXES` gives the store
/// that many prefixes, each holding an equal share of the stage's maps, to
/// partition the load over.
pub const KEY_PREFIXES: usize = 8;

/// Suffix of a file still being written; never read, never published as is.
pub const TEMP_SUFFIX: &str = ".tmp";

/// Id of the `index`-th stage in pre-order.
pub fn stage_id(index: u64) -> u64 {
    FIRST_STAGE_ID + index
}

/// The directory of stage `stage_id` under `dir`.
pub fn stage_dir(dir: &Path, stage_id: u64) -> PathBuf {
    dir.join(format!("stage-{stage_id}"))
}

/// The map file of map `map` of stage `stage_id` under `dir`: every bucket
/// of the map as segments, closed by its commit marker. Published whole, so
/// its presence says the map is published. The exports `partition_path` and
/// `bucket_path` both answer with it.
pub fn map_path(dir: &Path, stage_id: u64, map: usize) -> PathBuf {
    let prefix = map % KEY_PREFIXES;
    stage_dir(dir, stage_id).join(format!("{prefix}-map-{map}.arrow"))
}

/// The stage and map of a map file's name relative to its location
/// (`stage-<S>/<K>-map-<M>.arrow`, as [`map_path`] makes it under a
/// location), or `None` for any other name: one with a prefix `K` other
/// than the map's, or numbers not as [`map_path`] writes them.
pub fn parse_map_name(name: &str) -> Option<(u64, usize)> {
    let (stage, file) = name.split_once('/')?;
    let stage = stage.strip_prefix("stage-")?.parse().ok()?;
    let (_, map) = file.split_once("-map-")?;
    let map = map.strip_suffix(".arrow")?.parse().ok()?;
    let named = map_path(Path::new(""), stage, map);
    (named.as_os_str() == name).then_some((stage, map))
}

/// A temp name beside `final_path`, unique to this writer: the pid separates
/// processes and the counter separates writers within one, so two writers of
/// one map (a retry racing a straggler) never interleave bytes in one file.
pub fn temp_path(final_path: &Path) -> PathBuf {
    static WRITERS: AtomicU64 = AtomicU64::new(0);
    let writer = WRITERS.fetch_add(1, Ordering::Relaxed);
    let name = final_path
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    final_path.with_file_name(format!(
        "{name}.{}-{writer}{TEMP_SUFFIX}",
        std::process::id()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_paths() {
        assert_eq!(stage_id(0), 1);
        assert_eq!(stage_id(3), 4);
        assert_eq!(
            map_path(Path::new("/s"), 2, 7),
            PathBuf::from("/s/stage-2/7-map-7.arrow")
        );
        assert_eq!(
            map_path(Path::new("/s"), 2, 21),
            PathBuf::from("/s/stage-2/5-map-21.arrow")
        );
    }

    #[test]
    fn a_stages_maps_are_spread_evenly_over_the_key_prefixes() {
        let mut per_prefix = std::collections::BTreeMap::<String, usize>::new();
        for map in 0..64 {
            let path = map_path(Path::new("root"), 3, map);
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let (prefix, _) = name.split_once("-map-").unwrap();
            *per_prefix
                .entry(format!("root/stage-3/{prefix}"))
                .or_default() += 1;
        }
        assert_eq!(per_prefix.len(), KEY_PREFIXES);
        assert!(
            per_prefix.values().all(|&n| n == 64 / KEY_PREFIXES),
            "{per_prefix:?}"
        );
    }

    #[test]
    fn a_map_files_name_parses_back_to_its_stage_and_map() {
        let name = map_path(Path::new(""), 4, 11);
        assert_eq!(parse_map_name(name.to_str().unwrap()), Some((4, 11)));
        for other in [
            "stage-4/3-map-11.arrow.tmp",
            "stage-4/map-11.arrow",
            "stage-4/2-map-11.arrow",
            "stage-4/03-map-11.arrow",
            "stage-04/3-map-11.arrow",
            "stage-x/1-map-1.arrow",
            "stage-1",
            "../1-map-1.arrow",
        ] {
            assert_eq!(parse_map_name(other), None, "{other}");
        }
    }

    #[test]
    fn temp_paths_are_unique_and_beside_the_final_file() {
        let final_path = map_path(Path::new("/s"), 1, 0);
        let a = temp_path(&final_path);
        let b = temp_path(&final_path);
        assert_ne!(a, b);
        for t in [&a, &b] {
            let name = t.file_name().unwrap().to_string_lossy();
            assert!(name.ends_with(TEMP_SUFFIX), "{name}");
            assert!(name.starts_with("0-map-0.arrow."), "{name}");
            assert_eq!(t.parent(), final_path.parent());
        }
    }
}
