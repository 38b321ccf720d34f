//! `dfx tpch`: TPC-H run distributed and single-process, answers checked.
//!
//! ```text
//! datagen ──► <data-dir>/sf<S>-p<P>/<table>/part-<i>.parquet   (cached)
//!                │
//! queries ──► for each query:  stock DataFusion × runs (the baseline) ─┐
//!                              dfx session in one process × runs       │
//!                              distributed × runs (fresh shuffle dir each)
//!                                                 ├─► compare with stock ──► report
//! ```
//!
//! - [`datagen`]: the eight tables as Parquet, one file per partition, cached.
//! - [`queries`]: the 22 queries (`host/queries/q<N>.sql`, compiled in).
//! - [`runner`]: times the three ways and checks dfx's answers agree with stock's.
//! - [`compare`]: what "agree" means (same column names and types, decimals
//!   exactly, floats to 1e-6 relative, order only where the query orders).
//! - [`report`]: the results table and its JSON.
//! - [`plot`]: the same figures as an SVG bar chart.

pub mod compare;
pub mod datagen;
pub mod error;
pub mod plot;
pub mod queries;
pub mod report;
pub mod runner;
pub mod upload;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

pub use error::TpchError;
pub use runner::{TpchOptions, run_tpch};

/// Default data directory, relative to the working directory: beside the
/// build output, so `cargo clean` removes it and git ignores it.
pub const DEFAULT_DATA_DIR: &str = "target/tpch-data";

/// Arguments of `dfx tpch`.
#[derive(Debug, Clone, Args)]
pub struct TpchArgs {
    /// TPC-H scale factor (1 = about 1 GB of raw data).
    #[arg(long, default_value_t = 0.1, value_name = "SF")]
    pub scale: f64,
    /// Files per table, and partitions every session plans for.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub partitions: usize,
    /// Where distributed plans are cut into stages.
    #[arg(long, value_enum, default_value_t = crate::session::Split::Exchange)]
    pub split: crate::session::Split,
    /// How workers compress their map files: `auto` is none for a local
    /// directory and LZ4 for S3; `lz4` and `none` force one (to measure).
    #[arg(long, value_enum, default_value_t = crate::session::ShuffleCompression::Auto)]
    pub shuffle_compression: crate::session::ShuffleCompression,
    /// Where map files live between stages: `object_store` (the shuffle
    /// location) or `local` (each on its worker's disk, streamed between
    /// workers over Arrow Flight; pool workers only).
    #[arg(long, value_enum, default_value_t = dfx_runtime::ShuffleDurability::ObjectStore)]
    pub shuffle_durability: dfx_runtime::ShuffleDurability,
    /// How distributed tasks run: `pool` (long-lived workers, the default)
    /// or `process` (one worker process per task).
    #[arg(long, value_enum, default_value_t = dfx_runtime::scheduler::WorkerMode::Pool)]
    pub worker_mode: dfx_runtime::scheduler::WorkerMode,
    /// Attempts per task before the query fails: a task whose worker died,
    /// was killed or timed out is run again.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub max_attempts: u32,
    /// Seconds one task may run before its worker is killed and the task
    /// retried (no limit by default).
    #[arg(long, value_name = "SECS")]
    pub task_timeout: Option<u64>,
    /// Where distributed runs publish: a directory or s3://BUCKET/PREFIX,
    /// under which each run of each query gets a fresh location (default:
    /// a temporary directory per run).
    #[arg(long, value_name = "DIR|URL")]
    pub shuffle_dir: Option<PathBuf>,
    /// Read the tables from s3://BUCKET/PREFIX: the generated files are
    /// copied there first (kept when already there), and every mode, stock
    /// DataFusion too, reads them from S3 (endpoint, region and credentials
    /// from the AWS_* environment variables). Default: the local files.
    #[arg(long, value_name = "URL")]
    pub tables_on: Option<String>,
    /// Queries to run: `all`, or a list such as `1,3,6` or `1-5,18`.
    #[arg(long, default_value = "all", value_name = "LIST")]
    pub queries: String,
    /// Where generated data is cached (one sub-directory per scale and partition count).
    #[arg(long, default_value = DEFAULT_DATA_DIR, value_name = "DIR")]
    pub data_dir: PathBuf,
    /// Timed runs per query and mode, the three modes in turn within each
    /// run; the table shows the medians.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub runs: usize,
    /// Also write the figures as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Also draw each query's times (stock, dfx-local, distributed) side by
    /// side as an SVG bar chart into this file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Seconds one run of one query may take; a run past it is stopped (its
    /// workers killed) and the query reported as timed out.
    #[arg(long, default_value_t = 300, value_name = "SECS")]
    pub timeout: u64,
    /// The plugin file (default: $DFX_PLUGIN, else beside this executable).
    #[arg(long, value_name = "PATH")]
    pub plugin: Option<PathBuf>,
    /// Set the plugin's dfx_engine.KEY in every session the distributed and
    /// dfx-local runs make (coalesce=off, join_filters=on). Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = crate::session::parse_engine_option)]
    pub settings: Vec<(String, String)>,
    /// Partitions of a stage each task of a distributed run runs at once
    /// (the plugin's dfx_engine.partitions_per_task). Default: this
    /// machine's cores.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub partitions_per_task: Option<u64>,
    /// No live progress line on stderr while a distributed run's tasks run
    /// (it shows only on a terminal, once a run has taken about a second).
    #[arg(long)]
    pub no_progress: bool,
}

