//! `dfx bench overhead`: what one task costs when it has no data to work on.
//!
//! A distributed query pays, for every task, a process start, a plugin load
//! and ABI handshake, a session build, a plan decode, the execution and the
//! report. With an empty table the execution is next to nothing, so what is
//! left is the fixed price of a task.
//!
//! ```text
//! driver (overhead)                       timed worker (`dfx bench task`)
//! -----------------                       --------------------------------
//! fresh shuffle dir, plan, encode
//! note the time, spawn ─────────────────► start: process start = now - spawn time
//!                                         load plugin + handshake
//!                                         build session (same factory)
//!                                         read + decode the stage, check it
//!                                         execute map 0, drain
//!            report + exit = exit - t ◄── note t, print the report line
//! ```
//!
//! The timed worker does what `dfx worker` does, with a clock around each
//! step; the benchmark also runs the real `dfx worker` on the same kind of
//! task, spawn to exit, so the two totals can be compared. The timings ride
//! in the report line as extra keys: the `{"stage_id", "partition", "rows"}`
//! contract of the last stdout line is kept.
//!
//! Then the same kind of task in both worker modes, side by side, as the
//! driver sees it (median and 90th percentile per task):
//!
//! - **process**: a real `dfx worker <envelope>` per task, spawn to exit;
//! - **pool, same query**: a warm `dfx worker --serve` given the task again
//!   (its session is built already), request to response;
//! - **pool, new query**: a warm worker given the first task of a new query
//!   (another shuffle directory: its session is built for it);
//! - **pool, new worker**: the first task of a freshly started worker
//!   (process start, plugin load, session build), paid once per slot.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::parquet::arrow::ArrowWriter;
use serde::Serialize;

use super::timed::{SPAWN_TIME_ENV, StepTimes, TimedReport, now_ns, run_child};
use crate::tpch::TpchError;
use crate::tpch::report::median;
use crate::{Plugin, SessionSpec, WorkerReport, build_session};
use dfx_runtime::protocol::{Envelope, TASK_DIR, envelope_path, plan_path};
use dfx_runtime::scheduler::WorkerPool;

/// The query each benchmark task runs a stage of: an aggregate over an
/// empty table, so the stage exists and has nothing to do.
pub const OVERHEAD_SQL: &str = "SELECT count(*) AS n FROM empty";

/// Arguments of `dfx bench overhead`.
#[derive(Debug, Clone, Args)]
pub struct OverheadArgs {
    /// Tasks to time (each in a fresh shuffle directory, one after another).
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub tasks: usize,
    /// The plugin file (default: $DFX_PLUGIN, else beside this executable).
    #[arg(long, value_name = "PATH")]
    pub plugin: Option<PathBuf>,
    /// Also write the figures as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// Medians over the timed tasks, in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OverheadReport {
    /// Tasks timed.
    pub tasks: usize,
    /// Step name and median milliseconds, in the order the steps happen.
    pub steps: Vec<(String, f64)>,
    /// Sum of the step medians.
    pub total_ms: f64,
    /// Median spawn-to-exit of the real `dfx worker` on the same kind of task.
    pub real_worker_ms: f64,
    /// Per task in each worker mode, as the driver sees it.
    pub modes: Vec<ModeCost>,
}

/// What one task costs the driver in one worker mode.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModeCost {
    /// Which mode and case.
    pub mode: String,
    /// Tasks timed.
    pub tasks: usize,
    /// Median milliseconds per task.
    pub median_ms: f64,
    /// 90th percentile (nearest rank) milliseconds per task.
    pub p90_ms: f64,
    /// Median of the worker's own time for the task (its report's
    /// `elapsed_ms`; in process mode it includes loading the plugin).
    pub worker_median_ms: f64,
    /// Median of the driver's time minus the worker's, task by task: the
    /// price of getting the task to a worker and its report back.
    pub dispatch_median_ms: f64,
}

