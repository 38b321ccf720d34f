//! The worker: run one map task of one stage, publish its buckets, report.
//!
//! Steps, in the order DESIGN.md fixes (each check before the work it guards):
//!
//! 1. build the session from the envelope's spec (the driver's factory,
//!    without registering the tables: a stage carries its scans whole);
//! 2. check the session's codec ids equal the envelope's — *before* decoding,
//!    since bytes decoded by the wrong codecs are misread, not rejected;
//! 3. have the plugin vet the encoded stage (no sink, no file outside the
//!    spec's tables, no writer aimed elsewhere, no foreign extension node:
//!    an envelope is code), then decode it and check its root is the
//!    plugin's writer;
//! 4. check, with the plugin's description of that writer, that it is the
//!    envelope's stage, that it publishes into the envelope's shuffle
//!    directory (a plan cannot make a worker write outside its query's
//!    directory) and that the map is one it has;
//! 5. execute the map and drain it: the writer reads its upstream buckets,
//!    runs the stage, publishes `stage-S/map-M.arrow` (its buckets, closed by
//!    the commit marker), and yields one summary batch;
//! 6. report `{"stage_id", "partition", "rows", "bytes", "elapsed_ms"}`,
//!    rows and bytes summed over the summary's buckets.
//!
//! [`serve`] runs the same steps for one task after another in one process
//! (`dfx worker --serve`, the serve protocol in [`crate::envelope`]): the
//! plugin is loaded once, and the last sessions built stay warm for the next
//! tasks of the same query.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use datafusion::arrow::array::{Array, UInt64Array};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::physical_plan::ExecutionPlan;
use futures::StreamExt;

use crate::Plugin;
use crate::envelope::{Envelope, ServeRequest, ServeResponse, TaskError, WorkerReport};
use crate::error::{DataFusionContext, HostError, Result};
use crate::memory::{bind_below_root, limited_context};
use crate::session::{DfxSession, build_worker_session};
use crate::stages::node_display;

/// Name of the column of a writer's summary batch holding each bucket's rows.
pub const SUMMARY_ROWS_COLUMN: &str = "rows";

/// Name of the column of a writer's summary batch holding each bucket's bytes.
pub const SUMMARY_BYTES_COLUMN: &str = "bytes";

/// Sessions a serving worker keeps built: the current query's, and the one
/// before it (a driver running two queries at once alternates). More would
/// only hold memory for queries that are over.
pub const WARM_SESSIONS: usize = 2;

/// What one map published, from the writer's summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Published {
    /// Rows, over every bucket.
    pub rows: usize,
    /// Bytes, over every bucket; `None` when the summary has no bytes column.
    pub bytes: Option<u64>,
}

/// Run the task `envelope` describes and return its report.
///
/// # Errors
///
/// Each refusal names the stage, the map and what disagreed; a failure
/// while executing carries DataFusion's or the plugin's message.
pub async fn run_task(plugin: &Plugin, envelope: &Envelope) -> Result<WorkerReport> {
    let started = Instant::now();
    let session = build_worker_session(plugin, &envelope.spec).await?;
    run_in_session(&session, envelope, started).await
}

