//! Where the planner puts the filters: a join whose build side is its own
//! stage gets a [`KeySummaryExec`] below that stage's writer and a
//! [`JoinFilterExec`] as near the probe side's scan as its keys can be
//! followed, in another stage, which then depends on the build stage.
//!
//! | join | probe side filtered? |
//! | --- | --- |
//! | inner, left outer, left semi, right semi (the probe side is the right) | yes: a probe row whose key no build row holds is in no output row |
//! | right or full outer, right anti, right mark | no: every probe row is in the output |
//! | left anti, left mark, null-aware anti | no: kept out, as the rows a probe side holds decide them (a null probe key empties a `NOT IN`) |
//! | null equal to null (`IS NOT DISTINCT FROM` keys) | no: a null key matches there |
//! | keys of different types on the two sides | no: equal values of different types hash apart |
//! | a build stage that reads a whole table (no filter, join, aggregate or limit), under `auto` | no: it holds every key of its table, which a probe side referring to it by a foreign key all has |
//! | a build stage that joins whole tables (an inner join on keys alone), its keys from the side with at least as many rows, under `auto` | no: that side refers to the other, so each of its rows, and every key of its table, is there |
//!
//! The probe keys are followed down through projections, filters, sorts,
//! merges and repartitions, through a reader into the stage it reads, and
//! into the side of an inner join that holds every key column. The filter
//! sits where they can be followed no further (a Parquet scan gets its
//! bounds for pruning); only below a reader, in a stage of its own: in the
//! join's own stage, the join itself already drops those rows. In that
//! stage, the rows are tested above its own inner joins rather than below
//! them (their joins with broadcast dimensions often drop most rows first,
//! for less than a test costs), and the filter at the scan only prunes it
//! by the keys' bounds.
//!
//! Why the graph stays acyclic: a new dependency goes from a stage in a
//! join's probe subtree to the stage of its build subtree, and the two
//! subtrees share no stage. Every dependency, old or new, points to a stage
//! whose subtree ends earlier in a post-order walk of the plan.
//!
//! Whether a filter pays is decided in steps. At plan time, where it
//! decides the stage graph (a dependency cannot be taken back once the
//! scheduler has it): not for a probe scan of fewer than [`MIN_PROBE_ROWS`]
//! rows (its statistics; Parquet footers give them exactly), which is not
//! worth making a stage wait, nor for a build side holding every key of a
//! table (reading it whole, or joining it whole with a table it refers to).
//! At task time, by the rows the build stage published (exact, where a
//! plan-time estimate of a build side after joins and filters is often
//! absent or far off): over `join_filter_ratio` times the probe table's
//! rows, the filter passes rows unchanged, as it does once it has dropped
//! fewer than one in ten of the first rows it tested. Forced `on`, only
//! the join's type and keys decide.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::common::{JoinType, NullEquality, Result};
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{Column, DynamicFilterPhysicalExpr};
use datafusion::physical_expr::projection::update_expr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};

use crate::config::JoinFilters;
use crate::exec::join_filter::{BuildStage, JoinFilterExec};
use crate::exec::key_summary::KeySummaryExec;
use crate::exec::shuffle_reader::ShuffleReaderExec;
use crate::exec::shuffle_writer::ShuffleWriterExec;
use crate::exec::store_scan::StoreScanExec;
use crate::filters::summary::MAX_HASHED_KEYS;

/// Key expressions, one per key column.
type Keys = Vec<Arc<dyn PhysicalExpr>>;

/// A join's two children.
type Children = (Arc<dyn ExecutionPlan>, Arc<dyn ExecutionPlan>);

/// A probe scan with fewer rows than this is not filtered under `auto`.
pub const MIN_PROBE_ROWS: usize = 10_000;

/// `plan`, cut into stages and numbered, with the filters of every join
/// they fit (none under [`JoinFilters::Off`]). Stage ids do not change; the
/// caller numbers the plan again so each writer's deps include the build
/// stages its filters read (`first_writers` in `crate::planner::number_stages`).
///
/// # Errors
///
/// A node that refuses its new children, or a key whose type cannot be
/// resolved.
pub fn add_join_filters(
    plan: Arc<dyn ExecutionPlan>,
    filters: JoinFilters,
) -> Result<Arc<dyn ExecutionPlan>> {
    if filters == JoinFilters::Off {
        return Ok(plan);
    }
    let children = plan
        .children()
        .into_iter()
        .map(|child| add_join_filters(Arc::clone(child), filters))
        .collect::<Result<Vec<_>>>()?;
    let plan = replace_children_if_necessary(plan, children)?;
    let Some(join) = plan.downcast_ref::<HashJoinExec>() else {
        return Ok(plan);
    };
    match filter_join(join, filters)? {
        Some((left, right)) => replace_children_if_necessary(plan, vec![left, right]),
        None => Ok(plan),
    }
}

