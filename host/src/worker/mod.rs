//! The worker: run one map task of one stage, publish its buckets, report.
//!
//! Steps, each check before the work it guards:
//!
//! 1. build the session from the envelope's spec (the driver's factory,
//!    without registering the tables: a stage carries its scans whole);
//! 2. the runtime's checks before decoding ([`dfx_runtime::protocol::check_task`]):
//!    codec ids, the stage's id, shuffle location and map, and the plugin's
//!    vet (once per stage and session);
//! 3. decode the stage and check its root is the plugin's writer (by its
//!    node name, never its display);
//! 4. execute the map and drain it: the writer reads its upstream buckets,
//!    runs the stage, publishes `stage-S/K-map-M.arrow` (its buckets, closed by
//!    the commit marker), and yields one summary batch;
//! 5. respond with the report, or with the failure classified by what the
//!    plugin recorded while the task ran ([`Response::of_outcome`]).
//!
//! [`serve`] runs the same steps for one task after another in one process
//! (`dfx worker --serve`, the serve protocol of [`dfx_runtime::protocol`]):
//! the plugin is loaded once, and the last sessions built stay warm for the
//! next tasks of the same query.

pub mod memory;

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{Array, UInt64Array};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use dfx_abi::stages::node_display;
use dfx_abi::{MapLayout, Plugin};
use dfx_runtime::protocol::report::clear_recorded;
use dfx_runtime::protocol::serve::{read_task_file, serve as serve_requests};
use dfx_runtime::protocol::{Envelope, Published, Response, TaskInput, WorkerReport, check_task};
use futures::StreamExt;

use crate::error::{DataFusionContext, HostError, Result};
use crate::session::{DfxSession, SessionSpec, build_worker_session};
use crate::worker::memory::{bind_below_root, limited_context};

/// Name of the column of a writer's summary batch holding each bucket's rows.
pub const SUMMARY_ROWS_COLUMN: &str = "rows";

/// Name of the column of a writer's summary batch holding each bucket's bytes.
pub const SUMMARY_BYTES_COLUMN: &str = "bytes";

/// Sessions a serving worker keeps built: the current query's, and the one
/// before it (a driver running two queries at once alternates). More would
/// only hold memory for queries that are over.
pub const WARM_SESSIONS: usize = 2;

/// Run the task `envelope` describes in a session of its own and return its
/// report.
///
/// # Errors
///
/// [`HostError::Invalid`] with the task's response message: each refusal
/// names the stage, the map and what disagreed; a failure while executing
/// carries DataFusion's or the plugin's message.
pub async fn run_task(plugin: &Plugin, envelope: &Envelope) -> Result<WorkerReport> {
    match respond(plugin, &mut SessionCache::default(), envelope.clone()).await {
        Response::Report(report) => Ok(report),
        Response::Error(error) => Err(HostError::Invalid(error.error)),
    }
}

/// The response to the task of `envelope`, its session taken from `cache`.
pub async fn respond(plugin: &Plugin, cache: &mut SessionCache, envelope: Envelope) -> Response {
    let started = Instant::now();
    // A record left by an earlier task must not classify this one.
    clear_recorded(plugin, &envelope);
    let outcome = run_envelope(plugin, cache, &envelope).await;
    Response::of_outcome(
        plugin,
        &envelope,
        outcome.map_err(|err| err.to_string()),
        started.elapsed().as_secs_f64() * 1e3,
    )
}

/// Steps 1 to 4 for `envelope`.
async fn run_envelope(
    plugin: &Plugin,
    cache: &mut SessionCache,
    envelope: &Envelope,
) -> Result<Published> {
    let task = TaskInput::read(plugin, envelope.clone())?;
    let session = cache.session(plugin, &envelope.spec).await?;
    let published = match decode_checked(session, &task) {
        Ok(stage) => run_map(session, &stage, envelope).await,
        Err(err) => Err(err),
    };
    // Whatever failed, the kept stage may hold what the failure left behind
    // (a build side that failed): no later task runs from it.
    published.inspect_err(|_| session.forget_stage())
}

/// The sessions a serving worker keeps built, keyed by their spec's JSON,
/// the most recently used last.
#[derive(Default)]
pub struct SessionCache {
    warm: Vec<(String, DfxSession)>,
}

impl SessionCache {
    /// The session for `spec`: the warm one built from the same spec, or a
    /// new one (then the least recently used is let go past
    /// [`WARM_SESSIONS`]).
    ///
    /// # Errors
    ///
    /// What [`build_worker_session`] reports.
    pub async fn session(&mut self, plugin: &Plugin, spec: &SessionSpec) -> Result<&DfxSession> {
        // The whole spec is the key: two queries differ at least in their
        // shuffle location, which travels in the session's config.
        let key = spec.to_json();
        let entry = match self.warm.iter().position(|(k, _)| *k == key) {
            Some(at) => self.warm.remove(at),
            None => (key, build_worker_session(plugin, spec).await?),
        };
        self.warm.push(entry);
        if self.warm.len() > WARM_SESSIONS {
            self.warm.remove(0);
        }
        // Just pushed, so never empty.
        Ok(&self.warm[self.warm.len() - 1].1)
    }

