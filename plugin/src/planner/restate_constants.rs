//! Restating a stage input's constants above the reader that replaces its
//! exchange, as a filter every host decodes (see [`restate_constants`]).

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, IsNullExpr, Literal};
use datafusion::physical_expr::utils::conjunction;
use datafusion::physical_expr::{AcrossPartitions, PhysicalExpr};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

/// `reader` under a filter restating each column its stage's input holds
/// constant (`b = 'x'` after `WHERE b = 'x'`), when there is one.
///
/// Why: a host sees the reader across the FFI boundary, which carries a
/// plan's partitioning and ordering but not its constants. The plan above
/// the reader was optimized knowing them (a window over `PARTITION BY b, a`
/// sorted on `a` alone), and decoded in a worker its operators check their
/// input again: without the constant the window refused to run. A filter is
/// a node every host decodes, and its predicate states the constant there;
/// the rows already satisfy it. Only a column with a known value can be
/// restated; one of no known value stays lost.
pub fn restate_constants(
    reader: Arc<dyn ExecutionPlan>,
    input: &Arc<dyn ExecutionPlan>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let schema = reader.schema();
    let mut predicates: Vec<Arc<dyn PhysicalExpr>> = Vec::new();
    for constant in input.equivalence_properties().constants() {
        let AcrossPartitions::Uniform(Some(value)) = &constant.across_partitions else {
            continue;
        };
        let Some(column) = constant.expr.downcast_ref::<Column>() else {
            continue;
        };
        let same_type = schema.fields().get(column.index()).is_some_and(|field| {
            field.name() == column.name() && *field.data_type() == value.data_type()
        });
        if !same_type {
            continue;
        }
        let column: Arc<dyn PhysicalExpr> = Arc::new(column.clone());
        predicates.push(if value.is_null() {
            Arc::new(IsNullExpr::new(column))
        } else {
            Arc::new(BinaryExpr::new(
                column,
                Operator::Eq,
                Arc::new(Literal::new(value.clone())),
            ))
        });
    }
    if predicates.is_empty() {
        return Ok(reader);
    }
    Ok(Arc::new(FilterExec::try_new(
        conjunction(predicates),
        reader,
    )?))
}
