//! Finding the stages the plugin's planner cut a plan into, and showing them.
//!
//! Glossary: a **stage** is a subtree whose root is the plugin's writer node
//! (`ShuffleWriterExec`); it runs as one **map task** per partition of its
//! input, each task in its own worker process, and each map splits its rows
//! into **buckets**. A consumer reads a stage through a reader node
//! (`ShuffleReaderExec`) whose only child is that writer, so stages nest:
//!
//! ```text
//! root (driver) ── reader ── writer S1 (deps [2]) ── ... ── reader ── writer S2 (deps [])
//! ```
//!
//! Stages are found by the rule every host shares, [`dfx_abi::stages`]: by
//! containment of the plugin's node name in a node's display, in pre-order,
//! descending into stages, so the n-th writer found has the id
//! `plugin.stage_id(n)`. Everything else about a stage (maps, buckets, the
//! stages it reads) is asked of the plugin, never read off a display string.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use dfx_abi::Plugin;
pub use dfx_abi::stages::{find_stages, node_display};
use serde::Serialize;

use crate::error::{DataFusionContext, HostError, Result};

/// What the plugin says about one stage: everything a driver schedules by.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StageInfo {
    /// The id the planner gave the writer (checked against its position).
    pub stage_id: u64,
    /// The shuffle directory the writer publishes into.
    pub shuffle_dir: PathBuf,
    /// Map tasks: one per partition of the writer's input.
    pub maps: usize,
    /// Buckets each map splits its rows into.
    pub buckets: usize,
    /// Ids of the stages this one reads, ascending: it runs once all of them
    /// are published.
    pub deps: Vec<u64>,
    /// How rows are split into buckets, for display (`hash([k@0], 4)`, `single`).
    pub partitioning: String,
}

/// One stage of a plan: what the plugin says about it, and the writer node.
#[derive(Debug, Clone)]
pub struct Stage {
    /// Id, maps, buckets, deps.
    pub info: StageInfo,
    /// The writer node itself (the root of the stage).
    pub plan: Arc<dyn ExecutionPlan>,
}

impl Stage {
    /// The stage's id.
    pub fn stage_id(&self) -> u64 {
        self.info.stage_id
    }
}

/// The plan's stages in pre-order, each described by the plugin.
///
/// # Errors
///
/// A writer the plugin cannot describe, or whose id is not the one its
/// pre-order position gives (`plugin.stage_id(n)`): the host and the plugin
/// would then name different files for the same stage.
pub fn stages(plugin: &Plugin, plan: &Arc<dyn ExecutionPlan>) -> Result<Vec<Stage>> {
    let mut found = Vec::new();
    for (index, writer) in find_stages(plan, plugin.stage_node_name())
        .into_iter()
        .enumerate()
    {
        let expected = plugin.stage_id(index);
        let info = plugin.stage_info(&writer).context(|| {
            format!(
                "cannot describe stage {expected} (writer {} in pre-order: {})",
                index + 1,
                node_display(writer.as_ref())
            )
        })?;
        if info.stage_id != expected {
            return Err(HostError::Invalid(format!(
                "stage numbering disagrees: writer {} in pre-order should be stage {expected} \
                 but the plugin says it is stage {}; the host and the plugin would name \
                 different files for it",
                index + 1,
                info.stage_id
            )));
        }
        found.push(Stage {
            info: StageInfo {
                stage_id: info.stage_id,
                shuffle_dir: PathBuf::from(info.shuffle_dir.as_str()),
                maps: info.maps as usize,
                buckets: info.buckets as usize,
                deps: info.deps.iter().copied().collect(),
                partitioning: info.partitioning.into_string(),
            },
            plan: writer,
        });
    }
    Ok(found)
}

/// Group `stages` into waves: each wave holds every stage (in the order
/// given) whose deps are all in earlier waves.
///
/// # Errors
///
/// A dep that names no stage of the plan, or stages that can never run
/// (each waits for another); either would leave the driver waiting forever.
pub fn waves(stages: &[StageInfo]) -> Result<Vec<Vec<u64>>> {
    let known: BTreeSet<u64> = stages.iter().map(|s| s.stage_id).collect();
    for stage in stages {
        if let Some(missing) = stage.deps.iter().find(|d| !known.contains(d)) {
            return Err(HostError::Invalid(format!(
                "stage {} reads stage {missing}, which is not in the plan (stages {:?})",
                stage.stage_id, known
            )));
        }
    }
    let mut done = BTreeSet::new();
    let mut waves = Vec::new();
    while done.len() < stages.len() {
        let wave: Vec<u64> = stages
            .iter()
            .filter(|s| !done.contains(&s.stage_id) && s.deps.iter().all(|d| done.contains(d)))
            .map(|s| s.stage_id)
            .collect();
        if wave.is_empty() {
            let stuck: Vec<u64> = stages
                .iter()
                .map(|s| s.stage_id)
                .filter(|id| !done.contains(id))
                .collect();
            return Err(HostError::Invalid(format!(
                "stages {stuck:?} wait for each other and can never run"
            )));
        }
        done.extend(wave.iter().copied());
        waves.push(wave);
    }
    Ok(waves)
}

