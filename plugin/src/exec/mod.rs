//! Every plan node of dfx, one a file, sharing [`common`]'s helpers.
//!
//! ```text
//! ShuffleWriterExec           a stage's root: runs one map, publishes its buckets
//! ShuffleReaderExec           reads a stage's published buckets (hash, pass-through, broadcast)
//! MapScanExec                 a file scan cut to the file group one map reads
//! StoreScanExec               a scan of a table on an object store, run with the worker's stores
//! KeySummaryExec              summarizes a build side's join keys for the writer to publish
//! JoinFilterExec              filters a probe side by a build stage's published keys
//! SealedRecursiveQueryExec    a whole recursive query, a leaf to the host
//! SealedInputExec             a writer's input run by the plugin, under the memory limit
//! ```
//!
//! [`aligned_reads`] says which stages a writer's input reads partition by
//! partition, so that each map is handed only its slice's buckets of them.
//!
//! Their names and payloads are [`crate::wire`]'s; their codec is
//! [`crate::codec`]; the rewrites that place them are [`crate::planner`]'s.

pub mod aligned_reads;
pub mod common;
pub(crate) mod driven;
pub mod join_filter;
pub mod key_summary;
pub mod map_scan;
pub mod sealed_input;
pub mod sealed_recursive_query;
pub mod shuffle_reader;
pub mod shuffle_writer;
pub mod store_scan;
pub(crate) mod told_task;

pub use join_filter::{BuildStage, JoinFilterExec};
pub use key_summary::KeySummaryExec;
pub use map_scan::MapScanExec;
pub use sealed_input::SealedInputExec;
pub use sealed_recursive_query::SealedRecursiveQueryExec;
pub use shuffle_reader::ShuffleReaderExec;
pub use shuffle_writer::ShuffleWriterExec;
pub use store_scan::StoreScanExec;