/// Whether a probe row whose key no build row holds can be dropped.
fn probe_side_filterable(join: &HashJoinExec) -> bool {
    !join.null_aware
        && join.null_equality() == NullEquality::NullEqualsNothing
        && matches!(
            join.join_type(),
            JoinType::Inner | JoinType::Left | JoinType::LeftSemi | JoinType::RightSemi
        )
}

/// The join's new children, summary and filter in place, when it gets a
/// filter.
fn filter_join(join: &HashJoinExec, filters: JoinFilters) -> Result<Option<Children>> {
    if !probe_side_filterable(join) || join.on().is_empty() {
        return Ok(None);
    }
    let (left_schema, right_schema) = (join.left().schema(), join.right().schema());
    for (left, right) in join.on() {
        if left.data_type(&left_schema)? != right.data_type(&right_schema)? {
            return Ok(None);
        }
    }
    let build_keys: Vec<_> = join.on().iter().map(|(l, _)| Arc::clone(l)).collect();
    let probe_keys: Vec<_> = join.on().iter().map(|(_, r)| Arc::clone(r)).collect();
    let Some((writer, build_keys)) = build_stage(join.left(), build_keys) else {
        return Ok(None);
    };
    if writer.input().is::<KeySummaryExec>() {
        return Ok(None);
    }
    if matches!(filters, JoinFilters::Auto(_)) && holds_every_key(writer.input(), &build_keys) {
        return Ok(None);
    }
    let build = BuildStage {
        stage_id: writer.stage_id(),
        maps: writer.maps(),
        buckets: writer.buckets(),
        shuffle_dir: writer.shuffle_dir().to_path_buf(),
    };
    let mut placed = Placement {
        build,
        filters,
        max_build_rows: None,
        declined: false,
    };
    let Some(right) = placed.place(join.right(), probe_keys, false)? else {
        return Ok(None);
    };
    let max_rows = placed.max_build_rows.unwrap_or(u64::MAX);
    let left = with_summary(join.left(), writer.stage_id(), &build_keys, max_rows)?;
    Ok(Some((left, right)))
}

/// Whether `node`'s rows hold every key of a table in `keys`, so a probe
/// side referring to that table by a foreign key keeps every row: `node`
/// reads a whole table ([`is_whole_table`]), or joins whole tables (an
/// inner join on keys alone) and `keys` come from the side with at least
/// as many rows, by their statistics. That side is the one referring to the
/// other, so each of its rows finds its match (TPC-H's orders joined with
/// customer, summed up by order key: every order is there, and lineitem
/// would only wait for them).
fn holds_every_key(node: &Arc<dyn ExecutionPlan>, keys: &[Arc<dyn PhysicalExpr>]) -> bool {
    if is_whole_table(node) {
        return true;
    }
    // Through the nodes that keep every row (not a filter), the keys
    // followed as the filters' placement follows them.
    if node.is::<ProjectionExec>() || node.is::<RepartitionExec>() {
        return follow_row_by_row(node, keys.to_vec())
            .is_some_and(|(input, keys)| holds_every_key(input, &keys));
    }
    let Some(join) = node.downcast_ref::<HashJoinExec>() else {
        return false;
    };
    if join.filter().is_some() || !is_whole_table(join.left()) || !is_whole_table(join.right()) {
        return false;
    }
    let Some((side, _)) = follow_inner_join(join, keys) else {
        return false;
    };
    let (keys_side, other) = match side {
        0 => (join.left(), join.right()),
        _ => (join.right(), join.left()),
    };
    match (table_rows(keys_side), table_rows(other)) {
        (Some(rows), Some(other_rows)) => rows >= other_rows,
        _ => false,
    }
}

/// The row count the statistics give for `node`, seen through a reader into
/// the stage it reads (the reader's own statistics say nothing). Asked of
/// whole tables only, whose footers count their rows; a scan with a dynamic
/// filter calls its count inexact, though the filter keeps every row.
fn table_rows(node: &Arc<dyn ExecutionPlan>) -> Option<usize> {
    if let Some(writer) = read_stage(node) {
        return table_rows(writer.input());
    }
    StatisticsContext::new()
        .compute(node.as_ref(), &StatisticsArgs::new())
        .ok()?
        .num_rows
        .get_value()
        .copied()
}

