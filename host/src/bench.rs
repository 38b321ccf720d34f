//! `dfx bench overhead`: what one task costs when it has no data to work on.
//! (`dfx bench many-files`, what a table of many files costs the driver and
//! each task, is [`many_files`]; `dfx bench skew`, a skewed join with skew
//! splitting off and on and switched to a broadcast join, is [`skew`].)
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

pub mod many_files;
pub mod skew;

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::parquet::arrow::ArrowWriter;
use serde::{Deserialize, Serialize};

use crate::error::HostError;
use crate::tpch::TpchError;
use crate::tpch::report::median;
use crate::{Plugin, SessionSpec, WorkerReport, build_session, build_worker_session, load_plugin};
use dfx_runtime::protocol::{Envelope, TASK_DIR, envelope_path, plan_path};
use dfx_runtime::scheduler::WorkerPool;

/// Environment variable carrying the driver's spawn time (ns since the Unix
/// epoch) to the timed worker.
pub const SPAWN_TIME_ENV: &str = "DFX_BENCH_SPAWN_NS";

/// The query each benchmark task runs a stage of: an aggregate over an
/// empty table, so the stage exists and has nothing to do.
pub const OVERHEAD_SQL: &str = "SELECT count(*) AS n FROM empty";

/// Arguments of `dfx bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Which benchmark.
    #[command(subcommand)]
    pub command: BenchCommand,
}

/// The benchmarks.
#[derive(Debug, Clone, Subcommand)]
pub enum BenchCommand {
    /// What one task costs with no data: process start, plugin load and
    /// handshake, session build, decode, execute, report (medians over N tasks).
    Overhead(OverheadArgs),
    /// Run one task with a clock around each step (started by `overhead`).
    #[command(hide = true)]
    Task(TaskArgs),
    /// What a table of many files costs: the driver's planning, encoding
    /// and cut, and each task's read, checks and decode, cut to its own
    /// files and with the whole stage (medians; `--run`: end to end).
    ManyFiles(many_files::ManyFilesArgs),
    /// A join whose probe side holds most rows under one key, distributed
    /// with skew splitting off, `auto`, and the join switched to a
    /// broadcast one in turn, and in one process (medians, ratios to
    /// splitting off).
    Skew(skew::SkewArgs),
}

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

/// Arguments of the hidden `dfx bench task`.
#[derive(Debug, Clone, Args)]
pub struct TaskArgs {
    /// The plugin file.
    #[arg(long, value_name = "PATH")]
    pub plugin: Option<PathBuf>,
    /// The task envelope.
    pub envelope: PathBuf,
}

/// Step timings of one task, in microseconds, as the timed worker reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StepTimes {
    /// Spawn by the driver to the first instruction of the subcommand.
    pub process_start_us: f64,
    /// `load_plugin`: open the file, abi_stable checks, dfx ABI and major checks.
    pub plugin_load_us: f64,
    /// Read the envelope and `build_worker_session` (planner, codecs, config, functions).
    pub session_build_us: f64,
    /// Read the plan file and decode it with the session's codecs.
    pub decode_us: f64,
    /// Execute the map and drain it (the writer publishes its buckets).
    pub execute_us: f64,
    /// Print the report until the driver sees the process exit.
    pub report_us: f64,
}

/// The timed worker's last stdout line: the worker report plus timings.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct TimedReport {
    stage_id: u64,
    partition: usize,
    rows: usize,
    steps: StepTimes,
    /// When the report was about to be printed (ns since the epoch).
    report_at_ns: u128,
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

