//! `KeySummaryExec`: the node right below a build stage's writer that sums
//! up the join keys of the rows going by, for the writer to publish in its
//! map's file, where its commit marker points to it.
//!
//! ```text
//!   ShuffleWriterExec (stage B)   publishes the summary before its marker
//!     KeySummaryExec [keys]       rows pass unchanged; keys summed up
//!       <build side>
//! ```
//!
//! Executed on its own (a host collecting a plan without running its
//! stages), it passes rows through and sums nothing up.

use std::fmt;
use std::sync::{Arc, Mutex};

use datafusion::arrow::datatypes::DataType;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties,
};
use futures::StreamExt;

use crate::counters::LiveObject;
use crate::exec::common::{display_exprs, exec_defaults};
use crate::filters::slot::SummarySlot;
use crate::filters::summary::{KeySummary, SummaryBuilder};
use crate::wire::KEY_SUMMARY_NODE_NAME;

/// Sums up the join keys of its input for the writer above it.
#[derive(Debug)]
pub struct KeySummaryExec {
    /// Past this many rows in a map, its keys are not collected (the probe
    /// side would not be filtered by them anyway).
    max_rows: u64,
    keys: Vec<Arc<dyn PhysicalExpr>>,
    input: Arc<dyn ExecutionPlan>,
    _live: LiveObject,
}

impl KeySummaryExec {
    /// This node over `input` in place of its own input.
    fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::new(input, self.keys.clone(), self.max_rows)))
    }

    /// A node summing up `keys` (expressions on `input`'s schema), collecting
    /// the keys of at most `max_rows` rows per map.
    pub fn new(
        input: Arc<dyn ExecutionPlan>,
        keys: Vec<Arc<dyn PhysicalExpr>>,
        max_rows: u64,
    ) -> Self {
        Self {
            input,
            keys,
            max_rows,
            _live: LiveObject::new(),
        }
    }

    /// The key expressions.
    pub fn keys(&self) -> &[Arc<dyn PhysicalExpr>] {
        &self.keys
    }

    /// The most rows whose keys a map collects.
    pub fn max_rows(&self) -> u64 {
        self.max_rows
    }

    /// The build side below.
    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }

    /// The data types of the keys, against the input's schema.
    fn key_types(&self) -> Result<Vec<DataType>> {
        let schema = self.input.schema();
        self.keys.iter().map(|key| key.data_type(&schema)).collect()
    }

    /// The summary of a map with no row.
    ///
    /// # Errors
    ///
    /// A key whose type cannot be resolved.
    pub fn empty_summary(&self) -> Result<KeySummary> {
        let types = self.key_types()?;
        let maps = self.input.output_partitioning().partition_count();
        Ok(SummaryBuilder::new(&types, self.max_rows, maps).finish())
    }

    /// An empty summary of one map of a stage of `maps` maps, for
    /// [`Self::summarized`] to fill.
    ///
    /// # Errors
    ///
    /// A key whose type cannot be resolved.
    pub fn new_slot(&self, maps: usize) -> Result<SummarySlot> {
        let types = self.key_types()?;
        Ok(Arc::new(Mutex::new(Some(SummaryBuilder::new(
            &types,
            self.max_rows,
            maps,
        )))))
    }

    /// `input` (partitions of this node's input) with its keys summed up
    /// into `slot` as its rows go by; complete once every stream feeding
    /// the slot has ended (never, if one fails). The streams of a map's
    /// partitions share its slot.
    pub fn summarized(
        &self,
        input: SendableRecordBatchStream,
        slot: &SummarySlot,
    ) -> SendableRecordBatchStream {
        let builder = Arc::clone(slot);
        let keys = self.keys.clone();
        let stream = input.map(move |batch| {
            let batch = batch?;
            let mut builder = builder.lock().map_err(|_| {
                DataFusionError::Internal(
                    "dfx join filter: the key summary's lock is poisoned".into(),
                )
            })?;
            if let Some(builder) = builder.as_mut() {
                builder.update(&batch, &keys)?;
            }
            Ok(batch)
        });
        Box::pin(RecordBatchStreamAdapter::new(self.input.schema(), stream))
    }
}

impl DisplayAs for KeySummaryExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let keys = display_exprs(&self.keys);
        write!(
            f,
            "{KEY_SUMMARY_NODE_NAME}: keys=[{keys}], max_rows={}",
            self.max_rows
        )
    }
}

impl ExecutionPlan for KeySummaryExec {
    exec_defaults!(
        name = KEY_SUMMARY_NODE_NAME,
        properties_of = input,
        one_child = (input, with_input),
        expressions = keys,
    );

    /// Rows pass through; nothing is summed up (only the writer above it
    /// publishes a summary, through [`KeySummaryExec::summarized`]).
    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        self.input.execute(partition, context)
    }
}