/// The plugin settings of `args`: its `--set`s, with the partitions each
/// task runs from `--partitions-per-task`, else a `--set`, else this
/// machine's cores.
fn engine_options(args: &TpchArgs) -> BTreeMap<String, String> {
    let mut options: BTreeMap<String, String> = args.settings.iter().cloned().collect();
    let key = dfx_abi::PARTITIONS_PER_TASK.to_string();
    match args.partitions_per_task {
        Some(n) => {
            options.insert(key, n.to_string());
        }
        None => {
            options
                .entry(key)
                .or_insert_with(|| crate::session::default_partitions_per_task().to_string());
        }
    }
    options
}

/// Exit status when some query's distributed answer differs from the local one.
pub const EXIT_MISMATCH: u8 = 1;
/// Exit status when every answer that was compared agrees but some query
/// could not run in one of the modes.
pub const EXIT_NOT_RUN: u8 = 2;

/// Run `dfx tpch` as the CLI does: load the plugin, generate or reuse the
/// data, run every selected query, print the table (stdout) and write the
/// JSON. Workers are this executable (`<exe> worker <envelope>`).
///
/// Returns [`EXIT_MISMATCH`] if any answer differs, [`EXIT_NOT_RUN`] if a
/// query could not run, success otherwise.
///
/// # Errors
/// Bad arguments, a plugin that cannot be loaded, data that cannot be
/// generated, or a JSON file that cannot be written. A query that fails is
/// not an error here: it is a row of the table.
pub async fn run_cli(args: TpchArgs) -> Result<ExitCode, TpchError> {
    let queries = queries::parse_selection(&args.queries)?;
    let plugin = crate::load_plugin(args.plugin.as_deref())?;
    let host = crate::Host::new(plugin)?
        .worker_mode(args.worker_mode)
        .max_attempts(args.max_attempts)
        .task_timeout(args.task_timeout.map(std::time::Duration::from_secs))
        .progress(!args.no_progress);
    let data_dir =
        std::path::absolute(&args.data_dir).map_err(|e| TpchError::io(&args.data_dir, e))?;
    let options = TpchOptions {
        scale: args.scale,
        partitions: args.partitions,
        split: args.split,
        shuffle_compression: args.shuffle_compression,
        shuffle_durability: args.shuffle_durability,
        queries,
        data_dir,
        shuffle_root: args.shuffle_dir.clone(),
        tables_on: args.tables_on.clone(),
        runs: args.runs,
        engine_options: engine_options(&args),
        progress: true,
        timeout: std::time::Duration::from_secs(args.timeout.max(1)),
    };
    let report = run_tpch(&host, &options).await;
    host.shutdown().await;
    let report = report?;
    let tables = args.tables_on.as_deref().unwrap_or("local files");
    println!(
        "TPC-H sf{} with {} partitions, split {}, shuffle compression {}, shuffle durability {}, \
         worker mode {}, tables on {tables}, median of {} run(s) per mode, the modes in \
         turn\n",
        report.scale,
        report.partitions,
        report.split,
        report.shuffle_compression,
        args.shuffle_durability,
        args.worker_mode.as_str(),
        report.runs
    );
    print!("{}", report.table());
    if let Some(path) = &args.json {
        report.write_json(path)?;
        eprintln!("figures written to {}", path.display());
    }
    if let Some(path) = &args.plot {
        plot::write_svg(&report, path)?;
        eprintln!("chart drawn into {}", path.display());
    }
    if report.mismatches > 0 {
        eprintln!(
            "dfx tpch: {} query answer(s) DIFFER between distributed and single-process runs",
            report.mismatches
        );
        return Ok(ExitCode::from(EXIT_MISMATCH));
    }
    if report.failures > 0 {
        eprintln!(
            "dfx tpch: {} query(ies) could not run in both modes (see the table)",
            report.failures
        );
        return Ok(ExitCode::from(EXIT_NOT_RUN));
    }
    Ok(ExitCode::SUCCESS)
}
