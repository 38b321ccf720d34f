//! `dfx`: run SQL over Parquet directories, distributed over worker
//! processes by the dfx plugin. A thin CLI over [`dfx_host`].

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Parser, Subcommand, ValueEnum};
use datafusion::arrow::record_batch::RecordBatch;
use dfx_host::session::{ShuffleCompression, Split, TableDefinition, TableFormat};
use dfx_host::{
    Host, HostError, Response, Result, SessionSpec, WorkerCommand, WorkerMode, load_plugin,
};
use dfx_runtime::spec::Script;

/// Distributed SQL over tables of files (Parquet, CSV, JSON, Arrow; local or on S3) with the dfx plugin.
#[derive(Debug, Parser)]
#[command(name = "dfx", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// One variant per subcommand; add new ones here and in `main`'s match.
#[derive(Debug, Subcommand)]
enum Command {
    /// Run a query: each map of each stage in its own worker, stage after stage, then the plan's root here.
    Run(RunArgs),
    /// Show the physical plan with each stage marked with its id, maps, buckets and deps.
    Explain(ExplainArgs),
    /// Run one task from an envelope file, or serve tasks from stdin with
    /// --serve (what the driver starts; not for humans).
    Worker(WorkerArgs),
    /// TPC-H distributed and single-process: answers checked, timings compared.
    #[cfg(feature = "cli-extras")]
    Tpch(dfx_host::tpch::TpchArgs),
    /// Benchmarks (`dfx bench overhead`: what one task costs with no data).
    #[cfg(feature = "cli-extras")]
    Bench(dfx_host::bench::BenchArgs),
}

/// Options shared by `run` and `explain`.
#[derive(Debug, Args)]
struct QueryArgs {
    /// The plugin file (default: $DFX_PLUGIN, else beside this executable).
    #[arg(long, value_name = "PATH")]
    plugin: Option<PathBuf>,
    /// A table: NAME=LOCATION, a directory or one file, as a local path,
    /// file://... or s3://BUCKET/PREFIX (one partition per file).
    /// Repeatable. Its format is --table-format, else the location's
    /// extension, else Parquet. A script's CREATE EXTERNAL TABLE says more
    /// (options, partition columns).
    #[arg(long = "table", value_name = "NAME=LOCATION", value_parser = parse_table)]
    tables: Vec<(String, String)>,
    /// The format of every --table: parquet, csv, json (newline-delimited)
    /// or arrow. Default: from each location's extension, else Parquet.
    #[arg(long, value_enum, value_name = "FORMAT")]
    table_format: Option<TableFormat>,
    /// Partitions the session plans for.
    #[arg(
        long,
        value_name = "N",
        default_value_t = dfx_host::session::DEFAULT_TARGET_PARTITIONS,
        value_parser = parse_at_least_one
    )]
    partitions: usize,
    /// Shuffle location for stage output (must not hold stage output yet):
    /// a directory, file://DIR or s3://BUCKET/PREFIX (endpoint, region and
    /// credentials from the AWS_* environment variables).
    /// Default: a fresh temporary directory, removed after success.
    #[arg(long, value_name = "DIR|URL")]
    shuffle_dir: Option<PathBuf>,
    /// Run in this process with no shuffle directory: no stages, no workers.
    #[arg(long)]
    local: bool,
    /// Where the plan is cut into stages: at every exchange, or the
    /// aggregate split (one stage per topmost partial aggregate).
    #[arg(long, value_enum, default_value_t = Split::Exchange)]
    split: Split,
    /// How workers compress their map files: `auto` is none for a local
    /// directory and LZ4 for S3; `lz4` and `none` force one.
    #[arg(long, value_enum, default_value_t = ShuffleCompression::Auto)]
    shuffle_compression: ShuffleCompression,
    /// Set the plugin's dfx_engine.KEY in every session of the query, the
    /// driver's and each worker's (join_filters=off, join_filter_ratio=0.2,
    /// memory_table_limit=...); a KEY starting with `datafusion.` sets that
    /// DataFusion setting instead. Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = dfx_host::session::parse_engine_option)]
    settings: Vec<(String, String)>,
    /// Read the SQL from FILE (`-` for stdin) instead of the argument: a
    /// query, or a script of CREATE EXTERNAL TABLE statements, then
    /// queries, separated by `;` (each query runs and prints in turn).
    #[arg(
        short = 'f',
        long = "file",
        value_name = "FILE",
        conflicts_with = "sql"
    )]
    file: Option<PathBuf>,
    /// The SQL query. It may start with a `-- comment` (as the TPC-H query
    /// files do): a value that begins with dashes is still the query.
    /// Without it and without -f, the query is read from stdin.
    #[arg(allow_hyphen_values = true)]
    sql: Option<String>,
}