/// The plan, indented, with each writer marked with its stage id, maps,
/// buckets and deps, and each reader with the stage it reads and the
/// partitions it reads it into.
///
/// ```text
/// FFI_ExecutionPlan: ShuffleReaderExec, number_of_children=1    <-- reads stage 1 as 4 partition(s)
///   FFI_ExecutionPlan: ShuffleWriterExec, number_of_children=1    <== stage 1 (maps 4, buckets 1, single, deps [2])
/// ```
///
/// # Errors
///
/// What [`stages`] reports.
pub fn render_with_stages(plugin: &Plugin, plan: &Arc<dyn ExecutionPlan>) -> Result<String> {
    let stages = stages(plugin, plan)?;
    let mut out = String::new();
    render(plugin, plan, &stages, 0, &mut out);
    Ok(out)
}

fn render(
    plugin: &Plugin,
    plan: &Arc<dyn ExecutionPlan>,
    stages: &[Stage],
    depth: usize,
    out: &mut String,
) {
    let line = node_display(plan.as_ref());
    let _ = write!(out, "{:indent$}{line}", "", indent = depth * 2);
    if let Some(stage) = find(stages, plan) {
        let _ = write!(out, "    <== {}", describe(&stage.info));
    } else if let Some(stage) = read_by(plugin, plan, stages) {
        let _ = write!(
            out,
            "    <-- reads stage {} as {} partition(s)",
            stage.stage_id(),
            plan.output_partitioning().partition_count()
        );
    }
    out.push('\n');
    for child in plan.children() {
        render(plugin, child, stages, depth + 1, out);
    }
}

fn find<'a>(stages: &'a [Stage], plan: &Arc<dyn ExecutionPlan>) -> Option<&'a Stage> {
    stages.iter().find(|s| Arc::ptr_eq(&s.plan, plan))
}

/// The stage `plan` reads, when `plan` is one of the plugin's readers (its
/// only child is the writer of the stage it reads).
pub fn read_by<'a>(
    plugin: &Plugin,
    plan: &Arc<dyn ExecutionPlan>,
    stages: &'a [Stage],
) -> Option<&'a Stage> {
    let reader = plugin.reader_node_name()?;
    if !node_display(plan.as_ref()).contains(reader) {
        return None;
    }
    match plan.children().as_slice() {
        [writer] => find(stages, writer),
        _ => None,
    }
}

/// One line describing a stage: `stage 2 (maps 4, buckets 4, hash([k@0], 4), deps [3])`.
pub fn describe(info: &StageInfo) -> String {
    format!(
        "stage {} (maps {}, buckets {}, {}, deps {:?})",
        info.stage_id, info.maps, info.buckets, info.partitioning, info.deps
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(stage_id: u64, deps: &[u64]) -> StageInfo {
        StageInfo {
            stage_id,
            shuffle_dir: PathBuf::from("/s"),
            maps: 2,
            buckets: 2,
            deps: deps.to_vec(),
            partitioning: "single".into(),
        }
    }

    #[test]
    fn a_stage_runs_in_the_wave_after_its_last_dep() {
        // 1 reads 2 and 4; 2 reads 3; 3 and 4 read nothing.
        let stages = [info(1, &[2, 4]), info(2, &[3]), info(3, &[]), info(4, &[])];
        assert_eq!(waves(&stages).unwrap(), vec![vec![3, 4], vec![2], vec![1]]);
        assert_eq!(waves(&[info(1, &[])]).unwrap(), vec![vec![1]]);
        assert!(waves(&[]).unwrap().is_empty());
    }

    #[test]
    fn unknown_or_circular_deps_are_refused_instead_of_waiting_forever() {
        let err = waves(&[info(1, &[7])]).unwrap_err().to_string();
        assert!(err.contains("stage 1 reads stage 7"), "{err}");
        let err = waves(&[info(1, &[2]), info(2, &[1])])
            .unwrap_err()
            .to_string();
        assert!(err.contains("[1, 2] wait for each other"), "{err}");
    }
}
