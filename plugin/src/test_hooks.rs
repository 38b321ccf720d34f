//! Fault injection for the reliability tests. Everything here is compiled
//! only with the `test-hooks` feature, never shipped: a plain build's hooks
//! are empty functions.
//!
//! `DFX_TEST_KILL_AFTER_BATCHES=K:FLAG`: a map task that has just written its
//! K-th segment to its map file kills its own process with SIGKILL, as a crash
//! or the OOM killer would: no destructor runs, no temp file is removed. Only
//! the first task anywhere to get there dies (the one that creates the file
//! FLAG), so its retry, and every later task, runs through.
//!
//! `DFX_TEST_SLOW_PUBLISH=stage-S/K-map-M.arrow:MILLIS:FLAG`: the first attempt
//! of that map to get ready to publish (the one that creates FLAG) sleeps
//! MILLIS first, a straggler for speculation to overtake.

/// Called by a map task after each batch it stages for its map file (a
/// segment holds one or more); `written` counts them, from 1, for this task.
#[inline]
pub fn batch_written(written: u64) {
    #[cfg(feature = "test-hooks")]
    kill_after_batches(written);
    #[cfg(not(feature = "test-hooks"))]
    let _ = written;
}

#[cfg(feature = "test-hooks")]
fn kill_after_batches(written: u64) {
    let Ok(setting) = std::env::var("DFX_TEST_KILL_AFTER_BATCHES") else {
        return;
    };
    let Some((k, flag)) = setting.split_once(':') else {
        return;
    };
    if k.parse::<u64>().ok() != Some(written) {
        return;
    }
    // First to create the flag dies; everyone else carries on.
    if std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(flag)
        .is_ok()
    {
        // SAFETY: kill(2) on our own pid with a valid signal number; it
        // touches no memory of ours.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

/// Called by a map task just before it publishes its map file as `path`.
#[inline]
pub fn before_publish(path: &std::path::Path) {
    #[cfg(feature = "test-hooks")]
    slow_publish(path);
    #[cfg(not(feature = "test-hooks"))]
    let _ = path;
}

#[cfg(feature = "test-hooks")]
fn slow_publish(path: &std::path::Path) {
    let Ok(setting) = std::env::var("DFX_TEST_SLOW_PUBLISH") else {
        return;
    };
    let mut parts = setting.splitn(3, ':');
    let (Some(name), Some(millis), Some(flag)) = (parts.next(), parts.next(), parts.next()) else {
        return;
    };
    let Ok(millis) = millis.parse::<u64>() else {
        return;
    };
    if !path.ends_with(name) {
        return;
    }
    if std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(flag)
        .is_ok()
    {
        // Blocks the polling thread: the worker runs this one task, and the
        // point is that it takes long.
        std::thread::sleep(std::time::Duration::from_millis(millis));
    }
}
