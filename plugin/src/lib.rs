//! dfx as one plugin file: the stage node, planner, codec, config and
//! functions of a distributed DataFusion engine, exported through one
//! `abi_stable` root module (see `dfx-abi`).
//!
//! Glossary:
//! - **stage**: a subtree that runs in worker processes; its root is a
//!   [`ShuffleWriterExec`], and it reads other stages through
//!   [`ShuffleReaderExec`]s whose child is the upstream writer.
//! - **map task** (task): one (stage, map) pair, run by one worker: it runs
//!   one partition of the stage's input and publishes it split into buckets.
//! - **bucket**: the rows of one map destined for one consumer partition.
//! - **exchange**: a writer/reader pair (hash, pass-through or broadcast).
//! - **shuffle location**: the local directory or `s3://bucket/prefix` where
//!   map tasks publish their map files, each closed by its commit marker
//!   (see [`paths`]), and readers find them.
//! - **failure class**: how a failed task may be retried, recorded where the
//!   error is made (see [`error`]).
//!
//! The rooms, from the bottom up (a module imports only those above it in
//! this list, never one that imports it back):
//!
//! ```text
//! error, paths, counters, guard, test_hooks   errors and their classes, file names, plumbing
//! wire, read_settings, isolation              payloads and node names; settings a driver hands tasks;
//!                                             what a stage needs to run alone
//! config                                      the dfx_engine keys
//! filters, tables, memory_table               key summaries; tables on object stores; in-memory tables
//! exchange                                    the shuffle's bytes: publish, locate, stream, store
//! exec                                        every *Exec node, one a file
//! encoded                                     encoded plans, without decoding: walk, cut, assemble
//! codec                                       physical, join filter, logical
//! planner                                     the query planner and its rewrites, one a file
//! adapt, vet, functions, export               adaptive stages; the stage check; UDFs; the FFI root
//! ```

pub mod adapt;
pub mod codec;
pub mod config;
pub mod counters;
pub mod encoded;
pub mod error;
pub mod exchange;
pub mod exec;
pub mod export;
pub mod filters;
pub mod functions;
pub mod guard;
pub mod isolation;
pub mod memory_table;
pub mod paths;
pub mod planner;
pub mod read_settings;
pub mod tables;
pub mod test_hooks;
pub mod vet;
pub mod wire;

pub use codec::DfxPhysicalCodec;
pub use config::{DfxConfig, SHUFFLE_DIR_KEY, SPLIT_KEY, SplitMode};
pub use exec::{ShuffleReaderExec, ShuffleWriterExec};
pub use isolation::isolate_partitions;
pub use planner::{DfxQueryPlanner, insert_stages};
pub use wire::{CODEC_ID, ReadMode};
