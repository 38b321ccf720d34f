//! Where stage output lives: stage ids, bucket files, commit markers, the glob.
//!
//! The one definition of these conventions. Hosts never re-spell them: they
//! call the plugin's exported functions, which call these.
//!
//! ```text
//! <dir>/stage-<S>/map-<M>/bucket-<B>.arrow   rows of map M that fall in bucket B
//!                                            (no file for an empty bucket)
//! <dir>/stage-<S>/map-<M>.json               map M's commit marker, written last
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Id of the first stage in pre-order; the n-th stage has `FIRST_STAGE_ID + n`.
pub const FIRST_STAGE_ID: u64 = 1;

/// Glob, relative to a shuffle directory, matching every stage output entry.
pub const PARTITION_GLOB: &str = "stage-*";

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

/// The directory holding map `map`'s bucket files.
pub fn map_dir(dir: &Path, stage_id: u64, map: usize) -> PathBuf {
    stage_dir(dir, stage_id).join(format!("map-{map}"))
}

/// The file of bucket `bucket` of map `map` of stage `stage_id` under `dir`.
pub fn bucket_path(dir: &Path, stage_id: u64, map: usize, bucket: usize) -> PathBuf {
    map_dir(dir, stage_id, map).join(format!("bucket-{bucket}.arrow"))
}

/// The commit marker of map `map` of stage `stage_id` under `dir`.
pub fn marker_path(dir: &Path, stage_id: u64, map: usize) -> PathBuf {
    stage_dir(dir, stage_id).join(format!("map-{map}.json"))
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
            bucket_path(Path::new("/s"), 2, 7, 3),
            PathBuf::from("/s/stage-2/map-7/bucket-3.arrow")
        );
        assert_eq!(
            marker_path(Path::new("/s"), 2, 7),
            PathBuf::from("/s/stage-2/map-7.json")
        );
    }

    #[test]
    fn temp_paths_are_unique_and_beside_the_final_file() {
        let final_path = bucket_path(Path::new("/s"), 1, 0, 2);
        let a = temp_path(&final_path);
        let b = temp_path(&final_path);
        assert_ne!(a, b);
        for t in [&a, &b] {
            let name = t.file_name().unwrap().to_string_lossy();
            assert!(name.ends_with(TEMP_SUFFIX), "{name}");
            assert!(name.starts_with("bucket-2.arrow."), "{name}");
            assert_eq!(t.parent(), final_path.parent());
        }
    }
}
