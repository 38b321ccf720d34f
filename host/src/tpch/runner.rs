//! Run TPC-H queries both ways, time them, and check the answers agree.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::prelude::{SessionConfig, SessionContext};

use super::TpchError;
use super::compare::{RowOrder, compare, compare_columns, row_order, rows_of};
use super::datagen::{Dataset, Provenance, ensure_dataset};
use super::queries::query;
use super::report::{Outcome, QueryReport, RunReport, first_line, median};
use crate::session::{ShuffleCompression, Split, TableDefinition};
use crate::{Host, HostError, SessionSpec, build_session};

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct TpchOptions {
    /// TPC-H scale factor.
    pub scale: f64,
    /// Files per table, and the sessions' target partitions.
    pub partitions: usize,
    /// Where distributed plans are cut into stages.
    pub split: Split,
    /// How workers compress their map files.
    pub shuffle_compression: ShuffleCompression,
    /// Where map files live between stages.
    pub shuffle_durability: dfx_runtime::ShuffleDurability,
    /// Query numbers, in the order to run them.
    pub queries: Vec<u8>,
    /// Where datasets are cached (absolute: workers resolve it elsewhere).
    pub data_dir: PathBuf,
    /// Where each distributed run gets a fresh location (a directory or an
    /// `s3://` URL); `None`: a temporary directory per run.
    pub shuffle_root: Option<PathBuf>,
    /// Where the tables are read from: `None` for the generated files, or
    /// an `s3://bucket/prefix` they are copied under first.
    pub tables_on: Option<String>,
    /// Timed runs per query and mode (at least 1).
    pub runs: usize,
    /// The plugin's `dfx_engine` settings (keys without the prefix) for
    /// every session, the stock one's aside: its decisions forced on or off.
    pub engine_options: BTreeMap<String, String>,
    /// Progress on stderr (data generation bar, one line per query).
    pub progress: bool,
    /// Longest a single run of a query may take before it is abandoned
    /// (its workers are killed) and reported as timed out.
    pub timeout: Duration,
}

/// Generate (or reuse) the data, then run every selected query with `host`.
///
/// # Errors
/// Invalid options or data that cannot be generated. A query that fails to
/// run is reported in its row, not returned as an error.
pub async fn run_tpch(host: &Host, options: &TpchOptions) -> Result<RunReport, TpchError> {
    if options.runs == 0 {
        return Err(TpchError::Invalid("--runs must be at least 1".to_string()));
    }
    let dataset = prepare_data(options).await?;
    let tables = match &options.tables_on {
        None => dataset
            .tables()
            .into_iter()
            .map(|(name, dir)| (name, TableDefinition::from(dir)))
            .collect(),
        Some(url) => {
            super::upload::upload_dataset(&dataset, url, &BTreeMap::new(), options.progress).await?
        }
    };
    let mut spec = SessionSpec::new(tables)
        .with_target_partitions(options.partitions)
        .with_split(options.split)
        .with_shuffle_compression(options.shuffle_compression);
    spec.shuffle_durability = options.shuffle_durability;
    spec.engine_options = options.engine_options.clone();
    let mut reports = Vec::new();
    for &number in &options.queries {
        let report = run_query_in(
            host,
            &spec,
            number,
            options.runs,
            options.timeout,
            options.shuffle_root.as_deref(),
        )
        .await?;
        if options.progress {
            let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1} ms"));
            eprintln!(
                "q{number}: {} (stock {}, dfx-local {}, distributed {})",
                report.outcome.label(),
                ms(report.stock_ms),
                ms(report.local_ms),
                ms(report.distributed_ms),
            );
        }
        reports.push(report);
    }
    Ok(RunReport::new(
        options.scale,
        options.partitions,
        options.split,
        options.shuffle_compression,
        options.runs,
        reports,
    ))
}

/// The dataset `options` ask for, generated off the async runtime's threads.
async fn prepare_data(options: &TpchOptions) -> Result<Dataset, TpchError> {
    let (dir, scale, partitions, progress) = (
        options.data_dir.clone(),
        options.scale,
        options.partitions,
        options.progress,
    );
    let (dataset, provenance) =
        tokio::task::spawn_blocking(move || ensure_dataset(&dir, scale, partitions, progress))
            .await
            .map_err(|e| TpchError::Invalid(format!("data generation did not finish: {e}")))??;
    if options.progress {
        let how = match provenance {
            Provenance::Cached => "reusing",
            Provenance::Generated => "generated",
        };
        eprintln!("{how} TPC-H data in {}", dataset.root.display());
    }
    Ok(dataset)
}

