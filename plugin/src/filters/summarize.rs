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

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
    ReplaceChildrenOptions,
};
use futures::StreamExt;

use super::summary::{KeySummary, SummaryBuilder};
use crate::counters::LiveObject;

/// Name of the node.
pub const KEY_SUMMARY_NODE_NAME: &str = "KeySummaryExec";

/// Sums up the join keys of its input for the writer above it.
#[derive(Debug)]
pub struct KeySummaryExec {
    input: Arc<dyn ExecutionPlan>,
    keys: Vec<Arc<dyn PhysicalExpr>>,
    /// Past this many rows in a map, its keys are not collected (the probe
    /// side would not be filtered by them anyway).
    max_rows: u64,
    _live: LiveObject,
}

/// A map's summary while its rows go by: the writer takes it once it has
/// read its input to the end.
pub type SummarySlot = Arc<Mutex<Option<SummaryBuilder>>>;

/// The summary in `slot`, once the input has been read to the end.
pub fn finish(slot: &SummarySlot) -> Option<KeySummary> {
    let builder = slot.lock().ok()?.take()?;
    Some(builder.finish())
}

impl KeySummaryExec {
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

    /// The summary of a map with no row.
    ///
    /// # Errors
    ///
    /// A key whose type cannot be resolved.
    pub fn empty_summary(&self) -> Result<KeySummary> {
        let schema = self.input.schema();
        let types = self
            .keys
            .iter()
            .map(|key| key.data_type(&schema))
            .collect::<Result<Vec<_>>>()?;
        let maps = self.input.output_partitioning().partition_count();
        Ok(SummaryBuilder::new(&types, self.max_rows, maps).finish())
    }

    /// Run map `map` of the input; the summary of its rows is in the slot
    /// once the stream has ended (never, if it fails).
    ///
    /// # Errors
    ///
    /// The input's, or a key whose type cannot be resolved.
    pub fn execute_summarized(
        &self,
        map: usize,
        context: Arc<TaskContext>,
    ) -> Result<(SendableRecordBatchStream, SummarySlot)> {
        let schema = self.input.schema();
        let types = self
            .keys
            .iter()
            .map(|key| key.data_type(&schema))
            .collect::<Result<Vec<_>>>()?;
        let slot: SummarySlot = Arc::new(Mutex::new(Some(SummaryBuilder::new(
            &types,
            self.max_rows,
            // The stage's maps: each is one partition of the input.
            self.input.output_partitioning().partition_count(),
        ))));
        let builder = Arc::clone(&slot);
        let keys = self.keys.clone();
        let input = self.input.execute(map, context)?;
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
        Ok((
            Box::pin(RecordBatchStreamAdapter::new(schema, stream)),
            slot,
        ))
    }
}

impl DisplayAs for KeySummaryExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let keys: Vec<String> = self.keys.iter().map(|k| k.to_string()).collect();
        write!(
            f,
            "{KEY_SUMMARY_NODE_NAME}: keys=[{}], max_rows={}",
            keys.join(", "),
            self.max_rows
        )
    }
}

impl ExecutionPlan for KeySummaryExec {
    fn name(&self) -> &str {
        KEY_SUMMARY_NODE_NAME
    }

    /// The input's: rows pass unchanged.
    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        for key in &self.keys {
            if f(key)? == TreeNodeRecursion::Stop {
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal(format!(
                "dfx {KEY_SUMMARY_NODE_NAME}: takes one child, got {}",
                children.len()
            )));
        }
        Ok(Arc::new(Self::new(
            children.swap_remove(0),
            self.keys.clone(),
            self.max_rows,
        )))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(
                datafusion::physical_plan::execution_plan::ChildrenPropertiesMode::Recompute,
            ),
        )
    }

    /// Rows pass through; nothing is summed up (only the writer above it
    /// publishes a summary, through [`KeySummaryExec::execute_summarized`]).
    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        self.input.execute(partition, context)
    }
}
