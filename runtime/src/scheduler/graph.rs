//! The stage graph the scheduler is given: each stage's id, maps, buckets
//! and the stages it reads, as the plugin describes them, and the encoded
//! stage as the host hands it over.
//!
//! ```text
//! root (driver) ── reader ── writer S1 (deps [2]) ── ... ── reader ── writer S2 (deps [])
//! ```
//!
//! A **stage** runs as one **map task** per partition of its input; each map
//! splits its rows into **buckets**. A stage may run once every stage it
//! **deps** on is published. The graph comes from the plugin's exports
//! (`encoded_stage_info` of a stage's bytes, see [`crate::prepare()`]), never
//! from a display string.
//!
//! These types sit beneath both the scheduler and the stage file
//! ([`crate::protocol::stage_file`]), so neither imports the other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use dfx_abi::DfxStageInfo;
use serde::Serialize;

use crate::error::{Result, RuntimeError};

/// What the plugin says about one stage: everything a driver schedules by.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StageInfo {
    /// The id the planner gave the writer (checked against its position).
    pub stage_id: u64,
    /// The shuffle directory the writer publishes into.
    pub shuffle_dir: PathBuf,
    /// Map tasks: one per slice of the writer's input partitions.
    pub maps: usize,
    /// Buckets each map splits its rows into.
    pub buckets: usize,
    /// Input partitions each map runs: map `m` runs those from
    /// `m * partitions_per_map` on.
    pub partitions_per_map: usize,
    /// Ids of the stages this one reads, ascending: it runs once all of them
    /// are published.
    pub deps: Vec<u64>,
    /// Those of them read partition by partition: map `m` reads only the
    /// buckets of its own slice of them.
    pub aligned_deps: Vec<u64>,
    /// How rows are split into buckets, for display (`hash([k@0], 4)`, `single`).
    pub partitioning: String,
}

impl From<DfxStageInfo> for StageInfo {
    fn from(info: DfxStageInfo) -> Self {
        Self {
            stage_id: info.stage_id,
            shuffle_dir: PathBuf::from(info.shuffle_dir.as_str()),
            maps: info.maps as usize,
            buckets: info.buckets as usize,
            partitions_per_map: info.partitions_per_map as usize,
            deps: info.deps.iter().copied().collect(),
            aligned_deps: info.aligned_deps.iter().copied().collect(),
            partitioning: info.partitioning.into_string(),
        }
    }
}

/// One stage as the host hands it over: the plugin's description and its
/// bytes, encoded with the host's session (and cut for its maps by
/// [`crate::prepare()`]).
#[derive(Debug, Clone)]
pub struct EncodedStage {
    /// Id, maps, buckets, deps.
    pub info: StageInfo,
    /// The encoded writer, or the stage file it was cut into.
    pub bytes: Vec<u8>,
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
            return Err(RuntimeError::Invalid(format!(
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
            return Err(RuntimeError::Invalid(format!(
                "stages {stuck:?} wait for each other and can never run"
            )));
        }
        done.extend(wave.iter().copied());
        waves.push(wave);
    }
    Ok(waves)
}

/// One line describing a stage: `stage 2 (maps 4, buckets 4, hash([k@0], 4), deps [3])`.
pub fn describe(info: &StageInfo) -> String {
    format!(
        "stage {} (maps {}, buckets {}, {}, deps {:?})",
        info.stage_id, info.maps, info.buckets, info.partitioning, info.deps
    )
}

/// For each stage, the stages on the longest chain from it to the root
/// (itself and the root included): the critical path it starts, as far as
/// the graph alone tells, before any task has run.
pub(crate) fn remaining_paths(infos: &[StageInfo]) -> BTreeMap<u64, usize> {
    fn path(stage: u64, infos: &[StageInfo], paths: &mut BTreeMap<u64, usize>) -> usize {
        if let Some(&known) = paths.get(&stage) {
            return known;
        }
        let readers: Vec<u64> = infos
            .iter()
            .filter(|reader| reader.deps.contains(&stage))
            .map(|reader| reader.stage_id)
            .collect();
        // The graph was checked for cycles (`waves`), so this ends.
        let longest = readers
            .into_iter()
            .map(|reader| path(reader, infos, paths))
            .max()
            .unwrap_or(0);
        paths.insert(stage, longest + 1);
        longest + 1
    }
    let mut paths = BTreeMap::new();
    for info in infos {
        path(info.stage_id, infos, &mut paths);
    }
    paths
}

/// Whether `stage` reads no stage: nothing it reads has published, so
/// there is nothing to adapt it to.
pub(crate) fn reads_no_stage(infos: &[StageInfo], stage: u64) -> bool {
    infos
        .iter()
        .find(|info| info.stage_id == stage)
        .is_none_or(|info| info.deps.is_empty())
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
            partitions_per_map: 1,
            deps: deps.to_vec(),
            aligned_deps: Vec::new(),
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
