//! The plugin's I/O runtime.
//!
//! object_store's S3 client needs a tokio runtime (its HTTP connections and
//! timers register with one). The plugin cannot use its host's: it carries
//! its own copy of tokio, and a copy finds no runtime of another on the
//! thread, so a request made while the host polls would panic ("no reactor
//! running"). So the plugin builds a runtime of its own, once, on first
//! use: a thread per core (at least two), because a task running a slice
//! of partitions computes them at once on it (see `crate::exec::driven`).
//! Every request is spawned onto it and its `JoinHandle` awaited from the host-polled stream:
//! the stream never blocks a host thread on the network (a `block_on` there
//! would stall, or, inside the host's own runtime, deadlock a
//! single-threaded one).

use std::future::Future;
use std::sync::LazyLock;

use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

/// Threads of the plugin's runtime: one per core this process may use, at
/// least two (a part upload and a download in flight).
fn io_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().max(2))
}

/// Start `work` on the I/O runtime without awaiting it: for a caller that
/// is not async and waits for its answer on a channel.
///
/// # Errors
///
/// A runtime that cannot start.
pub fn spawn_detached<F>(work: F) -> Result<(), String>
where
    F: Future<Output = ()> + Send + 'static,
{
    spawn(work).map(drop)
}

/// The plugin's I/O runtime (see the module's doc for why it has one).
/// The plugin's own runtime (see the module doc); a sealed recursive query
/// also runs on it (see `crate::planner`).
pub(crate) fn io_runtime() -> Result<&'static Runtime, String> {
    static RUNTIME: LazyLock<Result<Runtime, String>> = LazyLock::new(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(io_threads())
            .thread_name("dfx-io")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the plugin's I/O runtime: {e}"))
    });
    RUNTIME.as_ref().map_err(Clone::clone)
}

/// Spawn `work` onto the I/O runtime (see the module's doc).
pub(crate) fn spawn<F>(work: F) -> Result<JoinHandle<F::Output>, String>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    Ok(io_runtime()?.spawn(work))
}

/// Run `work` on the I/O runtime and await its end from any executor.
///
/// # Errors
///
/// A runtime that cannot start, or a task that panicked.
pub async fn on_io<F>(work: F) -> Result<F::Output, String>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    join(spawn(work)?).await
}

pub(crate) async fn join<T>(handle: JoinHandle<T>) -> Result<T, String> {
    handle
        .await
        .map_err(|e| format!("an S3 request did not finish: {e}"))
}
