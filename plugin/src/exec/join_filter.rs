//! `JoinFilterExec`: the probe side's filter near its scan, built when its
//! task runs from the key summaries every map of the build stage published.
//!
//! ```text
//!   ... (the probe stage, which depends on build stage B)
//!     JoinFilterExec [keys, stage B]  1. read the key summary of every map of B
//!       DataSourceExec (Parquet)      2. the scan again, with `key >= min AND key <= max`
//!                                        added to its predicate: row groups and pages
//!                                        outside every map's bounds are skipped
//!                                     3. each batch: rows whose key no map of B holds
//!                                        are dropped, before they are hashed and written
//! ```
//!
//! It filters only when B's published rows are at most `max_build_rows`
//! (the planner's threshold against the probe table's rows); over it, or
//! when a map published no summary, rows pass unchanged, as they do once
//! the filter has dropped fewer than one in ten of the first rows it tested
//! (unless forced on: `max_build_rows` unbounded). A build stage
//! with no non-null key leaves nothing to read: the scan is not run.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use datafusion::arrow::array::BooleanArray;
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::physical_plan::{FileScanConfig, FileSource, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, Literal};
use datafusion::physical_expr::utils::conjunction;
use datafusion::physical_plan::metrics::{self, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};
use futures::{StreamExt, TryStreamExt};

use crate::config::DfxConfig;
use crate::counters::LiveObject;
use crate::exchange::locate::read_map_keys;
use crate::exec::common::{display_exprs, exec_defaults};
use crate::exec::map_scan::MapScanExec;
use crate::exec::store_scan::StoreScanExec;
use crate::filters::summary::{KeyFilter, KeySummary};
use crate::wire::JOIN_FILTER_NODE_NAME;

/// The build stage whose summaries a filter reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildStage {
    /// Its id.
    pub stage_id: u64,
    /// Its maps.
    pub maps: usize,
    /// Its buckets per map.
    pub buckets: usize,
    /// Where it publishes.
    pub shuffle_dir: PathBuf,
}

/// Drops the probe rows whose join key the build stage does not hold.
#[derive(Debug)]
pub struct JoinFilterExec {
    input: Arc<dyn ExecutionPlan>,
    keys: Vec<Arc<dyn PhysicalExpr>>,
    build: BuildStage,
    max_build_rows: u64,
    /// Whether it tests each row; `false`: it only prunes the scan below
    /// it by the keys' bounds, and a filter higher in its stage tests the
    /// rows (after the stage's own joins, see [`crate::planner::add_join_filters`]).
    tests_rows: bool,
    metrics: ExecutionPlanMetricsSet,
    _live: LiveObject,
}

impl JoinFilterExec {
    /// This node over `input` in place of its own input.
    fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        let filter = Self::new(
            input,
            self.keys.clone(),
            self.build.clone(),
            self.max_build_rows,
        );
        Ok(Arc::new(if self.tests_rows {
            filter
        } else {
            filter.bounds_only()
        }))
    }

    /// A filter of `input`'s rows by `keys` (expressions on its schema, one
    /// per column of the build's key, in order), reading the summaries of
    /// `build`, when it published at most `max_build_rows` rows.
    pub fn new(
        input: Arc<dyn ExecutionPlan>,
        keys: Vec<Arc<dyn PhysicalExpr>>,
        build: BuildStage,
        max_build_rows: u64,
    ) -> Self {
        Self {
            input,
            keys,
            build,
            max_build_rows,
            tests_rows: true,
            metrics: ExecutionPlanMetricsSet::new(),
            _live: LiveObject::new(),
        }
    }

    /// The same filter pruning its scan by the keys' bounds only, its rows
    /// passing untested.
    pub fn bounds_only(mut self) -> Self {
        self.tests_rows = false;
        self
    }

    /// Whether it tests each row (else it only prunes its scan).
    pub fn tests_rows(&self) -> bool {
        self.tests_rows
    }

    /// The probe key expressions.
    pub fn keys(&self) -> &[Arc<dyn PhysicalExpr>] {
        &self.keys
    }

    /// The build stage read.
    pub fn build(&self) -> &BuildStage {
        &self.build
    }

    /// Above this many published build rows, rows pass unchanged.
    pub fn max_build_rows(&self) -> u64 {
        self.max_build_rows
    }

    /// The probe side below.
    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }
}

impl DisplayAs for JoinFilterExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "{JOIN_FILTER_NODE_NAME}: keys=[{}], build_stage={}, max_build_rows={}{}",
            display_exprs(&self.keys),
            self.build.stage_id,
            self.max_build_rows,
            if self.tests_rows { "" } else { ", bounds only" }
        )
    }
}

impl ExecutionPlan for JoinFilterExec {
    exec_defaults!(
        name = JOIN_FILTER_NODE_NAME,
        guarded_execute = (start, place),
        expressions = keys,
        one_child = (input, with_input),
        properties_of = input,
    );

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

impl JoinFilterExec {
    /// How errors and panics name this node's partition `partition`.
    fn place(&self, partition: usize) -> String {
        format!(
            "{JOIN_FILTER_NODE_NAME} of build stage {} partition {partition}",
            self.build.stage_id
        )
    }

