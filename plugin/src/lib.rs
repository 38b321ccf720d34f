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
//!   error is made (see [`failures`]).

pub mod adaptive;
pub mod codec;
pub mod config;
pub mod counters;
pub mod exchange;
pub mod export;
pub mod failures;
pub mod filters;
pub mod functions;
pub mod guard;
pub mod map_files;
pub mod memory_table;
pub mod paths;
pub mod planner;
pub mod recursive;
pub mod split;
pub mod tables;
pub mod test_hooks;
pub mod vet;

pub use codec::{CODEC_ID, DfxPhysicalCodec};
pub use config::{DfxConfig, SHUFFLE_DIR_KEY, SPLIT_KEY, SplitMode};
pub use exchange::{ReadMode, ShuffleReaderExec, ShuffleWriterExec};
pub use planner::{DfxQueryPlanner, isolate_partitions};
pub use split::insert_stages;
