//! Filters that cross stages: a hash join's build stage publishes a summary
//! of its join keys with each map, and the probe side's scan stage, which
//! then depends on it, drops the rows whose key no build map holds before
//! hashing and writing them.
//!
//! Stock DataFusion pushes a dynamic filter from a hash join's build side
//! into its probe side's scan; dfx turns those off (see
//! [`crate::isolation::isolate_partitions`]: a filter built in one task never
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
//! - [`slot`]: a map's summary while its rows go by;
//! - [`crate::exec::key_summary`]: `KeySummaryExec`, below the build stage's writer;
//! - [`crate::exec::join_filter`]: `JoinFilterExec`, on the probe side near its scan;
//! - [`crate::planner::add_join_filters`]: which joins get them, where, and when they pay;
//! - [`crate::codec::join_filter`]: both nodes across a process boundary.

pub mod slot;
pub mod summary;

pub use summary::KeySummary;