impl QueryArgs {
    /// The query: the argument, the file of -f, or stdin when neither is
    /// given (as datafusion-cli reads it).
    fn sql(&self) -> Result<String> {
        let sql = match (&self.sql, &self.file) {
            (Some(sql), _) => sql.clone(),
            (None, Some(file)) if file.as_os_str() != "-" => std::fs::read_to_string(file)
                .map_err(|e| HostError::io("cannot read the SQL file", file, e))?,
            (None, _) => {
                use std::io::{IsTerminal as _, Read as _};
                let mut stdin = std::io::stdin();
                if stdin.is_terminal() {
                    eprintln!("dfx: reading the query from stdin (end it with Ctrl-D)");
                }
                let mut sql = String::new();
                stdin
                    .read_to_string(&mut sql)
                    .map_err(|e| HostError::io("cannot read the SQL from", "stdin", e))?;
                sql
            }
        };
        if sql.trim().is_empty() {
            let from = match (&self.sql, &self.file) {
                (Some(_), _) => "the SQL argument".to_string(),
                (None, Some(file)) if file.as_os_str() != "-" => file.display().to_string(),
                (None, _) => "stdin".to_string(),
            };
            return Err(HostError::Invalid(format!(
                "no query: {from} is empty (give the SQL as an argument, with -f FILE, or on stdin)"
            )));
        }
        Ok(sql)
    }
}

#[derive(Debug, Args)]
struct RunArgs {
    #[command(flatten)]
    query: QueryArgs,
    /// How to print the result on stdout.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// At most this many workers at once (default: the cores this process may use).
    #[arg(long, value_name = "N", value_parser = parse_at_least_one)]
    max_workers: Option<usize>,
    /// How tasks run: on long-lived serving workers reused from task to task
    /// (`pool`), or in a new worker process each (`process`).
    #[arg(long, value_enum, default_value_t = WorkerMode::Pool)]
    worker_mode: WorkerMode,
    /// Attempts per task, the first included: a task whose worker died, was
    /// killed, timed out or left no readable report runs again (1: never).
    #[arg(
        long,
        value_name = "N",
        default_value_t = dfx_runtime::scheduler::DEFAULT_MAX_ATTEMPTS as usize,
        value_parser = parse_at_least_one
    )]
    max_attempts: usize,
    /// Stop a task attempt running longer than SECS (its worker killed); it
    /// counts as failed and is retried. Default: no limit.
    #[arg(long, value_name = "SECS", value_parser = parse_at_least_one)]
    task_timeout: Option<usize>,
    /// Give a task running FACTOR times its stage's median (and at least a
    /// second) a second attempt on an idle worker slot; the first attempt to
    /// publish wins and the other is stopped. Default: no speculation.
    #[arg(long, value_name = "FACTOR", value_parser = parse_speculation)]
    speculate: Option<dfx_runtime::scheduler::Speculation>,
    /// The most memory each map task's operators may hold (512M, 2G): a
    /// DataFusion memory pool in every worker; sorts and aggregations spill
    /// to disk past it, operators that cannot spill fail. Default: no limit.
    #[arg(long, value_name = "SIZE", value_parser = dfx_host::worker::memory::parse_size)]
    memory_limit: Option<u64>,
    /// After the answer, per stage: tasks, workers, rows, bytes and task
    /// time min / median / max; then the critical path (the chain of stages
    /// whose slowest tasks sum largest) and the final read's time.
    #[arg(long)]
    analyze: bool,
    /// Also write each stage (maps, buckets, deps) with every task's rows,
    /// bytes and times, the waves, the final read and the wall time as JSON
    /// to FILE (a script's last query), for tools that model a run.
    #[arg(long, value_name = "FILE")]
    analyze_json: Option<PathBuf>,
    /// Start workers with PROGRAM instead of `<this executable> worker`; its
    /// last argument is `--serve` in pool mode, the envelope path in process
    /// mode (e.g. another host's worker).
    #[arg(long, value_name = "PROGRAM")]
    worker: Option<PathBuf>,
    /// An argument for --worker's PROGRAM, before `--serve` or the envelope
    /// path. Repeatable.
    #[arg(
        long = "worker-arg",
        value_name = "ARG",
        allow_hyphen_values = true,
        requires = "worker"
    )]
    worker_args: Vec<String>,
}

