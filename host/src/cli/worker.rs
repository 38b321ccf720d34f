//! `dfx worker`: run one task from its envelope, or serve tasks from stdin
//! (what the driver starts).

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use dfx_host::{HostError, Response, Result, load_plugin};

#[derive(Debug, Args)]
pub struct WorkerArgs {
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

/// Run `dfx worker`: one envelope's task, or `--serve` until stdin ends.
pub async fn worker(args: WorkerArgs) -> Result<()> {
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
