//! The "other process" of the cross-process tests.
//!
//! `dfx-ffi-child run <plan-file>` builds its own host session on the plugin
//! file (the same one the test uses: `DFX_PLUGIN` is inherited, else the
//! profile directory's), decodes the encoded plan through its own codec chain,
//! executes every partition and prints, as the last line of stdout,
//! `{"display": <indented plan>, "rows": [<rows per partition>]}`.
//!
//! When the decoded root is a stage (a `ShuffleWriterExec`), it runs every
//! map as a worker would: `rows` holds what each map published (the sum of
//! its summary's `rows` column), and the report adds `stage_info` (the
//! plugin's description of the decoded writer) and `encoded_stage_info` (the
//! same, read from the bytes), both as seen in this process.
//! On any error it prints the error to stderr and exits with status 1.

use std::path::PathBuf;
use std::process::ExitCode;

use dfx_ffi_tests::locate::plugin;
use dfx_ffi_tests::plans::{
    Stage, node_display, plan_display, run_partitions, run_stage, stage_info_to_json,
};
use dfx_ffi_tests::session::{SessionOptions, TestSession};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let plan_file = match args.as_slice() {
        [command, file] if command == "run" => PathBuf::from(file),
        _ => {
            eprintln!("usage: dfx-ffi-child run <plan-file>");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("dfx-ffi-child: cannot start a runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(plan_file)) {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("dfx-ffi-child: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run(plan_file: PathBuf) -> datafusion::common::Result<String> {
    let bytes = std::fs::read(&plan_file).map_err(|err| {
        datafusion::common::DataFusionError::Execution(format!(
            "reading {}: {err}",
            plan_file.display()
        ))
    })?;
    // No shuffle directory of its own: the stage carries the driver's.
    let session = TestSession::new(plugin(), &SessionOptions::default()).await?;
    let plan = session.decode(&bytes)?;
    let display = plan_display(&plan);
    if !node_display(plan.as_ref()).contains(plugin().stage_node_name()) {
        let rows = run_partitions(&plan, session.ctx.task_ctx()).await?;
        return Ok(serde_json::json!({ "display": display, "rows": rows }).to_string());
    }
    let info = plugin().stage_info(&plan)?;
    let encoded = plugin().encoded_stage_info(&bytes)?;
    let stage = Stage {
        writer: plan,
        info: info.clone(),
    };
    let rows: Vec<u64> = run_stage(&stage, session.ctx.task_ctx())
        .await?
        .iter()
        .map(|run| run.rows())
        .collect();
    Ok(serde_json::json!({
        "display": display,
        "rows": rows,
        "stage_info": stage_info_to_json(&info),
        "encoded_stage_info": stage_info_to_json(&encoded),
    })
    .to_string())
}