/// Run `dfx bench ...` as the CLI does.
///
/// # Errors
/// Whatever the benchmark or the timed task reports.
pub async fn run_cli(args: BenchArgs) -> Result<ExitCode, TpchError> {
    match args.command {
        BenchCommand::Overhead(args) => {
            let plugin = load_plugin(args.plugin.as_deref())?;
            let exe = std::env::current_exe()
                .map_err(|e| HostError::io("cannot find", "the running executable", e))?;
            let report = overhead(&plugin, &exe, args.tasks).await?;
            print!("{}", report.table());
            write_json(args.json.as_deref(), &report)?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Task(args) => {
            timed_task(args.plugin.as_deref(), &args.envelope).await?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::ManyFiles(args) => {
            let plugin = load_plugin(args.output.plugin.as_deref())?;
            let figures = many_files::many_files(&plugin, &args).await?;
            print!("{}", many_files::table(&figures));
            write_json(args.output.json.as_deref(), &figures)?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Skew(args) => {
            let plugin = load_plugin(args.output.plugin.as_deref())?;
            let figures = skew::skew(&plugin, &args).await?;
            print!("{}", skew::table(&figures));
            write_json(args.output.json.as_deref(), &figures)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The options every benchmark with files of its own takes.
#[derive(Debug, Clone, Args)]
pub struct BenchOutput {
    /// Where the tables and shuffle locations go (default: a temp directory).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// The plugin file (default: $DFX_PLUGIN, else beside this executable).
    #[arg(long, value_name = "PATH")]
    pub plugin: Option<PathBuf>,
    /// Also write the figures as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// Write `figures` as pretty JSON to `path`, when one was asked for.
fn write_json(path: Option<&Path>, figures: &impl Serialize) -> Result<(), TpchError> {
    let Some(path) = path else {
        return Ok(());
    };
    let text = serde_json::to_string_pretty(figures)
        .map_err(|e| TpchError::Invalid(format!("cannot serialise the figures: {e}")))?;
    std::fs::write(path, text + "\n").map_err(|e| TpchError::io(path, e))
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

fn micros(started: Instant) -> f64 {
    started.elapsed().as_secs_f64() * 1e6
}

/// The timed worker: run the task in `envelope` like `dfx worker`, timing
/// each step, and print the report line with the timings.
///
/// # Errors
/// Any step failing, named.
pub async fn timed_task(plugin_path: Option<&Path>, envelope: &Path) -> Result<(), TpchError> {
    let entered_ns = now_ns();
    let spawned_ns: Option<u128> = std::env::var(SPAWN_TIME_ENV)
        .ok()
        .and_then(|v| v.parse().ok());
    let mut steps = StepTimes {
        process_start_us: spawned_ns
            .map(|s| entered_ns.saturating_sub(s) as f64 / 1e3)
            .unwrap_or(f64::NAN),
        ..StepTimes::default()
    };

    let t = Instant::now();
    let plugin = load_plugin(plugin_path)?;
    steps.plugin_load_us = micros(t);

    let t = Instant::now();
    let envelope = Envelope::read(envelope)?;
    let session = build_worker_session(&plugin, &envelope.spec).await?;
    steps.session_build_us = micros(t);

    let t = Instant::now();
    let task = dfx_runtime::TaskInput::read(&plugin, envelope.clone())?;
    let stage = crate::worker::decode_checked(&session, &task)?;
    steps.decode_us = micros(t);

    let t = Instant::now();
    let rows = crate::worker::run_map(&session, &stage, &envelope)
        .await?
        .rows;
    steps.execute_us = micros(t);

    let report = TimedReport {
        stage_id: envelope.stage_id,
        partition: envelope.partition,
        rows,
        steps,
        report_at_ns: now_ns(),
    };
    let line = serde_json::to_string(&report)
        .map_err(|e| TpchError::Invalid(format!("cannot serialise the report: {e}")))?;
    println!("{line}");
    Ok(())
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

/// Run a child to its end; its stdout, or why it failed (with its stderr).
async fn run_child(mut command: tokio::process::Command, what: &str) -> Result<String, TpchError> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Never leave a worker behind if the benchmark is interrupted.
        .kill_on_drop(true);
    let output = command
        .output()
        .await
        .map_err(|e| TpchError::Invalid(format!("{what}: cannot start: {e}")))?;
    if !output.status.success() {
        return Err(TpchError::Invalid(format!(
            "{what}: {}; its stderr:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim_end()
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
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
    let spec = SessionSpec::new([("empty".to_string(), table)]).with_target_partitions(1);

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
