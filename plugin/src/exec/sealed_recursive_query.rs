//! Recursive queries (`WITH RECURSIVE`) in a form that crosses to a host and
//! on to a worker.
//!
//! Three things stand in the way, and each has its answer here:
//!
//! - datafusion-proto encodes neither `RecursiveQueryExec` nor the
//!   `WorkTableExec` below it, and the two share the work table in memory.
//!   dfx's codec encodes both; decoding the query node links them again
//!   (`RecursiveQueryExec::try_new` hands its table to the one work table
//!   read of its recursive term).
//! - A `WorkTableExec` cannot say which columns it projects, so before a
//!   plan leaves the planner each projected read becomes a read of the whole
//!   table under a `ProjectionExec` ([`whole_work_tables`]).
//! - Decoding a recursive query builds nodes of its own (projections to its
//!   output schema), so in a host the query's subtree holds plugin nodes that
//!   the host's codecs cannot encode again when a driver ships the stage. So
//!   the planner seals each recursive query in a [`SealedRecursiveQueryExec`]:
//!   a leaf to the host, whose payload is the whole subtree, encoded and
//!   decoded by the plugin alone.
//!
//! The split rule never cuts inside a recursive query, so the whole of it
//! runs in one task (or, locally, in one process).

use std::fmt;
use std::sync::Arc;

use datafusion::common::Result;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};

use crate::exec::common::exec_defaults;
use crate::exec::driven;
use crate::wire::SEALED_NODE_NAME;

/// A recursive query (a `RecursiveQueryExec` and its subtree) that a host
/// sees as a leaf: it runs the query it holds, and the codec carries the
/// whole subtree as one payload (see the module doc for why).
#[derive(Debug)]
pub struct SealedRecursiveQueryExec {
    query: Arc<dyn ExecutionPlan>,
}

impl SealedRecursiveQueryExec {
    /// Seal `query`, a `RecursiveQueryExec`.
    pub fn new(query: Arc<dyn ExecutionPlan>) -> Self {
        Self { query }
    }

    /// The sealed recursive query.
    pub fn query(&self) -> &Arc<dyn ExecutionPlan> {
        &self.query
    }
}

impl DisplayAs for SealedRecursiveQueryExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{SEALED_NODE_NAME}: ")?;
        self.query.fmt_as(t, f)?;
        write!(f, ", runs whole in one task")
    }
}

impl ExecutionPlan for SealedRecursiveQueryExec {
    exec_defaults!(
        name = SEALED_NODE_NAME,
        properties_of = query,
        leaf,
        no_expressions,
        guarded_execute = (drive, place),
    );
}

impl SealedRecursiveQueryExec {
    /// How errors and panics name partition `partition` of this query.
    fn place(&self, partition: usize) -> String {
        format!("{SEALED_NODE_NAME} partition {partition}")
    }

    /// Partition `partition` of the query, run on the plugin's runtime
    /// (see [`driven`] for why).
    fn drive(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        driven::drive(
            Arc::clone(&self.query),
            partition,
            context,
            "the recursive query",
        )
    }
}