/// Run one query `runs` times each way (stock DataFusion, dfx's session in
/// one process, distributed), the three ways in turn within each run, and
/// compare every dfx answer with stock's.
///
/// # Errors
/// Only an unknown query number or a shuffle directory that cannot be
/// created; query failures land in the report.
pub async fn run_query(
    host: &Host,
    spec: &SessionSpec,
    number: u8,
    runs: usize,
    timeout: Duration,
) -> Result<QueryReport, TpchError> {
    run_query_in(host, spec, number, runs, timeout, None).await
}

/// [`run_query`], each distributed run publishing into a fresh location
/// under `shuffle_root` (a directory or an `s3://` URL) when given.
///
/// # Errors
/// Those of [`run_query`].
pub async fn run_query_in(
    host: &Host,
    spec: &SessionSpec,
    number: u8,
    runs: usize,
    timeout: Duration,
    shuffle_root: Option<&std::path::Path>,
) -> Result<QueryReport, TpchError> {
    let sql = query(number)
        .ok_or_else(|| TpchError::Invalid(format!("no TPC-H query {number}")))?
        .sql;
    let mut report = QueryReport {
        query: number,
        rows: None,
        stock_ms: None,
        local_ms: None,
        distributed_ms: None,
        ratio: None,
        stages: None,
        tasks: None,
        decisions: Vec::new(),
        outcome: Outcome::Agree,
    };

    let order = match ordering_of(host, spec, sql).await {
        Ok(order) => order,
        Err(err) => {
            report.outcome = Outcome::LocalFailed(summary(&err));
            return Ok(report);
        }
    };

    // Each run times the three modes in turn (stock, dfx-local, distributed),
    // so a busy spell on a shared machine falls on all three rather than on
    // whichever mode's runs it happens to span. The reference is the first
    // stock answer: stock DataFusion, default config, same files and
    // partitions, which every dfx run is checked against.
    let mut stock_times = Vec::new();
    let mut local_times = Vec::new();
    let mut distributed_times = Vec::new();
    let mut expected: Option<(Vec<RecordBatch>, Vec<_>)> = None;
    for run in 0..runs {
        let started = Instant::now();
        match within(timeout, run_stock(sql, spec)).await {
            Ok(batches) => {
                stock_times.push(millis(started));
                if expected.is_none() {
                    let rows = rows_of(&batches)?;
                    report.rows = Some(rows.len());
                    expected = Some((batches, rows));
                }
            }
            Err(err) => {
                report.outcome = Outcome::LocalFailed(format!("stock: {}", summary(&err)));
                return Ok(report);
            }
        }
        let Some((expected, expected_rows)) = &expected else {
            // The first stock run either answered or returned above.
            break;
        };

        let started = Instant::now();
        match within(timeout, host.run_local(sql, spec)).await {
            Ok(batches) => {
                local_times.push(millis(started));
                let actual = rows_of(&batches)?;
                let agreement = compare_columns(expected, &batches)
                    .and_then(|()| compare(expected_rows, &actual, &order));
                if let Err(mismatch) = agreement {
                    report.outcome =
                        Outcome::Mismatch(format!("dfx-local run {}: {mismatch}", run + 1));
                    return Ok(report);
                }
            }
            Err(err) => {
                report.outcome = Outcome::LocalFailed(format!("dfx-local: {}", summary(&err)));
                return Ok(report);
            }
        }

        // One directory per query run: the driver refuses a directory holding
        // stage output, since readers would take the first run's files.
        let (run_dir, _shuffle) = match shuffle_root {
            // Fresh by name under the user's root (a URL has no temp dirs).
            Some(root) => (
                root.join(format!(
                    "dfx-tpch-q{number}-{}-{}-{run}",
                    std::process::id(),
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_nanos())
                )),
                None,
            ),
            None => {
                let shuffle = tempfile::Builder::new()
                    .prefix(&format!("dfx-tpch-q{number}-"))
                    .tempdir()
                    .map_err(|e| TpchError::io(&std::env::temp_dir(), e))?;
                (shuffle.path().to_path_buf(), Some(shuffle))
            }
        };
        let run_spec = spec.clone().with_shuffle_dir(run_dir);
        let started = Instant::now();
        // Dropping the run on timeout kills its workers (they are kill_on_drop).
        match within(timeout, host.run_distributed(sql, &run_spec)).await {
            Ok(result) => {
                distributed_times.push(millis(started));
                report.stages = Some(result.stages.len());
                report.tasks = Some(result.tasks.len());
                report.decisions = result
                    .decisions
                    .iter()
                    .map(|d| format!("stage {}: {}", d.stage_id, d.reason))
                    .collect();
                let actual = rows_of(&result.batches)?;
                let agreement = compare_columns(expected, &result.batches)
                    .and_then(|()| compare(expected_rows, &actual, &order));
                if let Err(mismatch) = agreement {
                    report.outcome = Outcome::Mismatch(format!("run {}: {mismatch}", run + 1));
                }
            }
            Err(err) => {
                report.outcome = Outcome::DistributedFailed(summary(&err));
                break;
            }
        }
        if !matches!(report.outcome, Outcome::Agree) {
            break;
        }
    }
    report.stock_ms = median(&stock_times);
    report.local_ms = median(&local_times);
    report.distributed_ms = median(&distributed_times);
    if let (Some(stock), Some(distributed), Outcome::Agree) =
        (report.stock_ms, report.distributed_ms, &report.outcome)
        && stock > 0.0
    {
        report.ratio = Some(distributed / stock);
    }
    Ok(report)
}

