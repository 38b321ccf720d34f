//! The plugin's query planner as a session of this host holds it.
//!
//! A logical plan crosses into the plugin's planner as datafusion-proto
//! bytes. Protobuf carries an `EmptyRelation` as one flag, without its
//! schema, so the optimizer's empty relations (what `WHERE false` or
//! `LIMIT 0` become) arrive with no columns and every node above them fails
//! to resolve its own ("No field named t.v"). [`PluginQueryPlanner`] hands
//! the plugin a plan whose empty relations say their columns in a form the
//! bytes keep: a zero-row limit over typed nulls, aliased to the same
//! qualified names. It yields no row, as the empty relation did.
//!
//! The bytes carry a table as DataFusion's plan format knows it: a listing
//! table, a view, an empty table, a recursive query's work table. Anything
//! else (a table function such as `generate_series`, an in-memory table)
//! crosses through the plugin's logical codec, by value. A plugin built
//! before that codec cannot carry it: [`refuse_uncarried_scans`] names such
//! a scan before the encoder fails with words about a codec.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::tree_node::{Transformed, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::datasource::cte_worktable::CteWorkTable;
use datafusion::datasource::empty::EmptyTable;
use datafusion::datasource::listing::ListingTable;
use datafusion::datasource::source_as_provider;
use datafusion::datasource::view::ViewTable;
use datafusion::execution::context::QueryPlanner;
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_ffi::query_planner::ForeignQueryPlanner;

/// The plugin's planner, handed plans whose empty relations keep their
/// columns across the boundary (see the module docs).
#[derive(Debug)]
pub struct PluginQueryPlanner {
    /// The plugin's planner, across the boundary.
    pub planner: ForeignQueryPlanner,
    /// Whether the session's logical codec is the plugin's, which carries
    /// every table; without it, scans the plan format cannot carry are
    /// refused by name.
    pub carries_tables: bool,
}

#[async_trait]
impl QueryPlanner for PluginQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if !self.carries_tables {
            refuse_uncarried_scans(logical_plan)?;
        }
        let plan = typed_empty_relations(logical_plan.clone())?;
        self.planner.create_physical_plan(&plan, session).await
    }
}

/// A planning error naming the first scan in `plan` (subqueries included)
/// whose table the plan's bytes cannot carry into the plugin's planner (see
/// the module docs); `Ok` when every table can cross.
///
/// # Errors
///
/// `DataFusionError::NotImplemented` naming the table as the query spelled
/// it, saying what dfx runs instead.
pub fn refuse_uncarried_scans(plan: &LogicalPlan) -> Result<()> {
    let mut uncarried = None;
    plan.apply_with_subqueries(|node| {
        let LogicalPlan::TableScan(scan) = node else {
            return Ok(TreeNodeRecursion::Continue);
        };
        let Ok(provider) = source_as_provider(&scan.source) else {
            return Ok(TreeNodeRecursion::Continue);
        };
        let carried = provider.downcast_ref::<ListingTable>().is_some()
            || provider.downcast_ref::<ViewTable>().is_some()
            || provider.downcast_ref::<EmptyTable>().is_some()
            || provider.downcast_ref::<CteWorkTable>().is_some();
        if carried {
            return Ok(TreeNodeRecursion::Continue);
        }
        uncarried = Some(scan.table_name.to_string());
        Ok(TreeNodeRecursion::Stop)
    })?;
    match uncarried {
        None => Ok(()),
        Some(table) => Err(DataFusionError::NotImplemented(format!(
            "dfx cannot plan a query that reads {table}: it is a table function or an \
             in-memory table, and dfx's planner receives only tables DataFusion's plan format \
             carries (files registered as tables, views); register the data as a table instead"
        ))),
    }
}