#[derive(Debug, Args)]
struct ExplainArgs {
    #[command(flatten)]
    query: QueryArgs,
}

#[derive(Debug, Args)]
struct WorkerArgs {
    /// The plugin file (default: $DFX_PLUGIN, else beside this executable).
    #[arg(long, value_name = "PATH")]
    plugin: Option<PathBuf>,
    /// Serve tasks: read `{"envelope": "<path>"}` lines from stdin, answer
    /// each with one JSON line on stdout, exit at end of input.
    #[arg(long, conflicts_with = "envelope")]
    serve: bool,
    /// The task envelope (JSON) written by the driver.
    #[arg(required_unless_present = "serve")]
    envelope: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    /// An aligned text table.
    Table,
    /// CSV with a header row.
    Csv,
    /// A JSON array of objects.
    Json,
}

fn parse_table(value: &str) -> std::result::Result<(String, String), String> {
    match value.split_once('=') {
        Some((name, location)) if !name.is_empty() && !location.is_empty() => {
            Ok((name.to_string(), location.to_string()))
        }
        _ => Err(format!("expected NAME=LOCATION, got {value:?}")),
    }
}

/// A count that must be at least 1: zero partitions or zero workers is a
/// mistake to report, not a value to round up silently.
fn parse_at_least_one(value: &str) -> std::result::Result<usize, String> {
    match value.parse::<usize>() {
        Ok(0) => Err("expected at least 1, got 0".to_string()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!(
            "expected a whole number of at least 1, got {value:?}"
        )),
    }
}

fn parse_speculation(
    value: &str,
) -> std::result::Result<dfx_runtime::scheduler::Speculation, String> {
    let factor = value
        .parse::<f64>()
        .map_err(|_| format!("expected a number above 1, got {value:?}"))?;
    dfx_runtime::scheduler::Speculation::after(factor)
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // `tpch` and `bench` choose their own exit status (a mismatch is not an error).
    #[cfg_attr(not(feature = "cli-extras"), allow(unused_mut))]
    let mut status = ExitCode::SUCCESS;
    let work = async {
        match cli.command {
            Command::Run(args) => run(args).await,
            Command::Explain(args) => explain(args).await,
            Command::Worker(args) => worker(args).await,
            #[cfg(feature = "cli-extras")]
            Command::Tpch(args) => dfx_host::tpch::run_cli(args)
                .await
                .map(|code| status = code)
                .map_err(HostError::from),
            #[cfg(feature = "cli-extras")]
            Command::Bench(args) => dfx_host::bench::run_cli(args)
                .await
                .map(|code| status = code)
                .map_err(HostError::from),
        }
    };
    // On Ctrl-C (or SIGTERM) the `work` future is dropped, which kills every
    // worker it started (they are `kill_on_drop`) and removes a temporary
    // shuffle directory, before the process exits.
    let outcome = tokio::select! {
        outcome = work => outcome,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("dfx: interrupted; workers stopped");
            return ExitCode::from(130);
        }
        _ = terminated() => {
            eprintln!("dfx: terminated; workers stopped");
            return ExitCode::from(143);
        }
    };
    match outcome {
        Ok(()) => status,
        Err(err) => {
            eprintln!("dfx: error: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Resolves when the process receives SIGTERM; never if it cannot listen.
async fn terminated() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            term.recv().await;
        }
        Err(_) => std::future::pending().await,
    }
}

fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).map_err(|e| HostError::io("cannot resolve", path, e))
}

/// The spec `args` and the tables of `script` describe, every path
/// absolute: workers may resolve them from another directory.
fn spec_of(args: &QueryArgs, script: &Script) -> Result<SessionSpec> {
    let mut tables: Vec<(String, TableDefinition)> = Vec::new();
    for (name, location) in &args.tables {
        let format = args.table_format.unwrap_or_else(|| {
            // A file's extension says the format; a directory's name says
            // nothing.
            TableFormat::from_file_name(location.trim_end_matches('/'))
                .unwrap_or(TableFormat::Parquet)
        });
        tables.push((name.clone(), TableDefinition::new(location.clone(), format)));
    }
    tables.extend(script.tables.iter().cloned());
    let mut seen = std::collections::BTreeSet::new();
    let mut absolute_tables = Vec::new();
    for (name, table) in tables {
        if !seen.insert(name.clone()) {
            return Err(HostError::Invalid(format!(
                "table {name} is defined twice (by --table or CREATE EXTERNAL TABLE)"
            )));
        }
        let table = table
            .absolute()
            .map_err(|e| HostError::io("cannot resolve", name.as_str(), e))?;
        absolute_tables.push((name, table));
    }
    let mut spec = SessionSpec::new(absolute_tables)
        .with_target_partitions(args.partitions)
        .with_split(args.split)
        .with_shuffle_compression(args.shuffle_compression);
    let (datafusion, engine): (Vec<_>, Vec<_>) = args
        .settings
        .iter()
        .cloned()
        .partition(|(key, _)| key.starts_with("datafusion."));
    spec.engine_options = engine.into_iter().collect();
    spec.datafusion_options = datafusion.into_iter().collect();
    spec.validate()?;
    Ok(spec)
}

/// A shuffle directory for one query: the user's, or a fresh temporary one.
fn shuffle_dir(dir: Option<&Path>) -> Result<(PathBuf, Option<tempfile::TempDir>)> {
    match dir {
        // A URL is taken as written: made "absolute" it would be a path.
        Some(url) if dfx_runtime::spec::ShuffleLocation::is_url(url) => {
            Ok((url.to_path_buf(), None))
        }
        Some(dir) => Ok((absolute(dir)?, None)),
        None => {
            let temp = tempfile::Builder::new()
                .prefix("dfx-shuffle-")
                .tempdir()
                .map_err(|e| HostError::io("cannot create", std::env::temp_dir(), e))?;
            Ok((temp.path().to_path_buf(), Some(temp)))
        }
    }
}

async fn run(args: RunArgs) -> Result<()> {
    let started = Instant::now();
    let plugin = load_plugin(args.query.plugin.as_deref())?;
    let host = match &args.worker {
        Some(program) => {
            let command = args
                .worker_args
                .iter()
                .fold(WorkerCommand::new(program), |command, arg| command.arg(arg));
            Host::with_worker(plugin, command)
        }
        None => Host::new(plugin)?,
    }
    .max_workers(args.max_workers)
    .worker_mode(args.worker_mode)
    .max_attempts(u32::try_from(args.max_attempts).unwrap_or(u32::MAX))
    .task_timeout(
        args.task_timeout
            .map(|secs| std::time::Duration::from_secs(secs as u64)),
    )
    .speculation(args.speculate)
    .progress(true);
    let script = Script::parse(&args.query.sql()?)?;
    let spec = spec_of(&args.query, &script)?;
    let count = script.queries.len();
    for (index, sql) in script.queries.iter().enumerate() {
        if count > 1 {
            eprintln!("query {} of {count}", index + 1);
        }
        let shuffle = match (&args.query.shuffle_dir, count) {
            // One location per query: a location must hold no stage output yet.
            (Some(dir), 2..) => Some(dir.join(format!("query-{}", index + 1))),
            (dir, _) => dir.clone(),
        };
        let last = index + 1 == count;
        run_query(&host, &args, sql, &spec, shuffle, started, last).await?;
    }
    Ok(())
}

