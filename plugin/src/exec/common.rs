//! What every dfx node shares: the checks of `replace_children`, the
//! `ExecutionPlan` methods that are the same for all of them, and the
//! guarded execute, written once here rather than in each node.

use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::ExecutionPlan;

use crate::guard;
use crate::guard::GuardedStream;

/// The one child a node of one input is given, or an error naming the
/// node (`place`) and the number it was given.
///
/// # Errors
///
/// Any number of children but one.
pub fn require_one_child(
    place: impl std::fmt::Display,
    mut children: Vec<Arc<dyn ExecutionPlan>>,
) -> Result<Arc<dyn ExecutionPlan>> {
    if children.len() != 1 {
        return Err(DataFusionError::Internal(format!(
            "dfx {place}: takes one child, got {}",
            children.len()
        )));
    }
    Ok(children.swap_remove(0))
}

/// Checks that a leaf node (`place`) is given no children.
///
/// # Errors
///
/// Any child.
pub fn require_no_children(
    place: impl std::fmt::Display,
    children: &[Arc<dyn ExecutionPlan>],
) -> Result<()> {
    if children.is_empty() {
        return Ok(());
    }
    Err(DataFusionError::Internal(format!(
        "dfx {place}: is a leaf, got {} children",
        children.len()
    )))
}

/// `ExecutionPlan::apply_expressions` over `exprs`, stopping where `f` says.
///
/// # Errors
///
/// Those of `f`.
pub fn visit_expressions<'a>(
    exprs: impl IntoIterator<Item = &'a Arc<dyn PhysicalExpr>>,
    f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
) -> Result<TreeNodeRecursion> {
    for expr in exprs {
        if f(expr)? == TreeNodeRecursion::Stop {
            return Ok(TreeNodeRecursion::Stop);
        }
    }
    Ok(TreeNodeRecursion::Continue)
}

/// `exprs` as a display lists them: `a@0, b@1`.
pub fn display_exprs(exprs: &[Arc<dyn PhysicalExpr>]) -> String {
    let shown: Vec<String> = exprs.iter().map(ToString::to_string).collect();
    shown.join(", ")
}

/// A node's `execute`, behind [`crate::guard`]: a panic while starting or
/// in any poll of the stream becomes an error naming `place`, so none
/// unwinds into the host.
///
/// # Errors
///
/// Those of `start`, or its panic as an error.
pub fn guarded_execute(
    place: String,
    start: impl FnOnce() -> Result<SendableRecordBatchStream>,
) -> Result<SendableRecordBatchStream> {
    let stream = guard::catch(format_args!("{place} execute"), start)?;
    Ok(GuardedStream::wrap(place, stream))
}

