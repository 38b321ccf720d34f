//! Adaptive stages, the scheduler's side: once every stage a stage reads
//! is published, the plugin is asked how it runs (export `adapt_stage`),
//! and its tasks are made so before any starts.
//!
//! The plugin answers with the partitions each task runs (a group runs as
//! one task, under its first partition's map) and the settings every task
//! of the stage is given (`SessionSpec::stage_options`). The scheduler runs
//! the groups' tasks only; the group's other maps are the head's to
//! publish, so a lost one is restored by running the head again.
//!
//! Or it answers with settings alone (a join switched to a broadcast
//! one): every task is told them, and the stage runs as planned.
//!
//! Or it answers with tasks of their own settings: a split partition's
//! parts, the first as the partition's map, the others as maps added past
//! the stage's planned ones (each made from the partition's task). An
//! added map is a task like any other: it is retried, and a lost one is
//! run again. A plugin without the export, or one that fails to answer,
//! leaves the stage as planned: a decision never fails a query.

use std::collections::{BTreeMap, BTreeSet};

use abi_stable::std_types::{RResult, RSlice, RStr};
use dfx_abi::{Plugin, SHUFFLE_RANGES};
use serde::{Deserialize, Serialize};

use crate::protocol::stage_file;
use crate::scheduler::attempts::Attempts;
use crate::scheduler::graph::EncodedStage;
use crate::scheduler::task::Task;
use crate::scheduler::tasks::{added_task, restore, with_stage_options};
use crate::spec::SessionSpec;

/// The plugin's answer for one ready stage.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Adaptation {
    /// The partitions each task runs, `[first, last]`, when coalesced;
    /// `None`: one task per map, as planned.
    #[serde(default)]
    pub groups: Option<Vec<[usize; 2]>>,
    /// `dfx_engine` settings (without the prefix) for every task of the stage.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    /// What was decided and why; `None` when no decision applies.
    #[serde(default)]
    pub reason: Option<String>,
    /// Tasks run with settings of their own (after the stage's); a map at
    /// or past the stage's planned maps is added to it.
    #[serde(default)]
    pub tasks: Option<Vec<PlannedTask>>,
}

/// One task of an adapted stage, as the plugin answers it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PlannedTask {
    /// The map it runs as.
    pub map: usize,
    /// The planned map whose task it is made from (its own for a planned one).
    pub like: usize,
    /// `dfx_engine` settings (without the prefix) for this task alone.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
}

/// One adaptive decision, as `--analyze` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    /// The stage it is about.
    pub stage_id: u64,
    /// Tasks the stage was planned with.
    pub planned_tasks: usize,
    /// Tasks it ran with.
    pub tasks: usize,
    /// What was decided and why.
    pub reason: String,
}

/// Ask `plugin` how the ready stage `bytes` runs, with `spec`'s settings
/// and `slots` tasks at once, and the layouts the maps it reads reported
/// (`ranges`, the `shuffle_ranges` setting), which it sizes partitions by
/// instead of reading markers. `Ok(None)` from a plugin without the export.
///
/// # Errors
///
/// The plugin's error, or an answer that is not one, as text.
pub fn ask(
    plugin: &Plugin,
    bytes: &[u8],
    spec: &SessionSpec,
    slots: usize,
    ranges: Option<String>,
) -> Result<Option<Adaptation>, String> {
    let Some(adapt) = plugin.module().adapt_stage() else {
        return Ok(None);
    };
    let plan = stage_file::shared_part(bytes).map_err(|e| e.to_string())?;
    let mut settings: BTreeMap<String, String> = spec.plugin_settings().into_iter().collect();
    if let Some(ranges) = ranges {
        settings.insert(SHUFFLE_RANGES.to_string(), ranges);
    }
    let request = serde_json::json!({ "settings": settings, "slots": slots }).to_string();
    match adapt(RSlice::from_slice(plan), RStr::from_str(&request)) {
        RResult::ROk(answer) => serde_json::from_str(answer.as_str())
            .map(Some)
            .map_err(|e| format!("the plugin's answer is not an adaptation: {e}: {answer}")),
        RResult::RErr(message) => Err(message.into_string()),
    }
}

/// Check that `groups` cover maps `0..maps` at most once each, in order.
///
/// # Errors
///
/// The first group that is reversed, overlaps the one before or is past
/// the last map.
pub fn check_groups(groups: &[[usize; 2]], maps: usize) -> Result<(), String> {
    let mut next = 0;
    for &[first, last] in groups {
        if first > last || first < next || last >= maps {
            return Err(format!(
                "group [{first}, {last}] is reversed, overlaps the one before or is past the \
                 stage's {maps} map(s)"
            ));
        }
        next = last + 1;
    }
    Ok(())
}