impl ModeCost {
    /// `samples`: (driver's ms, worker's ms) per task.
    fn of(mode: &str, samples: &[(f64, f64)]) -> Self {
        let driver: Vec<f64> = samples.iter().map(|s| s.0).collect();
        let worker: Vec<f64> = samples.iter().map(|s| s.1).collect();
        Self {
            mode: mode.to_string(),
            tasks: samples.len(),
            median_ms: median(&driver).unwrap_or(f64::NAN),
            p90_ms: percentile(&driver, 0.9).unwrap_or(f64::NAN),
            worker_median_ms: median(&worker).unwrap_or(f64::NAN),
            dispatch_median_ms: median(&samples.iter().map(|s| s.0 - s.1).collect::<Vec<_>>())
                .unwrap_or(f64::NAN),
        }
    }
}

/// The `q` quantile of `values` by nearest rank; `None` when empty.
pub fn percentile(values: &[f64], q: f64) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = (q * v.len() as f64).ceil().max(1.0) as usize;
    Some(v[rank.min(v.len()) - 1])
}

impl OverheadReport {
    /// The breakdown as a Markdown table.
    pub fn table(&self) -> String {
        let mut out = format!(
            "overhead of one task with no data, median of {} task(s)\n\n| step | median ms |\n|---|--:|\n",
            self.tasks
        );
        for (name, ms) in &self.steps {
            out.push_str(&format!("| {name} | {ms:.2} |\n"));
        }
        out.push_str(&format!(
            "| **sum of steps** | **{:.2}** |\n| real `dfx worker`, spawn to exit | {:.2} |\n",
            self.total_ms, self.real_worker_ms
        ));
        out.push_str(
            "\nper task in each worker mode, as the driver sees it\n\n\
             | mode | tasks | median ms | p90 ms | worker's own median ms | driver minus worker, median ms |\n\
             |---|--:|--:|--:|--:|--:|\n",
        );
        for mode in &self.modes {
            out.push_str(&format!(
                "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} |\n",
                mode.mode,
                mode.tasks,
                mode.median_ms,
                mode.p90_ms,
                mode.worker_median_ms,
                mode.dispatch_median_ms
            ));
        }
        out.push_str(
            "\nA worker's own time includes executing the stage, which publishes its files \
             with fsync: on a busy disk that step, not the dispatch, varies most.\n",
        );
        out
    }
}

/// A one-task stage ready to run: its envelope, inside a fresh shuffle directory.
struct PreparedTask {
    stage_id: u64,
    envelope: PathBuf,
    _shuffle: tempfile::TempDir,
}

/// Plan [`OVERHEAD_SQL`] over `spec` in a fresh shuffle directory and write
/// the envelope of map 0 of its first stage that reads no other stage (so it
/// can run alone), as the driver would.
async fn prepare_task(plugin: &Plugin, spec: &SessionSpec) -> Result<PreparedTask, TpchError> {
    let shuffle = tempfile::Builder::new()
        .prefix("dfx-bench-")
        .tempdir()
        .map_err(|e| TpchError::io(&std::env::temp_dir(), e))?;
    let spec = spec.clone().with_shuffle_dir(shuffle.path());
    let session = build_session(plugin, &spec).await?;
    let plan = session.physical_plan(OVERHEAD_SQL).await?;
    let stage = crate::driver::stages::stages(plugin, &plan)?
        .into_iter()
        .find(|stage| stage.info.deps.is_empty())
        .ok_or_else(|| {
            TpchError::Invalid(format!(
                "the plan of {OVERHEAD_SQL:?} has no {} reading no other stage",
                plugin.stage_node_name()
            ))
        })?;
    let stage_id = stage.stage_id();
    let task_dir = shuffle.path().join(TASK_DIR);
    std::fs::create_dir_all(&task_dir).map_err(|e| TpchError::io(&task_dir, e))?;
    let plan_file = plan_path(&task_dir, stage_id);
    let bytes = session.encode(stage.plan.clone())?;
    std::fs::write(&plan_file, bytes).map_err(|e| TpchError::io(&plan_file, e))?;
    let envelope = Envelope {
        spec: SessionSpec {
            codec_ids: session.codec_ids(),
            ..spec
        },
        plan: plan_file,
        stage_id,
        partition: 0,
        attempt: 0,
        added_from: None,
    };
    let path = envelope_path(&task_dir, stage_id, 0);
    envelope.write(&path)?;
    Ok(PreparedTask {
        stage_id,
        envelope: path,
        _shuffle: shuffle,
    })
}

