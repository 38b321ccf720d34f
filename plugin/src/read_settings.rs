//! The settings a driver hands the tasks of one stage, telling its readers
//! (and its writer) what to read: one type per setting, each with the one
//! format the driver writes and the one parser the tasks read it with.
//!
//! ```text
//! dfx_engine.coalesced_partitions  "<stage>:<first>-<last>,<first>-<last>,..."   e.g. "7:0-2,3,4-5"
//! dfx_engine.coalesced_maps        "<stage>:<first>-<last>,<first>-<last>,..."   e.g. "7:0-1,2"
//! dfx_engine.split_read            "<stage>:<partition>:<probe stage>:<first>-<last>:<map>:<companion>,..."
//!                                                                                 e.g. "4:1:2:0-0:1:3"
//! dfx_engine.split_parts           "<stage>:<partition>:<probe stage>:<first>-<last>,..."
//!                                                                                 e.g. "4:5:2:0-0,1-3"
//! dfx_engine.broadcast_read        "<stage>:<probe stage>:<build stage>,..."     e.g. "5:3:4"
//! ```
//!
//! **Coalesced partitions.** Each group is a run of adjacent partitions
//! and the groups are disjoint. The task of a group runs as its first
//! partition (its *head*): the stage's hash readers give that partition
//! the buckets of the whole group, and the writer publishes the other
//! partitions' maps empty, so the stage still has every map its readers
//! expect. A partition in no group reads its own bucket, as planned.
//!
//! **Coalesced maps.** The same groups, of the maps of a stage whose
//! tasks run slices of several partitions: the task of a group runs as its
//! first map and executes the partitions of every slice in the group at
//! once, each partition reading its own bucket as planned, and the writer
//! publishes the other maps empty. Only the writer reads this setting.
//!
//! **Split reads.** Which partition a part of a split partition reads,
//! whose probe maps, the map it publishes as and, for the first part, the
//! maps of the others (see [`crate::adapt::skew_split`]).
//!
//! **Split parts.** A partition of a task's slice run as several parts
//! inside that task, each reading the partition's bucket from a range of
//! the probe stage's maps (a split read publishing as the task's own map),
//! so a skewed partition spreads over the task's cores. Only the writer
//! reads this setting; it tells each part's readers its split read.
//!
//! **Broadcast reads.** Which stages a switched stage reads whole and
//! which by map (see [`crate::adapt::broadcast_switch`]).
//!
//! Nothing here imports the rest of the plugin: the config, the readers,
//! the writer and the adaptive step all ask this module.

use std::ops::{Range, RangeInclusive};
use std::str::FromStr;

use datafusion::common::{DataFusionError, Result};

/// The key (without the `dfx_engine.` prefix) by which the driver tells a
/// coalesced stage's tasks their partitions.
pub const COALESCED_PARTITIONS: &str = "coalesced_partitions";

/// The key (without the `dfx_engine.` prefix) by which the driver tells a
/// coalesced stage of slices the maps each of its tasks runs.
pub const COALESCED_MAPS: &str = "coalesced_maps";

/// The key (without the prefix) by which the driver tells a task of a
/// split partition which part it reads.
pub const SPLIT_READ: &str = "split_read";

/// The key (without the prefix) by which the driver tells a task of a
/// stage of slices which partition of its slice runs as several parts.
pub const SPLIT_PARTS: &str = "split_parts";

/// The key (without the prefix) by which the driver tells a switched
/// stage's tasks how they read.
pub const BROADCAST_READ: &str = "broadcast_read";

/// One setting's text being parsed: the one parser every setting here
/// goes through, so each is split, numbered and refused the same way.
struct SettingText<'a> {
    /// The key, without the `dfx_engine.` prefix.
    key: &'static str,
    /// The value, trimmed.
    text: &'a str,
    /// The form it must have, for the error.
    expected: &'static str,
}

impl<'a> SettingText<'a> {
    /// `text` of `key`, or `None` when it is empty (nothing was set).
    fn of(key: &'static str, text: &'a str, expected: &'static str) -> Option<Self> {
        let text = text.trim();
        (!text.is_empty()).then_some(Self {
            key,
            text,
            expected,
        })
    }