/// Check that `tasks` name each planned map (of `maps`) at most once and
/// as itself, and add maps `maps..` in order, each made from a planned one.
///
/// # Errors
///
/// The first task that breaks this.
pub fn check_tasks(tasks: &[PlannedTask], maps: usize) -> Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    let mut added: Vec<usize> = tasks.iter().map(|t| t.map).filter(|&m| m >= maps).collect();
    added.sort_unstable();
    for (expected, map) in (maps..).zip(added) {
        if map != expected {
            return Err(format!(
                "added maps are not numbered from the stage's {maps} planned map(s) up: \
                 expected map {expected}, found {map}"
            ));
        }
    }
    for task in tasks {
        if !seen.insert(task.map) {
            return Err(format!("map {} is named twice", task.map));
        }
        if task.like >= maps || (task.map < maps && task.map != task.like) {
            return Err(format!(
                "map {} is made from map {}, not a planned map of its own (of {maps})",
                task.map, task.like
            ));
        }
    }
    Ok(())
}

/// What the scheduler asks the plugin about each ready stage with (see the
/// module doc).
pub(crate) struct Adapter<'a> {
    plugin: &'a Plugin,
    spec: &'a SessionSpec,
    /// Each stage's plan bytes, by id.
    stages: BTreeMap<u64, &'a [u8]>,
}

impl<'a> Adapter<'a> {
    /// An adapter asking `plugin` about `stages` (a query's), with `spec`'s
    /// settings.
    pub(crate) fn new(
        plugin: &'a Plugin,
        spec: &'a SessionSpec,
        stages: &'a [EncodedStage],
    ) -> Self {
        Self {
            plugin,
            spec,
            stages: stages
                .iter()
                .map(|stage| (stage.info.stage_id, stage.bytes.as_slice()))
                .collect(),
        }
    }
}

impl Adapter<'_> {
    /// Ask the plugin how the ready `stage` (of `maps` maps) runs, and make
    /// its tasks so: every task of the stage is told the plugin's settings;
    /// when partitions are grouped, each group's first task runs the
    /// group, the others are `covered`, and a lost map of theirs reruns
    /// the group's task. The decision, if one was made; a failed answer
    /// leaves the stage as planned and says why.
    pub(crate) fn adapt(
        &self,
        stage: u64,
        maps: usize,
        slots: usize,
        tasks: &mut Vec<Task>,
        covered: &mut BTreeSet<usize>,
        attempts: &Attempts,
    ) -> Option<Decision> {
        let bytes = self.stages.get(&stage)?;
        let kept = |reason: String| Decision {
            stage_id: stage,
            planned_tasks: maps,
            tasks: maps,
            reason,
        };
        let ranges = attempts.layouts().setting_for(stage);
        let adaptation = match ask(self.plugin, bytes, self.spec, slots, ranges) {
            Ok(Some(adaptation)) => adaptation,
            Ok(None) => return None,
            Err(err) => {
                return Some(kept(format!(
                    "kept as planned: the plugin {} could not decide: {err}",
                    self.plugin.path().display()
                )));
            }
        };
        let reason = adaptation.reason.clone()?;
        if let Some(planned) = &adaptation.tasks {
            let tasks_now = match self.with_planned_tasks(stage, maps, tasks, &adaptation, planned)
            {
                Ok(added) => maps + added,
                Err(err) => return Some(kept(format!("kept as planned: {err}"))),
            };
            attempts.replace_first(tasks.iter().filter(|t| t.stage_id == stage));
            return Some(Decision {
                stage_id: stage,
                planned_tasks: maps,
                tasks: tasks_now,
                reason,
            });
        }
        // Settings alone (a switched join's reads) keep the planned tasks.
        if adaptation.groups.is_none() && adaptation.settings.is_empty() {
            return Some(kept(reason));
        }
        let groups = adaptation.groups.unwrap_or_default();
        if let Err(err) = check_groups(&groups, maps) {
            return Some(kept(format!("kept as planned: the plugin's {err}")));
        }
        let index_of: BTreeMap<usize, usize> = tasks
            .iter()
            .enumerate()
            .filter(|(_, task)| task.stage_id == stage)
            .map(|(index, task)| (task.map, index))
            .collect();
        // Every task of the stage told the settings, before any is covered.
        let mut rewritten = BTreeMap::new();
        for (&map, &index) in &index_of {
            match with_stage_options(&tasks[index], &adaptation.settings) {
                Ok(task) => {
                    rewritten.insert(map, task);
                }
                Err(err) => {
                    return Some(kept(format!(
                        "kept as planned: the envelope of stage {stage} map {map} could not be \
                         rewritten: {err}"
                    )));
                }
            }
        }
        for (&map, task) in &rewritten {
            tasks[index_of[&map]] = task.clone();
        }
        let mut heads = BTreeMap::new();
        for &[first, last] in &groups {
            for member in first + 1..=last {
                let index = index_of[&member];
                covered.insert(index);
                heads.insert(member, first);
                // No worker is given it: its head's task runs the map.
                if tasks[index].inline.is_none() {
                    let _ = std::fs::remove_file(&tasks[index].envelope);
                }
            }
        }
        attempts.regroup(stage, &rewritten, &heads);
        Some(Decision {
            stage_id: stage,
            planned_tasks: maps,
            tasks: maps - heads.len(),
            reason,
        })
    }
}

