//! `dfx bench skew`: a join whose probe side puts most of its rows under
//! one key, distributed with skew splitting off, skew splitting `auto`
//! and the join switched to a broadcast one in turn, and in one process,
//! side by side.
//!
//! ```text
//! t: --rows rows in --files Parquet files; a --hot share of them key 0,
//!    the others keys 1.. once each
//! d: every even key of 0 ..= 2 x (t's other rows): fewer rows than t (so
//!    it is the build side) and more than DataFusion broadcasts (so the
//!    join is partitioned)
//! SELECT count(*), count(d.k) FROM t LEFT JOIN d ON t.k = d.k
//! ```
//!
//! Key 0's bucket holds the hot rows of every map of t's stage; unsplit,
//! one task probes all of them while the other slots idle. Every answer is
//! checked against the one the tables were built to give.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use datafusion::arrow::array::{Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::parquet::arrow::ArrowWriter;
use serde::Serialize;

use super::output::BenchOutput;
use crate::session::TableDefinition;
use crate::tpch::TpchError;
use crate::tpch::report::median;
use crate::{Host, Plugin, SessionSpec};

/// The benchmark's query.
pub const SKEW_SQL: &str = "SELECT count(*) AS n, count(d.k) AS matched \
                            FROM t LEFT JOIN d ON t.k = d.k";

/// The distributed ways the query runs, by name, and the settings of each:
/// neither decision about the skewed join, skew splitting alone, and the
/// defaults, under which the broadcast switch (tried first) takes the join.
const MODES: [(&str, &[(&str, &str)]); 3] = [
    (
        "skew_split=off",
        &[("skew_split", "off"), ("broadcast_switch", "off")],
    ),
    ("skew_split=auto", &[("broadcast_switch", "off")]),
    ("broadcast_switch=auto", &[]),
];

/// Rows written per Parquet row group and batch.
const BATCH_ROWS: usize = 1 << 20;

/// Arguments of `dfx bench skew`.
#[derive(Debug, Clone, Args)]
pub struct SkewArgs {
    /// Rows of the skewed table `t`.
    #[arg(long, default_value_t = 20_000_000, value_name = "N")]
    pub rows: u64,
    /// The share of `t`'s rows under key 0.
    #[arg(long, default_value_t = 0.9, value_name = "FRACTION")]
    pub hot: f64,
    /// Parquet files of `t` (maps of its scan stage).
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub files: u64,
    /// Partitions the session plans for.
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub partitions: usize,
    /// Partitions each task runs at once (a slice; see `dfx run
    /// --partitions-per-task`). In slices, a skewed partition runs as
    /// parts inside its slice's task.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub partitions_per_task: usize,
    /// Runs of each mode, taken in turn (medians are reported).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub runs: usize,
    /// Where its files go (tables already there are reused), the plugin,
    /// and the JSON figures.
    #[command(flatten)]
    pub output: BenchOutput,
}

/// The figures of one way of running the query.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SkewFigures {
    /// `one process`, or the distributed mode's name (`skew_split=auto`).
    pub mode: String,
    /// Wall time of each run, in milliseconds.
    pub runs_ms: Vec<f64>,
    /// Their median.
    pub median_ms: f64,
    /// Tasks the last run ran (none in one process).
    pub tasks: usize,
    /// The adaptive decisions of the last run that changed a stage's tasks
    /// (or split a partition inside a task, or switched a join).
    pub decisions: Vec<String>,
}

