//! A worker's checks of a task before anything is decoded from it: the one
//! definition, called by the workers of both hosts.
//!
//! An envelope is code, and bytes decoded by the wrong codecs are misread
//! rather than refused, so in this order:
//!
//! 1. the session's codec ids equal the ones the driver encoded with;
//! 2. the encoded stage (read by the plugin without decoding) is the
//!    envelope's stage, publishes into the spec's shuffle location (a plan
//!    must not make a worker write outside its query's location), and has
//!    the envelope's map;
//! 3. the plugin vets it: no sink, no file outside the spec's tables, no
//!    writer aimed elsewhere, no extension node that is not dfx's, no scan
//!    cut for another map than the envelope's.

use std::path::Path;
use std::time::SystemTime;

use abi_stable::std_types::{RResult, RSlice, RStr};
use dfx_abi::Plugin;

use crate::error::Result;
use crate::protocol::envelope::Envelope;
use crate::protocol::stage_file;
use crate::spec::location::same_location;

/// A task as a worker receives it: its envelope and its encoded stage.
#[derive(Debug, Clone)]
pub struct TaskInput {
    /// The envelope.
    pub envelope: Envelope,
    /// The encoded stage the envelope's `plan` names.
    pub plan: Vec<u8>,
    /// When the driver wrote the plan file, if known: a serving worker keeps
    /// a decoded stage only for the same bytes written at the same time.
    pub written: Option<SystemTime>,
}

impl TaskInput {
    /// Read the encoded stage `envelope.plan` names, as the envelope's map
    /// runs it: a stage cut for its maps is read in part, the shared part
    /// and this map's files, and put together by `plugin` (see
    /// [`crate::protocol::stage_file`]).
    ///
    /// # Errors
    ///
    /// A plan file that cannot be read, or a stage file without this map's
    /// files; named.
    pub fn read(plugin: &Plugin, envelope: Envelope) -> Result<Self> {
        // Taken first: a serving worker keeps a decoded stage only for the
        // same bytes written at the same time.
        let written = std::fs::metadata(&envelope.plan)
            .and_then(|meta| meta.modified())
            .ok();
        let plan =
            stage_file::read_task_plan(plugin, &envelope.plan, envelope.planned_map() as u64)?;
        Ok(Self {
            envelope,
            plan,
            written,
        })
    }

    /// The task of `envelope` from its plan handed over by value (a plain
    /// plan, a stage file or its copy for this map), as [`Self::read`]
    /// would read it from the file.
    ///
    /// # Errors
    ///
    /// A stage file without this map's files, or files the plugin refuses.
    pub fn from_bytes(plugin: &Plugin, envelope: Envelope, plan: Vec<u8>) -> Result<Self> {
        let plan = stage_file::task_plan_from_bytes(plugin, plan, envelope.planned_map() as u64)?;
        Ok(Self {
            envelope,
            plan,
            written: None,
        })
    }

    /// `stage S map M`, as every message of the task begins.
    pub fn name(&self) -> String {
        format!(
            "stage {} map {}",
            self.envelope.stage_id, self.envelope.partition
        )
    }
}

/// Check `task` before it is decoded, in a session carrying `codec_ids`:
/// steps 1 and 2 of this module, then step 3 when `vet` (a worker that
/// vetted the same bytes in the same session may skip it).
///
/// # Errors
///
/// The first check that fails, naming stage, map and plan file, what was
/// expected and what was found.
pub fn check_task(
    plugin: &Plugin,
    task: &TaskInput,
    codec_ids: &[String],
    vet: bool,
) -> std::result::Result<(), String> {
    let envelope = &task.envelope;
    let name = task.name();
    let plan_file = envelope.plan.display();
    if codec_ids != envelope.spec.codec_ids.as_slice() {
        return Err(format!(
            "{name}: refusing to decode {plan_file}: it was encoded with codec ids {:?} but this \
             worker's session carries {codec_ids:?}",
            envelope.spec.codec_ids
        ));
    }
    let info = plugin
        .encoded_stage_info(&task.plan)
        .map_err(|err| format!("{name}: plan {plan_file}: {}", err.strip_backtrace()))?;
    if info.stage_id != envelope.stage_id {
        return Err(format!(
            "{name}: plan {plan_file} holds stage {}, not the envelope's stage {}",
            info.stage_id, envelope.stage_id
        ));
    }
    let Some(expected) = envelope.spec.shuffle_dir.as_deref() else {
        return Err(format!(
            "{name}: the envelope's spec has no shuffle directory, so no stage may run"
        ));
    };
    // Compared as locations: `file:///x` is `/x`, a trailing `/` does not
    // count, and an `s3://` URL keeps its `//`.
    if !same_location(Path::new(info.shuffle_dir.as_str()), expected) {
        return Err(format!(
            "{name}: refusing a stage whose shuffle directory differs from the envelope's: the \
             stage names {}, the envelope's spec {}; a plan must not make a worker write outside \
             its query's directory",
            info.shuffle_dir,
            expected.display()
        ));
    }
    if envelope.planned_map() as u64 >= info.maps {
        return Err(format!(
            "{name}: map {} out of range; the stage in {plan_file} has {} map(s)",
            envelope.planned_map(),
            info.maps
        ));
    }
    if envelope.added_from.is_some() && (envelope.partition as u64) < info.maps {
        return Err(format!(
            "{name}: the envelope says the map was added to the stage, but the stage in \
             {plan_file} plans it (of {} map(s))",
            info.maps
        ));
    }
    if vet {
        vet_stage(plugin, task, &expected.display().to_string())
            .map_err(|err| format!("{name}: plan {plan_file}: {err}"))?;
    }
    Ok(())
}

/// The plugin's vet of `task`'s plan, told the envelope's map as well as
/// its tables and location, so a scan cut for another map is refused too.
fn vet_stage(
    plugin: &Plugin,
    task: &TaskInput,
    shuffle_dir: &str,
) -> std::result::Result<(), String> {
    let Some(vet) = plugin.module().vet_stage() else {
        return Err(format!(
            "the plugin {} cannot vet a stage (built before vet_stage); a worker runs no stage \
             it cannot vet",
            plugin.path().display()
        ));
    };
    let allowed = serde_json::json!({
        "tables": task.envelope.spec.table_roots(),
        "shuffle_dir": shuffle_dir,
        "map": task.envelope.planned_map(),
    })
    .to_string();
    match vet(RSlice::from_slice(&task.plan), RStr::from_str(&allowed)) {
        RResult::ROk(()) => Ok(()),
        RResult::RErr(message) => Err(format!(
            "dfx plugin {}: stage check failed: {message}",
            plugin.path().display()
        )),
    }
}