/// The `ExecutionPlan` methods every dfx node writes the same way, each
/// named by a key, so that a node file holds only what is its own. Every
/// node gets `with_new_children`, the deprecated entry point DataFusion
/// still requires, handed to `replace_children` with properties recomputed;
/// the keys add:
///
/// - `name = CONST`: `name`;
/// - `properties = field` (its own) or `properties_of = field` (a child's);
/// - `one_child = (field, rebuild)`: `children` is `self.field`, and
///   `replace_children` hands the one child it is given to
///   `self.rebuild(child)` (any other number is refused); or `leaf` (no
///   children; `replace_children` refuses any);
/// - `expressions = field` (a `Vec` of them) or `no_expressions`;
/// - `guarded_execute = (start, place)`: `execute` runs `self.start(partition,
///   context)` behind [`guarded_execute`], errors named by `self.place(partition)`.
macro_rules! exec_defaults {
    ($($key:ident $(= $value:tt)?),* $(,)?) => {
        $crate::exec::common::exec_defaults!(@ with_new_children);
        $($crate::exec::common::exec_defaults!(@ $key $($value)?);)*
    };
    (@ name $name:tt) => {
        fn name(&self) -> &str {
            $name
        }
    };
    (@ properties $field:tt) => {
        fn properties(&self) -> &::std::sync::Arc<::datafusion::physical_plan::PlanProperties> {
            &self.$field
        }
    };
    (@ properties_of $field:tt) => {
        fn properties(&self) -> &::std::sync::Arc<::datafusion::physical_plan::PlanProperties> {
            self.$field.properties()
        }
    };
    (@ one_child ($field:ident, $rebuild:ident)) => {
        fn children(&self) -> ::std::vec::Vec<&::std::sync::Arc<dyn ::datafusion::physical_plan::ExecutionPlan>> {
            vec![&self.$field]
        }

        fn replace_children(
            self: ::std::sync::Arc<Self>,
            children: ::std::vec::Vec<::std::sync::Arc<dyn ::datafusion::physical_plan::ExecutionPlan>>,
            _options: ::datafusion::physical_plan::execution_plan::ReplaceChildrenOptions,
        ) -> ::datafusion::common::Result<::std::sync::Arc<dyn ::datafusion::physical_plan::ExecutionPlan>> {
            let child = $crate::exec::common::require_one_child(self.name(), children)?;
            self.$rebuild(child)
        }
    };
    (@ leaf) => {
        fn children(&self) -> ::std::vec::Vec<&::std::sync::Arc<dyn ::datafusion::physical_plan::ExecutionPlan>> {
            ::std::vec::Vec::new()
        }

        fn replace_children(
            self: ::std::sync::Arc<Self>,
            children: ::std::vec::Vec<::std::sync::Arc<dyn ::datafusion::physical_plan::ExecutionPlan>>,
            _options: ::datafusion::physical_plan::execution_plan::ReplaceChildrenOptions,
        ) -> ::datafusion::common::Result<::std::sync::Arc<dyn ::datafusion::physical_plan::ExecutionPlan>> {
            $crate::exec::common::require_no_children(self.name(), &children)?;
            Ok(self)
        }
    };
    (@ expressions $field:tt) => {
        fn apply_expressions(
            &self,
            f: &mut dyn FnMut(
                &::std::sync::Arc<dyn ::datafusion::physical_expr::PhysicalExpr>,
            ) -> ::datafusion::common::Result<::datafusion::common::tree_node::TreeNodeRecursion>,
        ) -> ::datafusion::common::Result<::datafusion::common::tree_node::TreeNodeRecursion> {
            $crate::exec::common::visit_expressions(&self.$field, f)
        }
    };
    (@ no_expressions) => {
        fn apply_expressions(
            &self,
            _f: &mut dyn FnMut(
                &::std::sync::Arc<dyn ::datafusion::physical_expr::PhysicalExpr>,
            ) -> ::datafusion::common::Result<::datafusion::common::tree_node::TreeNodeRecursion>,
        ) -> ::datafusion::common::Result<::datafusion::common::tree_node::TreeNodeRecursion> {
            Ok(::datafusion::common::tree_node::TreeNodeRecursion::Continue)
        }
    };
    (@ with_new_children) => {
        fn with_new_children(
            self: ::std::sync::Arc<Self>,
            children: ::std::vec::Vec<::std::sync::Arc<dyn ::datafusion::physical_plan::ExecutionPlan>>,
        ) -> ::datafusion::common::Result<::std::sync::Arc<dyn ::datafusion::physical_plan::ExecutionPlan>> {
            self.replace_children(
                children,
                ::datafusion::physical_plan::execution_plan::ReplaceChildrenOptions::new(
                    ::datafusion::physical_plan::execution_plan::ChildrenPropertiesMode::Recompute,
                ),
            )
        }
    };
    (@ guarded_execute ($start:ident, $place:ident)) => {
        fn execute(
            &self,
            partition: usize,
            context: ::std::sync::Arc<::datafusion::execution::TaskContext>,
        ) -> ::datafusion::common::Result<::datafusion::execution::SendableRecordBatchStream> {
            $crate::exec::common::guarded_execute(self.$place(partition), || {
                self.$start(partition, context)
            })
        }
    };
}

pub(crate) use exec_defaults;