/// Run one query of a script and print its answer and figures.
async fn run_query(
    host: &Host,
    args: &RunArgs,
    sql: &str,
    spec: &SessionSpec,
    shuffle: Option<PathBuf>,
    started: Instant,
    last: bool,
) -> Result<()> {
    if args.query.local {
        let batches = host.run_local(sql, spec).await?;
        print_batches(&batches, args.format)?;
        eprintln!(
            "local run: no stages, no tasks; {} row(s) in {:.2?}",
            rows(&batches),
            started.elapsed()
        );
        return Ok(());
    }
    let (dir, temp) = shuffle_dir(shuffle.as_deref())?;
    let mut spec = spec.clone().with_shuffle_dir(&dir);
    spec.memory_limit = args.memory_limit;
    let outcome = host.run_distributed(sql, &spec).await;
    // Workers end and are reaped before the answer is printed, so their CPU
    // time counts as this process's children's (`/usr/bin/time dfx run`).
    // Pooled workers stay for a script's next query.
    if last || args.worker_mode != WorkerMode::Pool {
        host.shutdown().await;
    }
    let result = match outcome {
        Ok(result) => result,
        Err(err) => {
            // Kept when workers were dispatched: the envelopes and whatever
            // they published are the evidence. An empty one is just removed.
            // (The driver's lock file alone is not evidence.)
            let dispatched = |dir: &std::path::Path| {
                std::fs::read_dir(dir).is_ok_and(|entries| {
                    entries
                        .flatten()
                        .any(|e| e.file_name() != dfx_abi::lock::LOCK_FILE)
                })
            };
            if let Some(temp) = temp.filter(|t| dispatched(t.path())) {
                let kept = temp.keep();
                eprintln!(
                    "dfx: shuffle directory kept for inspection: {}",
                    kept.display()
                );
            }
            return Err(err);
        }
    };
    print_batches(&result.batches, args.format)?;
    eprintln!(
        "stages: {}; waves: {}; tasks: {}; split: {}; wall time: {:.2?}",
        result.stages.len(),
        result.waves.len(),
        result.tasks.len(),
        spec.split,
        started.elapsed()
    );
    let summaries = dfx_host::driver::analyze::stage_summaries(&result);
    for (stage, summary) in result.stages.iter().zip(&summaries) {
        let bytes = summary
            .bytes
            .map_or_else(|| "unknown".to_string(), |b| b.to_string());
        eprintln!(
            "  {}: {} row(s), {bytes} byte(s) published",
            dfx_host::driver::stages::describe(stage),
            summary.rows
        );
    }
    // Every task when there are few; a table of a thousand files would make
    // this one line of a thousand entries, so past that only the first ones.
    const TASKS_SHOWN: usize = 32;
    let mut per_task: Vec<String> = result
        .task_rows
        .iter()
        .take(TASKS_SHOWN)
        .map(|((stage, map), rows)| format!("{stage}/{map}={rows}"))
        .collect();
    if result.task_rows.len() > TASKS_SHOWN {
        per_task.push(format!(
            "... ({} more; --analyze has each stage's spread)",
            result.task_rows.len() - TASKS_SHOWN
        ));
    }
    eprintln!("rows per task (stage/map=rows): {}", per_task.join(" "));
    for retry in &result.retries {
        eprintln!("retried: {retry}");
    }
    if args.analyze {
        eprint!(
            "\nworker mode: {}\n{}",
            result.worker_mode,
            dfx_host::driver::analyze::render(&result)
        );
    }
    if let Some(file) = &args.analyze_json {
        let wall_ms = started.elapsed().as_secs_f64() * 1e3;
        let doc = dfx_host::driver::analyze::to_json(&result, wall_ms);
        std::fs::write(file, format!("{doc:#}\n"))
            .map_err(|e| HostError::io("cannot write", file.clone(), e))?;
    }
    let fate = if temp.is_some() {
        "temporary, removed"
    } else {
        "kept"
    };
    eprintln!(
        "result: {} row(s); shuffle directory: {} ({fate})",
        result.rows(),
        dir.display()
    );
    if let Some(temp) = temp {
        let path = temp.path().to_path_buf();
        temp.close()
            .map_err(|e| HostError::io("cannot remove", path, e))?;
    }
    Ok(())
}

