//! `dfx bench many-files`: what a table of many files costs the driver and
//! each task, with every task's plan cut to its own files and, for
//! comparison, with the whole stage shipped to every task as before.
//!
//! ```text
//! for each file count N (one-row Parquet files, one map each):
//!   driver:  session (lists the table) ─► plan ─► encode the stages ─► cut them ─► write
//!   a task:  read its plan ─► checks and vet ─► decode      (median over sampled maps,
//!            each in a `dfx bench task` worker process of its own)
//!              cut:   the shared part and its map's files from the stage file
//!              whole: the whole encoded stage, every file in it
//!   --run:   the query end to end on `dfx worker --serve`s, against one process
//! ```
//!
//! The query is `SELECT count(*), sum(k) FROM t`: one scan stage of N
//! maps, read by the driver's root; its answer is known (N rows, keys
//! 0 .. N-1).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use datafusion::arrow::array::{Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::parquet::arrow::ArrowWriter;
use dfx_runtime::protocol::{Envelope, TASK_DIR, TaskInput, plan_path, stage_file};
use dfx_runtime::scheduler::EncodedStage;
use serde::Serialize;

use super::output::BenchOutput;
use super::timed::{SPAWN_TIME_ENV, TimedReport, now_ns, run_child};
use crate::error::HostError;
use crate::session::TableDefinition;
use crate::tpch::TpchError;
use crate::tpch::report::median;
use crate::{Host, Plugin, SessionSpec, build_session};

/// The benchmark's query.
pub const MANY_FILES_SQL: &str = "SELECT count(*) AS n, sum(k) AS total FROM t";

/// Arguments of `dfx bench many-files`.
#[derive(Debug, Clone, Args)]
pub struct ManyFilesArgs {
    /// File counts to measure, each a table of that many one-row files.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1000,10000",
        value_name = "N,.."
    )]
    pub files: Vec<u64>,
    /// Maps whose plans are timed per file count (spread over the stage).
    #[arg(long, default_value_t = 25, value_name = "N")]
    pub sample: usize,
    /// Runs of the driver's steps per file count (medians are reported).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub repeat: usize,
    /// Also run the query end to end on serving workers and check it
    /// against one process.
    #[arg(long)]
    pub run: bool,
    /// Where its files go, the plugin, and the JSON figures.
    #[command(flatten)]
    pub output: BenchOutput,
}

/// The figures of one file count.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ManyFilesFigures {
    /// Files in the table (maps of its scan stage).
    pub files: u64,
    /// Driver: the session, which lists and registers the table (median
    /// of the runs, as every driver figure).
    pub session_ms: f64,
    /// Driver: planning the query (the plugin's planner cuts it into stages).
    pub plan_ms: f64,
    /// Driver: encoding every stage once.
    pub encode_ms: f64,
    /// Driver: cutting every encoded stage for its maps.
    pub cut_ms: f64,
    /// Driver: writing the stage files.
    pub write_ms: f64,
    /// Bytes of the whole encoded scan stage.
    pub stage_bytes: usize,
    /// Bytes of the stage file (shared part, offsets, every map's files).
    pub stage_file_bytes: usize,
    /// Bytes of one task's plan, cut (median over the sample).
    pub task_bytes: f64,
    /// Per task, cut: read its plan, check and vet it, decode it, in a
    /// worker process (`dfx bench task`; median ms).
    pub task_cut_ms: f64,
    /// Per task, whole stage: the same steps on the whole stage (median ms).
    pub task_whole_ms: f64,
    /// `--run`: the query end to end on serving workers, ms.
    pub run_ms: Option<f64>,
    /// `--run`: tasks the scheduler ran.
    pub run_tasks: Option<usize>,
}

impl ManyFilesFigures {
    /// Driver total: session, plan, encode, cut, write.
    pub fn driver_ms(&self) -> f64 {
        self.session_ms + self.plan_ms + self.encode_ms + self.cut_ms + self.write_ms
    }
}