    fn start(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let schema = self.input.schema();
        let input = Arc::clone(&self.input);
        let keys = self.keys.clone();
        let build = self.build.clone();
        let max_build_rows = self.max_build_rows;
        let tests_rows = self.tests_rows;
        let dropped = metrics::MetricBuilder::new(&self.metrics).counter("rows_dropped", partition);
        let kept = metrics::MetricBuilder::new(&self.metrics).output_rows(partition);
        let opened = async move {
            let config = DfxConfig::from_config(context.session_config().options())?;
            let summaries = read_summaries(&build, &config).await?;
            let Some(summaries) = summaries else {
                return input.execute(partition, context);
            };
            let rows: u64 = summaries.iter().map(|s| s.rows).sum();
            if rows > max_build_rows {
                return input.execute(partition, context);
            }
            let filter = KeyFilter::from_summaries(&summaries, keys.len())?;
            if filter.empty {
                // No key to match: the scan need not run at all.
                let empty: SendableRecordBatchStream = Box::pin(RecordBatchStreamAdapter::new(
                    input.schema(),
                    futures::stream::empty(),
                ));
                return Ok(empty);
            }
            let input = with_bounds_pruning(&input, &keys, &filter)?;
            if !tests_rows {
                return input.execute(partition, context);
            }
            let bounds = bounds_predicate(&keys, &filter);
            let stream = input.execute(partition, context)?;
            // Forced on (no threshold), it never gives up.
            let mut verdict = Verdict::new(max_build_rows == u64::MAX);
            let filtered = stream.map(move |batch| {
                let batch = batch?;
                let before = batch.num_rows();
                let batch = if verdict.given_up() {
                    batch
                } else if filter.has_keys() {
                    filter.filter(&batch, &keys)?
                } else {
                    match &bounds {
                        Some(predicate) => filter_by(&batch, predicate)?,
                        None => batch,
                    }
                };
                verdict.saw(before, batch.num_rows());
                dropped.add(before - batch.num_rows());
                kept.add(batch.num_rows());
                Ok(batch)
            });
            Ok(
                Box::pin(RecordBatchStreamAdapter::new(input.schema(), filtered))
                    as SendableRecordBatchStream,
            )
        };
        let stream = futures::stream::once(opened).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// Rows a filter tests before judging whether it pays.
const SAMPLE_ROWS: usize = 1 << 16;

/// Whether a filter still pays: one that dropped fewer than one row in ten
/// of its first [`SAMPLE_ROWS`] passes the rest unchanged (every key of
/// the probe side is in the build, as a foreign key to a whole table is),
/// where testing each row would cost more than it saves.
struct Verdict {
    forced: bool,
    seen: usize,
    dropped: usize,
    given_up: bool,
}

impl Verdict {
    fn new(forced: bool) -> Self {
        Self {
            forced,
            seen: 0,
            dropped: 0,
            given_up: false,
        }
    }

    fn given_up(&self) -> bool {
        self.given_up
    }

    fn saw(&mut self, before: usize, after: usize) {
        if self.forced || self.given_up {
            return;
        }
        self.seen += before;
        self.dropped += before - after;
        if self.seen >= SAMPLE_ROWS && self.dropped * 10 < self.seen {
            self.given_up = true;
        }
    }
}

/// Build maps whose summaries one probe task reads at once: each is a
/// marker read then a range read, so waiting on them one after another
/// would cost every build map's round trips in turn.
const SUMMARIES_IN_FLIGHT: usize = 16;

/// The key summary of every map of `build`, read concurrently, each where
/// the driver's layout of it says (else found through its marker); `None`
/// when some map published none (rows then pass unchanged).
async fn read_summaries(build: &BuildStage, config: &DfxConfig) -> Result<Option<Vec<KeySummary>>> {
    let handed = config.shuffle_ranges()?;
    let layouts = handed
        .as_ref()
        .and_then(|handed| handed.stages.get(&build.stage_id))
        .filter(|maps| maps.len() == build.maps);
    if layouts.is_none() && config.maps_only_on_workers()? {
        let handed: Vec<String> = handed
            .iter()
            .flat_map(|h| &h.stages)
            .map(|(stage, maps)| format!("stage {stage}: {} map(s)", maps.len()))
            .collect();
        return Err(DataFusionError::Execution(format!(
            "dfx stage {} (a join filter's build side): its maps stay on the disks of the \
             workers that wrote them (shuffle durability local), so the task needs a layout \
             of each of its {} map(s); it was handed [{}]",
            build.stage_id,
            build.maps,
            handed.join(", ")
        )));
    }
    // A map whose rows its coalesced head read is published empty, with an
    // empty summary, which adds nothing to the filter: the driver's layout
    // of it (a file of no bytes, never a published one) is not read.
    let read_by_head = |map: usize| layouts.is_some_and(|maps| maps[map].size == 0);
    let reads = (0..build.maps)
        .filter(|&map| !read_by_head(map))
        .map(|map| {
            read_map_keys(
                &build.shuffle_dir,
                config,
                (build.stage_id, map, build.buckets),
                layouts.map(|maps| &maps[map]),
            )
        });
    let summaries: Vec<Option<KeySummary>> = futures::stream::iter(reads)
        .buffered(SUMMARIES_IN_FLIGHT)
        .try_collect()
        .await?;
    Ok(summaries.into_iter().collect())
}

/// `key >= min AND key <= max` for every key column with bounds, on the
/// schema the keys are expressions of.
fn bounds_predicate(
    keys: &[Arc<dyn PhysicalExpr>],
    filter: &KeyFilter,
) -> Option<Arc<dyn PhysicalExpr>> {
    let mut parts: Vec<Arc<dyn PhysicalExpr>> = Vec::new();
    for (key, bounds) in keys.iter().zip(&filter.bounds) {
        let Some((min, max)) = bounds else {
            continue;
        };
        parts.push(Arc::new(BinaryExpr::new(
            Arc::clone(key),
            Operator::GtEq,
            Arc::new(Literal::new(min.clone())),
        )));
        parts.push(Arc::new(BinaryExpr::new(
            Arc::clone(key),
            Operator::LtEq,
            Arc::new(Literal::new(max.clone())),
        )));
    }
    (!parts.is_empty()).then(|| conjunction(parts))
}

fn filter_by(batch: &RecordBatch, predicate: &Arc<dyn PhysicalExpr>) -> Result<RecordBatch> {
    let keep = predicate.evaluate(batch)?.into_array(batch.num_rows())?;
    let keep = keep
        .as_any()
        .downcast_ref::<BooleanArray>()
        .ok_or_else(|| {
            DataFusionError::Internal("dfx join filter: the bounds are not a predicate".into())
        })?;
    Ok(filter_record_batch(batch, keep)?)
}

/// `input` with the build's bounds handed to its Parquet scan's pruning,
/// when it is one (directly, or inside a [`StoreScanExec`]) and the keys
/// are columns of the table; otherwise `input` itself.
///
/// Only pruning: the scan's row filter stays as configured, and the rows
/// are filtered above it.
fn with_bounds_pruning(
    input: &Arc<dyn ExecutionPlan>,
    keys: &[Arc<dyn PhysicalExpr>],
    filter: &KeyFilter,
) -> Result<Arc<dyn ExecutionPlan>> {
    if let Some(store) = input.downcast_ref::<StoreScanExec>() {
        let scan = with_bounds_pruning(store.scan(), keys, filter)?;
        return Ok(Arc::new(StoreScanExec::new(scan)));
    }
    if let Some(cut) = input.downcast_ref::<MapScanExec>() {
        let scan = with_bounds_pruning(cut.scan(), keys, filter)?;
        return Ok(Arc::new(MapScanExec::try_new(cut.payload(), scan)?));
    }
    let Some(scan) = input.downcast_ref::<DataSourceExec>() else {
        return Ok(Arc::clone(input));
    };
    let Some(config) = scan.data_source().downcast_ref::<FileScanConfig>() else {
        return Ok(Arc::clone(input));
    };
    let Some(parquet) = config.file_source().downcast_ref::<ParquetSource>() else {
        return Ok(Arc::clone(input));
    };
    let table = Arc::clone(parquet.table_schema().table_schema());
    let mut parts: Vec<Arc<dyn PhysicalExpr>> = Vec::new();
    for (key, bounds) in keys.iter().zip(&filter.bounds) {
        let Some((min, max)) = bounds else {
            continue;
        };
        let Some(column) = table_column(parquet, key) else {
            continue;
        };
        // The column as the table holds it: a key of another type (a
        // projection cast it) is not compared with the file's statistics.
        let Ok(index) = table.index_of(column.name()) else {
            continue;
        };
        if table.field(index).data_type() != &min.data_type() {
            continue;
        }
        let column: Arc<dyn PhysicalExpr> = Arc::new(Column::new(column.name(), index));
        parts.push(Arc::new(BinaryExpr::new(
            Arc::clone(&column),
            Operator::GtEq,
            Arc::new(Literal::new(min.clone())),
        )));
        parts.push(Arc::new(BinaryExpr::new(
            column,
            Operator::LtEq,
            Arc::new(Literal::new(max.clone())),
        )));
    }
    if parts.is_empty() {
        return Ok(Arc::clone(input));
    }
    let predicate = conjunction(FileSource::filter(parquet).into_iter().chain(parts));
    let mut config = config.clone();
    config.file_source = Arc::new(parquet.with_predicate(predicate));
    Ok(DataSourceExec::from_data_source(config))
}

/// The table column `key` (an expression on the scan's output) reads, when
/// it is a column through the scan's projection.
fn table_column(parquet: &ParquetSource, key: &Arc<dyn PhysicalExpr>) -> Option<Column> {
    let unprojected = match FileSource::projection(parquet) {
        Some(projection) => projection.unproject_expr(key).ok()?,
        None => Arc::clone(key),
    };
    unprojected.downcast_ref::<Column>().cloned()
}
