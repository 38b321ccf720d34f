//! The worker: run one task, publish its partition, report.
//!
//! Steps, in the order DESIGN.md fixes (each check before the work it guards):
//!
//! 1. build the session from the envelope's spec (the driver's factory);
//! 2. check the session's codec ids equal the envelope's — *before* decoding,
//!    since bytes decoded by the wrong codecs are misread, not rejected;
//! 3. decode the stage;
//! 4. check the partition is one the stage has;
//! 5. check the stage publishes into the envelope's shuffle directory, so a
//!    plan cannot make a worker write outside its query's directory;
//! 6. execute the partition and drain it: the stage node writes its file;
//! 7. report `{"stage_id", "partition", "rows"}`.

use std::path::Path;
use std::sync::Arc;

use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use dfx_abi::Plugin;
use futures::StreamExt;

use crate::envelope::{Envelope, WorkerReport};
use crate::error::{DataFusionContext, HostError, Result};
use crate::session::{DfxSession, build_session};
use crate::stages::node_display;

/// Run the task `envelope` describes and return its report.
///
/// # Errors
///
/// Each refusal names the stage, the partition and what disagreed; a failure
/// while executing carries DataFusion's or the plugin's message.
pub async fn run_task(plugin: &Plugin, envelope: &Envelope) -> Result<WorkerReport> {
    let (stage_id, partition) = (envelope.stage_id, envelope.partition);
    let task = format!("stage {stage_id} partition {partition}");

    let session = build_session(plugin, &envelope.spec).await?;
    if session.codec_ids() != envelope.spec.codec_ids {
        return Err(HostError::Invalid(format!(
            "{task}: refusing to decode {}: it was encoded with codec ids {:?} but this worker's \
             session carries {:?}",
            envelope.plan.display(),
            envelope.spec.codec_ids,
            session.codec_ids()
        )));
    }

    let bytes = std::fs::read(&envelope.plan)
        .map_err(|e| HostError::io("cannot read plan", &envelope.plan, e))?;
    let stage = session.decode(&bytes).map_err(|err| {
        HostError::Invalid(format!("{task}: plan {}: {err}", envelope.plan.display()))
    })?;
    let display = node_display(stage.as_ref());
    if !display.contains(plugin.stage_node_name()) {
        return Err(HostError::Invalid(format!(
            "{task}: plan {} is not a stage: its root is {display:?}",
            envelope.plan.display()
        )));
    }
    let partitions = stage.output_partitioning().partition_count();
    if partition >= partitions {
        return Err(HostError::Invalid(format!(
            "{task}: partition {partition} out of range; the stage in {} has {partitions} partition(s)",
            envelope.plan.display()
        )));
    }
    check_shuffle_dir(&session, &stage, &task)?;

    let mut stream = stage
        .execute(partition, session.ctx().task_ctx())
        .context(|| format!("{task}: cannot start"))?;
    let mut rows = 0;
    while let Some(batch) = stream.next().await {
        rows += batch.context(|| format!("{task}: failed"))?.num_rows();
    }
    Ok(WorkerReport {
        stage_id,
        partition,
        rows,
    })
}

/// Refuse a stage that would publish outside the envelope's shuffle directory.
///
/// The stage node keeps its directory inside itself (it travelled in the
/// encoded plan), and across FFI the host sees only the node's name, so the
/// plugin is asked what its node carries.
fn check_shuffle_dir(
    session: &DfxSession,
    stage: &Arc<dyn ExecutionPlan>,
    task: &str,
) -> Result<()> {
    let expected = session.spec().shuffle_dir.as_deref().ok_or_else(|| {
        HostError::Invalid(format!(
            "{task}: the envelope's spec has no shuffle directory, so no stage may run"
        ))
    })?;
    let info = session
        .plugin()
        .stage_info(stage)
        .context(|| format!("{task}: cannot read the stage's shuffle directory"))?;
    if Path::new(info.shuffle_dir.as_str()) == expected {
        return Ok(());
    }
    Err(HostError::Invalid(format!(
        "{task}: refusing a stage whose shuffle directory differs from the envelope's: the \
         stage names {}, the envelope's spec {}; a plan must not make a worker write outside \
         its query's directory",
        info.shuffle_dir,
        expected.display()
    )))
}