/// The figures as a Markdown table, one row per file count.
pub fn table(figures: &[ManyFilesFigures]) -> String {
    let mut out = String::from(
        "| files | driver: session / plan / encode / cut / write ms | stage bytes | task plan \
         bytes | per task, cut ms | per task, whole stage ms | end to end |\n\
         |--:|--|--:|--:|--:|--:|--|\n",
    );
    for f in figures {
        let run = match (f.run_ms, f.run_tasks) {
            (Some(ms), Some(tasks)) => format!("{:.1} s, {tasks} tasks", ms / 1e3),
            _ => "-".to_string(),
        };
        out.push_str(&format!(
            "| {} | {:.0} / {:.0} / {:.0} / {:.0} / {:.0} (total {:.0}) | {} | {:.0} | {:.2} | {:.2} | {run} |\n",
            f.files,
            f.session_ms,
            f.plan_ms,
            f.encode_ms,
            f.cut_ms,
            f.write_ms,
            f.driver_ms(),
            f.stage_bytes,
            f.task_bytes,
            f.task_cut_ms,
            f.task_whole_ms,
        ));
    }
    out
}

/// Run the benchmark for every file count of `args`.
///
/// # Errors
///
/// A table that cannot be written, a query that fails, or a distributed
/// answer that differs from the one-process answer.
pub async fn many_files(
    plugin: &Plugin,
    args: &ManyFilesArgs,
) -> Result<Vec<ManyFilesFigures>, TpchError> {
    let scratch = match &args.output.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| TpchError::io(dir, e))?;
            tempfile::Builder::new()
                .prefix("dfx-many-files-")
                .tempdir_in(dir)
        }
        None => tempfile::Builder::new().prefix("dfx-many-files-").tempdir(),
    }
    .map_err(|e| TpchError::io(&std::env::temp_dir(), e))?;
    let mut out = Vec::new();
    for &files in &args.files {
        let root = scratch.path().join(format!("files-{files}"));
        let table = write_table(&root, files)?;
        let figures = measure(plugin, &root, &table, files, args).await?;
        eprintln!(
            "{files} files: driver {:.0} ms; a task's decode in its worker {:.2} ms cut, \
             {:.2} ms whole",
            figures.driver_ms(),
            figures.task_cut_ms,
            figures.task_whole_ms
        );
        out.push(figures);
        // The next count's files are written fresh; these are not needed.
        let _ = std::fs::remove_dir_all(&root);
    }
    Ok(out)
}

/// The table `t`: `files` Parquet files of one row each, `k` = the file's
/// number. Returns its directory.
fn write_table(root: &Path, files: u64) -> Result<PathBuf, TpchError> {
    let table = root.join("t");
    std::fs::create_dir_all(&table).map_err(|e| TpchError::io(&table, e))?;
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
    ]));
    for file in 0..files {
        let k = file as i64;
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from(vec![k])),
                Arc::new(Int64Array::from(vec![k % 7])),
            ],
        )
        .map_err(|e| TpchError::Invalid(format!("cannot build a row: {e}")))?;
        let path = table.join(format!("part-{file:05}.parquet"));
        let out = std::fs::File::create(&path).map_err(|e| TpchError::io(&path, e))?;
        let mut writer = ArrowWriter::try_new(out, Arc::clone(&schema), None)
            .map_err(|e| TpchError::parquet(&path, e))?;
        writer
            .write(&batch)
            .map_err(|e| TpchError::parquet(&path, e))?;
        writer.close().map_err(|e| TpchError::parquet(&path, e))?;
    }
    Ok(table)
}

fn ms(started: Instant) -> f64 {
    started.elapsed().as_secs_f64() * 1e3
}

