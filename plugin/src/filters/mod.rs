//! Filters that cross stages: a hash join's build stage publishes a summary
//! of its join keys with each map, and the probe side's scan stage, which
//! then depends on it, drops the rows whose key no build map holds before
//! hashing and writing them.
//!
//! Stock DataFusion pushes a dynamic filter from a hash join's build side
//! into its probe side's scan; dfx turns those off (see
//! [`crate::planner::isolate_partitions`]: a filter built in one task never
//! reaches a scan in another). These do the same across processes:
//!
//! ```text
//!                 HashJoinExec (inner, on b.k = p.k)
//!                /                                  \
//!   reader of stage B                        reader of stage P
//!   ShuffleWriterExec B                      ShuffleWriterExec P (deps: ..., B)
//!     KeySummaryExec [b.k]                     ...
//!       <build side>                             JoinFilterExec [p.k] reads B's summaries
//!   each map's file: rows, min/max of              DataSourceExec  (pruned by B's min/max)
//!   each key column, the keys' hashes
//!   (exact, or a Bloom filter)
//! ```
//!
//! - [`summary`]: what a map publishes and how a probe task tests a row;
//! - [`summarize`]: `KeySummaryExec`, below the build stage's writer;
//! - [`probe`]: `JoinFilterExec`, on the probe side near its scan;
//! - [`plan`]: which joins get them, where, and when they pay;
//! - [`payload`]: both nodes across a process boundary.

pub mod payload;
pub mod plan;
pub mod probe;
pub mod summarize;
pub mod summary;

pub use plan::add_join_filters;
pub use probe::{JOIN_FILTER_NODE_NAME, JoinFilterExec};
pub use summarize::{KEY_SUMMARY_NODE_NAME, KeySummaryExec};
pub use summary::KeySummary;
