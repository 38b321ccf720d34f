//! Reaching a spec's tables: the S3 client for a table's bucket, the files
//! of a table, and the partition count a session plans for.
//!
//! Files are listed as DataFusion lists a listing table's
//! ([`ListingTableUrl`]: a directory, one file, or a glob; the format's
//! extension, with its compression's), so a host that counts here and a
//! session that registers the table see the same files.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::datasource::listing::ListingTableUrl;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::object_store::ObjectStoreUrl;
use futures::TryStreamExt;
use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;

use crate::error::{Result, RuntimeError};
use crate::spec::location::{S3_ALLOW_HTTP, S3_ENDPOINT, S3_REGION};
use crate::spec::{SessionSpec, TableDefinition, TableFormat};

/// The S3 client for `bucket`, configured by a spec's `store_options` over
/// the AWS environment (the rule of [`dfx_abi::location::apply_s3_options`]).
/// A host registers it on its session for `s3://bucket`.
///
/// # Errors
///
/// Settings object_store refuses (a malformed endpoint), naming the bucket.
pub fn s3_store(
    bucket: &str,
    store_options: &BTreeMap<String, String>,
) -> Result<Arc<dyn ObjectStore>> {
    let option = |key: &str| {
        store_options
            .get(key)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    };
    let allow_http = option(S3_ALLOW_HTTP).is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let builder = dfx_abi::location::apply_s3_options(
        AmazonS3Builder::from_env().with_bucket_name(bucket),
        option(S3_ENDPOINT),
        option(S3_REGION),
        allow_http,
    );
    let store = builder.build().map_err(|err| {
        RuntimeError::Invalid(format!("cannot configure S3 for bucket {bucket}: {err}"))
    })?;
    Ok(Arc::new(store))
}

/// The refusal of a table whose partition column is also a column of its
/// files, which both hosts raise: DataFusion takes such a definition, and a
/// query would then read one of the two by chance. `file_columns` are the
/// registered table's columns without its partition columns (a listing
/// table puts those last); `None` when no partition column repeats one.
pub fn partition_clash(
    name: &str,
    table: &TableDefinition,
    file_columns: &[&str],
) -> Option<String> {
    let column = table
        .partition_columns
        .iter()
        .find(|column| file_columns.contains(&column.name.as_str()))?;
    Some(format!(
        "table {name} ({}): partition column {} is also a column of its files; name the \
         partition column differently or leave it out of the definition",
        table.location, column.name
    ))
}

/// The extension DataFusion lists `table`'s files by: the format's, then
/// its compression's (`format.compression` of `gzip` lists `.csv.gz`).
pub fn file_extension(table: &TableDefinition) -> String {
    let mut extension = table.format.extension().to_string();
    if matches!(table.format, TableFormat::Csv | TableFormat::Json) {
        let compression = table
            .options
            .get("format.compression")
            .map(|c| c.trim().to_ascii_lowercase());
        let suffix = match compression.as_deref() {
            Some("gzip") => ".gz",
            Some("bzip2") => ".bz2",
            Some("xz") => ".xz",
            Some("zstd") => ".zst",
            _ => "",
        };
        extension.push_str(suffix);
    }
    extension
}

/// How many files table `name` holds, listed as DataFusion lists them.
///
/// # Errors
///
/// A location that cannot be parsed or listed (an unreachable bucket, a
/// directory that does not exist), or one that holds no file of the
/// table's format: each names the table and its location.
pub async fn table_file_count(
    name: &str,
    table: &TableDefinition,
    store_options: &BTreeMap<String, String>,
) -> Result<usize> {
    let invalid =
        |what: String| RuntimeError::Invalid(format!("table {name} ({}): {what}", table.location));
    let location = table.clone().absolute().map_err(|err| {
        RuntimeError::Invalid(format!(
            "table {name}: cannot resolve {}: {err}",
            table.location
        ))
    })?;
    let local_root = location.root();
    if !location.is_s3() && !local_root.exists() {
        return Err(invalid(format!("{} does not exist", local_root.display())));
    }
    let url = ListingTableUrl::parse(location.location.as_str())
        .map_err(|err| invalid(format!("not a location: {err}")))?;
    let store: Arc<dyn ObjectStore> = match location.s3_bucket() {
        Some(bucket) => s3_store(bucket, store_options)?,
        None => Arc::new(LocalFileSystem::new()),
    };
    let state = SessionStateBuilder::new().build();
    let extension = file_extension(table);
    let files = url
        .list_all_files(&state, store.as_ref(), &extension)
        .await
        .map_err(|err| invalid(format!("cannot list its files: {err}")))?;
    let count = files
        .try_fold(0usize, |count, _| async move { Ok(count + 1) })
        .await
        .map_err(|err| invalid(format!("cannot list its files: {err}")))?;
    if count == 0 {
        return Err(invalid(format!(
            "no {extension} file is there; a table needs at least one file of its format \
             ({})",
            table.format
        )));
    }
    Ok(count)
}

