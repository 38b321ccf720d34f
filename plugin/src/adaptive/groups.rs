//! The partitions each task of a coalesced stage reads, as the scheduler
//! tells the stage's tasks (`dfx_engine.coalesced_partitions`).
//!
//! ```text
//! "<stage>:<first>-<last>,<first>-<last>,..."     e.g. "7:0-2,3,4-5"
//! ```
//!
//! Each group is a run of adjacent partitions and the groups are disjoint.
//! The task of a group runs as its first partition (its *head*): the
//! stage's hash readers give that partition the buckets of the whole group,
//! and the writer publishes the other partitions' maps empty, so the stage
//! still has every map its readers expect. A partition in no group reads
//! its own bucket, as planned.

use std::ops::RangeInclusive;

use datafusion::common::{DataFusionError, Result};

/// Parsed `dfx_engine.coalesced_partitions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionGroups {
    /// The stage whose tasks were coalesced.
    pub stage_id: u64,
    /// Its groups, ascending and disjoint.
    pub groups: Vec<RangeInclusive<usize>>,
}

/// What a reader or writer does for one partition of a coalesced stage.
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
        let text = text.trim();
        if text.is_empty() {
            return Ok(None);
        }
        let bad = |why: &str| {
            DataFusionError::Configuration(format!(
                "dfx config: `dfx_engine.coalesced_partitions` is {text:?}: {why}; expected \
                 \"<stage>:<first>-<last>,...\" with ascending, disjoint groups"
            ))
        };
        let (stage, ranges) = text.split_once(':').ok_or_else(|| bad("no stage"))?;
        let stage_id = stage
            .trim()
            .parse()
            .map_err(|_| bad("the stage is no number"))?;
        let mut groups: Vec<RangeInclusive<usize>> = Vec::new();
        for part in ranges.split(',') {
            let number = |s: &str| {
                s.trim()
                    .parse::<usize>()
                    .map_err(|_| bad("not a partition"))
            };
            let group = match part.split_once('-') {
                Some((first, last)) => number(first)?..=number(last)?,
                None => number(part)?..=number(part)?,
            };
            if group.start() > group.end() {
                return Err(bad("a reversed group"));
            }
            if groups
                .last()
                .is_some_and(|last| last.end() >= group.start())
            {
                return Err(bad("groups overlap or are out of order"));
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
        }
    }
}
