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

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{Result, ScalarValue};
use datafusion::execution::context::QueryPlanner;
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_ffi::query_planner::ForeignQueryPlanner;

/// The plugin's planner, handed plans whose empty relations keep their
/// columns across the boundary (see the module docs).
#[derive(Debug)]
pub struct PluginQueryPlanner(pub ForeignQueryPlanner);

#[async_trait]
impl QueryPlanner for PluginQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let plan = typed_empty_relations(logical_plan.clone())?;
        self.0.create_physical_plan(&plan, session).await
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

    #[test]
    fn other_plans_are_left_as_they_are() -> Result<()> {
        let one_row = LogicalPlanBuilder::empty(true).build()?;
        assert_eq!(typed_empty_relations(one_row.clone())?, one_row);
        Ok(())
    }
}
