//! `dfx_runtime`: the runtime both dfx hosts link — the Rust host (`dfx`,
//! `dfx_host`) and the Python package (`dfx_engine._internal`).
//!
//! Glossary:
//! - **stage**: a subtree the plugin's planner rooted at its writer; it runs
//!   as one **task** per **map** (a partition of its input), each publishing
//!   its rows split into **buckets** at the query's shuffle location.
//! - **executor**: what runs a task's attempt: a **pool** of serving worker
//!   processes, a **process** per task, or a **foreign** executor the host
//!   supplies (Ray).
//! - **envelope**: the JSON a worker is given for one task (spec, plan file,
//!   stage, map, attempt); the worker answers with one **response**.
//!
//! ```text
//! spec/       SessionSpec (one serde type), the shuffle location, a table's
//!             definition, a script of CREATE EXTERNAL TABLE and queries
//! tables      a table's S3 client, its files, the partition floor
//! protocol/   envelope, response (its failure class as data), serve requests,
//!             the worker's checks before decoding, the stage file
//! prepare     describe and cut a query's encoded stages: the step both
//!             hosts call between encoding and running them
//! root/       a query driven from its plan's root: the planner a driving
//!             session holds, the root node that runs the stages
//! scheduler/  graph, options, run, ready (one RunState), tasks, adaptive,
//!             query_run, attempts, claim, executors: pool, process, foreign
//! flight/     the map server: a worker's map files served over Arrow Flight
//!             when they stay on its disk (`local` durability)
//! shuffle_root  a root each query gets a fresh location under: how one is
//!             named, removed, and found stale (`dfx gc`)
//! ```
//!
//! The engine itself (planner, nodes, codec) is the plugin's; this crate
//! only calls it through [`dfx_abi::Plugin`]. What only a host can do
//! (build its DataFusion session, plan, encode, execute a stage or the root)
//! stays in the host.

#![warn(missing_docs)]

pub mod error;
pub mod flight;
pub mod prepare;
pub mod protocol;
pub mod root;
pub mod scheduler;
pub mod shuffle_root;
pub mod spec;
pub mod tables;

pub use dfx_abi::FailureClass;
pub use error::{Result, Retry, RuntimeError, TaskFailure};
pub use prepare::prepare;
pub use protocol::{Envelope, Published, Request, Response, TaskError, TaskInput, WorkerReport};
pub use scheduler::{
    EncodedStage, Executor, QueryRun, Scheduler, SchedulerOptions, StageInfo, Task, TaskReport,
    WorkerCommand, WorkerMode, WorkerPool,
};
pub use spec::{
    SessionSpec, ShuffleCompression, ShuffleDurability, ShuffleLocation, Split, same_location,
};
