//! One driver per local shuffle directory, enforced by a lock rather than a
//! check.
//!
//! A driver refuses a directory that already holds stage output, but two
//! drivers started together on an empty one would both pass that check and
//! then read each other's files. So each driver takes an exclusive advisory
//! lock (`flock`) on [`LOCK_FILE`] in the directory first, and holds it for
//! the whole run: the second driver's attempt fails at once and names the
//! holder. The kernel drops the lock when its holder exits, however it exits,
//! so a crashed driver leaves nothing to clean up.
//!
//! Both hosts (the Rust `dfx_host` and the Python module) take it through this
//! type, so they exclude each other too.

use std::fs::{DirBuilder, File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// The lock file a driver holds in its shuffle directory. Not `stage-*`, so
/// it never counts as stage output.
pub const LOCK_FILE: &str = ".dfx-driver.lock";

/// A held driver lock on a shuffle directory; released on drop.
#[derive(Debug)]
pub struct DriverLock {
    path: PathBuf,
    // Held for its lock; closing the file releases it.
    _file: File,
}

impl DriverLock {
    /// Lock `dir` for this driver, creating it (mode 0700) if needed.
    ///
    /// # Errors
    ///
    /// A directory or lock file that cannot be created, or a lock another
    /// driver holds (naming its process id, as it wrote it).
    pub fn acquire(dir: &Path) -> Result<Self, String> {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("cannot create shuffle directory {}: {e}", dir.display()))?;
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| format!("cannot open the driver lock {}: {e}", path.display()))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let holder = if holder.is_empty() {
                    "another driver".to_string()
                } else {
                    format!("another driver ({holder})")
                };
                return Err(format!(
                    "shuffle directory {} is in use: {holder} holds its lock {}. One driver runs \
                     in a shuffle directory at a time; use another directory",
                    dir.display(),
                    path.display()
                ));
            }
            Err(TryLockError::Error(e)) => {
                return Err(format!("cannot lock {}: {e}", path.display()));
            }
        }
        // Who holds it, for the message a second driver prints.
        let _ = file.set_len(0);
        let _ = file.seek(SeekFrom::Start(0));
        let _ = write!(file, "pid {}", std::process::id());
        let _ = file.flush();
        Ok(Self { path, _file: file })
    }

    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_one_directory_is_refused_until_the_first_is_dropped() {
        let dir = tempfile_dir();
        let first = DriverLock::acquire(&dir).unwrap();
        let err = DriverLock::acquire(&dir).unwrap_err();
        assert!(err.contains("is in use"), "{err}");
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        drop(first);
        DriverLock::acquire(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("dfx-lock-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }
}