async fn measure(
    plugin: &Plugin,
    root: &Path,
    table: &Path,
    files: u64,
    args: &ManyFilesArgs,
) -> Result<ManyFilesFigures, TpchError> {
    let tables = [(
        "t".to_string(),
        TableDefinition::parquet(table.display().to_string()),
    )];
    let spec = SessionSpec::new(tables).with_shuffle_dir(root.join("shuffle"));

    let task_dir = root.join("shuffle").join(TASK_DIR);
    std::fs::create_dir_all(&task_dir).map_err(|e| TpchError::io(&task_dir, e))?;
    // The driver's steps `repeat` times, each from a new session; the
    // medians are reported, the last run's stages are used.
    let mut times: [Vec<f64>; 5] = Default::default();
    let mut last = None;
    for _ in 0..args.repeat.max(1) {
        let t = Instant::now();
        let session = build_session(plugin, &spec).await?;
        times[0].push(ms(t));
        let t = Instant::now();
        let plan = session.physical_plan(MANY_FILES_SQL).await?;
        let stages = crate::driver::stages::stages(plugin, &plan)?;
        times[1].push(ms(t));
        let t = Instant::now();
        let encoded = stages
            .iter()
            .map(|stage| {
                Ok(EncodedStage {
                    info: stage.info.clone(),
                    bytes: session.encode(Arc::clone(&stage.plan))?,
                })
            })
            .collect::<Result<Vec<_>, TpchError>>()?;
        times[2].push(ms(t));
        let t = Instant::now();
        let cut = stage_file::cut_stages(plugin, encoded.clone())?;
        times[3].push(ms(t));
        let t = Instant::now();
        for stage in &cut {
            let path = plan_path(&task_dir, stage.info.stage_id);
            std::fs::write(&path, &stage.bytes).map_err(|e| TpchError::io(&path, e))?;
        }
        times[4].push(ms(t));
        last = Some((session, encoded, cut));
    }
    let [session_ms, plan_ms, encode_ms, cut_ms, write_ms] =
        times.map(|t| median(&t).unwrap_or(f64::NAN));
    let Some((session, encoded, cut)) = last else {
        return Err(TpchError::Invalid("no driver run".to_string()));
    };

    // The scan stage: the one with a map per file.
    let index = encoded
        .iter()
        .position(|s| s.info.maps as u64 == files)
        .ok_or_else(|| {
            TpchError::Invalid(format!(
                "no stage of {files} maps in the plan of {MANY_FILES_SQL:?}"
            ))
        })?;
    let info = &encoded[index].info;
    let stage_bytes = encoded[index].bytes.len();
    let stage_file_bytes = cut[index].bytes.len();
    let cut_file = plan_path(&task_dir, info.stage_id);
    let whole_file = task_dir.join(format!("stage-{}.whole.plan", info.stage_id));
    std::fs::write(&whole_file, &encoded[index].bytes)
        .map_err(|e| TpchError::io(&whole_file, e))?;

    let shipped = SessionSpec {
        codec_ids: session.codec_ids(),
        target_partitions: session.ctx().copied_config().target_partitions(),
        ..spec.clone()
    };
    let samples = args.sample.clamp(1, info.maps.max(1));
    let maps: Vec<usize> = (0..samples).map(|i| i * info.maps / samples).collect();
    let exe = std::env::current_exe()
        .map_err(|e| HostError::io("cannot find", "the running executable", e))?;
    let shuffle = root.join("shuffle");
    let mut cut_times = Vec::new();
    let mut task_bytes = Vec::new();
    for &map in &maps {
        let envelope = Envelope {
            spec: shipped.clone(),
            plan: cut_file.clone(),
            stage_id: info.stage_id,
            partition: map,
            attempt: 0,
            added_from: None,
        };
        task_bytes.push(TaskInput::read(plugin, envelope.clone())?.plan.len() as f64);
        cut_times.push(timed_decode(&exe, plugin, &task_dir, envelope).await?);
    }
    // The same maps from the whole stage, as every task read it before the
    // cut, into a clean location (a map publishes once).
    clear_output(&shuffle)?;
    let mut whole_times = Vec::new();
    for &map in &maps {
        let envelope = Envelope {
            spec: shipped.clone(),
            plan: whole_file.clone(),
            stage_id: info.stage_id,
            partition: map,
            attempt: 0,
            added_from: None,
        };
        whole_times.push(timed_decode(&exe, plugin, &task_dir, envelope).await?);
    }

    let (run_ms, run_tasks) = if args.run {
        let (ms, tasks) = run_end_to_end(plugin, root, &tables_spec(table), files).await?;
        (Some(ms), Some(tasks))
    } else {
        (None, None)
    };
    Ok(ManyFilesFigures {
        files,
        session_ms,
        plan_ms,
        encode_ms,
        cut_ms,
        write_ms,
        stage_bytes,
        stage_file_bytes,
        task_bytes: median(&task_bytes).unwrap_or(f64::NAN),
        task_cut_ms: median(&cut_times).unwrap_or(f64::NAN),
        task_whole_ms: median(&whole_times).unwrap_or(f64::NAN),
        run_ms,
        run_tasks,
    })
}