/// Which file of table `name` DataFusion cannot register, and why, when a
/// whole table could not be: each file is read alone as the table's format
/// reads it, and the files' schemas are compared, so the error names the
/// file (a corrupt footer, a line that does not parse, a column whose type
/// differs from the first file's). `None` when every file reads alike.
///
/// Called only after registering the table failed: it reads every file's
/// schema again.
pub async fn unreadable_file(
    name: &str,
    table: &TableDefinition,
    store_options: &BTreeMap<String, String>,
) -> Option<String> {
    let location = table.clone().absolute().ok()?;
    let url = ListingTableUrl::parse(location.location.as_str()).ok()?;
    let bucket = location.s3_bucket().map(str::to_string);
    let store: Arc<dyn ObjectStore> = match &bucket {
        Some(bucket) => s3_store(bucket, store_options).ok()?,
        None => Arc::new(LocalFileSystem::new()),
    };
    let ctx = datafusion::prelude::SessionContext::new();
    if let Some(bucket) = &bucket {
        let store_url = ObjectStoreUrl::parse(format!("s3://{bucket}")).ok()?;
        ctx.register_object_store(store_url.as_ref(), Arc::clone(&store));
    }
    let state = ctx.state();
    let extension = file_extension(table);
    let files: Vec<_> = url
        .list_all_files(&state, store.as_ref(), &extension)
        .await
        .ok()?
        .try_collect()
        .await
        .ok()?;
    let mut first: Option<(String, datafusion::arrow::datatypes::SchemaRef)> = None;
    for file in files {
        let path = match &bucket {
            Some(bucket) => format!("s3://{bucket}/{}", file.location),
            None => format!("/{}", file.location),
        };
        let mut probe = table.clone();
        probe.location = path.clone();
        probe.partition_columns.clear();
        let schema = match ctx.sql(&probe.create_statement("dfx_probe")).await {
            Ok(_) => ctx.table("dfx_probe").await.ok()?.schema().inner().clone(),
            Err(err) => {
                return Some(format!(
                    "table {name}: {path} cannot be read as {}: {err}",
                    table.format
                ));
            }
        };
        let _ = ctx.deregister_table("dfx_probe");
        match &first {
            None => first = Some((path, schema)),
            Some((first_path, first_schema)) => {
                for field in schema.fields() {
                    if let Ok(other) = first_schema.field_with_name(field.name())
                        && other.data_type() != field.data_type()
                    {
                        return Some(format!(
                            "table {name}: column {} is {} in {path} but {} in {first_path}; \
                             every file of a table must give a column one type",
                            field.name(),
                            field.data_type(),
                            other.data_type()
                        ));
                    }
                }
            }
        }
    }
    None
}

/// The partitions a session built from `spec` plans for: its
/// `target_partitions`, raised to the file count of its largest table.
///
/// A task is one partition of a stage and the unit of work over a table is
/// a file, so a table of N files scans as N partitions. DataFusion groups a
/// listing table's files into `target_partitions` groups, so the floor is
/// raised here, the same in every host. The result depends only on the spec
/// and the files, never on the machine.
///
/// # Errors
///
/// A `target_partitions` of 0, or a table [`table_file_count`] refuses.
pub async fn effective_target_partitions(spec: &SessionSpec) -> Result<usize> {
    if spec.target_partitions == 0 {
        return Err(RuntimeError::Invalid(
            "session spec target_partitions must be at least 1, got 0".to_string(),
        ));
    }
    let mut partitions = spec.target_partitions;
    for (name, table) in &spec.tables {
        partitions = partitions.max(table_file_count(name, table, &spec.store_options).await?);
    }
    Ok(partitions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn files_are_counted_as_datafusion_lists_them() {
        let dir = tempfile::tempdir().unwrap();
        for file in ["a.parquet", "b.parquet", "c.csv", "d.csv.gz"] {
            std::fs::write(dir.path().join(file), b"x").unwrap();
        }
        let root = dir.path().display().to_string();
        let none = BTreeMap::new();
        let count = |table: TableDefinition| {
            let none = none.clone();
            async move { table_file_count("t", &table, &none).await }
        };
        assert_eq!(count(TableDefinition::parquet(&root)).await.unwrap(), 2);
        let csv = TableDefinition::new(&root, TableFormat::Csv);
        assert_eq!(count(csv.clone()).await.unwrap(), 1);
        let gz = csv.with_option("format.compression", "GZIP");
        assert_eq!(count(gz).await.unwrap(), 1);
        let one = TableDefinition::parquet(format!("{root}/a.parquet"));
        assert_eq!(count(one).await.unwrap(), 1);
        let glob = TableDefinition::parquet(format!("{root}/b*.parquet"));
        assert_eq!(count(glob).await.unwrap(), 1);
        let none_match = TableDefinition::parquet(format!("{root}/z*.parquet"));
        let err = count(none_match).await.unwrap_err().to_string();
        assert!(
            err.contains("table t") && err.contains("no .parquet file"),
            "{err}"
        );
        let missing = TableDefinition::parquet(format!("{root}/missing"));
        let err = count(missing).await.unwrap_err().to_string();
        assert!(err.contains("missing does not exist"), "{err}");
    }
}
