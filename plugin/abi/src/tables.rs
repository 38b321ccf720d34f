//! What a host's tables share with the plugin: the Parquet footer read, and
//! the limit on an in-memory table carried into a plan.

/// The config key, under the plugin's prefix (`dfx_engine.`), of the most
/// bytes (as Arrow IPC) an in-memory table may carry into a plan; hosts
/// name it to users and set it without spelling it.
pub const MEMORY_TABLE_LIMIT: &str = "memory_table_limit";

/// The stable start of the plugin's error refusing an in-memory table over
/// that limit. A host's planning wraps the error in words of its own (the
/// table's encoding failed), so a host finds the plugin's sentence by it,
/// to raise it alone; it never decides a retry.
pub const MEMORY_TABLE_TOO_LARGE: &str = "dfx in-memory table too large";

/// How many bytes from a Parquet file's end a host's tables read at once,
/// hoping the footer fits in them (a larger footer costs a second read);
/// both hosts register their tables with it.
///
/// DataFusion's default, 512 KiB, saves round trips to an object store; a
/// table here is a directory of local files, whose footers are a few KiB.
/// Every worker opens the files of its map afresh (its metadata cache has
/// never seen them), so at 512 KiB each open read and allocated half a
/// megabyte to parse a few KiB.
pub const PARQUET_FOOTER_HINT: usize = 64 * 1024;
