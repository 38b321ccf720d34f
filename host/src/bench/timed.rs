//! The timed worker, `dfx bench task`: a task run as `dfx worker` runs it,
//! with a clock around each step, its report line carrying the timings
//! (see [`super::overhead`](mod@super::overhead) for the steps and how the
//! driver reads them).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use serde::{Deserialize, Serialize};

use crate::tpch::TpchError;
use crate::{build_worker_session, load_plugin};
use dfx_runtime::protocol::Envelope;

/// Environment variable carrying the driver's spawn time (ns since the Unix
/// epoch) to the timed worker.
pub const SPAWN_TIME_ENV: &str = "DFX_BENCH_SPAWN_NS";

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
pub(super) struct TimedReport {
    stage_id: u64,
    partition: usize,
    rows: usize,
    pub(super) steps: StepTimes,
    /// When the report was about to be printed (ns since the epoch).
    pub(super) report_at_ns: u128,
}

/// Now, in nanoseconds since the Unix epoch (0 before it).
pub(super) fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Microseconds since `started`.
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

/// Run a child to its end; its stdout, or why it failed (with its stderr).
pub(super) async fn run_child(
    mut command: tokio::process::Command,
    what: &str,
) -> Result<String, TpchError> {
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