/// Steps 2 to 6 in a session already built from the envelope's spec;
/// `elapsed_ms` counts from `started`.
async fn run_in_session(
    session: &DfxSession,
    envelope: &Envelope,
    started: Instant,
) -> Result<WorkerReport> {
    let plan = read_plan(session, envelope)?;
    let published = match decode_stage(session, envelope, &plan) {
        Ok(stage) => run_map(session, &stage, envelope).await,
        Err(err) => Err(err),
    };
    let published = published.inspect_err(|_| session.forget_stage())?;
    Ok(WorkerReport {
        stage_id: envelope.stage_id,
        partition: envelope.partition,
        rows: published.rows,
        bytes: published.bytes,
        elapsed_ms: Some(started.elapsed().as_secs_f64() * 1e3),
    })
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
    pub async fn session(
        &mut self,
        plugin: &Plugin,
        spec: &crate::SessionSpec,
    ) -> Result<&DfxSession> {
        // The whole spec is the key: two queries differ at least in their
        // shuffle directory, which travels in the session's config.
        let key = serde_json::to_string(spec).unwrap_or_default();
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

/// Answer one serve request line: run its task (steps 1 to 6, the session
/// taken from `cache`) and return the response. Never fails: a task that
/// cannot run is an error response, and the worker serves the next one.
pub async fn serve_one(plugin: &Plugin, cache: &mut SessionCache, line: &str) -> ServeResponse {
    let started = Instant::now();
    let unknown = |error: String| {
        ServeResponse::Error(TaskError {
            stage_id: None,
            partition: None,
            error,
        })
    };
    let request: ServeRequest = match serde_json::from_str(line.trim()) {
        Ok(request) => request,
        Err(err) => {
            return unknown(format!(
                "cannot read the request {:.200?}: {err}; expected {{\"envelope\": \"<path>\"}} \
                 or {{\"task\": {{<envelope>}}}}",
                line.trim()
            ));
        }
    };
    let envelope = match request.envelope() {
        Ok(envelope) => envelope,
        Err(err) => return unknown(err.to_string()),
    };
    let outcome = match cache.session(plugin, &envelope.spec).await {
        Ok(session) => run_in_session(session, &envelope, started).await,
        Err(err) => Err(err),
    };
    match outcome {
        Ok(report) => ServeResponse::Report(report),
        Err(err) => ServeResponse::Error(TaskError {
            stage_id: Some(envelope.stage_id),
            partition: Some(envelope.partition),
            error: err.to_string(),
        }),
    }
}

/// Serve requests (`{"envelope": "<path>"}`, one per line) from `requests`
/// until it ends, writing one response line to `out` for each: the serve
/// protocol of [`crate::envelope`]. Blank lines are skipped.
///
/// # Errors
///
/// Only when `out` cannot be written (the driver is gone).
pub async fn serve(
    plugin: &Plugin,
    mut requests: tokio::sync::mpsc::Receiver<String>,
    out: &mut impl Write,
) -> Result<()> {
    let mut cache = SessionCache::default();
    while let Some(line) = requests.recv().await {
        if line.trim().is_empty() {
            continue;
        }
        let response = serve_one(plugin, &mut cache, &line).await;
        // One whole line, flushed: the driver waits for it.
        writeln!(out, "{}", response.to_line())
            .and_then(|()| out.flush())
            .map_err(|e| HostError::io("cannot write the response to", "stdout", e))?;
    }
    Ok(())
}

/// The lines of this process's stdin, read on their own thread so the
/// runtime (and a Ctrl-C handler) is never blocked by a read. The channel
/// ends at end of input or on a read error.
pub fn stdin_lines() -> tokio::sync::mpsc::Receiver<String> {
    let (sender, receiver) = tokio::sync::mpsc::channel(16);
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if sender.blocking_send(line).is_err() {
                break;
            }
        }
    });
    receiver
}

fn task_name(envelope: &Envelope) -> String {
    format!("stage {} map {}", envelope.stage_id, envelope.partition)
}

/// Check the session's codec ids against the envelope's, then read the
/// encoded stage (steps 2 and the read of 3).
///
/// # Errors
///
/// Codec ids that differ (named, before any byte is decoded) or a plan file
/// that cannot be read.
pub fn read_plan(session: &DfxSession, envelope: &Envelope) -> Result<PlanFile> {
    if session.codec_ids() != envelope.spec.codec_ids {
        return Err(HostError::Invalid(format!(
            "{}: refusing to decode {}: it was encoded with codec ids {:?} but this worker's \
             session carries {:?}",
            task_name(envelope),
            envelope.plan.display(),
            envelope.spec.codec_ids,
            session.codec_ids()
        )));
    }
    let read = || -> std::io::Result<PlanFile> {
        let mut file = std::fs::File::open(&envelope.plan)?;
        let written = file.metadata().and_then(|meta| meta.modified()).ok();
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(PlanFile { bytes, written })
    };
    read().map_err(|e| HostError::io("cannot read plan", &envelope.plan, e))
}

/// An encoded stage as read from its plan file.
#[derive(Debug, Clone)]
pub struct PlanFile {
    /// The encoded stage.
    pub bytes: Vec<u8>,
    /// When the driver wrote the file, if the file system says (see
    /// [`DfxSession::decode_stage_for_map`]).
    pub written: Option<SystemTime>,
}

