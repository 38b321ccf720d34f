//! The exchange: the two nodes that carry rows between stages.
//!
//! - [`ShuffleWriterExec`] is the root of every stage: a map task executes
//!   one of its input partitions and publishes the rows split into buckets.
//! - [`ShuffleReaderExec`] is how the consumer reads them: by bucket (hash),
//!   by map (pass-through) or all at once (broadcast).
//!
//! Files are named in [`crate::paths`]; each map's commit marker is
//! [`marker::MapMarker`]. The shuffle location is a local directory or an
//! `s3://` prefix ([`store`]).

pub mod dirs;
pub mod files;
pub mod ipc_check;
pub mod marker;
pub mod probe;
pub mod reader;
pub mod store;
pub mod writer;

pub use reader::{READER_NODE_NAME, ReadMode, ShuffleReaderExec};
pub use writer::{SUMMARY_SCHEMA, ShuffleWriterExec, WRITER_NODE_NAME};