    /// Sessions kept built.
    pub fn len(&self) -> usize {
        self.warm.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.warm.is_empty()
    }
}

/// Serve request lines from `requests` until it ends, writing one response
/// line to `out` for each: the runtime's serve loop
/// ([`dfx_runtime::protocol::serve::serve`]), each task run by [`respond`]
/// with the warm sessions of one [`SessionCache`].
///
/// # Errors
///
/// Only when a request cannot be read (stdin) or `out` cannot be written
/// (the driver is gone); a task that fails is its response, and serving
/// goes on.
pub async fn serve(
    plugin: &Plugin,
    mut requests: tokio::sync::mpsc::Receiver<std::io::Result<String>>,
    out: &mut impl Write,
) -> Result<()> {
    let mut cache = SessionCache::default();
    let requests = futures::stream::poll_fn(|cx| requests.poll_recv(cx));
    serve_requests(Some(plugin), requests, out, async |envelope| {
        respond(plugin, &mut cache, envelope).await
    })
    .await?;
    Ok(())
}

/// Run the task of the envelope file `path` (process mode): its response,
/// for the caller to write as the last line of stdout
/// ([`dfx_runtime::protocol::serve::write_response`]). A file that cannot
/// be read is an unknown task's response ([`read_task_file`]).
pub async fn run_envelope_file(plugin: &Plugin, path: &Path) -> Response {
    match read_task_file(path) {
        Ok(envelope) => respond(plugin, &mut SessionCache::default(), envelope).await,
        Err(unknown) => unknown,
    }
}

/// The lines of this process's stdin, read on their own thread so the
/// runtime (and a Ctrl-C handler) is never blocked by a read. The channel
/// ends at end of input, or after a read error (sent on, for [`serve`] to
/// report).
pub fn stdin_lines() -> tokio::sync::mpsc::Receiver<std::io::Result<String>> {
    let (sender, receiver) = tokio::sync::mpsc::channel(16);
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let failed = line.is_err();
            if sender.blocking_send(line).is_err() || failed {
                break;
            }
        }
    });
    receiver
}

/// Steps 2 and 3: the runtime's checks (the vet once per stage and
/// session), then the decode (the kept stage when it may serve this map)
/// and the check that its root is a writer.
///
/// # Errors
///
/// The first check that fails, or bytes that do not decode; each names the
/// stage, the map and the plan file.
pub fn decode_checked(session: &DfxSession, task: &TaskInput) -> Result<Arc<dyn ExecutionPlan>> {
    let envelope = &task.envelope;
    let plan_file = envelope.plan.display();
    let plugin = session.plugin();
    let codec_ids = session.codec_ids();
    // The vet walks the whole plan and depends only on the bytes and the
    // spec, so a serving worker vets a stage once, not once per map; the
    // cheap checks run for every envelope.
    let vetted = session.is_vetted(&task.plan);
    check_task(plugin, task, &codec_ids, !vetted).map_err(HostError::Invalid)?;
    if !vetted {
        session.mark_vetted(&task.plan);
    }
    let cannot =
        |err: String| HostError::Invalid(format!("{}: plan {plan_file}: {err}", task.name()));
    // A map running a slice runs its partitions at once on the plugin's
    // runtime, where only the plugin's own operators may run: the plugin
    // decodes the stage's input itself. The plugin tells from the bytes
    // (bytes it cannot read are left to the decode to refuse); one built
    // before it could is asked by the decoded stage.
    let runs_slices = plugin
        .stage_runs_slices(&task.plan)
        .and_then(std::result::Result::ok);
    let sealed = || {
        plugin
            .seal_stage_input(&task.plan)
            .map_err(HostError::Invalid)
            .and_then(|sealed| session.decode(&sealed))
            .map_err(|err| {
                cannot(format!(
                    "cannot seal the input of a stage whose maps run slices: {err}"
                ))
            })
    };
    if runs_slices == Some(true) {
        return checked_stage(plugin, task, sealed()?);
    }
    // Under a memory limit each task's pool must account for all its task
    // holds, so no task inherits a build side another task's pool reserved.
    let stage = match session.spec().memory_limit {
        None => session.decode_stage_for_map(&task.plan, task.written, envelope.planned_map()),
        Some(_) => session.decode(&task.plan),
    }
    .map_err(|err| cannot(err.to_string()))?;
    let stage = match runs_slices {
        None if runs_a_slice(&stage) => sealed()?,
        _ => stage,
    };
    checked_stage(plugin, task, stage)
}

