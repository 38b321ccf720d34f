//! What `run` and `explain` share: the query and its tables, read from the
//! command line into a [`SessionSpec`], and the shuffle directory.

use std::path::{Path, PathBuf};

use clap::Args;
use dfx_host::session::{ShuffleCompression, Split, TableDefinition, TableFormat};
use dfx_host::{HostError, Result, SessionSpec};
use dfx_runtime::ShuffleDurability;
use dfx_runtime::spec::Script;

/// Options shared by `run` and `explain`.
#[derive(Debug, Args)]
pub struct QueryArgs {
    /// The plugin file (default: $DFX_PLUGIN, else beside this executable).
    #[arg(long, value_name = "PATH")]
    pub plugin: Option<PathBuf>,
    /// A table: NAME=LOCATION, a directory or one file, as a local path,
    /// file://... or s3://BUCKET/PREFIX (one partition per file).
    /// Repeatable. Its format is --table-format, else the location's
    /// extension, else Parquet. A script's CREATE EXTERNAL TABLE says more
    /// (options, partition columns).
    #[arg(long = "table", value_name = "NAME=LOCATION", value_parser = parse_table)]
    pub tables: Vec<(String, String)>,
    /// The format of every --table: parquet, csv, json (newline-delimited)
    /// or arrow. Default: from each location's extension, else Parquet.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub table_format: Option<TableFormat>,
    /// Partitions the session plans for.
    #[arg(
        long,
        value_name = "N",
        default_value_t = dfx_host::session::DEFAULT_TARGET_PARTITIONS,
        value_parser = parse_at_least_one
    )]
    pub partitions: usize,
    /// Partitions of a stage each task runs at once, on all of its worker's
    /// threads, publishing one map file for them all (the plugin's
    /// dfx_engine.partitions_per_task). Default: this machine's cores, so a
    /// stage of as many partitions is one task, and a query no wider than
    /// that runs whole in this process, with no stage (`--set
    /// collapse_stages=task` runs it as one stage on a worker, `off` keeps
    /// its stages).
    #[arg(long, value_name = "N", value_parser = parse_at_least_one)]
    pub partitions_per_task: Option<usize>,
    /// Shuffle location for stage output (must not hold stage output yet):
    /// a directory, file://DIR or s3://BUCKET/PREFIX (endpoint, region and
    /// credentials from the AWS_* environment variables).
    /// Default: a fresh temporary directory, removed after success.
    #[arg(long, value_name = "DIR|URL")]
    pub shuffle_dir: Option<PathBuf>,
    /// Run in this process with no shuffle directory: no stages, no workers.
    #[arg(long)]
    pub local: bool,
    /// Where the plan is cut into stages: at every exchange, or the
    /// aggregate split (one stage per topmost partial aggregate).
    #[arg(long, value_enum, default_value_t = Split::Exchange)]
    pub split: Split,
    /// How workers compress their map files: `auto` is none for a local
    /// directory and LZ4 for S3; `lz4` and `none` force one.
    #[arg(long, value_enum, default_value_t = ShuffleCompression::Auto)]
    pub shuffle_compression: ShuffleCompression,
    /// Where map files live between stages: `object_store` keeps them in
    /// the shuffle location, read by every worker from there; `local`
    /// keeps each on the disk of the worker that wrote it, and workers
    /// stream them to each other over Arrow Flight (a lost worker's maps
    /// are run again). `local` needs a directory and pool workers.
    #[arg(long, value_enum, default_value_t = ShuffleDurability::ObjectStore)]
    pub shuffle_durability: ShuffleDurability,
    /// Where each worker's map server listens under --shuffle-durability
    /// local: HOST:PORT, port 0 for any free one. Default: 127.0.0.1:0,
    /// this host only.
    #[arg(long, value_name = "HOST:PORT")]
    pub map_server_bind: Option<String>,
    /// Set the plugin's dfx_engine.KEY in every session of the query, the
    /// driver's and each worker's (join_filters=off, join_filter_ratio=0.2,
    /// memory_table_limit=...); a KEY starting with `datafusion.` sets that
    /// DataFusion setting instead. Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = dfx_host::session::parse_engine_option)]
    pub settings: Vec<(String, String)>,
    /// Read the SQL from FILE (`-` for stdin) instead of the argument: a
    /// query, or a script of CREATE EXTERNAL TABLE statements, then
    /// queries, separated by `;` (each query runs and prints in turn).
    #[arg(
        short = 'f',
        long = "file",
        value_name = "FILE",
        conflicts_with = "sql"
    )]
    pub file: Option<PathBuf>,
    /// The SQL query. It may start with a `-- comment` (as the TPC-H query
    /// files do): a value that begins with dashes is still the query.
    /// Without it and without -f, the query is read from stdin.
    #[arg(allow_hyphen_values = true)]
    pub sql: Option<String>,
}

impl QueryArgs {
    /// The query: the argument, the file of -f, or stdin when neither is
    /// given (as datafusion-cli reads it).
    pub fn sql(&self) -> Result<String> {
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

/// `NAME=LOCATION`, both parts non-empty.
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
pub fn parse_at_least_one(value: &str) -> std::result::Result<usize, String> {
    match value.parse::<usize>() {
        Ok(0) => Err("expected at least 1, got 0".to_string()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!(
            "expected a whole number of at least 1, got {value:?}"
        )),
    }
}

/// `path` made absolute, as workers in another directory must read it.
fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).map_err(|e| HostError::io("cannot resolve", path, e))
}

/// The spec `args` and the tables of `script` describe, every path
/// absolute: workers may resolve them from another directory.
pub fn spec_of(args: &QueryArgs, script: &Script) -> Result<SessionSpec> {
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
    spec.shuffle_durability = args.shuffle_durability;
    spec.map_server_bind = args.map_server_bind.clone();
    let (datafusion, engine): (Vec<_>, Vec<_>) = args
        .settings
        .iter()
        .cloned()
        .partition(|(key, _)| key.starts_with("datafusion."));
    spec.engine_options = engine.into_iter().collect();
    let per_task = args.partitions_per_task.map(|n| n.to_string());
    let default = || dfx_host::session::default_partitions_per_task().to_string();
    match per_task {
        // The flag wins over a `--set` of the same key.
        Some(n) => {
            spec.engine_options
                .insert(dfx_abi::PARTITIONS_PER_TASK.to_string(), n);
        }
        None => {
            spec.engine_options
                .entry(dfx_abi::PARTITIONS_PER_TASK.to_string())
                .or_insert_with(default);
        }
    }
    spec.datafusion_options = datafusion.into_iter().collect();
    spec.validate()?;
    Ok(spec)
}

/// A shuffle directory for one query: the user's, or a fresh temporary one.
pub fn shuffle_dir(dir: Option<&Path>) -> Result<(PathBuf, Option<tempfile::TempDir>)> {
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
