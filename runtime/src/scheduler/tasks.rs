//! The tasks of a query as files and envelopes: each stage's plan file,
//! one envelope per map (inline, or a file beside the plan), and the
//! rewrites an adaptive decision makes of them before any attempt starts.
//! Both files are named by the protocol ([`plan_path`], [`envelope_path`]),
//! never here.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::error::{Result, RuntimeError};
use crate::protocol::envelope::{Envelope, envelope_path, plan_path};
use crate::scheduler::graph::EncodedStage;
use crate::scheduler::task::Task;
use crate::spec::SessionSpec;

/// Write every stage's plan file into `task_dir` and make one task per map:
/// its envelope inline, or written as a file when `envelope_files`. Tasks in
/// pre-order of their stages, maps ascending.
pub(crate) fn write_tasks(
    spec: &SessionSpec,
    task_dir: &Path,
    stages: &[EncodedStage],
    envelope_files: bool,
) -> Result<Vec<Task>> {
    // The driver's scratch lives in its own directory, never beside stage
    // output.
    std::fs::create_dir_all(task_dir)
        .map_err(|e| RuntimeError::io("cannot create", task_dir, e))?;
    let mut tasks = Vec::new();
    for stage in stages {
        let stage_id = stage.info.stage_id;
        let plan_file = plan_path(task_dir, stage_id);
        std::fs::write(&plan_file, &stage.bytes)
            .map_err(|e| RuntimeError::io("cannot write", &plan_file, e))?;
        for map in 0..stage.info.maps {
            let envelope = Envelope {
                spec: spec.clone(),
                plan: plan_file.clone(),
                stage_id,
                partition: map,
                attempt: 0,
                added_from: None,
            };
            let path = envelope_path(task_dir, stage_id, map);
            let inline = if envelope_files {
                envelope.write(&path)?;
                None
            } else {
                Some(Arc::new(envelope))
            };
            tasks.push(Task {
                stage_id,
                map,
                envelope: path,
                inline,
            });
        }
    }
    Ok(tasks)
}

/// A task of `like`'s stage running as map `map`, told `settings`: its
/// own envelope (inline, or a file beside `like`'s).
pub(crate) fn added_task(
    like: &Task,
    map: usize,
    settings: &BTreeMap<String, String>,
) -> Result<Task> {
    let mut envelope = like.read_envelope()?;
    envelope.added_from = Some(envelope.planned_map());
    envelope.partition = map;
    envelope.attempt = 0;
    envelope.spec.stage_options = settings.clone();
    let dir = like.envelope.parent().unwrap_or_else(|| Path::new(""));
    let path = envelope_path(dir, like.stage_id, map);
    if like.inline.is_some() {
        return Ok(Task {
            stage_id: like.stage_id,
            map,
            envelope: path,
            inline: Some(Arc::new(envelope)),
        });
    }
    envelope.write(&path)?;
    Ok(Task {
        stage_id: like.stage_id,
        map,
        envelope: path,
        inline: None,
    })
}

/// Put back the envelope file of `original` (an inline one has none).
pub(crate) fn restore(original: &Task) {
    if original.inline.is_some() {
        return;
    }
    if let Ok(mut envelope) = original.read_envelope() {
        envelope.spec.stage_options.clear();
        let _ = envelope.write(&original.envelope);
    }
}

/// `task` with its envelope's spec carrying `settings` as stage options:
/// a new inline envelope, or its envelope file rewritten (no attempt of it
/// has started).
pub(crate) fn with_stage_options(task: &Task, settings: &BTreeMap<String, String>) -> Result<Task> {
    let mut envelope = task.read_envelope()?;
    envelope.spec.stage_options = settings.clone();
    if task.inline.is_some() {
        return Ok(Task {
            inline: Some(Arc::new(envelope)),
            ..task.clone()
        });
    }
    envelope.write(&task.envelope)?;
    Ok(task.clone())
}