    /// The error for this text: `why`, against the form expected; the
    /// message quotes the text.
    fn bad(&self, why: &str) -> DataFusionError {
        DataFusionError::Configuration(format!(
            "dfx config: `dfx_engine.{}` is {:?}: {why}; expected {}",
            self.key, self.text, self.expected
        ))
    }

    /// The text's `N` fields, separated by `:`.
    fn fields<const N: usize>(&self) -> Result<[&'a str; N]> {
        let fields: Vec<&str> = self.text.split(':').collect();
        fields
            .try_into()
            .map_err(|_| self.bad(&format!("not {N} fields")))
    }

    /// `field` as a number.
    fn number<T: FromStr>(&self, field: &str) -> Result<T> {
        field.trim().parse().map_err(|_| self.bad("not a number"))
    }

    /// `field` as a comma-separated list of numbers; empty items skipped.
    fn numbers<T: FromStr>(&self, field: &str) -> Result<Vec<T>> {
        field
            .split(',')
            .filter(|item| !item.trim().is_empty())
            .map(|item| self.number(item))
            .collect()
    }

    /// `field` as `<first>-<last>`, or a lone number when `lone` allows it;
    /// a reversed range is refused.
    fn range(&self, field: &str, lone: bool) -> Result<RangeInclusive<usize>> {
        let (first, last) = match field.split_once('-') {
            Some((first, last)) => (first, last),
            None if lone => (field, field),
            None => return Err(self.bad("no range")),
        };
        let (first, last) = (self.number(first)?, self.number(last)?);
        if first > last {
            return Err(self.bad("a reversed range"));
        }
        Ok(first..=last)
    }
}

/// Parsed `dfx_engine.coalesced_partitions` (groups of partitions) or
/// `dfx_engine.coalesced_maps` (groups of maps, each a slice).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionGroups {
    /// The stage whose tasks were coalesced.
    pub stage_id: u64,
    /// Its groups, ascending and disjoint.
    pub groups: Vec<RangeInclusive<usize>>,
}

/// What a reader or writer does for one partition (or map) of a coalesced
/// stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartitionRole {
    /// Not coalesced: its own bucket.
    Own,
    /// The head of a group: the buckets of every partition in it.
    Head(RangeInclusive<usize>),
    /// A partition whose rows its group's head reads: nothing.
    Member,
}

impl PartitionGroups {
    /// The setting's value for `groups` of `stage_id`.
    pub fn format(stage_id: u64, groups: &[RangeInclusive<usize>]) -> String {
        let groups: Vec<String> = groups
            .iter()
            .map(|g| {
                if g.start() == g.end() {
                    g.start().to_string()
                } else {
                    format!("{}-{}", g.start(), g.end())
                }
            })
            .collect();
        format!("{stage_id}:{}", groups.join(","))
    }

    /// The groups a setting names; `None` for an empty setting.
    ///
    /// # Errors
    ///
    /// Text that is not `<stage>:<ranges>`, or ranges that are reversed,
    /// overlap or are out of order; the message quotes the text.
    pub fn parse(text: &str) -> Result<Option<Self>> {
        Self::parse_setting(COALESCED_PARTITIONS, text)
    }

    /// The groups of maps `dfx_engine.coalesced_maps` names; `None` for an
    /// empty setting.
    ///
    /// # Errors
    ///
    /// As [`Self::parse`].
    pub fn parse_maps(text: &str) -> Result<Option<Self>> {
        Self::parse_setting(COALESCED_MAPS, text)
    }

    fn parse_setting(key: &'static str, text: &str) -> Result<Option<Self>> {
        let Some(setting) = SettingText::of(
            key,
            text,
            "\"<stage>:<first>-<last>,...\" with ascending, disjoint groups",
        ) else {
            return Ok(None);
        };
        let [stage, ranges] = setting.fields()?;
        let stage_id = setting.number(stage)?;
        let mut groups: Vec<RangeInclusive<usize>> = Vec::new();
        for part in ranges.split(',') {
            let group = setting.range(part, true)?;
            if groups
                .last()
                .is_some_and(|last| last.end() >= group.start())
            {
                return Err(setting.bad("groups overlap or are out of order"));
            }
            groups.push(group);
        }
        Ok(Some(Self { stage_id, groups }))
    }