/// Write a Parquet file with one Int64 column and no rows: the empty table.
fn write_empty_table(dir: &Path) -> Result<PathBuf, TpchError> {
    let table = dir.join("empty");
    std::fs::create_dir_all(&table).map_err(|e| TpchError::io(&table, e))?;
    let path = table.join("part-1.parquet");
    let file = std::fs::File::create(&path).map_err(|e| TpchError::io(&path, e))?;
    let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, true)]));
    let writer =
        ArrowWriter::try_new(file, schema, None).map_err(|e| TpchError::parquet(&path, e))?;
    writer.close().map_err(|e| TpchError::parquet(&path, e))?;
    Ok(table)
}

/// Time `tasks` tasks with no data, using `program` (a `dfx` binary, or any
/// host answering `bench task` and `worker`) as the worker.
///
/// # Errors
/// A task that fails or reports unreadably, or files that cannot be written.
pub async fn overhead(
    plugin: &Plugin,
    program: &Path,
    tasks: usize,
) -> Result<OverheadReport, TpchError> {
    if tasks == 0 {
        return Err(TpchError::Invalid("--tasks must be at least 1".to_string()));
    }
    let data = tempfile::Builder::new()
        .prefix("dfx-bench-data-")
        .tempdir()
        .map_err(|e| TpchError::io(&std::env::temp_dir(), e))?;
    let table = write_empty_table(data.path())?;
    let mut spec = SessionSpec::new([("empty".to_string(), table)]).with_target_partitions(1);
    // A stage of one task, on a worker: what is measured. A plan this small
    // would otherwise be kept whole for the driver, with no task at all.
    spec.engine_options
        .insert("collapse_stages".to_string(), "task".to_string());

    let mut samples: Vec<StepTimes> = Vec::new();
    let mut real = Vec::new();
    for i in 0..tasks {
        // Timed worker.
        let task = prepare_task(plugin, &spec).await?;
        let mut command = tokio::process::Command::new(program);
        command
            .arg("bench")
            .arg("task")
            .arg("--plugin")
            .arg(plugin.path())
            .arg(&task.envelope);
        command.env(SPAWN_TIME_ENV, now_ns().to_string());
        let stdout = run_child(command, &format!("timed task {}", i + 1)).await?;
        let exited_ns = now_ns();
        let line = stdout
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or_default();
        // The contract part must parse as a plain worker report too.
        report_of(&stdout).map_err(|e| TpchError::Invalid(format!("timed task {}: {e}", i + 1)))?;
        let report: TimedReport = serde_json::from_str(line.trim()).map_err(|e| {
            TpchError::Invalid(format!(
                "timed task {}: unreadable timings {line:?}: {e}",
                i + 1
            ))
        })?;
        let mut steps = report.steps;
        steps.report_us = exited_ns.saturating_sub(report.report_at_ns) as f64 / 1e3;
        samples.push(steps);

        // The real worker, spawn to exit, on a fresh task of the same kind.
        let task = prepare_task(plugin, &spec).await?;
        let mut command = tokio::process::Command::new(program);
        command
            .arg("worker")
            .arg("--plugin")
            .arg(plugin.path())
            .arg(&task.envelope);
        let started = Instant::now();
        let stdout = run_child(command, &format!("dfx worker task {}", i + 1)).await?;
        let spawn_to_exit = started.elapsed().as_secs_f64() * 1e3;
        let report = report_of(&stdout)
            .map_err(|e| TpchError::Invalid(format!("dfx worker task {}: {e}", i + 1)))?;
        real.push((spawn_to_exit, report.elapsed_ms.unwrap_or(f64::NAN)));
    }

    let pool = pool_costs(plugin, program, &spec, tasks).await?;
    let modes = vec![
        ModeCost::of("process: `dfx worker` per task", &real),
        pool.same_query,
        pool.new_query,
        pool.new_worker,
    ];

    let step = |name: &str, f: fn(&StepTimes) -> f64| {
        let values: Vec<f64> = samples.iter().map(|s| f(s) / 1e3).collect();
        (name.to_string(), median(&values).unwrap_or(f64::NAN))
    };
    let steps = vec![
        step("process start", |s| s.process_start_us),
        step("plugin load + handshake", |s| s.plugin_load_us),
        step("session build", |s| s.session_build_us),
        step("decode", |s| s.decode_us),
        step("execute", |s| s.execute_us),
        step("report + exit", |s| s.report_us),
    ];
    let total_ms = steps.iter().map(|(_, ms)| ms).sum();
    Ok(OverheadReport {
        tasks,
        steps,
        total_ms,
        real_worker_ms: median(&real.iter().map(|r| r.0).collect::<Vec<_>>()).unwrap_or(f64::NAN),
        modes,
    })
}

