//! `dfx run`: run each query of the SQL distributed (or `--local`) and print
//! its answer, then the stages, tasks and, with `--analyze`, where the time
//! went.

use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, ValueEnum};
use datafusion::arrow::record_batch::RecordBatch;
use dfx_host::{Host, HostError, Result, SessionSpec, WorkerCommand, WorkerMode, load_plugin};
use dfx_runtime::spec::Script;

use super::query::{QueryArgs, parse_at_least_one, shuffle_dir, spec_of};

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    query: QueryArgs,
    /// A shuffle root: each query gets a fresh location under it
    /// (`ROOT/q-<time>-<random>/`), removed once its answer is read and
    /// kept when it fails; a directory, file://DIR or s3://BUCKET/PREFIX.
    /// Not with --shuffle-dir. `dfx gc ROOT` removes what crashed drivers left.
    #[arg(long, value_name = "DIR|URL")]
    shuffle_root: Option<PathBuf>,
    /// Keep each query's location under --shuffle-root after its answer.
    #[arg(long, requires = "shuffle_root")]
    keep_shuffle: bool,
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
    /// No live progress line on stderr while the tasks run (it shows only
    /// on a terminal, once a query has taken about a second).
    #[arg(long)]
    no_progress: bool,
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

/// `--speculate`'s factor, as the scheduler takes it.
fn parse_speculation(
    value: &str,
) -> std::result::Result<dfx_runtime::scheduler::Speculation, String> {
    let factor = value
        .parse::<f64>()
        .map_err(|_| format!("expected a number above 1, got {value:?}"))?;
    dfx_runtime::scheduler::Speculation::after(factor)
}

impl RunArgs {
    /// The query options: tables, partitions, settings, the plugin.
    pub fn query(&self) -> &QueryArgs {
        &self.query
    }

    /// The memory each map task may hold (`--memory-limit`).
    pub fn memory_limit(&self) -> Option<u64> {
        self.memory_limit
    }

    /// Whether `--analyze` asks for each stage's task times.
    pub fn analyze(&self) -> bool {
        self.analyze
    }

    /// Whether no query was given (neither SQL nor `-f`) and stdin is a
    /// terminal: then `dfx run` opens the shell instead of waiting for a
    /// query to end with Ctrl-D.
    pub fn wants_shell(&self) -> bool {
        use std::io::IsTerminal as _;
        self.query.sql.is_none() && self.query.file.is_none() && std::io::stdin().is_terminal()
    }

    /// The host these options describe: its plugin, workers, bounds,
    /// retries and progress line.
    ///
    /// # Errors
    ///
    /// A plugin that cannot be found or is refused, or an executable path
    /// that cannot be known.
    pub fn host(&self) -> Result<Host> {
        host_of(self)
    }

    /// `spec` under the `--shuffle-root` given (with `--keep-shuffle`), the
    /// root resolved to one path for the driver and its workers from any
    /// directory; `spec` itself without one.
    ///
    /// # Errors
    ///
    /// A root that cannot be resolved.
    pub fn with_shuffle_root(&self, spec: SessionSpec) -> Result<SessionSpec> {
        let Some(root) = &self.shuffle_root else {
            return Ok(spec);
        };
        let (root, _) = shuffle_dir(Some(root.as_path()))?;
        let mut spec = spec.with_shuffle_root(root);
        spec.keep_shuffle = self.keep_shuffle;
        Ok(spec)
    }
}

/// Run `dfx run`: every query of the script, in turn, on one host.
pub async fn run(args: RunArgs) -> Result<()> {
    let started = Instant::now();
    let host = host_of(&args)?;
    let script = Script::parse(&args.query.sql()?)?;
    let spec = args.with_shuffle_root(spec_of(&args.query, &script)?)?;
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

/// The host `args` describe.
fn host_of(args: &RunArgs) -> Result<Host> {
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
    .progress(!args.no_progress);
    Ok(host)
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
    // Under a root the host makes each query's location itself.
    let (dir, temp) = match (&spec.shuffle_root, shuffle) {
        (Some(_), None) => (None, None),
        (_, shuffle) => {
            let (dir, temp) = shuffle_dir(shuffle.as_deref())?;
            (Some(dir), temp)
        }
    };
    let mut spec = spec.clone();
    spec.shuffle_dir = dir;
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
    if result.stages.is_empty() {
        // Said, so no-one reads "0 tasks" as a query that did nothing.
        eprintln!(
            "the plan is no wider than a task: it ran whole in this process \
             (--set collapse_stages=task runs it on a worker)"
        );
    }
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
    if !per_task.is_empty() {
        eprintln!("rows per task (stage/map=rows): {}", per_task.join(" "));
    }
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
    let fate = match (temp.is_some(), &spec.shuffle_root) {
        (true, _) => "temporary, removed",
        (false, Some(_)) if !spec.keep_shuffle => "under the shuffle root, removed",
        _ => "kept",
    };
    eprintln!(
        "result: {} row(s); shuffle directory: {} ({fate})",
        result.rows(),
        result.shuffle_location
    );
    if let Some(temp) = temp {
        let path = temp.path().to_path_buf();
        temp.close()
            .map_err(|e| HostError::io("cannot remove", path, e))?;
    }
    Ok(())
}

/// Rows in all of `batches`.
fn rows(batches: &[RecordBatch]) -> usize {
    batches.iter().map(RecordBatch::num_rows).sum()
}

/// Print the answer on stdout in `format`.
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
