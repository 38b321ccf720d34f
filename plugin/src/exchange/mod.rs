//! The exchange's bytes, no nodes: how a stage's maps are published and
//! read back.
//!
//! - [`files`]: a map's file, its segments (Arrow IPC) and their checks;
//! - [`marker`]: the commit marker closing each map's file;
//! - [`cutter`]: a partition's rows cut into buckets and encoded;
//! - [`publish`]: a map's segments written into its file and published;
//! - [`staging`]: a map's segments held by bucket until it publishes;
//! - [`locate`]: a map's marker (and key summary) found and checked;
//! - [`stream`]: one reader partition's segments, read and decoded;
//! - [`fetch`]: a remote reader's ranges, merged and fetched at once;
//! - [`flight_store`]: a map file read from the worker that serves it;
//! - [`store`]: the shuffle location, a local directory or an `s3://` prefix;
//! - [`reads`]: ranged reads of an S3 object, pinned to its entity tag;
//! - [`io`]: the plugin's own runtime, on which every request runs;
//! - [`dirs`], [`probe`], [`ipc_check`]: stage directories, the location's
//!   probe, the IPC stream check.
//!
//! The nodes that drive them are [`crate::exec::ShuffleWriterExec`] and
//! [`crate::exec::ShuffleReaderExec`]; files are named in [`crate::paths`].

pub(crate) mod cutter;
pub mod dirs;
pub mod fetch;
pub mod files;
pub(crate) mod flight_store;
pub mod io;
pub mod ipc_check;
pub mod locate;
pub mod marker;
pub mod probe;
pub mod publish;
pub mod reads;
pub mod shared_reads;
pub mod staging;
pub mod store;
pub mod stream;
