//! [`MemorySourceTable`]: a carried table's rows, as the planner meets them,
//! and the source files it writes once into a shuffle location.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatchOptions;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::writer::FileWriter;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::{DataFusionError, Result, TableReference};
use datafusion::datasource::TableType;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::memory::MemTable;
use datafusion::datasource::physical_plan::{ArrowSource, FileGroup, FileScanConfigBuilder};
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use dfx_abi::location::ShuffleLocation;
use object_store::path::Path as ObjectPath;

use crate::config::DfxConfig;
use crate::exchange::dirs::PRIVATE_DIR_MODE;
use crate::exchange::files::{TempFile, create_exclusive, decode_segment, describe_fields};
use crate::memory_table::TablePayload;
use crate::paths::temp_path;

/// The directory of a shuffle location that holds carried tables:
/// `sources/<digest>/part-<p>.arrow`, one Arrow IPC file per partition.
/// Not `stage-*`, so it never counts as stage output.
pub const SOURCES_DIR: &str = "sources";

/// A table carried by [`crate::codec::DfxLogicalCodec`]: its partitions' rows as
/// Arrow IPC, scanned from memory when nothing is distributed, and from
/// source files in the shuffle location when the plan is cut into stages.
#[derive(Debug)]
pub struct MemorySourceTable {
    name: String,
    schema: SchemaRef,
    payload: TablePayload,
}

impl MemorySourceTable {
    /// The table `table_ref` of `schema`, its rows in `payload`.
    ///
    /// # Errors
    ///
    /// A payload whose partitions are not Arrow IPC streams of `schema`'s
    /// columns, naming the partition.
    pub fn try_new(
        table_ref: &TableReference,
        schema: SchemaRef,
        mut payload: TablePayload,
    ) -> Result<Self> {
        if payload.partitions.is_empty() {
            // One empty partition rather than none: a scan of no partitions
            // would be a stage of no maps.
            let mut empty = Vec::new();
            datafusion::arrow::ipc::writer::StreamWriter::try_new(&mut empty, &schema)?.finish()?;
            payload.partitions.push(empty);
        }
        let table = Self {
            name: table_ref.to_string(),
            schema,
            payload,
        };
        // Checked now, so a bad payload fails the plan rather than a task.
        table.partitions()?;
        Ok(table)
    }

    /// Each partition's batches, in `self.schema`.
    fn partitions(&self) -> Result<Vec<Vec<RecordBatch>>> {
        let expected = self.schema.fields();
        let mut partitions = Vec::with_capacity(self.payload.partitions.len());
        for (p, bytes) in self.payload.partitions.iter().enumerate() {
            let fail = |what: String| {
                DataFusionError::Execution(format!(
                    "dfx in-memory table `{}`, partition {p}: {what}",
                    self.name
                ))
            };
            let (found, batches) = decode_segment(bytes.clone()).map_err(fail)?;
            let agree = found.fields().len() == expected.len()
                && found
                    .fields()
                    .iter()
                    .zip(expected.iter())
                    .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type());
            if !agree {
                return Err(fail(format!(
                    "its rows have columns ({}), the plan expects ({})",
                    describe_fields(found.fields()),
                    describe_fields(expected)
                )));
            }
            let batches = batches
                .into_iter()
                .map(|batch| {
                    // The row count too: a batch of no columns has only that.
                    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
                    RecordBatch::try_new_with_options(
                        Arc::clone(&self.schema),
                        batch.columns().to_vec(),
                        &options,
                    )
                })
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| fail(e.to_string()))?;
            partitions.push(batches);
        }
        Ok(partitions)
    }

    /// A name for these rows that differs when they do: written once, a
    /// second scan of the same table (a self-join) finds its files there.
    fn digest(&self) -> String {
        let mut hasher = DefaultHasher::new();
        self.schema.to_string().hash(&mut hasher);
        self.payload.partitions.hash(&mut hasher);
        let bytes: usize = self.payload.partitions.iter().map(Vec::len).sum();
        format!("{:016x}-{bytes}", hasher.finish())
    }

    /// Write each partition once under `location`'s [`SOURCES_DIR`] and scan
    /// the files, one file group (one partition) per partition.
    fn scan_files(
        &self,
        location: &Path,
        projection: Option<&Vec<usize>>,
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let fail = |what: String| {
            DataFusionError::Execution(format!("dfx in-memory table `{}`: {what}", self.name))
        };
        let root = match ShuffleLocation::parse(location).map_err(|e| fail(e.to_string()))? {
            ShuffleLocation::Local(dir) => dir,
            ShuffleLocation::S3(s3) => {
                return Err(fail(format!(
                    "a table held in memory is written into the shuffle location for the \
                     workers to read, and only a local one is supported; {} is on S3. Write the \
                     data to files every worker reads and register them as a table",
                    s3.url()
                )));
            }
        };
        let root = std::path::absolute(&root)
            .map_err(|e| fail(format!("cannot resolve {}: {e}", root.display())))?;
        let dir = root.join(SOURCES_DIR).join(self.digest());
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(PRIVATE_DIR_MODE)
            .create(&dir)
            .map_err(|e| fail(format!("cannot create {}: {e}", dir.display())))?;
        let mut groups = Vec::new();
        for (p, batches) in self.partitions()?.into_iter().enumerate() {
            let file = dir.join(format!("part-{p}.arrow"));
            let size = match std::fs::symlink_metadata(&file) {
                // Written by an earlier scan of the same rows.
                Ok(meta) if meta.is_file() => meta.len(),
                Ok(_) => {
                    return Err(fail(format!(
                        "{} exists and is not a file: refusing to read through it",
                        file.display()
                    )));
                }
                Err(_) => write_file(&file, &self.schema, &batches)
                    .map_err(|e| fail(format!("cannot write {}: {e}", file.display())))?,
            };
            let key = ObjectPath::from_absolute_path(&file)
                .map_err(|e| fail(format!("{}: {e}", file.display())))?;
            groups.push(FileGroup::new(vec![PartitionedFile::new(
                key.to_string(),
                size,
            )]));
        }
        let source = Arc::new(ArrowSource::new_file_source(Arc::clone(&self.schema)));
        let config = FileScanConfigBuilder::new(ObjectStoreUrl::local_filesystem(), source)
            .with_file_groups(groups)
            .with_projection_indices(projection.cloned())?
            .with_limit(limit)
            .build();
        Ok(DataSourceExec::from_data_source(config))
    }
}

