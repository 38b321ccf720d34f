//! `dfx`: run SQL over Parquet directories, distributed over worker
//! processes by the dfx plugin. A thin CLI over [`dfx_host`].
//!
//! Each subcommand is a module of [`cli`].

mod cli;

use std::io::IsTerminal as _;
use std::process::ExitCode;

use clap::{CommandFactory as _, Parser, Subcommand};
use dfx_host::HostError;

use cli::explain::ExplainArgs;
use cli::gc::GcArgs;
use cli::run::RunArgs;
use cli::shell::ShellArgs;
use cli::worker::WorkerArgs;

/// Distributed SQL over tables of files (Parquet, CSV, JSON, Arrow; local or on S3) with the dfx plugin.
#[derive(Debug, Parser)]
#[command(name = "dfx", version, about, propagate_version = true)]
struct Cli {
    /// Without one, on a terminal: the shell (`dfx shell`).
    #[command(subcommand)]
    command: Option<Command>,
}

/// One variant per subcommand; add new ones here and in `main`'s match.
#[derive(Debug, Subcommand)]
enum Command {
    /// Run a query: each map of each stage in its own worker, stage after stage, then the plan's root here.
    Run(RunArgs),
    /// A prompt: queries, CREATE EXTERNAL TABLE, SET and SHOW, \d, one worker pool for the session.
    Shell(ShellArgs),
    /// Show the physical plan with each stage marked with its id, maps, buckets and deps.
    Explain(ExplainArgs),
    /// Remove the query locations crashed drivers left under a shuffle root
    /// (older than --older-than, held by no live driver).
    Gc(GcArgs),
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

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = match cli.command {
        Some(command) => command,
        None if std::io::stdin().is_terminal() => match Cli::parse_from(["dfx", "shell"]).command {
            Some(shell) => shell,
            None => unreachable!("`dfx shell` names a subcommand"),
        },
        None => {
            // Not a terminal: no one to prompt. Say what dfx takes.
            let _ = Cli::command().print_help();
            return ExitCode::from(2);
        }
    };
    // The shell handles Ctrl-C itself: it stops a query, not the shell.
    let command = match command {
        Command::Shell(args) => return exit_status(cli::shell::shell(args).await),
        Command::Run(args) if args.wants_shell() => {
            return exit_status(cli::shell::shell(ShellArgs::from_run(args)).await);
        }
        command => command,
    };
    // `tpch` and `bench` choose their own exit status (a mismatch is not an error).
    #[cfg_attr(not(feature = "cli-extras"), allow(unused_mut))]
    let mut status = ExitCode::SUCCESS;
    let work = async {
        match command {
            Command::Shell(_) => unreachable!("the shell ran above"),
            Command::Run(args) => cli::run::run(args).await,
            Command::Explain(args) => cli::explain::explain(args).await,
            Command::Gc(args) => cli::gc::gc(args).await,
            Command::Worker(args) => cli::worker::worker(args).await,
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
        Err(err) => exit_status(Err(err)),
    }
}

/// Success, or the error printed as `dfx: error: ...` and a failure status.
fn exit_status(outcome: Result<(), HostError>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
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