/// The writer of the stage `node` reads, when `node` is a reader.
fn read_stage(node: &Arc<dyn ExecutionPlan>) -> Option<&ShuffleWriterExec> {
    node.downcast_ref::<ShuffleReaderExec>()?
        .writer()?
        .downcast_ref::<ShuffleWriterExec>()
}

/// Whether `node` reads a whole table: only scans and nodes that keep every
/// row (no filter, join, aggregate or limit; another join's summary or
/// filter counts as keeping them, as it mostly does for a whole table).
/// Its keys are every key of the table, and a probe side referring to that
/// table by a foreign key keeps every row: a filter would only make the
/// probe stage wait (TPC-H's orders by customer: none of 1.5 million rows
/// dropped, the orders stage a wave later).
fn is_whole_table(node: &Arc<dyn ExecutionPlan>) -> bool {
    let keeps_rows = node.is::<ProjectionExec>()
        || node.is::<RepartitionExec>()
        || node.is::<KeySummaryExec>()
        || node.is::<JoinFilterExec>()
        || node
            .downcast_ref::<CoalescePartitionsExec>()
            .is_some_and(|c| c.fetch().is_none())
        || node
            .downcast_ref::<SortExec>()
            .is_some_and(|s| s.fetch().is_none());
    if let Some(store) = node.downcast_ref::<StoreScanExec>() {
        return is_whole_table(store.scan());
    }
    if let Some(writer) = read_stage(node) {
        return is_whole_table(writer.input());
    }
    if node.is::<DataSourceExec>() {
        // A dynamic filter is a join's. Pushed into a scan of another stage,
        // no process fills it; in the join's own stage it drops only rows
        // without a match, which a table referring to a whole one has none of.
        let keeps_every_row = |filter: &Arc<dyn PhysicalExpr>| {
            filter.downcast_ref::<DynamicFilterPhysicalExpr>().is_some()
        };
        return node
            .downcast_ref::<DataSourceExec>()
            .and_then(|s| s.data_source().downcast_ref::<FileScanConfig>())
            .is_none_or(|config| {
                config
                    .file_source()
                    .filter()
                    .is_none_or(|f| keeps_every_row(&f))
                    && config.limit.is_none()
            });
    }
    keeps_rows && node.children().into_iter().all(is_whole_table)
}

/// The writer of the stage a join's build side reads, and the build keys
/// as expressions on that writer's input, following them down through the
/// row-by-row nodes between the join and the reader. The stage's rows are a
/// superset of the build side's (a filter above the reader only removes),
/// which is all a summary needs.
fn build_stage(
    node: &Arc<dyn ExecutionPlan>,
    keys: Vec<Arc<dyn PhysicalExpr>>,
) -> Option<(&ShuffleWriterExec, Vec<Arc<dyn PhysicalExpr>>)> {
    if let Some(reader) = node.downcast_ref::<ShuffleReaderExec>() {
        let writer = reader.writer()?.downcast_ref::<ShuffleWriterExec>()?;
        return Some((writer, keys));
    }
    let (child, keys) = follow_row_by_row(node, keys)?;
    build_stage(child, keys)
}

/// `keys` (on `node`'s output) as expressions on its only input, for nodes
/// that pass each row through or drop it.
fn follow_row_by_row(
    node: &Arc<dyn ExecutionPlan>,
    keys: Keys,
) -> Option<(&Arc<dyn ExecutionPlan>, Keys)> {
    if let Some(projection) = node.downcast_ref::<ProjectionExec>() {
        let keys = keys
            .iter()
            .map(|key| update_expr(key, projection.expr(), true).ok().flatten())
            .collect::<Option<Vec<_>>>()?;
        return Some((projection.input(), keys));
    }
    if let Some(filter) = node.downcast_ref::<FilterExec>() {
        let keys = match filter.projection() {
            None => keys,
            Some(projection) => {
                let input = filter.input().schema();
                keys.into_iter()
                    .map(|key| {
                        remap_columns(&key, |column| {
                            let index = *projection.get(column.index())?;
                            Some(Column::new(input.field(index).name(), index))
                        })
                    })
                    .collect::<Option<Vec<_>>>()?
            }
        };
        return Some((filter.input(), keys));
    }
    if let Some(coalesce) = node.downcast_ref::<CoalescePartitionsExec>()
        && coalesce.fetch().is_none()
    {
        return Some((coalesce.input(), keys));
    }
    if let Some(sort) = node.downcast_ref::<SortExec>()
        && sort.fetch().is_none()
    {
        return Some((sort.input(), keys));
    }
    if let Some(repartition) = node.downcast_ref::<RepartitionExec>() {
        return Some((repartition.input(), keys));
    }
    // Another join's summary or filter: the rows pass (or are dropped)
    // unchanged, so filters stack near the scan.
    if let Some(summary) = node.downcast_ref::<KeySummaryExec>() {
        return Some((summary.input(), keys));
    }
    if let Some(filter) = node.downcast_ref::<JoinFilterExec>() {
        return Some((filter.input(), keys));
    }
    None
}