    /// What `partition` reads.
    pub fn role(&self, partition: usize) -> PartitionRole {
        match self.groups.iter().find(|g| g.contains(&partition)) {
            None => PartitionRole::Own,
            Some(group) if *group.start() == partition => PartitionRole::Head(group.clone()),
            Some(_) => PartitionRole::Member,
        }
    }

    /// The partitions whose maps the head `partition` publishes empty.
    pub fn members_of(&self, partition: usize) -> Vec<usize> {
        match self.role(partition) {
            PartitionRole::Head(group) => group.skip(1).collect(),
            PartitionRole::Own | PartitionRole::Member => Vec::new(),
        }
    }
}

/// Parsed `dfx_engine.split_read`: the part of a split partition one task
/// reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitRead {
    /// The stage whose partition is split.
    pub stage_id: u64,
    /// The partition.
    pub partition: usize,
    /// The stage its probe side reads, split by map.
    pub probe_stage: u64,
    /// The probe stage's maps this part reads.
    pub maps: RangeInclusive<usize>,
    /// The map this part publishes as: the partition's own for the first
    /// part, one added past the stage's planned maps for the others.
    pub map: usize,
    /// The maps the other parts publish as (the first part's only).
    pub companions: Vec<usize>,
}

impl SplitRead {
    /// The setting's value.
    pub fn format(&self) -> String {
        let companions: Vec<String> = self.companions.iter().map(ToString::to_string).collect();
        format!(
            "{}:{}:{}:{}-{}:{}:{}",
            self.stage_id,
            self.partition,
            self.probe_stage,
            self.maps.start(),
            self.maps.end(),
            self.map,
            companions.join(",")
        )
    }

    /// The part a setting names; `None` for an empty setting.
    ///
    /// # Errors
    ///
    /// Text that is not of the form above, or a reversed map range; the
    /// message quotes the text.
    pub fn parse(text: &str) -> Result<Option<Self>> {
        let Some(setting) = SettingText::of(
            SPLIT_READ,
            text,
            "\"<stage>:<partition>:<probe stage>:<first>-<last>:<map>:<companion>,...\"",
        ) else {
            return Ok(None);
        };
        let [stage, partition, probe, maps, map, companions] = setting.fields()?;
        Ok(Some(Self {
            stage_id: setting.number(stage)?,
            partition: setting.number(partition)?,
            probe_stage: setting.number(probe)?,
            maps: setting.range(maps, false)?,
            map: setting.number(map)?,
            companions: setting.numbers(companions)?,
        }))
    }
}

/// Parsed `dfx_engine.split_parts`: a partition of a task's slice run as
/// several parts inside the task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitParts {
    /// The stage whose partition is split.
    pub stage_id: u64,
    /// The partition.
    pub partition: usize,
    /// The stage its probe side reads, split by map.
    pub probe_stage: u64,
    /// Each part's range of the probe stage's maps, ascending and disjoint.
    pub parts: Vec<RangeInclusive<usize>>,
}

impl SplitParts {
    /// The setting's value.
    pub fn format(&self) -> String {
        let parts: Vec<String> = self
            .parts
            .iter()
            .map(|r| format!("{}-{}", r.start(), r.end()))
            .collect();
        format!(
            "{}:{}:{}:{}",
            self.stage_id,
            self.partition,
            self.probe_stage,
            parts.join(",")
        )
    }