/// The report a worker left as the last line of `stdout`.
fn report_of(stdout: &str) -> Result<WorkerReport, String> {
    match dfx_runtime::Response::parse_last(stdout)? {
        dfx_runtime::Response::Report(report) => Ok(report),
        dfx_runtime::Response::Error(error) => Err(error.error),
    }
}

/// The pool's costs per task, one [`ModeCost`] per case.
struct PoolCosts {
    same_query: ModeCost,
    new_query: ModeCost,
    new_worker: ModeCost,
}

/// Run `task` on `pool`; the driver's and the worker's milliseconds for it.
async fn pooled(
    pool: &WorkerPool,
    task: &PreparedTask,
    what: String,
) -> Result<(f64, f64), TpchError> {
    let task = dfx_runtime::scheduler::Task {
        stage_id: task.stage_id,
        map: 0,
        envelope: task.envelope.clone(),
        inline: None,
    };
    pool.run(&task, 1)
        .await
        .map(|report| (report.wall_ms, report.elapsed_ms.unwrap_or(f64::NAN)))
        .map_err(|failure| TpchError::Invalid(format!("{what}: {failure}")))
}

/// Time `tasks` tasks of each pool case with `program worker --serve`.
async fn pool_costs(
    plugin: &Plugin,
    program: &Path,
    spec: &SessionSpec,
    tasks: usize,
) -> Result<PoolCosts, TpchError> {
    let command = dfx_runtime::scheduler::WorkerCommand::dfx(program)
        .env(crate::loader::PLUGIN_ENV, plugin.path());
    let mut new_worker = Vec::new();
    let mut new_query = Vec::new();
    let mut same_query = Vec::new();
    for i in 0..tasks {
        // A fresh pool each time: its first task starts the worker.
        let pool = WorkerPool::new(command.clone());
        let task = prepare_task(plugin, spec).await?;
        new_worker.push(pooled(&pool, &task, format!("new pooled worker {}", i + 1)).await?);
    }
    let pool = WorkerPool::new(command);
    let task = prepare_task(plugin, spec).await?;
    // Warm up: start the worker and build the query's session.
    pooled(&pool, &task, "pooled warm-up".into()).await?;
    for i in 0..tasks {
        // The same map again: the writer publishes over its earlier output
        // (temp file, then rename), as a retry would.
        same_query.push(pooled(&pool, &task, format!("pooled task {}", i + 1)).await?);
    }
    for i in 0..tasks {
        let task = prepare_task(plugin, spec).await?;
        new_query.push(pooled(&pool, &task, format!("pooled new query {}", i + 1)).await?);
    }
    Ok(PoolCosts {
        same_query: ModeCost::of("pool: warm worker, same query", &same_query),
        new_query: ModeCost::of("pool: warm worker, first task of a new query", &new_query),
        new_worker: ModeCost::of("pool: first task of a new worker", &new_worker),
    })
}
