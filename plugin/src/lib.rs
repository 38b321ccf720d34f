//! dfx as one plugin file: the stage node, planner, codec, config and
//! functions of a distributed DataFusion engine, exported through one
//! `abi_stable` root module (see `dfx-abi`).
//!
//! Glossary:
//! - **stage**: a subtree whose partitions run in worker processes; its root
//!   is a [`ShuffleStageExec`].
//! - **task**: one (stage, partition) pair, run by one worker.
//! - **shuffle directory**: where tasks publish their partition files
//!   (`stage-<id>-part-<p>.arrow`) and the driver reads them back.

pub mod codec;
pub mod config;
pub mod counters;
pub mod export;
pub mod functions;
pub mod paths;
pub mod planner;
pub mod stage;

pub use codec::{CODEC_ID, DfxPhysicalCodec};
pub use config::{DfxConfig, SHUFFLE_DIR_KEY};
pub use planner::{DfxQueryPlanner, insert_stages};
pub use stage::{STAGE_NODE_NAME, ShuffleStageExec};
