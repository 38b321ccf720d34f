//! Registering a spec's tables in a session: each by the statement its
//! definition writes, with the S3 client for its bucket, and its partition
//! columns checked against the files' own.

use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::prelude::SessionContext;
use dfx_runtime::spec::{SessionSpec, TableDefinition};

use crate::error::{DataFusionContext, HostError, Result};

/// Register `table` as `name` in `ctx`, by the statement its definition
/// writes ([`TableDefinition::create_statement`]), after giving the session
/// the S3 client for its bucket. The Parquet options are the session's
/// (the footer read the plugin's settings set).
///
/// # Errors
///
/// A location DataFusion cannot list or read a schema from, files whose
/// schemas conflict, or a partition column that is also a column of the
/// files: each names the table and its location.
pub(super) async fn register_table(
    ctx: &SessionContext,
    name: &str,
    table: &TableDefinition,
    spec: &SessionSpec,
) -> Result<()> {
    let what = || format!("cannot register table {name} over {}", table.location);
    let table = table
        .clone()
        .absolute()
        .map_err(|e| HostError::io("cannot resolve", table.location.as_str(), e))?;
    if let Some(bucket) = table.s3_bucket() {
        let store = dfx_runtime::tables::s3_store(bucket, &spec.store_options)?;
        let url = ObjectStoreUrl::parse(format!("s3://{bucket}")).context(what)?;
        ctx.register_object_store(url.as_ref(), store);
    }
    // Run by `sql` itself: the empty frame it answers needs no collect,
    // which would plan it (with stages, in a distributing session).
    if let Err(err) = ctx.sql(&table.create_statement(name)).await {
        // Which file, when one is to blame: DataFusion names the table's
        // location at most.
        let file = dfx_runtime::tables::unreadable_file(name, &table, &spec.store_options).await;
        return Err(match file {
            Some(file) => HostError::Invalid(format!("cannot register {file}")),
            None => HostError::datafusion(what(), err),
        });
    }
    check_partition_columns(ctx, name, &table).await
}

/// Refuse a table whose partition column is also a column of its files:
/// DataFusion takes the definition, and a query would then read one of
/// the two by chance.
async fn check_partition_columns(
    ctx: &SessionContext,
    name: &str,
    table: &TableDefinition,
) -> Result<()> {
    if table.partition_columns.is_empty() {
        return Ok(());
    }
    let provider = ctx
        .table_provider(name)
        .await
        .context(|| format!("table {name} is not registered"))?;
    // A listing table's columns: its files', then its partition columns.
    let schema = provider.schema();
    let columns: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    let files = columns.len().saturating_sub(table.partition_columns.len());
    if let Some(clash) = dfx_runtime::tables::partition_clash(name, table, &columns[..files]) {
        return Err(HostError::Invalid(clash));
    }
    Ok(())
}
