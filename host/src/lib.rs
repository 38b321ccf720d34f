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
//!   **shuffle directory** (one file per map, `stage-S/K-map-M.arrow`, closed
//!   by its commit marker).
//! - **pool**: long-lived serving workers (`dfx worker --serve`) that run
//!   task after task with the plugin loaded once; the default. Process mode
//!   starts one worker per task instead ([`WorkerMode`]).
//! - **driver**: plans the query once, hands its encoded stages to the
//!   runtime's scheduler ([`dfx_runtime::scheduler`], shared with the
//!   Python host), then executes the root of that same plan, whose readers
//!   read the published files.
//!
//! ```text
//! load_plugin ─► build_session(spec) ─► plan ─► stages ─► encode ─► envelopes
//!                                                                    │
//!      answer ◄─ execute the plan's root ◄─ the runtime's scheduler (workers: run_task)
//! ```
//!
//! [`Host`] is the entry point for embedding; `dfx` is a thin CLI over it.
//! The default feature `cli-extras` adds [`tpch`] and
//! [`bench`](mod@bench) (`dfx tpch`, `dfx bench`) and the workers' progress
//! bar; an embedder that turns default features off builds neither the
//! TPC-H generator nor indicatif.

#![warn(missing_docs)]

#[cfg(feature = "cli-extras")]
pub mod bench;
pub mod driver;
pub mod error;
pub mod loader;
pub mod session;
#[cfg(feature = "cli-extras")]
pub mod tpch;
pub mod worker;

pub use dfx_abi::{DriverLock, Plugin};
pub use dfx_runtime::protocol::{Envelope, Request, Response, WorkerReport};
pub use dfx_runtime::scheduler::{Decision, Speculation, TaskReport, WorkerCommand, WorkerMode};
pub use dfx_runtime::{Retry, RuntimeError, TaskFailure};
pub use driver::stages::find_stages;
pub use driver::{DistributedResult, Host};
pub use error::{HostError, Result};
pub use loader::{load_plugin, locate_plugin};
pub use session::{DfxSession, SessionSpec, build_session, build_worker_session};
pub use worker::run_task;