/// `expr` with every column replaced by `map`'s answer; `None` when it
/// has none for one.
fn remap_columns(
    expr: &Arc<dyn PhysicalExpr>,
    map: impl Fn(&Column) -> Option<Column>,
) -> Option<Arc<dyn PhysicalExpr>> {
    let mut missing = false;
    let remapped = Arc::clone(expr)
        .transform_up(|e| {
            let Some(column) = e.downcast_ref::<Column>() else {
                return Ok(Transformed::no(e));
            };
            match map(column) {
                Some(new) => Ok(Transformed::yes(Arc::new(new) as Arc<dyn PhysicalExpr>)),
                None => {
                    missing = true;
                    Ok(Transformed::no(e))
                }
            }
        })
        .data()
        .ok()?;
    (!missing).then_some(remapped)
}

/// `keys` on an inner join's output as expressions on the one input that
/// holds every column they read, with that input's index.
fn follow_inner_join(
    join: &HashJoinExec,
    keys: &[Arc<dyn PhysicalExpr>],
) -> Option<(usize, Vec<Arc<dyn PhysicalExpr>>)> {
    if *join.join_type() != JoinType::Inner {
        return None;
    }
    let (left, right) = (join.left().schema(), join.right().schema());
    let left_len = left.fields().len();
    let side = |column: &Column| -> Option<(usize, usize)> {
        let combined = match &join.projection {
            Some(projection) => *projection.get(column.index())?,
            None => column.index(),
        };
        Some(if combined < left_len {
            (0, combined)
        } else {
            (1, combined - left_len)
        })
    };
    let mut sides = Vec::new();
    for key in keys {
        key.apply(|e| {
            if let Some(column) = e.downcast_ref::<Column>() {
                sides.push(side(column).map(|(s, _)| s));
            }
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        })
        .ok()?;
    }
    let first = (*sides.first()?)?;
    if sides.iter().any(|s| *s != Some(first)) {
        return None;
    }
    let schema = if first == 0 { left } else { right };
    let keys = keys
        .iter()
        .map(|key| {
            remap_columns(key, |column| {
                let (_, index) = side(column)?;
                Some(Column::new(schema.field(index).name(), index))
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some((first, keys))
}

/// Where one join's filter goes.
struct Placement {
    build: BuildStage,
    filters: JoinFilters,
    /// The threshold of the filter placed, once placed.
    max_build_rows: Option<u64>,
    /// Whether the deepest place was found too small to filter: nothing
    /// above it is filtered either (the rows are the same).
    declined: bool,
}

impl Placement {
    /// `node` (on the probe side, `keys` on its output) with the filter
    /// placed as deep below it as the keys can be followed; `None` when it
    /// found no place in a stage other than the join's (`crossed`: whether
    /// `node` is in one).
    fn place(
        &mut self,
        node: &Arc<dyn ExecutionPlan>,
        keys: Vec<Arc<dyn PhysicalExpr>>,
        crossed: bool,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        if let Some(reader) = node.downcast_ref::<ShuffleReaderExec>() {
            let writer = reader.planned_writer()?;
            let Some(below) = self.place(writer.children()[0], keys, true)? else {
                return Ok(None);
            };
            let writer = replace_children_if_necessary(Arc::clone(writer), vec![below])?;
            return Ok(Some(replace_children_if_necessary(
                Arc::clone(node),
                vec![writer],
            )?));
        }
        if let Some(join) = node.downcast_ref::<HashJoinExec>() {
            if let Some((side, side_keys)) = follow_inner_join(join, &keys) {
                let children: Vec<Arc<dyn ExecutionPlan>> =
                    node.children().into_iter().cloned().collect();
                if let Some(below) = self.place(&children[side], side_keys, crossed)? {
                    let mut children = children;
                    children[side] = below;
                    let joined = replace_children_if_necessary(Arc::clone(node), children)?;
                    if crossed {
                        return self.hoisted(joined, keys).map(Some);
                    }
                    return Ok(Some(joined));
                }
                if self.declined {
                    return Ok(None);
                }
            }
            return self.here(node, keys, crossed);
        }
        if let Some((child, child_keys)) = follow_row_by_row(node, keys.clone()) {
            if let Some(below) = self.place(child, child_keys, crossed)? {
                return Ok(Some(replace_children_if_necessary(
                    Arc::clone(node),
                    vec![below],
                )?));
            }
            if self.declined {
                return Ok(None);
            }
        }
        self.here(node, keys, crossed)
    }

    /// `joined`, an inner join in the probe side's own stage with the filter
    /// placed below it, with the rows tested right above it instead: the
    /// stage's own join (with a broadcast dimension, say) often drops most
    /// rows for less than testing them costs (TPC-H q8's lineitem stage
    /// keeps 0.7 % of its rows by its join with part, and testing all of
    /// them first took most of its time). The filter below keeps pruning
    /// its scan by the keys' bounds, or goes when it is not over a scan.
    /// A filter placed in another stage below (through a reader) stays
    /// there, and `joined` is returned as it is.
    fn hoisted(
        &self,
        joined: Arc<dyn ExecutionPlan>,
        keys: Vec<Arc<dyn PhysicalExpr>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let stage = self.build.stage_id;
        let mut moved = false;
        let joined = joined
            .transform_down(|node| {
                // Another stage: none of this filter's nodes is there.
                if node.is::<ShuffleReaderExec>() {
                    return Ok(Transformed::new(node, false, TreeNodeRecursion::Jump));
                }
                let Some(filter) = node.downcast_ref::<JoinFilterExec>() else {
                    return Ok(Transformed::no(node));
                };
                if filter.build().stage_id != stage || !filter.tests_rows() {
                    return Ok(Transformed::no(node));
                }
                moved = true;
                let input = Arc::clone(filter.input());
                if !(input.is::<DataSourceExec>() || input.is::<StoreScanExec>()) {
                    return Ok(Transformed::yes(input));
                }
                let bounds = JoinFilterExec::new(
                    input,
                    filter.keys().to_vec(),
                    filter.build().clone(),
                    filter.max_build_rows(),
                )
                .bounds_only();
                Ok(Transformed::yes(Arc::new(bounds) as Arc<dyn ExecutionPlan>))
            })
            .data()?;
        if !moved {
            return Ok(joined);
        }
        Ok(Arc::new(JoinFilterExec::new(
            joined,
            keys,
            self.build.clone(),
            self.max_build_rows.unwrap_or(u64::MAX),
        )))
    }

    /// The filter right above `node`, when it is in another stage than the
    /// join and worth it.
    fn here(
        &mut self,
        node: &Arc<dyn ExecutionPlan>,
        keys: Vec<Arc<dyn PhysicalExpr>>,
        crossed: bool,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        if !crossed {
            return Ok(None);
        }
        let probe_rows = StatisticsContext::new()
            .compute(node.as_ref(), &StatisticsArgs::new())
            .ok()
            .and_then(|stats| stats.num_rows.get_value().copied());
        let max_build_rows = match (self.filters, probe_rows) {
            (JoinFilters::Off, _) => return Ok(None),
            (JoinFilters::On, _) => u64::MAX,
            (JoinFilters::Auto(_), Some(rows)) if rows < MIN_PROBE_ROWS => {
                self.declined = true;
                return Ok(None);
            }
            (JoinFilters::Auto(ratio), Some(rows)) => (rows as f64 * ratio) as u64,
            (JoinFilters::Auto(_), None) => MAX_HASHED_KEYS,
        };
        self.max_build_rows = Some(max_build_rows);
        Ok(Some(Arc::new(JoinFilterExec::new(
            Arc::clone(node),
            keys,
            self.build.clone(),
            max_build_rows,
        ))))
    }
}

/// The build side `node` with a [`KeySummaryExec`] right below the writer
/// of stage `stage_id`, summing up `keys`.
fn with_summary(
    node: &Arc<dyn ExecutionPlan>,
    stage_id: u64,
    keys: &[Arc<dyn PhysicalExpr>],
    max_rows: u64,
) -> Result<Arc<dyn ExecutionPlan>> {
    if let Some(writer) = node.downcast_ref::<ShuffleWriterExec>()
        && writer.stage_id() == stage_id
    {
        let summary: Arc<dyn ExecutionPlan> = Arc::new(KeySummaryExec::new(
            Arc::clone(writer.input()),
            keys.to_vec(),
            max_rows,
        ));
        return replace_children_if_necessary(Arc::clone(node), vec![summary]);
    }
    let children = node
        .children()
        .into_iter()
        .map(|child| with_summary(child, stage_id, keys, max_rows))
        .collect::<Result<Vec<_>>>()?;
    replace_children_if_necessary(Arc::clone(node), children)
}
