//! `dfx_host`: the Rust host of the dfx distributed query engine.
//!
//! Glossary:
//! - **plugin**: the one file (`libdfx_plugin.so`) holding the engine — the
//!   writer and reader nodes, planner, codec, config, functions. The host
//!   links none of it.
//! - **stage**: a subtree whose root is the plugin's writer
//!   (`ShuffleWriterExec`); its consumer reads it through a reader
//!   (`ShuffleReaderExec`). Stages nest; each reads the stages it **deps** on.
//! - **task**: one `(stage, map)`: a **worker** process runs partition `map`
//!   of the stage's input and publishes its **buckets** into the query's
//!   **shuffle directory** (one file per map, `stage-S/map-M.arrow`, closed
//!   by its commit marker).
//! - **pool**: long-lived serving workers (`dfx worker --serve`) that run
//!   task after task with the plugin loaded once; the default. Process mode
//!   starts one worker per task instead ([`dispatch::WorkerMode`]).
//! - **wave**: every stage whose deps are all published; its tasks run
//!   together, a bounded number at once.
//! - **driver**: plans the query once, runs the waves, then executes the
//!   root of that same plan, whose readers read the published files.
//!
//! ```text
//! load_plugin ─► build_session(spec) ─► plan ─► stages ─► encode ─► envelopes
//!                                                                    │
//!      answer ◄─ execute the plan's root ◄─ wave n ◄─ ... ◄─ wave 1 (workers: run_task)
//! ```
//!
//! [`Host`] is the entry point for embedding; `dfx` is a thin CLI over it.
//! The default feature `cli-extras` adds [`tpch`] and [`bench`] (`dfx tpch`,
//! `dfx bench`) and the workers' progress bar; an embedder that turns default
//! features off builds neither the TPC-H generator nor indicatif.

#![warn(missing_docs)]

pub mod analyze;
#[cfg(feature = "cli-extras")]
pub mod bench;
pub mod codec_chain;
pub mod dispatch;
pub mod driver;
pub mod envelope;
pub mod error;
pub mod loader;
pub mod memory;
pub mod pool;
pub mod query_planner;
pub mod retry;
pub mod session;
pub mod stages;
pub mod store;
#[cfg(feature = "cli-extras")]
pub mod tpch;
pub mod worker;

pub use dfx_abi::{DriverLock, Plugin};
pub use dispatch::{TaskReport, WorkerMode};
pub use driver::{DistributedResult, Host};
pub use envelope::{Envelope, ServeRequest, ServeResponse, WorkerReport};
pub use error::{HostError, Result, Retry, TaskFailure};
pub use loader::{load_plugin, locate_plugin};
pub use session::{DfxSession, SessionSpec, build_session, build_worker_session};
pub use stages::find_stages;
pub use worker::run_task;
