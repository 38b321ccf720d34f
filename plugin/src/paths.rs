//! Where stage output lives: stage ids, partition file names, the glob.
//!
//! The one definition of these conventions. Hosts never re-spell them: they
//! call the plugin's exported functions, which call these.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Id of the first stage in pre-order; the n-th stage has `FIRST_STAGE_ID + n`.
pub const FIRST_STAGE_ID: u64 = 1;

/// Glob, relative to a shuffle directory, matching every stage output file.
pub const PARTITION_GLOB: &str = "stage-*-part-*.arrow";

/// Suffix of a file still being written; never read, never published as is.
pub const TEMP_SUFFIX: &str = ".arrow.tmp";

/// Id of the `index`-th stage in pre-order.
pub fn stage_id(index: u64) -> u64 {
    FIRST_STAGE_ID + index
}

/// The published file of `partition` of stage `stage_id` under `dir`.
pub fn partition_path(dir: &Path, stage_id: u64, partition: usize) -> PathBuf {
    dir.join(format!("stage-{stage_id}-part-{partition}.arrow"))
}

/// A temp name beside `final_path`, unique to this writer: the pid separates
/// processes and the counter separates writers within one, so two writers of
/// one partition never interleave their batches in one file.
pub fn temp_path(final_path: &Path) -> PathBuf {
    static WRITERS: AtomicU64 = AtomicU64::new(0);
    let writer = WRITERS.fetch_add(1, Ordering::Relaxed);
    let stem = final_path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    final_path.with_file_name(format!(
        "{stem}.{}-{writer}{TEMP_SUFFIX}",
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
            partition_path(Path::new("/s"), 2, 7),
            PathBuf::from("/s/stage-2-part-7.arrow")
        );
    }

    #[test]
    fn temp_paths_are_unique_and_never_match_the_glob() {
        let final_path = partition_path(Path::new("/s"), 1, 0);
        let a = temp_path(&final_path);
        let b = temp_path(&final_path);
        assert_ne!(a, b);
        for t in [&a, &b] {
            let name = t.file_name().unwrap().to_string_lossy();
            assert!(name.ends_with(TEMP_SUFFIX), "{name}");
            assert!(name.starts_with("stage-1-part-0."), "{name}");
        }
    }
}
