//! `dfx bench`: the benchmarks, one module each.
//!
//! - `dfx bench overhead`, what one task costs when it has no data to work
//!   on, is [`overhead`](mod@overhead) (its timed worker, `dfx bench task`,
//!   is [`timed`]);
//! - `dfx bench many-files`, what a table of many files costs the driver and
//!   each task, is [`many_files`];
//! - `dfx bench skew`, a skewed join with skew splitting off and on and
//!   switched to a broadcast join, is [`skew`].

pub mod many_files;
pub mod output;
pub mod overhead;
pub mod skew;
pub mod timed;

use std::process::ExitCode;

use clap::{Args, Subcommand};

use crate::error::HostError;
use crate::load_plugin;
use crate::tpch::TpchError;
use output::write_json;

// The paths these had when this was one file.
pub use output::BenchOutput;
pub use overhead::{ModeCost, OVERHEAD_SQL, OverheadArgs, OverheadReport, overhead, percentile};
pub use timed::{SPAWN_TIME_ENV, StepTimes, TaskArgs, timed_task};

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