async fn explain(args: ExplainArgs) -> Result<()> {
    let script = Script::parse(&args.query.sql()?)?;
    let plugin = load_plugin(args.query.plugin.as_deref())?;
    let host = Host::new(plugin)?;
    let mut spec = spec_of(&args.query, &script)?;
    // Planning writes nothing, so a temporary directory is only a name here.
    let (dir, _temp) = shuffle_dir(args.query.shuffle_dir.as_deref())?;
    if !args.query.local {
        spec = spec.with_shuffle_dir(dir);
    }
    for sql in &script.queries {
        print!("{}", host.explain(sql, &spec).await?);
    }
    Ok(())
}

async fn worker(args: WorkerArgs) -> Result<()> {
    let started = Instant::now();
    let plugin = load_plugin(args.plugin.as_deref())?;
    let Some(path) = args.envelope else {
        // `--serve`: the plugin stays loaded for every task until stdin ends.
        let requests = dfx_host::worker::stdin_lines();
        return dfx_host::worker::serve(&plugin, requests, &mut std::io::stdout()).await;
    };
    let response = dfx_host::worker::run_envelope_file(&plugin, &path).await;
    let response = match response {
        // A process's time for its task includes loading the plugin.
        Response::Report(mut report) => {
            report.elapsed_ms = Some(started.elapsed().as_secs_f64() * 1e3);
            Response::Report(report)
        }
        failed => failed,
    };
    // The last line of stdout is the response; the driver reads nothing else.
    dfx_runtime::protocol::serve::write_response(&mut std::io::stdout().lock(), &response)?;
    match response {
        Response::Report(_) => Ok(()),
        Response::Error(error) => Err(HostError::Invalid(error.error)),
    }
}

fn rows(batches: &[RecordBatch]) -> usize {
    batches.iter().map(RecordBatch::num_rows).sum()
}

fn print_batches(batches: &[RecordBatch], format: Format) -> Result<()> {
    use std::io::Write as _;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let arrow = |e: datafusion::arrow::error::ArrowError| {
        HostError::Invalid(format!("cannot print the result: {e}"))
    };
    match format {
        Format::Table => {
            let table =
                datafusion::arrow::util::pretty::pretty_format_batches(batches).map_err(arrow)?;
            writeln!(out, "{table}").map_err(|e| HostError::io("cannot write", "stdout", e))?;
        }
        Format::Csv => {
            let mut writer = datafusion::arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(&mut out);
            for batch in batches {
                writer.write(batch).map_err(arrow)?;
            }
        }
        Format::Json => {
            let mut writer = datafusion::arrow::json::ArrayWriter::new(&mut out);
            for batch in batches {
                writer.write(batch).map_err(arrow)?;
            }
            writer.finish().map_err(arrow)?;
            writeln!(out).map_err(|e| HostError::io("cannot write", "stdout", e))?;
        }
    }
    Ok(())
}
