//! The task-context provider a session's codecs are built with, bound to
//! the session once it exists.

use std::sync::{Arc, OnceLock, Weak};

use datafusion::execution::{TaskContext, TaskContextProvider};
use datafusion::prelude::SessionContext;

thread_local! {
    /// Set while [`DfxSession::decode`] makes its lean attempt on this thread.
    pub(super) static LEAN_DECODE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A task-context provider bound to its session after the session exists.
///
/// The plugin's planner needs the codecs and the codecs need a provider,
/// but the provider is the session the planner goes into. This breaks the
/// cycle: the codecs get the provider first, the session is bound to it once
/// built. A weak reference, so the provider never keeps the session alive.
///
/// The plugin's codec asks for a context each time it decodes one dfx node,
/// and datafusion-ffi converts the whole context across the boundary each
/// time: every function of the session and every config entry, both ways.
/// A worker decodes its stage with every stage below it, so that was a
/// tenth of a distributed query's CPU. A dfx node needs functions only when
/// a writer hashes on one, so a decode first hands the plugin a lean
/// context (no functions, default config; see [`DfxSession::decode`]).
#[derive(Default)]
pub(super) struct LateTaskContext {
    pub(super) session: OnceLock<Weak<SessionContext>>,
    pub(super) lean: OnceLock<Arc<TaskContext>>,
}

impl TaskContextProvider for LateTaskContext {
    fn task_ctx(&self) -> Arc<TaskContext> {
        if LEAN_DECODE.with(std::cell::Cell::get) {
            return Arc::clone(self.lean.get_or_init(|| Arc::new(TaskContext::default())));
        }
        match self.session.get().and_then(Weak::upgrade) {
            Some(ctx) => ctx.task_ctx(),
            // Only reachable while the session is being built or after it is
            // gone; a default context still decodes built-in nodes.
            None => Arc::new(TaskContext::default()),
        }
    }
}
