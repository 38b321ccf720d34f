//! `dfx shell` (and `dfx` with no query on a terminal): a prompt in
//! datafusion-cli's manner, every query run distributed on one worker pool
//! that lasts the session.
//!
//! ```text
//! line (rustyline: editing, history) ─► input: a `\` command, or SQL up to `;`
//!   \d, \d NAME, \stats, \?, \q           ─► commands
//!   SET / SHOW                            ─► the session spec (settings)
//!   CREATE EXTERNAL TABLE, SELECT ...     ─► session: the spec, the host and its pool
//! ```
//!
//! An error is printed as `dfx run` prints it, and the shell goes on.

pub mod commands;
pub mod input;
pub mod session;
pub mod settings;

use std::path::PathBuf;

use clap::Args;
use dfx_host::{HostError, Result};
use dfx_runtime::spec::Script;
use rustyline::error::ReadlineError;

use super::query::spec_of;
use super::run::RunArgs;
use commands::Command;
use input::{Input, Pending};
use session::ShellSession;

/// Rows of an answer shown unless `--maxrows` says otherwise, as
/// datafusion-cli shows.
pub const DEFAULT_MAXROWS: usize = 40;

/// The environment variable naming the history file.
pub const HISTORY_ENV: &str = "DFX_HISTORY";

/// The history file's name in the user's home directory.
const HISTORY_FILE: &str = ".dfx_history";

/// Options of `dfx shell`: `dfx run`'s (tables, partitions, settings,
/// workers, retries), less a query, and how many rows an answer shows.
#[derive(Debug, Args)]
pub struct ShellArgs {
    #[command(flatten)]
    run: RunArgs,
    /// Rows of each answer shown (`inf`: all); the footer says how many
    /// there were.
    #[arg(long, value_name = "N|inf", default_value = "40", value_parser = parse_maxrows)]
    maxrows: usize,
}

impl ShellArgs {
    /// The shell `dfx run` opens when it is given no query on a terminal.
    pub fn from_run(run: RunArgs) -> Self {
        Self {
            run,
            maxrows: DEFAULT_MAXROWS,
        }
    }
}

/// `--maxrows`: a count, or `inf` for every row.
fn parse_maxrows(value: &str) -> std::result::Result<usize, String> {
    if value.eq_ignore_ascii_case("inf") {
        return Ok(usize::MAX);
    }
    value
        .parse()
        .map_err(|_| format!("expected a number of rows or inf, got {value:?}"))
}

/// Run the shell until `\q` or Ctrl-D.
///
/// # Errors
///
/// A query given on the command line, a plugin that cannot be loaded, a
/// bad table or setting given on the command line, or a terminal that
/// cannot be read. Errors of the statements typed are printed, not
/// returned.
pub async fn shell(args: ShellArgs) -> Result<()> {
    let query = args.run.query();
    if query.sql.is_some() || query.file.is_some() {
        return Err(HostError::Invalid(
            "dfx shell takes no query: type it at the prompt, or use dfx run".into(),
        ));
    }
    let host = args.run.host()?;
    let mut spec = args
        .run
        .with_shuffle_root(spec_of(query, &Script::default())?)?;
    spec.memory_limit = args.run.memory_limit();
    let mut session = ShellSession::new(
        host,
        spec,
        query.shuffle_dir.as_deref(),
        args.maxrows,
        args.run.analyze(),
    )?;
    let config = rustyline::Config::builder().auto_add_history(true).build();
    let mut editor = rustyline::DefaultEditor::with_config(config)
        .map_err(|e| HostError::Invalid(format!("cannot open the terminal for the shell: {e}")))?;
    let history = history_file();
    if let Some(file) = &history {
        // A first run has no history yet; any other failure only costs the
        // history, never the shell.
        if let Err(err) = editor.load_history(file)
            && file.exists()
        {
            eprintln!("dfx: history not loaded from {}: {err}", file.display());
        }
    }
    println!("dfx shell: SQL ends with `;`. \\? for help, \\q to quit.");
    let outcome = read_inputs(&mut editor, &mut session).await;
    if let Some(file) = &history
        && let Err(err) = editor.save_history(file)
    {
        eprintln!("dfx: history not saved to {}: {err}", file.display());
    }
    session.close().await;
    outcome
}

/// Read and run inputs until `\q`, Ctrl-D or a terminal that fails.
async fn read_inputs(
    editor: &mut rustyline::DefaultEditor,
    session: &mut ShellSession,
) -> Result<()> {
    let mut pending = Pending::default();
    loop {
        let prompt = if pending.is_empty() { "dfx> " } else { "  -> " };
        // The terminal is read on this thread while no query runs; the
        // runtime's other threads keep the pool's workers served.
        let line = match tokio::task::block_in_place(|| editor.readline(prompt)) {
            Ok(line) => line,
            Err(ReadlineError::Interrupted) => {
                pending.clear();
                continue;
            }
            Err(ReadlineError::Eof) => return Ok(()),
            Err(err) => {
                return Err(HostError::Invalid(format!(
                    "cannot read the shell's input: {err}"
                )));
            }
        };
        for input in pending.push_line(&line) {
            match input {
                Input::Command(text) => match commands::parse(&text) {
                    Command::Quit => return Ok(()),
                    Command::Help => println!("{}\n", commands::HELP),
                    Command::ListTables => report(session.list_tables()),
                    Command::Describe(table) => report(session.describe(&table).await),
                    Command::Stats => println!("{}", session.stats()),
                    Command::Unknown(text) => {
                        eprintln!("dfx: unknown command {text:?}; \\? lists the commands\n")
                    }
                },
                Input::Sql(sql) => {
                    // Ctrl-C stops the query (its running workers are
                    // killed, the pool starts others), not the shell.
                    tokio::select! {
                        outcome = session.run_statement(&sql) => report(outcome),
                        _ = tokio::signal::ctrl_c() => eprintln!("dfx: query stopped\n"),
                    }
                }
            }
        }
    }
}

/// Print an input's error as `dfx run` would, and go on.
fn report(outcome: Result<()>) {
    if let Err(err) = outcome {
        eprintln!("dfx: error: {err}\n");
    }
}

/// The history file: `$DFX_HISTORY`, else `~/.dfx_history`; none when
/// neither is known (the shell then keeps no history).
fn history_file() -> Option<PathBuf> {
    if let Some(file) = std::env::var_os(HISTORY_ENV).filter(|f| !f.is_empty()) {
        return Some(PathBuf::from(file));
    }
    std::env::var_os("HOME")
        .filter(|home| !home.is_empty())
        .map(|home| PathBuf::from(home).join(HISTORY_FILE))
}
