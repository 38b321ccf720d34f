//! Sealing each recursive query of a plan for the trip to a host (see
//! [`crate::exec::sealed_recursive_query`]): each projected work table read
//! made whole, then the query wrapped in a [`SealedRecursiveQueryExec`].

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::common::{Result, not_impl_err};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::recursive_query::RecursiveQueryExec;
use datafusion::physical_plan::work_table::WorkTableExec;

use crate::exec::sealed_recursive_query::SealedRecursiveQueryExec;

/// `plan` with every recursive query's work table reads made whole
/// ([`whole_work_tables`]) and each topmost recursive query sealed.
///
/// # Errors
///
/// As [`whole_work_tables`].
pub fn seal_recursive_queries(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    whole_work_tables(plan)?
        .transform_down(|node| {
            if node.is::<RecursiveQueryExec>() {
                let sealed: Arc<dyn ExecutionPlan> = Arc::new(SealedRecursiveQueryExec::new(node));
                return Ok(Transformed::new(sealed, true, TreeNodeRecursion::Jump));
            }
            Ok(Transformed::no(node))
        })
        .data()
}

/// `plan` with every work table read of each recursive query reading the
/// whole work table, any projection made a `ProjectionExec` above it.
///
/// # Errors
///
/// A recursive query whose columns share a name (a projected read could
/// not be told apart from another), or a node refusing its new children.
pub fn whole_work_tables(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let Some(query) = node.downcast_ref::<RecursiveQueryExec>() else {
            return Ok(Transformed::no(node));
        };
        let recursive = whole_reads_of(query)?;
        if !recursive.transformed {
            return Ok(Transformed::no(node));
        }
        let rebuilt = RecursiveQueryExec::try_new(
            query.name().to_string(),
            query.schema(),
            Arc::clone(query.static_term()),
            recursive.data,
            query.is_distinct(),
        )?;
        Ok(Transformed::yes(Arc::new(rebuilt) as Arc<dyn ExecutionPlan>))
    })
    .data()
}

/// `query`'s recursive term with its own work table read whole.
fn whole_reads_of(query: &RecursiveQueryExec) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
    // The work table holds batches of the query's output schema: both
    // terms are projected to it before their rows go in.
    let table = query.schema();
    let name = query.name();
    Arc::clone(query.recursive_term()).transform_down(|node| {
        let Some(read) = node.downcast_ref::<WorkTableExec>() else {
            return Ok(Transformed::no(node));
        };
        let read_schema = read.schema();
        if read.name() != name || read_schema.fields() == table.fields() {
            return Ok(Transformed::no(node));
        }
        let whole: Arc<dyn ExecutionPlan> = Arc::new(WorkTableExec::new(
            name.to_string(),
            Arc::clone(&table),
            None,
        )?);
        let mut columns = Vec::with_capacity(read_schema.fields().len());
        for field in read_schema.fields() {
            let mut matches = table.fields().iter().enumerate();
            let index = match matches.find(|(_, f)| f.name() == field.name()) {
                Some((index, _)) if !matches.any(|(_, f)| f.name() == field.name()) => index,
                Some(_) => {
                    return not_impl_err!(
                        "recursive query {name:?}: its work table has more than one column \
                         named {:?}, so dfx cannot tell which one a read projects; rename one",
                        field.name()
                    );
                }
                None => {
                    return not_impl_err!(
                        "recursive query {name:?}: a read of its work table projects column \
                         {:?}, which the table ({}) does not have",
                        field.name(),
                        table
                    );
                }
            };
            let column: Arc<dyn datafusion::physical_plan::PhysicalExpr> =
                Arc::new(Column::new(field.name(), index));
            columns.push((column, field.name().clone()));
        }
        let projected: Arc<dyn ExecutionPlan> = Arc::new(ProjectionExec::try_new(columns, whole)?);
        Ok(Transformed::new(projected, true, TreeNodeRecursion::Jump))
    })
}