/// `plan` with each row-less `EmptyRelation` that has columns (subqueries
/// included) replaced by `LIMIT 0` over one row of typed nulls named as its
/// columns. A column whose type has no null literal leaves its relation
/// as it was.
pub fn typed_empty_relations(plan: LogicalPlan) -> Result<LogicalPlan> {
    plan.transform_up_with_subqueries(|node| {
        let LogicalPlan::EmptyRelation(empty) = &node else {
            return Ok(Transformed::no(node));
        };
        if empty.produce_one_row || empty.schema.fields().is_empty() {
            return Ok(Transformed::no(node));
        }
        let columns: Option<Vec<Expr>> = empty
            .schema
            .iter()
            .map(|(qualifier, field)| {
                let null = ScalarValue::try_from(field.data_type()).ok()?;
                Some(Expr::Literal(null, None).alias_qualified(qualifier.cloned(), field.name()))
            })
            .collect();
        let Some(columns) = columns else {
            return Ok(Transformed::no(node));
        };
        let typed = LogicalPlanBuilder::empty(true)
            .project(columns)?
            .limit(0, Some(0))?
            .build()?;
        Ok(Transformed::yes(typed))
    })
    .map(|rewritten| rewritten.data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::common::DFSchema;
    use datafusion::logical_expr::EmptyRelation;
    use datafusion::prelude::SessionContext;
    use datafusion_proto::bytes::{logical_plan_from_bytes, logical_plan_to_bytes};

    fn empty_with_columns() -> Result<LogicalPlan> {
        let schema = Schema::new(vec![
            Field::new("k", DataType::Int32, true),
            Field::new("v", DataType::Decimal128(10, 2), true),
        ]);
        Ok(LogicalPlan::EmptyRelation(EmptyRelation {
            produce_one_row: false,
            schema: Arc::new(DFSchema::try_from_qualified_schema("t", &schema)?),
        }))
    }

    #[test]
    fn an_empty_relation_keeps_its_columns_through_protobuf() -> Result<()> {
        let empty = empty_with_columns()?;
        let ctx = SessionContext::new();
        // Unrewritten, the bytes lose the columns.
        let lost = logical_plan_from_bytes(&logical_plan_to_bytes(&empty)?, &ctx.task_ctx())?;
        assert!(lost.schema().fields().is_empty());
        let typed = typed_empty_relations(empty.clone())?;
        let kept = logical_plan_from_bytes(&logical_plan_to_bytes(&typed)?, &ctx.task_ctx())?;
        assert_eq!(
            kept.schema().columns(),
            empty.schema().columns(),
            "qualified names survive"
        );
        let types: Vec<_> = kept
            .schema()
            .fields()
            .iter()
            .map(|f| f.data_type().clone())
            .collect();
        assert_eq!(types, vec![DataType::Int32, DataType::Decimal128(10, 2)]);
        assert!(matches!(kept, LogicalPlan::Limit(_)), "no row: {kept}");
        Ok(())
    }

    #[tokio::test]
    async fn a_table_function_is_named_and_a_listing_table_passes() -> Result<()> {
        let ctx = SessionContext::new();
        for sql in [
            "SELECT count(*) FROM generate_series(1, 10)",
            "SELECT v FROM (SELECT 1 AS v) WHERE v IN (SELECT value FROM range(1, 3))",
        ] {
            let plan = ctx.state().create_logical_plan(sql).await?;
            let err = refuse_uncarried_scans(&plan).unwrap_err().to_string();
            assert!(
                err.contains("dfx cannot plan a query that reads")
                    && (err.contains("generate_series") || err.contains("range")),
                "{sql}: {err}"
            );
        }
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("t.csv"), "k\n1\n")?;
        ctx.register_csv("t", dir.path().to_str().unwrap(), Default::default())
            .await?;
        let plan = ctx.state().create_logical_plan("SELECT k FROM t").await?;
        refuse_uncarried_scans(&plan)?;
        Ok(())
    }

    #[test]
    fn other_plans_are_left_as_they_are() -> Result<()> {
        let one_row = LogicalPlanBuilder::empty(true).build()?;
        assert_eq!(typed_empty_relations(one_row.clone())?, one_row);
        Ok(())
    }
}