impl Adapter<'_> {
    /// Make `stage`'s tasks as `planned` says: each planned map named told
    /// the stage's settings and its own, each added map (past `maps`) a
    /// new task made from its `like`. The number of maps added. Added
    /// tasks are written first, and a planned task's envelope is restored
    /// when a later one cannot be rewritten, so a failure leaves the stage
    /// as planned.
    fn with_planned_tasks(
        &self,
        stage: u64,
        maps: usize,
        tasks: &mut Vec<Task>,
        adaptation: &Adaptation,
        planned: &[PlannedTask],
    ) -> std::result::Result<usize, String> {
        check_tasks(planned, maps).map_err(|e| format!("the plugin's {e}"))?;
        let index_of: BTreeMap<usize, usize> = tasks
            .iter()
            .enumerate()
            .filter(|(_, task)| task.stage_id == stage)
            .map(|(index, task)| (task.map, index))
            .collect();
        let settings_of = |task: &PlannedTask| {
            let mut settings = adaptation.settings.clone();
            settings.extend(task.settings.clone());
            settings
        };
        let mut added = Vec::new();
        for task in planned.iter().filter(|t| t.map >= maps) {
            let like = index_of.get(&task.like).ok_or_else(|| {
                format!(
                    "stage {stage} has no task of map {} to add map {} from",
                    task.like, task.map
                )
            })?;
            let made = added_task(&tasks[*like], task.map, &settings_of(task)).map_err(|e| {
                format!("map {} of stage {stage} could not be added: {e}", task.map)
            })?;
            added.push(made);
        }
        let mut rewritten: Vec<(usize, Task, Task)> = Vec::new();
        for task in planned.iter().filter(|t| t.map < maps) {
            let index = index_of[&task.map];
            match with_stage_options(&tasks[index], &settings_of(task)) {
                Ok(made) => rewritten.push((index, tasks[index].clone(), made)),
                Err(err) => {
                    for (_, original, _) in &rewritten {
                        restore(original);
                    }
                    for task in &added {
                        if task.inline.is_none() {
                            let _ = std::fs::remove_file(&task.envelope);
                        }
                    }
                    return Err(format!(
                        "the envelope of stage {stage} map {} could not be rewritten: {err}",
                        task.map
                    ));
                }
            }
        }
        for (index, _, made) in rewritten {
            tasks[index] = made;
        }
        let count = added.len();
        tasks.extend(added);
        Ok(count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_checked_against_the_maps() {
        assert!(check_groups(&[[0, 2], [3, 3]], 4).is_ok());
        assert!(check_groups(&[[0, 1], [1, 2]], 4).is_err());
        assert!(check_groups(&[[2, 1]], 4).is_err());
        assert!(check_groups(&[[0, 4]], 4).is_err());
    }

    #[test]
    fn added_tasks_are_checked_against_the_maps() {
        let task = |map, like| PlannedTask {
            map,
            like,
            settings: BTreeMap::new(),
        };
        assert!(check_tasks(&[task(1, 1), task(3, 1), task(4, 1)], 3).is_ok());
        // Not numbered from the planned maps up.
        assert!(check_tasks(&[task(1, 1), task(4, 1)], 3).is_err());
        // Named twice.
        assert!(check_tasks(&[task(1, 1), task(1, 1)], 3).is_err());
        // A planned map made from another, or from one past the plan.
        assert!(check_tasks(&[task(1, 2)], 3).is_err());
        assert!(check_tasks(&[task(3, 3)], 3).is_err());
    }

    #[test]
    fn an_answer_parses() {
        let answer: Adaptation = serde_json::from_str(
            r#"{"groups": [[0, 1]], "settings": {"coalesced_partitions": "3:0-1"}, "reason": "r"}"#,
        )
        .unwrap();
        assert_eq!(answer.groups, Some(vec![[0, 1]]));
        assert_eq!(answer.settings["coalesced_partitions"], "3:0-1");
    }
}