/// Write `batches` as the Arrow IPC file `file`, under a temp name renamed
/// into place, so a reader never sees half a file; its size.
fn write_file(file: &Path, schema: &SchemaRef, batches: &[RecordBatch]) -> std::io::Result<u64> {
    let temp = temp_path(file);
    let mut guard = TempFile::new(temp.clone());
    let out = create_exclusive(&temp)?;
    let mut writer = FileWriter::try_new(out, schema).map_err(std::io::Error::other)?;
    for batch in batches {
        writer.write(batch).map_err(std::io::Error::other)?;
    }
    writer.finish().map_err(std::io::Error::other)?;
    let mut out = writer.into_inner().map_err(std::io::Error::other)?;
    out.flush()?;
    out.sync_all()?;
    let size = out.metadata()?.len();
    guard.publish(file)?;
    Ok(size)
}

#[async_trait]
impl TableProvider for MemorySourceTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match DfxConfig::from_config(state.config_options())?.shuffle_dir() {
            Some(location) => self.scan_files(&location, projection, limit),
            None => {
                let table = MemTable::try_new(Arc::clone(&self.schema), self.partitions()?)?;
                table.scan(state, projection, filters, limit).await
            }
        }
    }
}

/// Whether `file`, a path as a file scan in an encoded stage spells it
/// (`tmp/q1/sources/…`), lies under the [`SOURCES_DIR`] of the local
/// shuffle location `location`: a stage may read the tables its driver
/// carried there, as it reads its spec's tables.
pub fn is_source_file(file: &str, location: &str) -> bool {
    let Ok(ShuffleLocation::Local(dir)) = ShuffleLocation::parse(Path::new(location)) else {
        return false;
    };
    let Ok(file) = ObjectPath::parse(file) else {
        return false;
    };
    let sources: PathBuf = dir.join(SOURCES_DIR);
    let mut roots = Vec::new();
    if let Ok(absolute) = std::path::absolute(&sources)
        && let Ok(root) = ObjectPath::from_absolute_path(&absolute)
    {
        roots.push(root);
    }
    if let Ok(root) = ObjectPath::from_filesystem_path(&sources) {
        roots.push(root);
    }
    roots.iter().any(|root| file.prefix_match(root).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_file_lies_under_its_own_location_only() {
        let location = "/tmp/dfx-q1";
        assert!(is_source_file(
            "tmp/dfx-q1/sources/ab-3/part-0.arrow",
            location
        ));
        assert!(is_source_file(
            "tmp/dfx-q1/sources/ab-3/part-0.arrow",
            "file:///tmp/dfx-q1/"
        ));
        assert!(!is_source_file(
            "tmp/dfx-q1/stage-1/0-map-0.arrow",
            location
        ));
        assert!(!is_source_file(
            "tmp/dfx-q2/sources/ab-3/part-0.arrow",
            location
        ));
        assert!(!is_source_file("etc/passwd", location));
        assert!(!is_source_file("b/sources/x", "s3://b"));
    }
}
