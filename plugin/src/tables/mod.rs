//! Tables on an object store: how the plugin lists and reads a table whose
//! files are on S3, inside a host that cannot lend it its own client.
//!
//! A host registers a table's S3 client on its own session, but
//! datafusion-ffi 55 rebuilds every session and task context that crosses
//! the boundary with `RuntimeEnv::default()`, which knows local files only.
//! So the plugin reaches the store itself, in two places:
//!
//! ```text
//! planner  ListingTable::scan lists the files ── runtime with [`TableStores`]
//! stage    StoreScanExec (plugin node) ─────────  runs its scan with them
//!            └─ DataSourceExec over s3://bucket   (encoded inside its payload)
//! ```
//!
//! The scan of a table on S3 is wrapped in a [`StoreScanExec`] when a plan
//! is cut into stages, so wherever it runs (a worker's stage, the driver's
//! root) its files are read through the plugin's client, configured by the
//! session's `dfx_engine.s3_*` settings over the AWS environment, as the
//! shuffle's is. A scan of local files is left as DataFusion planned it, and
//! so is every scan of a plan run in one process: the host runs it with the
//! store it registered, and a filter DataFusion pushed into it may read a
//! scalar subquery's value from a node above it, a link no payload carries.

mod store;

pub use store::{IoStore, TableStores, with_table_stores, with_table_stores_context};