/// Decode the stage and check it against the envelope (steps 3 and 4).
///
/// # Errors
///
/// Bytes that do not decode, a root that is not a writer, or a writer whose
/// id, shuffle directory or map count disagrees with the envelope.
pub fn decode_stage(
    session: &DfxSession,
    envelope: &Envelope,
    plan: &PlanFile,
) -> Result<Arc<dyn ExecutionPlan>> {
    let bytes = plan.bytes.as_slice();
    let task = task_name(envelope);
    let plan_file = envelope.plan.display();
    // An envelope is code: before anything is built from it, the plugin
    // checks the stage reads only the spec's tables and shuffle location and
    // writes only through its writer.
    let spec = session.spec();
    let tables: Vec<PathBuf> = spec.tables.values().cloned().collect();
    let shuffle_dir = spec
        .shuffle_dir
        .as_deref()
        .map(|dir| dir.display().to_string())
        .unwrap_or_default();
    session
        .vet_once(bytes, || {
            session.plugin().vet_stage(bytes, &tables, &shuffle_dir)
        })
        .map_err(|err| {
            HostError::Invalid(format!(
                "{task}: plan {plan_file}: {}",
                err.strip_backtrace()
            ))
        })?;
    // Under a memory limit each task's pool must account for all its task
    // holds, so no task inherits a build side another task's pool reserved.
    let stage = match spec.memory_limit {
        None => session.decode_stage_for_map(bytes, plan.written, envelope.partition),
        Some(_) => session.decode(bytes),
    }
    .map_err(|err| HostError::Invalid(format!("{task}: plan {plan_file}: {err}")))?;
    check_stage(session, envelope, &stage)?;
    Ok(stage)
}

fn check_stage(
    session: &DfxSession,
    envelope: &Envelope,
    stage: &Arc<dyn ExecutionPlan>,
) -> Result<()> {
    let task = task_name(envelope);
    let plan_file = envelope.plan.display();
    let plugin = session.plugin();
    let display = node_display(stage.as_ref());
    if !display.contains(plugin.stage_node_name()) {
        return Err(HostError::Invalid(format!(
            "{task}: plan {plan_file} is not a stage: its root is {display:?}, not a {}",
            plugin.stage_node_name()
        )));
    }
    // Across FFI the host sees only the node's name; what the writer carries
    // (it travelled inside the encoded plan) is the plugin's to say.
    let info = plugin
        .stage_info(stage)
        .context(|| format!("{task}: cannot describe the stage in {plan_file}"))?;
    if info.stage_id != envelope.stage_id {
        return Err(HostError::Invalid(format!(
            "{task}: plan {plan_file} holds stage {}, not the envelope's stage {}",
            info.stage_id, envelope.stage_id
        )));
    }
    let expected = session.spec().shuffle_dir.as_deref().ok_or_else(|| {
        HostError::Invalid(format!(
            "{task}: the envelope's spec has no shuffle directory, so no stage may run"
        ))
    })?;
    // Compared as locations: `file:///x` is `/x`, and an `s3://` URL keeps
    // its `//` (as a path, `s3://b` and `s3:/b` would be equal).
    if !crate::store::same_location(Path::new(info.shuffle_dir.as_str()), expected) {
        return Err(HostError::Invalid(format!(
            "{task}: refusing a stage whose shuffle directory differs from the envelope's: the \
             stage names {}, the envelope's spec {}; a plan must not make a worker write outside \
             its query's directory",
            info.shuffle_dir,
            expected.display()
        )));
    }
    if envelope.partition as u64 >= info.maps {
        return Err(HostError::Invalid(format!(
            "{task}: map {} out of range; the stage in {plan_file} has {} map(s)",
            envelope.partition, info.maps
        )));
    }
    Ok(())
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
    let task = task_name(envelope);
    let ctx = session.stage_task_ctx();
    // With a memory limit, the stage's operators run with a pool (see
    // `crate::memory` for why below the root rather than at it).
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
        .execute(envelope.partition, ctx)
        .context(|| format!("{task}: cannot start"))?;
    let mut published = Published {
        rows: 0,
        bytes: Some(0),
    };
    while let Some(batch) = stream.next().await {
        let batch = batch.context(|| format!("{task}: failed"))?;
        published.rows +=
            summary_rows(&batch).map_err(|err| HostError::Invalid(format!("{task}: {err}")))?;
        published.bytes = match (published.bytes, summary_bytes(&batch)) {
            (Some(sum), Some(bytes)) => Some(sum + bytes),
            _ => None,
        };
    }
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
