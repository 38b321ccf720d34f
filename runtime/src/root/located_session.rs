//! A session as the plugin's planner sees it for one query: the host's
//! session with the query's shuffle location in its config.
//!
//! A session under a shuffle root plans each query for a location made for
//! that query alone, so the location cannot be the session's own setting.
//! The planner reads it from the config it is handed: this hands it the
//! host's session with that one setting (and the split) changed, every
//! other call passed through.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::{CatalogProviderList, Session};
use datafusion::common::config::TableOptions;
use datafusion::common::{DFSchema, Result};
use datafusion::execution::TaskContext;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::logical_expr::execution_props::ExecutionProps;
use datafusion::logical_expr::registry::ExtensionTypeRegistryRef;
use datafusion::logical_expr::{
    AggregateUDF, Expr, HigherOrderUDF, LogicalPlan, ScalarUDF, WindowUDF,
};
use datafusion::physical_plan::{ExecutionPlan, PhysicalExpr};
use datafusion::prelude::SessionConfig;

/// The prefix datafusion-ffi keeps a foreign library's config options under.
const FFI_EXTENSION_PREFIX: &str = "datafusion_ffi";

/// The host's session, planning one query in its own shuffle location.
pub struct LocatedSession<'a> {
    inner: &'a dyn Session,
    config: SessionConfig,
    table_options: TableOptions,
}

impl<'a> LocatedSession<'a> {
    /// `inner` with `settings` (full keys, the plugin's prefix included) set
    /// on a copy of its config.
    ///
    /// # Errors
    ///
    /// A key the config does not know (the plugin's config extension was not
    /// installed on the session), naming it.
    pub fn new(inner: &'a dyn Session, settings: &[(String, String)]) -> Result<Self> {
        let mut config = inner.config().clone();
        for (key, value) in settings {
            config.options_mut().set(key, value)?;
            // A config that crossed datafusion-ffi may hold the key a second
            // time, spelled with the FFI prefix, and the plugin reads both
            // spellings (the last it meets wins): both are set.
            let crossed = format!("{FFI_EXTENSION_PREFIX}.{key}");
            if config.options().entries().iter().any(|e| e.key == crossed) {
                config
                    .options_mut()
                    .set(&format!("{FFI_EXTENSION_PREFIX}.{crossed}"), value)?;
            }
        }
        Ok(Self {
            inner,
            config,
            table_options: inner.table_options().clone(),
        })
    }
}

#[async_trait]
impl Session for LocatedSession<'_> {
    fn session_id(&self) -> &str {
        self.inner.session_id()
    }

    fn config(&self) -> &SessionConfig {
        &self.config
    }

    fn catalog_list(&self) -> Arc<dyn CatalogProviderList> {
        self.inner.catalog_list()
    }

    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.inner.create_physical_plan(logical_plan).await
    }

    fn create_physical_expr(
        &self,
        expr: Expr,
        df_schema: &DFSchema,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        self.inner.create_physical_expr(expr, df_schema)
    }

    fn scalar_functions(&self) -> &HashMap<String, Arc<ScalarUDF>> {
        self.inner.scalar_functions()
    }

    fn higher_order_functions(&self) -> &HashMap<String, Arc<HigherOrderUDF>> {
        self.inner.higher_order_functions()
    }

    fn aggregate_functions(&self) -> &HashMap<String, Arc<AggregateUDF>> {
        self.inner.aggregate_functions()
    }

    fn window_functions(&self) -> &HashMap<String, Arc<WindowUDF>> {
        self.inner.window_functions()
    }

    fn extension_type_registry(&self) -> &ExtensionTypeRegistryRef {
        self.inner.extension_type_registry()
    }

    fn runtime_env(&self) -> &Arc<RuntimeEnv> {
        self.inner.runtime_env()
    }

    fn execution_props(&self) -> &ExecutionProps {
        self.inner.execution_props()
    }

    /// Not the inner session: datafusion-ffi exports a session that
    /// downcasts to its own foreign one as that one, config and all.
    fn as_any(&self) -> &dyn Any {
        &()
    }

    fn table_options(&self) -> &TableOptions {
        &self.table_options
    }

    fn table_options_mut(&mut self) -> &mut TableOptions {
        &mut self.table_options
    }

    fn task_ctx(&self) -> Arc<TaskContext> {
        Arc::new(TaskContext::from(self as &dyn Session))
    }
}
