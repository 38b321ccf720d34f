//! `dfx tpch --tables-on s3://...`: the generated tables copied to an S3
//! prefix, so every mode reads them from there.
//!
//! ```text
//! <data-dir>/sf<S>-p<P>/<table>/part-<i>.parquet
//!     ──► s3://bucket/prefix/sf<S>-p<P>/<table>/part-<i>.parquet
//! ```
//!
//! An object already there with the local file's size is kept: the data of a
//! scale and partition count never changes once generated.

use std::collections::BTreeMap;

use dfx_runtime::spec::TableDefinition;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt, PutPayload};

use super::TpchError;
use super::datagen::Dataset;

/// Copy every table of `dataset` under `url` (`s3://bucket/prefix`) and
/// answer each table's definition there.
///
/// # Errors
///
/// A URL that is not `s3://bucket[/prefix]`, a local file that cannot be
/// read, or a request S3 refuses: each naming the file or object.
pub async fn upload_dataset(
    dataset: &Dataset,
    url: &str,
    store_options: &BTreeMap<String, String>,
    progress: bool,
) -> Result<BTreeMap<String, TableDefinition>, TpchError> {
    let rest = url.strip_prefix("s3://").ok_or_else(|| {
        TpchError::Invalid(format!("--tables-on takes s3://BUCKET[/PREFIX], got {url}"))
    })?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(TpchError::Invalid(format!(
            "--tables-on {url} names no bucket"
        )));
    }
    let prefix = prefix.trim_matches('/');
    let store =
        dfx_runtime::tables::s3_store(bucket, store_options).map_err(crate::HostError::from)?;
    let dataset_name = dataset
        .root
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let base = [prefix, dataset_name.as_str()]
        .into_iter()
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("/");
    let (mut sent, mut kept) = (0usize, 0usize);
    let mut tables = BTreeMap::new();
    for (table, dir) in dataset.tables() {
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .map_err(|e| TpchError::io(&dir, e))?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| path.extension().is_some_and(|e| e == "parquet"))
            .collect();
        files.sort();
        for file in files {
            let name = file
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let key = ObjectPath::from(format!("{base}/{table}/{name}"));
            let bytes = std::fs::read(&file).map_err(|e| TpchError::io(&file, e))?;
            let failed = |e: object_store::Error| {
                TpchError::Invalid(format!(
                    "cannot copy {} to s3://{bucket}/{key}: {e}",
                    file.display()
                ))
            };
            match store.head(&key).await {
                Ok(meta) if meta.size == bytes.len() as u64 => kept += 1,
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {
                    store
                        .put(&key, PutPayload::from(bytes))
                        .await
                        .map_err(failed)?;
                    sent += 1;
                }
                Err(e) => return Err(failed(e)),
            }
        }
        tables.insert(
            table.clone(),
            TableDefinition::parquet(format!("s3://{bucket}/{base}/{table}/")),
        );
    }
    if progress {
        eprintln!("tables on s3://{bucket}/{base}/: {sent} file(s) copied, {kept} already there");
    }
    Ok(tables)
}
