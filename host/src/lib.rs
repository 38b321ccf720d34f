//! `dfx_host`: the Rust host of the dfx distributed query engine.
//!
//! Glossary:
//! - **plugin**: the one file (`libdfx_plugin.so`) holding the engine — stage
//!   node, planner, codec, config, functions. The host links none of it.
//! - **stage**: a subtree the plugin's planner wrapped in its stage node.
//! - **task**: one `(stage, partition)`; runs in its own **worker** process
//!   and publishes one Arrow IPC file into the query's **shuffle directory**.
//! - **driver**: plans the query, ships every task, waits for all, then runs
//!   the query again, reading the published files instead of recomputing.
//!
//! ```text
//! load_plugin ─► build_session(spec) ─► plan ─► stages ─► encode ─► envelopes
//!                                                          │
//!           answer ◄─ plan + execute again ◄─ fan_out(workers: run_task)
//! ```
//!
//! [`Host`] is the entry point for embedding; `dfx` is a thin CLI over it.

#![warn(missing_docs)]

pub mod bench;
pub mod codec_chain;
pub mod dispatch;
pub mod driver;
pub mod envelope;
pub mod error;
pub mod loader;
pub mod session;
pub mod stages;
pub mod tpch;
pub mod worker;

pub use dfx_abi::Plugin;
pub use driver::{DistributedResult, Host, require_empty_shuffle};
pub use envelope::{Envelope, WorkerReport};
pub use error::{HostError, Result, TaskFailure};
pub use loader::{load_plugin, locate_plugin};
pub use session::{DfxSession, SessionSpec, build_session};
pub use stages::find_stages;
pub use worker::run_task;