/// The decode step of the task `envelope` in a worker process of its own
/// (`dfx bench task`: read the plan, check and vet it, decode it), in ms.
/// Timed there, not here: the driver's heap holds the whole plan.
async fn timed_decode(
    exe: &Path,
    plugin: &Plugin,
    task_dir: &Path,
    envelope: Envelope,
) -> Result<f64, TpchError> {
    let what = format!("stage {} map {}", envelope.stage_id, envelope.partition);
    let path = task_dir.join(format!(
        "timed-{}-{}.json",
        envelope.stage_id, envelope.partition
    ));
    envelope.write(&path)?;
    let mut command = tokio::process::Command::new(exe);
    command
        .arg("bench")
        .arg("task")
        .arg("--plugin")
        .arg(plugin.path())
        .arg(&path);
    command.env(SPAWN_TIME_ENV, now_ns().to_string());
    let stdout = run_child(command, &what).await?;
    let line = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default();
    let report: TimedReport = serde_json::from_str(line.trim())
        .map_err(|e| TpchError::Invalid(format!("{what}: unreadable timings {line:?}: {e}")))?;
    Ok(report.steps.decode_us / 1e3)
}

/// Remove the stage output under `shuffle` (not its task files).
fn clear_output(shuffle: &Path) -> Result<(), TpchError> {
    let entries = std::fs::read_dir(shuffle).map_err(|e| TpchError::io(shuffle, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| TpchError::io(shuffle, e))?;
        if entry.file_name().to_string_lossy().starts_with("stage-") {
            let path = entry.path();
            std::fs::remove_dir_all(&path).map_err(|e| TpchError::io(&path, e))?;
        }
    }
    Ok(())
}

fn tables_spec(table: &Path) -> SessionSpec {
    SessionSpec::new([(
        "t".to_string(),
        TableDefinition::parquet(table.display().to_string()),
    )])
}

/// The query on `dfx worker --serve`s (this executable), timed, and its
/// answer checked against one process and against the table's known sum.
async fn run_end_to_end(
    plugin: &Plugin,
    root: &Path,
    spec: &SessionSpec,
    files: u64,
) -> Result<(f64, usize), TpchError> {
    let host = Host::new(plugin.clone())?;
    let local = host.run_local(MANY_FILES_SQL, spec).await?;
    let spec = spec.clone().with_shuffle_dir(root.join("run"));
    let t = Instant::now();
    let result = host.run_distributed(MANY_FILES_SQL, &spec).await?;
    let elapsed = ms(t);
    host.shutdown().await;
    let answer = |batches: &[RecordBatch]| -> Option<(i64, i64)> {
        let batch = batches.iter().find(|b| b.num_rows() > 0)?;
        let n = batch
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()?
            .value(0);
        let total = batch
            .column(1)
            .as_any()
            .downcast_ref::<Int64Array>()?
            .value(0);
        Some((n, total))
    };
    let files = files as i64;
    let expected = Some((files, files * (files - 1) / 2));
    if answer(&result.batches) != expected || answer(&local) != expected {
        return Err(TpchError::Invalid(format!(
            "{files} files: distributed {:?}, one process {:?}, expected {expected:?}",
            answer(&result.batches),
            answer(&local)
        )));
    }
    Ok((elapsed, result.tasks.len()))
}
