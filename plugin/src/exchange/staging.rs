//! A map's segments held by bucket until the map publishes, so that its
//! file holds each bucket as one contiguous byte range (one ranged read
//! for a reader of that bucket).
//!
//! ```text
//! encoded segments ─► memory, per bucket ──(past SPILL_BYTES)──► spill file (local)
//!                                   at publish, bucket by bucket:
//!                                   spilled segments, then those still in memory
//! ```
//!
//! Segments arrive interleaved across buckets; a bucket's spilled segments
//! were all encoded before the ones still held, so copying the spilled ones
//! first keeps every bucket's rows in the order the map produced them. The
//! spill file is local even for an S3 location (the upload then happens at
//! publish), and is removed on drop whatever happens.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::exchange::files::{TempFile, create_exclusive_rw, read_range};
use crate::paths::temp_path;

/// Bytes of segments held in memory before they are spilled to disk. A map
/// smaller than this (most of them) creates no file but its own.
pub const SPILL_BYTES: u64 = 32 * 1024 * 1024;

/// One bucket's segments not yet published.
#[derive(Default)]
struct HeldBucket {
    /// Byte ranges of the spill file, in order.
    spilled: Vec<(u64, u64)>,
    /// Encoded segments in memory, after the spilled ones.
    held: Vec<Vec<u8>>,
}

/// A segment taken back out at publish: from memory, or a spilled range.
pub enum Taken<'a> {
    /// Still in memory.
    Held(Vec<u8>),
    /// At `(offset, len)` of the spill file.
    Spilled(&'a File, u64, u64),
}

/// Every bucket's unpublished segments (see the module doc).
pub struct Staging {
    buckets: Vec<HeldBucket>,
    held_bytes: u64,
    /// Where spilled segments go: `spill_near`'s directory.
    spill_near: PathBuf,
    spill: Option<(File, TempFile, u64)>,
}

impl Staging {
    /// Staging for `buckets` buckets, spilling beside the path
    /// `spill_near` (a name no file has: a temp name is made from it).
    pub fn new(buckets: usize, spill_near: PathBuf) -> Self {
        Self {
            buckets: (0..buckets).map(|_| HeldBucket::default()).collect(),
            held_bytes: 0,
            spill_near,
            spill: None,
        }
    }

    /// Hold `segment` of `bucket`; past [`SPILL_BYTES`] held, write every
    /// held segment to the spill file.
    ///
    /// # Errors
    ///
    /// The spill file's creation or write, naming it.
    pub fn push(&mut self, bucket: usize, segment: Vec<u8>) -> Result<(), String> {
        self.held_bytes += segment.len() as u64;
        self.buckets[bucket].held.push(segment);
        if self.held_bytes > SPILL_BYTES {
            self.spill_all()?;
        }
        Ok(())
    }

    fn spill_all(&mut self) -> Result<(), String> {
        if self.spill.is_none() {
            let temp = TempFile::new(temp_path(&self.spill_near));
            // Read back at publish: opened for both.
            let file = create_exclusive_rw(temp.path())
                .map_err(|e| format!("cannot create {}: {e}", temp.path().display()))?;
            self.spill = Some((file, temp, 0));
        }
        let (file, temp, len) = self.spill.as_mut().expect("created above");
        for bucket in &mut self.buckets {
            for segment in bucket.held.drain(..) {
                file.write_all(&segment)
                    .map_err(|e| format!("cannot write {}: {e}", temp.path().display()))?;
                bucket.spilled.push((*len, segment.len() as u64));
                *len += segment.len() as u64;
            }
        }
        self.held_bytes = 0;
        Ok(())
    }

    /// Bucket `bucket`'s segments, in order, taken out of the staging.
    pub fn take(&mut self, bucket: usize) -> Vec<Taken<'_>> {
        let held = std::mem::take(&mut self.buckets[bucket]);
        let file = self.spill.as_ref().map(|(file, _, _)| file);
        let mut taken: Vec<Taken<'_>> = Vec::new();
        if let Some(file) = file {
            taken.extend(
                held.spilled
                    .into_iter()
                    .map(|(offset, len)| Taken::Spilled(file, offset, len)),
            );
        }
        taken.extend(held.held.into_iter().map(Taken::Held));
        taken
    }
}

impl Taken<'_> {
    /// The segment's bytes.
    ///
    /// # Errors
    ///
    /// A spill file that cannot be read back.
    pub fn bytes(self, spill_near: &Path) -> Result<Vec<u8>, String> {
        match self {
            Taken::Held(bytes) => Ok(bytes),
            Taken::Spilled(file, offset, len) => read_range(file, offset, len).map_err(|e| {
                format!(
                    "cannot read back the spilled segments beside {}: {e}",
                    spill_near.display()
                )
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spilled_segments_come_back_before_held_ones_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let near = dir.path().join("0-map-0.arrow");
        let mut staging = Staging::new(2, near.clone());
        let big = vec![1u8; (SPILL_BYTES / 2) as usize];
        staging.push(0, big.clone()).unwrap();
        staging.push(1, vec![9]).unwrap();
        staging.push(0, big.clone()).unwrap(); // spills every bucket
        staging.push(0, vec![2, 2]).unwrap();
        let zero: Vec<Vec<u8>> = staging
            .take(0)
            .into_iter()
            .map(|t| t.bytes(&near).unwrap())
            .collect();
        assert_eq!(zero, vec![big.clone(), big, vec![2, 2]]);
        let one: Vec<Vec<u8>> = staging
            .take(1)
            .into_iter()
            .map(|t| t.bytes(&near).unwrap())
            .collect();
        assert_eq!(one, vec![vec![9]]);
        drop(staging);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "the spill file was left behind");
    }
}
