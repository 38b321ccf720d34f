//! Counters the plugin exports through its root module.
//!
//! Process-wide atomics: a test or benchmark on either side of the boundary
//! reads them to see what the plugin did, without parsing plans or logs.

use std::sync::atomic::{AtomicU64, Ordering};

use dfx_abi::DfxCounters;

static PLANNER_CALLS: AtomicU64 = AtomicU64::new(0);
static STAGES_INSERTED: AtomicU64 = AtomicU64::new(0);
static STAGES_ENCODED: AtomicU64 = AtomicU64::new(0);
static STAGES_DECODED: AtomicU64 = AtomicU64::new(0);
static LIVE_OBJECTS: AtomicU64 = AtomicU64::new(0);

/// One call of the planner.
pub(crate) fn planner_called() {
    PLANNER_CALLS.fetch_add(1, Ordering::Relaxed);
}

/// `n` stage nodes inserted by one planner call.
pub(crate) fn stages_inserted(n: u64) {
    STAGES_INSERTED.fetch_add(n, Ordering::Relaxed);
}

/// One stage node encoded by the codec.
pub(crate) fn stage_encoded() {
    STAGES_ENCODED.fetch_add(1, Ordering::Relaxed);
}

/// One stage node decoded by the codec.
pub(crate) fn stage_decoded() {
    STAGES_DECODED.fetch_add(1, Ordering::Relaxed);
}

/// A snapshot of every counter.
pub fn snapshot() -> DfxCounters {
    DfxCounters {
        planner_calls: PLANNER_CALLS.load(Ordering::Relaxed),
        stages_inserted: STAGES_INSERTED.load(Ordering::Relaxed),
        stages_encoded: STAGES_ENCODED.load(Ordering::Relaxed),
        stages_decoded: STAGES_DECODED.load(Ordering::Relaxed),
        live_objects: LIVE_OBJECTS.load(Ordering::Relaxed),
    }
}

/// A token held by every plugin-side object a host can keep alive (stage
/// nodes, their streams, planners, codecs): counted while it lives, so a test
/// can see that dropping a host's session released everything.
#[derive(Debug)]
pub(crate) struct LiveObject(());

impl LiveObject {
    pub(crate) fn new() -> Self {
        LIVE_OBJECTS.fetch_add(1, Ordering::Relaxed);
        LiveObject(())
    }
}

impl Clone for LiveObject {
    fn clone(&self) -> Self {
        LiveObject::new()
    }
}

impl Drop for LiveObject {
    fn drop(&mut self) {
        LIVE_OBJECTS.fetch_sub(1, Ordering::Relaxed);
    }
}
