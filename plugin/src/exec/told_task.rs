//! What the driver told one map task of a stage, checked against the
//! stage: the input partitions it runs, the map it publishes as and the
//! other maps it publishes (see `crate::adapt` and `crate::read_settings`).
//!
//! - A part of a split partition runs that partition and publishes as the
//!   map it is told, naming the other parts' maps if it is the first
//!   (`split_read`, a stage of one partition a map).
//! - The head of a coalesced group publishes the group's other maps empty
//!   (`coalesced_partitions`, whose readers read the group's buckets; or
//!   `coalesced_maps` in a stage of slices, where the head runs the
//!   partitions of every slice of its group).
//! - A slice's task may run one of its partitions as several parts, each
//!   reading a range of the probe stage's maps (`split_parts`).

use std::ops::Range;

use crate::config::DfxConfig;
use crate::read_settings::{PartitionGroups, PartitionRole, SplitParts};

/// The facts of a stage a task's settings are checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StageShape {
    /// The stage's id.
    pub(crate) stage_id: u64,
    /// Its input's partitions.
    pub(crate) partitions: usize,
    /// Input partitions each map runs (the last map may run fewer).
    pub(crate) partitions_per_map: usize,
    /// Whether each map keeps a bucket for every partition of its slice.
    pub(crate) keeps_partitions: bool,
}

impl StageShape {
    /// Its maps: one per slice of its partitions.
    pub(crate) fn maps(&self) -> usize {
        self.partitions.div_ceil(self.partitions_per_map.max(1))
    }

    /// The input partitions map `map` runs as planned.
    pub(crate) fn slice(&self, map: usize) -> Range<usize> {
        let start = (map * self.partitions_per_map).min(self.partitions);
        start..(start + self.partitions_per_map).min(self.partitions)
    }
}

/// What one map task runs and publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ToldTask {
    /// The map it publishes as.
    pub(crate) map: usize,
    /// The input partitions it runs.
    pub(crate) slice: Range<usize>,
    /// The maps the other parts of its split partition publish as (named
    /// by the first part's marker).
    pub(crate) companions: Vec<usize>,
    /// The maps of its coalesced group it publishes empty.
    pub(crate) members: Vec<usize>,
    /// The partition of its slice it runs as several parts.
    pub(crate) parts: Option<SplitParts>,
}

impl StageShape {
    /// What the task of `map` runs and publishes under the settings of
    /// `config`, or why they do not fit this stage.
    pub(crate) fn told_task(&self, map: usize, config: &DfxConfig) -> Result<ToldTask, String> {
        let (maps, stage_id) = (self.maps(), self.stage_id);
        let partition = map;
        let split = config.split_read().map_err(|e| e.to_string())?;
        let coalesced = config.coalesced_partitions().map_err(|e| e.to_string())?;
        let coalesced_maps = config.coalesced_maps().map_err(|e| e.to_string())?;
        // Partitions are split or coalesced in a stage of one partition a
        // map, slices coalesced in one of slices.
        if self.partitions_per_map > 1 && (split.is_some() || coalesced.is_some()) {
            return Err(format!(
                "each map runs a slice of {} partitions, so no partition is split or \
                 coalesced, yet the task was told to",
                self.partitions_per_map
            ));
        }
        if let Some(groups) = &coalesced
            && groups.stage_id != stage_id
        {
            return Err(format!(
                "the task was told the coalesced partitions of stage {}, not of this one",
                groups.stage_id
            ));
        }
        let slice_groups = self.slice_groups(coalesced.is_some(), coalesced_maps)?;
        let slice = match slice_groups.as_ref().map(|g| g.role(map)) {
            None | Some(PartitionRole::Own) => self.slice(map),
            Some(PartitionRole::Head(group)) if *group.end() < maps => {
                self.slice(*group.start()).start..self.slice(*group.end()).end
            }
            Some(PartitionRole::Head(group)) => {
                return Err(format!(
                    "the task was told to run maps {}-{}, past the stage's {maps}",
                    group.start(),
                    group.end()
                ));
            }
            Some(PartitionRole::Member) => {
                return Err(
                    "its map is coalesced into another map's task, yet it was run".to_string(),
                );
            }
        };
        let (published_as, companions) = match split {
            Some(split) if split.stage_id != stage_id || split.partition != partition => {
                return Err(format!(
                    "the task was told a part of partition {} of stage {}, not of this one",
                    split.partition, split.stage_id
                ));
            }
            Some(split) if split.map < maps && split.map != partition => {
                return Err(format!(
                    "the task was told to publish as map {}, another planned map",
                    split.map
                ));
            }
            Some(split) => (split.map, split.companions),
            None => (map, Vec::new()),
        };
        let members = coalesced
            .or(slice_groups)
            .map_or_else(Vec::new, |groups| groups.members_of(map));
        let parts = self.split_parts(config, &slice)?;
        Ok(ToldTask {
            map: published_as,
            slice,
            companions,
            members,
            parts,
        })
    }

