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
//!
//! An S3 prefix has no such lock: the plugin's probe claims it with a
//! create-only PUT of [`S3_LOCK_OBJECT`], whose body ([`S3LockHolder`]) names
//! the driver. Nothing releases it; the location is used once.

use std::fs::{DirBuilder, File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// The lock file a driver holds in its shuffle directory. Not `stage-*`, so
/// it never counts as stage output.
pub const LOCK_FILE: &str = ".dfx-driver.lock";

/// The lock object a driver creates (create-only) in an S3 prefix it runs in.
pub const S3_LOCK_OBJECT: &str = "_dfx-driver.lock";

/// How often, and how long apart, a driver tries again a lock this very
/// process holds (see [`DriverLock::acquire`]): a second in all.
const OWN_RELEASE_WAITS: u32 = 20;
const OWN_RELEASE_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// The body of [`S3_LOCK_OBJECT`]: which driver created it, so a cleaner on
/// the same machine can tell whether that driver still runs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct S3LockHolder {
    /// The driver's process id.
    pub driver_pid: u32,
    /// The driver's host name (empty when unknown).
    pub host: String,
}

impl S3LockHolder {
    /// This process, on this host.
    pub fn this_process() -> Self {
        Self {
            driver_pid: std::process::id(),
            host: host_name(),
        }
    }

    /// Whether the driver is this machine's and still runs: only then can
    /// a cleaner know; a driver elsewhere is judged by its location's age.
    pub fn is_alive_here(&self) -> bool {
        !self.host.is_empty()
            && self.host == host_name()
            && Path::new(&format!("/proc/{}", self.driver_pid)).exists()
    }
}

/// This machine's host name, empty when it cannot be read.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// Whether a driver holds the lock of directory `dir` now. Writes nothing
/// and creates nothing: a directory without a lock file is held by no one.
/// How a cleaner tells a live driver's location from a crashed one's (the
/// kernel dropped the crashed one's lock).
///
/// # Errors
///
/// A lock file that cannot be opened or tested, naming it.
pub fn is_held(dir: &Path) -> Result<bool, String> {
    let path = dir.join(LOCK_FILE);
    let file = match File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => {
            return Err(format!(
                "cannot open the driver lock {}: {e}",
                path.display()
            ));
        }
    };
    match file.try_lock() {
        // Released as the file closes here.
        Ok(()) => Ok(false),
        Err(TryLockError::WouldBlock) => Ok(true),
        Err(TryLockError::Error(e)) => Err(format!("cannot test {}: {e}", path.display())),
    }
}

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
        let ours = format!("pid {}", std::process::id());
        let mut waits = 0;
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) => {}
                Err(TryLockError::Error(e)) => {
                    return Err(format!("cannot lock {}: {e}", path.display()));
                }
            }
            let mut holder = String::new();
            let _ = file.seek(SeekFrom::Start(0));
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            // A lock this process just released: a child it was forking at
            // that moment holds a copy of the descriptor until it executes
            // its program, an instant.
            if holder == ours && waits < OWN_RELEASE_WAITS {
                waits += 1;
                std::thread::sleep(OWN_RELEASE_PAUSE);
                continue;
            }
            let holder = if holder.is_empty() {
                "another driver".to_string()
            } else {
                format!("another driver ({holder})")
            };
            return Err(format!(
                "shuffle directory {} is in use: {holder} holds its lock {}. One driver runs in a \
                 shuffle directory at a time; use another directory",
                dir.display(),
                path.display()
            ));
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
        assert_eq!(is_held(&dir), Ok(true));
        drop(first);
        assert_eq!(is_held(&dir), Ok(false));
        DriverLock::acquire(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("dfx-lock-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }
}
