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

use std::collections::BTreeMap;

use abi_stable::std_types::{RResult, RSlice, RStr};
use dfx_abi::Plugin;
use serde::{Deserialize, Serialize};

use crate::protocol::stage_file;
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
/// and `slots` tasks at once. `Ok(None)` from a plugin without the export.
///
/// # Errors
///
/// The plugin's error, or an answer that is not one, as text.
pub fn ask(
    plugin: &Plugin,
    bytes: &[u8],
    spec: &SessionSpec,
    slots: usize,
) -> Result<Option<Adaptation>, String> {
    let Some(adapt) = plugin.module().adapt_stage() else {
        return Ok(None);
    };
    let plan = stage_file::shared_part(bytes).map_err(|e| e.to_string())?;
    let settings: BTreeMap<String, String> = spec.plugin_settings().into_iter().collect();
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