    /// The parts a setting names; `None` for an empty setting.
    ///
    /// # Errors
    ///
    /// Text that is not of the form above, fewer than two parts, or ranges
    /// reversed, overlapping or out of order; the message quotes the text.
    pub fn parse(text: &str) -> Result<Option<Self>> {
        let Some(setting) = SettingText::of(
            SPLIT_PARTS,
            text,
            "\"<stage>:<partition>:<probe stage>:<first>-<last>,...\" with two or more \
             ascending, disjoint ranges",
        ) else {
            return Ok(None);
        };
        let [stage, partition, probe, ranges] = setting.fields()?;
        let mut parts: Vec<RangeInclusive<usize>> = Vec::new();
        for part in ranges.split(',') {
            let range = setting.range(part, false)?;
            if parts.last().is_some_and(|last| last.end() >= range.start()) {
                return Err(setting.bad("ranges overlap or are out of order"));
            }
            parts.push(range);
        }
        if parts.len() < 2 {
            return Err(setting.bad("fewer than two parts"));
        }
        Ok(Some(Self {
            stage_id: setting.number(stage)?,
            partition: setting.number(partition)?,
            probe_stage: setting.number(probe)?,
            parts,
        }))
    }

    /// What each part's readers are told: a split read of the partition
    /// publishing as `map`, the task's own, with no companions.
    pub fn reads(&self, map: usize) -> Vec<SplitRead> {
        self.parts
            .iter()
            .map(|maps| SplitRead {
                stage_id: self.stage_id,
                partition: self.partition,
                probe_stage: self.probe_stage,
                maps: maps.clone(),
                map,
                companions: Vec::new(),
            })
            .collect()
    }
}

/// Parsed `dfx_engine.broadcast_read`: the reads of a switched stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BroadcastRead {
    /// The switched stage.
    pub stage_id: u64,
    /// The stage its probe side reads, read by map.
    pub probe_stage: u64,
    /// The build stages every task reads whole.
    pub build_stages: Vec<u64>,
}

impl BroadcastRead {
    /// The setting's value.
    pub fn format(&self) -> String {
        let builds: Vec<String> = self.build_stages.iter().map(ToString::to_string).collect();
        format!(
            "{}:{}:{}",
            self.stage_id,
            self.probe_stage,
            builds.join(",")
        )
    }

    /// The reads a setting names; `None` for an empty setting.
    ///
    /// # Errors
    ///
    /// Text that is not of the form above, or one naming no build stage;
    /// the message quotes the text.
    pub fn parse(text: &str) -> Result<Option<Self>> {
        let Some(setting) = SettingText::of(
            BROADCAST_READ,
            text,
            "\"<stage>:<probe stage>:<build stage>,...\"",
        ) else {
            return Ok(None);
        };
        let [stage, probe, builds] = setting.fields()?;
        let build_stages = setting.numbers(builds)?;
        if build_stages.is_empty() {
            return Err(setting.bad("no build stage"));
        }
        Ok(Some(Self {
            stage_id: setting.number(stage)?,
            probe_stage: setting.number(probe)?,
            build_stages,
        }))
    }