/// Build the tables (unless there), then run the query in one process and
/// distributed with each mode in turn, `args.runs` times.
///
/// # Errors
///
/// A table that cannot be written, a run that fails, or an answer that is
/// not the one the tables give.
pub async fn skew(plugin: &Plugin, args: &SkewArgs) -> Result<Vec<SkewFigures>, TpchError> {
    if !(0.0..1.0).contains(&args.hot) || args.files == 0 || args.rows < args.files {
        return Err(TpchError::Invalid(format!(
            "--hot must be in [0, 1) (is {}), --files at least 1 and at most --rows (are {} \
             and {})",
            args.hot, args.files, args.rows
        )));
    }
    if args.partitions_per_task == 0 {
        return Err(TpchError::Invalid(
            "--partitions-per-task must be at least 1 (is 0)".to_string(),
        ));
    }
    let temp;
    let root = match &args.output.dir {
        Some(dir) => dir.clone(),
        None => {
            temp = tempfile::tempdir().map_err(|e| TpchError::io(Path::new("a temp dir"), e))?;
            temp.path().to_path_buf()
        }
    };
    let hot = (args.rows as f64 * args.hot) as u64;
    let cold = args.rows - hot;
    let tables = root.join(format!("skew-{}-{}-{}", args.rows, hot, args.files));
    let t = tables.join("t");
    let d = tables.join("d");
    if !t.is_dir() || !d.is_dir() {
        write_keys_table(&t, args.files, args.rows, |row| {
            if row < hot { 0 } else { (row - hot + 1) as i64 }
        })?;
        write_keys_table(&d, 1, cold + 1, |row| 2 * row as i64)?;
    }
    // Every row of t; key 0's rows and the even keys among 1..=cold match.
    let expected = (args.rows as i64, (hot + cold / 2) as i64);
    let spec = SessionSpec::new([
        (
            "t".to_string(),
            TableDefinition::parquet(t.display().to_string()),
        ),
        (
            "d".to_string(),
            TableDefinition::parquet(d.display().to_string()),
        ),
    ])
    .with_target_partitions(args.partitions);
    let host = Host::new(plugin.clone())?;
    let mut figures: Vec<SkewFigures> = std::iter::once("one process")
        .chain(MODES.iter().map(|(mode, _)| *mode))
        .map(|mode| SkewFigures {
            mode: mode.to_string(),
            runs_ms: Vec::new(),
            median_ms: 0.0,
            tasks: 0,
            decisions: Vec::new(),
        })
        .collect();
    for run in 0..args.runs {
        let started = Instant::now();
        let local = host.run_local(SKEW_SQL, &spec).await?;
        figures[0].runs_ms.push(ms(started));
        check(&local, expected, "one process")?;
        for (index, (mode, options)) in MODES.iter().enumerate() {
            let shuffle = root.join(format!("shuffle-{index}-{run}"));
            let mut distributed = spec.clone().with_shuffle_dir(&shuffle);
            let per_task = args.partitions_per_task.to_string();
            // Kept as stages however wide a slice: the decisions measured
            // are made between stages, which a plan no wider than a task
            // would not have.
            let slices = [
                ("partitions_per_task", per_task.as_str()),
                ("collapse_stages", "off"),
            ];
            for (key, value) in options.iter().chain(&slices) {
                distributed
                    .engine_options
                    .insert(key.to_string(), value.to_string());
            }
            let started = Instant::now();
            let result = host.run_distributed(SKEW_SQL, &distributed).await?;
            let elapsed = ms(started);
            check(&result.batches, expected, mode)?;
            let _ = std::fs::remove_dir_all(&shuffle);
            let entry = &mut figures[index + 1];
            entry.runs_ms.push(elapsed);
            entry.tasks = result.tasks.len();
            entry.decisions = result
                .decisions
                .iter()
                .filter(|d| {
                    d.tasks != d.planned_tasks
                        || d.reason.starts_with("switched to broadcast")
                        || d.reason.contains("parts inside its task")
                })
                .map(|d| format!("stage {}: {}", d.stage_id, d.reason))
                .collect();
        }
    }
    host.shutdown().await;
    for entry in &mut figures {
        entry.median_ms = median(&entry.runs_ms).unwrap_or(f64::NAN);
    }
    Ok(figures)
}

/// The figures as a table: each mode's median, tasks, and ratio to
/// `skew_split=off`, then the decisions that split or switched.
pub fn table(figures: &[SkewFigures]) -> String {
    let off = figures
        .iter()
        .find(|f| f.mode == "skew_split=off")
        .map_or(f64::NAN, |f| f.median_ms);
    let mut out = String::from("mode                   median ms  tasks  / off\n");
    for f in figures {
        out.push_str(&format!(
            "{:<22} {:>9.1}  {:>5}  {:>5.2}\n",
            f.mode,
            f.median_ms,
            f.tasks,
            f.median_ms / off
        ));
    }
    for f in figures {
        for decision in &f.decisions {
            out.push_str(&format!("{}: {decision}\n", f.mode));
        }
    }
    out
}

fn check(batches: &[RecordBatch], expected: (i64, i64), mode: &str) -> Result<(), TpchError> {
    let answer = batches.iter().find(|b| b.num_rows() > 0).and_then(|batch| {
        let n = batch.column(0).as_any().downcast_ref::<Int64Array>()?;
        let matched = batch.column(1).as_any().downcast_ref::<Int64Array>()?;
        Some((n.value(0), matched.value(0)))
    });
    if answer != Some(expected) {
        return Err(TpchError::Invalid(format!(
            "{mode}: the answer is {answer:?}, expected (rows, matched) = {expected:?}"
        )));
    }
    Ok(())
}

/// A table of `k` (row `r`'s key is `key(r)`) and `v` = 1, its `rows`
/// rows in `files` Parquet files of adjacent rows.
/// Write a table of `k` (`key(row)`) and `v` (1) into `dir`: `rows` rows
/// over `files` Parquet files of as even a share as counts allow.
///
/// # Errors
///
/// A directory or file that cannot be written.
pub fn write_keys_table(
    dir: &Path,
    files: u64,
    rows: u64,
    key: impl Fn(u64) -> i64,
) -> Result<(), TpchError> {
    std::fs::create_dir_all(dir).map_err(|e| TpchError::io(dir, e))?;
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
    ]));
    let per_file = rows.div_ceil(files);
    for file in 0..files {
        let (first, end) = (file * per_file, ((file + 1) * per_file).min(rows));
        let path = dir.join(format!("part-{file:03}.parquet"));
        let out = std::fs::File::create(&path).map_err(|e| TpchError::io(&path, e))?;
        let mut writer = ArrowWriter::try_new(out, Arc::clone(&schema), None)
            .map_err(|e| TpchError::parquet(&path, e))?;
        let mut start = first;
        while start < end {
            let stop = (start + BATCH_ROWS as u64).min(end);
            let keys: Int64Array = (start..stop).map(&key).collect::<Vec<_>>().into();
            let ones = Int64Array::from(vec![1i64; (stop - start) as usize]);
            let batch =
                RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(keys), Arc::new(ones)])
                    .map_err(|e| TpchError::Invalid(format!("cannot build a batch: {e}")))?;
            writer
                .write(&batch)
                .map_err(|e| TpchError::parquet(&path, e))?;
            start = stop;
        }
        writer.close().map_err(|e| TpchError::parquet(&path, e))?;
    }
    Ok(())
}

fn ms(started: Instant) -> f64 {
    started.elapsed().as_secs_f64() * 1e3
}