    /// The coalesced maps of a stage of slices a task was told
    /// (`coalesced_maps`), checked: never beside coalesced partitions,
    /// of this stage, whose maps do not keep a bucket per partition.
    fn slice_groups(
        &self,
        partitions_coalesced: bool,
        coalesced_maps: Option<PartitionGroups>,
    ) -> Result<Option<PartitionGroups>, String> {
        match coalesced_maps {
            None => Ok(None),
            Some(_) if partitions_coalesced => {
                Err("the task was told to coalesce both its partitions and its maps".to_string())
            }
            Some(groups) if groups.stage_id != self.stage_id => Err(format!(
                "the task was told the coalesced maps of stage {}, not of this one",
                groups.stage_id
            )),
            Some(_) if self.keeps_partitions => Err(
                "its maps keep a bucket for each partition of their slice, so they cannot be \
                 coalesced, yet the task was told to"
                    .to_string(),
            ),
            Some(groups) => Ok(Some(groups)),
        }
    }

    /// The partition of `slice` its task was told to run as
    /// several parts, checked against the stage.
    fn split_parts(
        &self,
        config: &DfxConfig,
        slice: &Range<usize>,
    ) -> Result<Option<SplitParts>, String> {
        let Some(parts) = config.split_parts().map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        if parts.stage_id != self.stage_id {
            return Err(format!(
                "the task was told the parts of a partition of stage {}, not of this one",
                parts.stage_id
            ));
        }
        if !slice.contains(&parts.partition) {
            return Err(format!(
                "the task was told to split partition {}, outside its slice {}..{}",
                parts.partition, slice.start, slice.end
            ));
        }
        Ok(Some(parts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Five partitions in slices of two: maps of two, two and one.
    const SLICED: StageShape = StageShape {
        stage_id: 7,
        partitions: 5,
        partitions_per_map: 2,
        keeps_partitions: false,
    };

    fn told(key: &str, value: &str) -> DfxConfig {
        let mut config = DfxConfig::default();
        match key {
            "coalesced_maps" => config.coalesced_maps = value.into(),
            "split_parts" => config.split_parts = value.into(),
            "split_read" => config.split_read = value.into(),
            other => panic!("{other}"),
        }
        config
    }

    #[test]
    fn a_head_of_coalesced_slices_runs_their_partitions_and_publishes_the_others_empty() {
        let config = told("coalesced_maps", "7:1-2");
        let task = SLICED.told_task(1, &config).unwrap();
        assert_eq!((task.map, task.slice.clone()), (1, 2..5));
        assert_eq!(task.members, vec![2]);
        // Map 0 is in no group: its own slice.
        assert_eq!(SLICED.told_task(0, &config).unwrap().slice, 0..2);
        let member = SLICED.told_task(2, &config).unwrap_err();
        assert!(
            member.contains("coalesced into another map's task"),
            "{member}"
        );
        let past = SLICED
            .told_task(1, &told("coalesced_maps", "7:1-3"))
            .unwrap_err();
        assert!(past.contains("past the stage's 3"), "{past}");
        let kept = StageShape {
            keeps_partitions: true,
            ..SLICED
        };
        let refused = kept.told_task(1, &config).unwrap_err();
        assert!(
            refused.contains("keep a bucket for each partition"),
            "{refused}"
        );
    }

    #[test]
    fn a_split_partition_must_lie_in_the_slice_of_its_stage() {
        let task = SLICED
            .told_task(1, &told("split_parts", "7:3:2:0-0,1-1"))
            .unwrap();
        assert_eq!(task.parts.map(|p| p.partition), Some(3));
        for (value, expected) in [
            ("7:1:2:0-0,1-1", "outside its slice 2..4"),
            ("8:3:2:0-0,1-1", "of stage 8, not of this one"),
        ] {
            let err = SLICED
                .told_task(1, &told("split_parts", value))
                .unwrap_err();
            assert!(err.contains(expected), "{value}: {err}");
        }
        // A split read is a stage of one partition a map's.
        let err = SLICED
            .told_task(1, &told("split_read", "7:1:2:0-0:1:"))
            .unwrap_err();
        assert!(
            err.contains("each map runs a slice of 2 partitions"),
            "{err}"
        );
    }
}