    /// The probe stage's maps (of `maps`) partition `partition` (of
    /// `partitions`) reads: contiguous shares, as even as counts allow.
    pub fn probe_maps(partition: usize, partitions: usize, maps: usize) -> Range<usize> {
        let partitions = partitions.max(1);
        let share = |p: usize| p.min(partitions) * maps / partitions;
        share(partition)..share(partition + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_roles() -> Result<()> {
        let text = PartitionGroups::format(7, &[0..=2, 3..=3, 4..=5]);
        assert_eq!(text, "7:0-2,3,4-5");
        let groups = PartitionGroups::parse(&text)?.expect("set");
        assert_eq!(groups.stage_id, 7);
        assert_eq!(groups.role(0), PartitionRole::Head(0..=2));
        assert_eq!(groups.role(2), PartitionRole::Member);
        assert_eq!(groups.role(3), PartitionRole::Head(3..=3));
        assert_eq!(groups.role(9), PartitionRole::Own);
        assert_eq!(groups.members_of(4), vec![5]);
        assert_eq!(groups.members_of(5), Vec::<usize>::new());
        assert_eq!(PartitionGroups::parse(" ")?, None);
        Ok(())
    }

    #[test]
    fn bad_settings_are_refused_with_the_text() {
        for bad in ["0-2", "x:0", "3:2-1", "3:0-2,1-3", "3:4,2", "3:a"] {
            let err = PartitionGroups::parse(bad).unwrap_err().to_string();
            assert!(err.contains(bad), "{bad}: {err}");
            // Groups of maps are refused alike, under their own key.
            let err = PartitionGroups::parse_maps(bad).unwrap_err().to_string();
            assert!(err.contains("dfx_engine.coalesced_maps"), "{bad}: {err}");
        }
    }

    #[test]
    fn split_parts_round_trip_into_reads_and_bad_ones_are_refused() -> Result<()> {
        let parts = SplitParts {
            stage_id: 4,
            partition: 5,
            probe_stage: 2,
            parts: vec![0..=0, 1..=3],
        };
        let text = parts.format();
        assert_eq!(text, "4:5:2:0-0,1-3");
        assert_eq!(SplitParts::parse(&text)?, Some(parts.clone()));
        let reads = parts.reads(2);
        assert_eq!(reads.len(), 2);
        assert_eq!((reads[1].partition, reads[1].map), (5, 2));
        assert_eq!(reads[1].maps, 1..=3);
        assert!(reads.iter().all(|r| r.companions.is_empty()));
        assert_eq!(SplitParts::parse("")?, None);
        for bad in [
            "4:5:2:0-1",
            "4:5:2:0-1,1-2",
            "4:5:2:2-3,0-1",
            "4:5:0-1,2-3",
            "4:x:2:0-1,2-3",
        ] {
            let err = SplitParts::parse(bad).unwrap_err().to_string();
            assert!(
                err.contains(bad) && err.contains("split_parts"),
                "{bad}: {err}"
            );
        }
        Ok(())
    }

    #[test]
    fn a_split_read_round_trips_and_bad_ones_are_refused() -> Result<()> {
        let read = SplitRead {
            stage_id: 4,
            partition: 1,
            probe_stage: 2,
            maps: 0..=1,
            map: 1,
            companions: vec![3, 4],
        };
        assert_eq!(read.format(), "4:1:2:0-1:1:3,4");
        assert_eq!(SplitRead::parse(&read.format())?, Some(read));
        let last = SplitRead::parse("4:1:2:2-2:4:")?.expect("set");
        assert_eq!(last.map, 4);
        assert!(last.companions.is_empty());
        assert_eq!(SplitRead::parse("")?, None);
        for bad in [
            "4:1:2",
            "4:1:2:1-0:1:",
            "4:x:2:0-1:1:",
            "4:1:2:0:1:",
            "4:1:2:0-1:y:",
        ] {
            let err = SplitRead::parse(bad).unwrap_err().to_string();
            assert!(err.contains(bad), "{bad}: {err}");
        }
        Ok(())
    }

    #[test]
    fn a_broadcast_read_round_trips_and_bad_ones_are_refused() -> Result<()> {
        let read = BroadcastRead {
            stage_id: 5,
            probe_stage: 3,
            build_stages: vec![4, 6],
        };
        assert_eq!(read.format(), "5:3:4,6");
        assert_eq!(BroadcastRead::parse(&read.format())?, Some(read));
        assert_eq!(BroadcastRead::parse(" ")?, None);
        for bad in ["5:3", "5:3:", "5:x:4", "5:3:4:1"] {
            let err = BroadcastRead::parse(bad).unwrap_err().to_string();
            assert!(err.contains(bad), "{bad}: {err}");
        }
        Ok(())
    }

    #[test]
    fn the_probe_maps_are_shared_out_whole_and_once() {
        for (partitions, maps) in [(2, 2), (4, 2), (2, 5), (3, 7), (1, 3)] {
            let mut covered = Vec::new();
            for p in 0..partitions {
                covered.extend(BroadcastRead::probe_maps(p, partitions, maps));
            }
            assert_eq!(
                covered,
                (0..maps).collect::<Vec<_>>(),
                "{partitions}/{maps}"
            );
        }
        assert_eq!(BroadcastRead::probe_maps(1, 2, 2), 1..2);
        // Past the partitions: nothing.
        assert!(BroadcastRead::probe_maps(5, 2, 2).is_empty());
    }
}