/// `sql` in a stock DataFusion session: default config but for the target
/// partitions, every table a Parquet listing table over the same files. No
/// plugin, no dfx session settings: the baseline a user would compare with.
pub async fn run_stock(sql: &str, spec: &SessionSpec) -> Result<Vec<RecordBatch>, HostError> {
    let config = SessionConfig::new().with_target_partitions(spec.target_partitions);
    let ctx = SessionContext::new_with_config(config);
    for (name, table) in &spec.tables {
        register_stock_table(&ctx, name, table, spec).await?;
    }
    ctx.sql(sql)
        .await
        .map_err(|e| HostError::datafusion("stock DataFusion cannot plan the query", e))?
        .collect()
        .await
        .map_err(|e| HostError::datafusion("stock DataFusion cannot run the query", e))
}

/// Register `table` in the stock session `ctx` as a DataFusion user would:
/// the S3 client for its bucket, then its `CREATE EXTERNAL TABLE`.
async fn register_stock_table(
    ctx: &SessionContext,
    name: &str,
    table: &TableDefinition,
    spec: &SessionSpec,
) -> Result<(), HostError> {
    let failed =
        |e| HostError::datafusion(format!("stock DataFusion cannot register table {name}"), e);
    if let Some(bucket) = table.s3_bucket() {
        let store = dfx_runtime::tables::s3_store(bucket, &spec.store_options)?;
        let url = ObjectStoreUrl::parse(format!("s3://{bucket}")).map_err(failed)?;
        ctx.register_object_store(url.as_ref(), store);
    }
    // Run by `sql` itself; the empty frame it answers needs no collect.
    ctx.sql(&table.create_statement(name))
        .await
        .map_err(failed)?;
    Ok(())
}

/// How the answer of `sql` is ordered, from its logical plan in a local session.
async fn ordering_of(host: &Host, spec: &SessionSpec, sql: &str) -> Result<RowOrder, HostError> {
    let local = spec.clone().without_shuffle_dir();
    let session = build_session(host.plugin(), &local).await?;
    let plan = session
        .ctx()
        .state()
        .create_logical_plan(sql)
        .await
        .map_err(|e| HostError::datafusion("cannot plan the query", e))?;
    Ok(row_order(&plan))
}

/// `work`, or a timeout error once `limit` has passed.
async fn within<T>(
    limit: Duration,
    work: impl std::future::Future<Output = Result<T, HostError>>,
) -> Result<T, HostError> {
    match tokio::time::timeout(limit, work).await {
        Ok(outcome) => outcome,
        Err(_) => Err(HostError::Invalid(format!(
            "timed out after {:.0} s (raise --timeout to wait longer)",
            limit.as_secs_f64()
        ))),
    }
}

fn millis(started: Instant) -> f64 {
    started.elapsed().as_secs_f64() * 1e3
}

/// One line saying why a run failed: for failed workers, the first task's
/// reason and the first line of its stderr, which is where the cause is.
pub fn summary(err: &HostError) -> String {
    match err {
        HostError::Runtime(dfx_runtime::RuntimeError::Workers {
            total, failures, ..
        }) => {
            let Some(first) = failures.first() else {
                return first_line(&err.to_string());
            };
            let cause = first
                .stderr
                .lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .unwrap_or("(no stderr)");
            format!(
                "{} of {total} task(s) failed; stage {} map {} {}: {cause}",
                failures.len(),
                first.stage_id,
                first.map,
                first.reason
            )
        }
        other => first_line(&other.to_string()),
    }
}
