//! A table over a directory of Parquet files, one partition per file.
//!
//! A task is one partition of a stage, and the natural unit of work over a
//! table directory is one file. DataFusion's listing table groups files into
//! the session's `target_partitions`, which the spec pins (2 by default) so
//! the plan above the scan does not depend on the machine. This wrapper plans
//! only the *scan* as if the session asked for one partition per file; the
//! rest of the plan keeps the spec's `target_partitions`.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{ScanArgs, ScanResult, Session, TableProvider};
use datafusion::common::{Constraints, Statistics};
use datafusion::datasource::listing::{ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown, TableType};
use datafusion::physical_plan::ExecutionPlan;

/// A listing table whose scan has exactly one partition per file.
#[derive(Debug)]
pub struct PerFileTable {
    inner: ListingTable,
    files: usize,
}

impl PerFileTable {
    /// The table over `url` (a directory URL) holding `files` files matching
    /// `options`, its schema inferred from them.
    ///
    /// # Errors
    ///
    /// A directory that cannot be listed or files whose schema cannot be read.
    pub async fn try_new(state: &SessionState, url: &str, options: ListingOptions, files: usize) -> Result<Self> {
        let url = ListingTableUrl::parse(url)?;
        let config = ListingTableConfig::new(url)
            .with_listing_options(options)
            .infer_schema(state)
            .await?;
        Ok(Self {
            inner: ListingTable::try_new(config)?,
            files: files.max(1),
        })
    }

    /// The number of files, which is the number of scan partitions.
    pub fn files(&self) -> usize {
        self.files
    }

    fn scan_state(&self, state: &dyn Session) -> Result<SessionState> {
        let state = state.as_any().downcast_ref::<SessionState>().ok_or_else(|| {
            DataFusionError::Internal("a per-file table is scanned only from a SessionState".into())
        })?;
        let mut state = state.clone();
        state.config_mut().options_mut().execution.target_partitions = self.files;
        Ok(state)
    }
}

#[async_trait]
impl TableProvider for PerFileTable {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }

    fn constraints(&self) -> Option<&Constraints> {
        self.inner.constraints()
    }

    fn table_type(&self) -> TableType {
        self.inner.table_type()
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let state = self.scan_state(state)?;
        self.inner.scan(&state, projection, filters, limit).await
    }

    async fn scan_with_args<'a>(&self, state: &dyn Session, args: ScanArgs<'a>) -> Result<ScanResult> {
        let state = self.scan_state(state)?;
        self.inner.scan_with_args(&state, args).await
    }

    fn supports_filters_pushdown(&self, filters: &[&Expr]) -> Result<Vec<TableProviderFilterPushDown>> {
        self.inner.supports_filters_pushdown(filters)
    }

    fn statistics(&self) -> Option<Statistics> {
        self.inner.statistics()
    }
}
