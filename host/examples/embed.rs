//! A custom host in a few dozen lines: this one binary is the driver and,
//! started again as `embed worker --serve` (a long-lived pooled worker, the
//! default) or `embed worker ENVELOPE` (one task), every worker.
//!
//! ```text
//! cargo run -p dfx-host --example embed -- /path/to/lineitem \
//!     "SELECT l_returnflag, sum(l_quantity) FROM lineitem GROUP BY l_returnflag"
//! ```
//!
//! The plugin file is found the way `dfx` finds it: `DFX_PLUGIN`, else beside
//! the executable (`target/<profile>/examples/` looks in `target/<profile>/`).

use std::path::{Path, PathBuf};

use datafusion::arrow::util::pretty::pretty_format_batches;
use dfx_host::{Host, Response, SessionSpec, load_plugin};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let plugin = load_plugin(None)?;

    // The worker half: `Host::new` starts this same executable with `worker`.
    if let [command, arg] = args.as_slice()
        && command == "worker"
    {
        if arg == "--serve" {
            let requests = dfx_host::worker::stdin_lines();
            dfx_host::worker::serve(&plugin, requests, &mut std::io::stdout()).await?;
        } else {
            // The response (report, or error with its retry class) is the
            // last line of stdout; a failed task also exits non-zero.
            let response = dfx_host::worker::run_envelope_file(&plugin, Path::new(arg)).await;
            println!("{}", response.to_line());
            if let Response::Error(error) = response {
                return Err(error.error.into());
            }
        }
        return Ok(());
    }

    // The driver half.
    let [table_dir, sql] = args.as_slice() else {
        return Err("usage: embed LINEITEM_DIR SQL".into());
    };
    let shuffle = tempfile::tempdir()?;
    let spec = SessionSpec::new([("lineitem".to_string(), PathBuf::from(table_dir))])
        .with_shuffle_dir(shuffle.path());
    let host = Host::new(plugin)?;
    let result = host.run_distributed(sql, &spec).await?;
    // Let the pooled workers exit and be reaped before this process does.
    host.shutdown().await;
    println!("{}", pretty_format_batches(&result.batches)?);
    eprintln!(
        "{} stages, {} tasks: {:?}",
        result.stages.len(),
        result.tasks.len(),
        result.task_rows
    );
    Ok(())
}