/// `stage` when its root is the plugin's writer, else why not.
fn checked_stage(
    plugin: &Plugin,
    task: &TaskInput,
    stage: Arc<dyn ExecutionPlan>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let plan_file = task.envelope.plan.display();
    // By the node's name, which a foreign node answers with its plugin
    // node's own (the plugin's exported stage node name); the display is
    // only for the message.
    if stage.name() != plugin.stage_node_name() {
        let display = node_display(stage.as_ref());
        return Err(HostError::Invalid(format!(
            "{}: plan {plan_file} is not a stage: its root is {display:?}, not a {}",
            task.name(),
            plugin.stage_node_name()
        )));
    }
    Ok(stage)
}

/// Whether each map of `stage` (a writer) runs several of its input's
/// partitions: it has fewer maps than its input has partitions.
fn runs_a_slice(stage: &Arc<dyn ExecutionPlan>) -> bool {
    let maps = stage.output_partitioning().partition_count();
    stage
        .children()
        .first()
        .is_some_and(|input| input.output_partitioning().partition_count() > maps)
}

/// Execute the envelope's map of `stage` and drain it (step 5); returns the
/// rows and bytes the writer published, summed over its summary's buckets.
///
/// # Errors
///
/// Whatever the writer reports (an upstream file missing, a failed
/// publish), or a summary without its `rows` column.
pub async fn run_map(
    session: &DfxSession,
    stage: &Arc<dyn ExecutionPlan>,
    envelope: &Envelope,
) -> Result<Published> {
    let task = format!("stage {} map {}", envelope.stage_id, envelope.partition);
    let ctx = session.stage_task_ctx();
    // With a memory limit, the stage's operators run with a pool (see
    // `crate::worker::memory` for why below the root rather than at it).
    let (stage, ctx) = match session.spec().memory_limit {
        None => (Arc::clone(stage), ctx),
        Some(limit) => {
            let ctx = limited_context(&ctx, limit)
                .context(|| format!("{task}: cannot set up the memory limit"))?;
            let bound = bind_below_root(stage, Arc::clone(&ctx))
                .context(|| format!("{task}: cannot set up the memory limit"))?;
            (bound, ctx)
        }
    };
    let mut stream = stage
        .execute(envelope.planned_map(), ctx)
        .context(|| format!("{task}: cannot start"))?;
    let mut published = Published {
        rows: 0,
        bytes: Some(0),
        layout: None,
    };
    let mut summary = Vec::new();
    while let Some(batch) = stream.next().await {
        let batch = batch.context(|| format!("{task}: failed"))?;
        published.rows +=
            summary_rows(&batch).map_err(|err| HostError::Invalid(format!("{task}: {err}")))?;
        published.bytes = match (published.bytes, summary_bytes(&batch)) {
            (Some(sum), Some(bytes)) => Some(sum + bytes),
            _ => None,
        };
        summary.push(batch);
    }
    published.layout = MapLayout::from_summary(&summary);
    Ok(published)
}

/// The bytes a writer's summary batch accounts for: the sum of its `bytes`
/// column, `None` if it has no UInt64 one.
pub fn summary_bytes(batch: &RecordBatch) -> Option<u64> {
    let column = batch
        .column_by_name(SUMMARY_BYTES_COLUMN)?
        .as_any()
        .downcast_ref::<UInt64Array>()?;
    Some(column.iter().map(Option::unwrap_or_default).sum())
}

/// The rows a writer's summary batch accounts for: the sum of its `rows`
/// column (one row per bucket).
///
/// # Errors
///
/// A batch without a UInt64 `rows` column, described with its schema.
pub fn summary_rows(batch: &RecordBatch) -> std::result::Result<usize, String> {
    let column = batch
        .column_by_name(SUMMARY_ROWS_COLUMN)
        .and_then(|c| c.as_any().downcast_ref::<UInt64Array>())
        .ok_or_else(|| {
            format!(
                "the writer's summary has no UInt64 {SUMMARY_ROWS_COLUMN:?} column; its schema \
                 is {}",
                batch.schema()
            )
        })?;
    Ok(column
        .iter()
        .map(|rows| rows.unwrap_or_default() as usize)
        .sum())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Int64Array, UInt64Array};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    #[test]
    fn a_summary_counts_the_rows_of_every_bucket() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("bucket", DataType::UInt64, false),
            Field::new("rows", DataType::UInt64, false),
            Field::new("bytes", DataType::UInt64, false),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(UInt64Array::from(vec![0, 1, 2])),
                Arc::new(UInt64Array::from(vec![5, 0, 7])),
                Arc::new(UInt64Array::from(vec![500, 0, 700])),
            ],
        )
        .unwrap();
        assert_eq!(summary_rows(&batch), Ok(12));
        assert_eq!(summary_bytes(&batch), Some(1200));

        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
        let not_a_summary =
            RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![3]))]).unwrap();
        assert_eq!(summary_bytes(&not_a_summary), None);
        let err = summary_rows(&not_a_summary).unwrap_err();
        assert!(err.contains("no UInt64 \"rows\" column"), "{err}");
    }
}
