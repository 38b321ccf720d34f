//! The directories a map task writes into: private, and its user's own.
//!
//! A shuffle directory is often under a shared path (`/tmp`), where another
//! user could prepare a trap before the query runs: a directory of theirs
//! (they could read, replace or delete our output in it), or a symlink
//! pointing our writes somewhere else. So before a writer creates anything:
//!
//! - the shuffle directory, if it exists, must be a directory owned by this
//!   process's user (it may be a symlink to one: configured paths often are);
//! - `stage-<S>/` inside it must be a real directory (not a symlink) owned
//!   by this user when it already exists (another map of the stage made it);
//! - whatever the writer creates is mode 0700: other users can neither list
//!   nor open the map files.
//!
//! The files themselves are created exclusively (see
//! [`crate::exchange::files`]).

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::paths::stage_dir;

/// Mode of every directory a writer creates.
pub const PRIVATE_DIR_MODE: u32 = 0o700;

/// The effective user id of this process.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions, touches no memory of ours and
    // cannot fail (POSIX).
    unsafe { libc::geteuid() }
}

/// Create (or check) `<shuffle_dir>/stage-<stage>/` for a writer.
///
/// # Errors
///
/// An existing directory on the way that belongs to another user, a
/// `stage-*` entry that is a symlink or not a directory, or the
/// I/O error of creating one; each names the path.
pub fn prepare_stage_dir(shuffle_dir: &Path, stage: u64) -> io::Result<PathBuf> {
    let uid = effective_uid();
    if let Err(e) = std::fs::metadata(shuffle_dir) {
        if e.kind() != io::ErrorKind::NotFound {
            return Err(named(shuffle_dir, e));
        }
        create_private(shuffle_dir, true)?;
    }
    // Checked after creating too: another process may have made it first.
    let meta = std::fs::metadata(shuffle_dir).map_err(|e| named(shuffle_dir, e))?;
    check_owned(shuffle_dir, &meta, uid)?;
    let dir = stage_dir(shuffle_dir, stage);
    match std::fs::symlink_metadata(&dir) {
        Ok(meta) if meta.file_type().is_symlink() => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is a symlink: refusing to write through it",
                    dir.display()
                ),
            ));
        }
        Ok(meta) => check_owned(&dir, &meta, uid)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => create_private(&dir, false)?,
        Err(e) => return Err(named(&dir, e)),
    }
    Ok(dir)
}

/// `dir` is a directory and belongs to `uid`.
fn check_owned(dir: &Path, meta: &std::fs::Metadata, uid: u32) -> io::Result<()> {
    if !meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} exists and is not a directory", dir.display()),
        ));
    }
    if meta.uid() != uid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} belongs to uid {}, not to this process's user (uid {uid}): refusing to \
                 write into a directory another user controls",
                dir.display(),
                meta.uid()
            ),
        ));
    }
    Ok(())
}

/// Create `dir` with mode 0700 (its missing parents too when `recursive`).
/// Another map of the same stage may create it first: that is fine, and the
/// result is checked like any existing directory.
fn create_private(dir: &Path, recursive: bool) -> io::Result<()> {
    let created = std::fs::DirBuilder::new()
        .recursive(recursive)
        .mode(PRIVATE_DIR_MODE)
        .create(dir);
    match created {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let meta = std::fs::symlink_metadata(dir).map_err(|e| named(dir, e))?;
            if meta.file_type().is_symlink() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{} is a symlink: refusing to write through it",
                        dir.display()
                    ),
                ));
            }
            check_owned(dir, &meta, effective_uid())
        }
        Err(e) => Err(named(dir, e)),
    }
}

fn named(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}
