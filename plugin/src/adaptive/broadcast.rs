//! Broadcast switching: a partitioned join whose build side turned out
//! small is run as a broadcast join, decided from the bytes its build
//! stages published.
//!
//! A partitioned hash join's task reads bucket `p` of both sides. Once
//! the build side is known to be small, every task may read the build
//! side whole instead, and the probe side by map rather than by bucket:
//! task `p` reads every bucket of its share of the probe stage's maps
//! (Spark's broadcast conversion with a local shuffle read). Each probe
//! row still meets every build row of its key in exactly one task, and
//! the tasks divide the probe rows as the probe stage's maps did, whatever
//! their keys: a key holding most rows no longer lands in one task.
//!
//! That is right where a partitioned task could be split by probe maps
//! ([`super::split`] states which operators allow it): every join on the
//! probe path keeps probe rows apart, and each partitioned one's build
//! side is a hash read (under projections, filters or batch coalescing),
//! which is the read switched to whole. The stage's maps and plan stay as
//! planned; its tasks are told (`dfx_engine.broadcast_read`)
//!
//! ```text
//! "<stage>:<probe stage>:<build stage>,..."   e.g. "5:3:4"
//! ```
//!
//! and its hash readers read accordingly. Its partitions may be coalesced
//! as well, by their shares' probe bytes: a group's head reads the whole
//! group's shares and the build side once. What the switch does not save:
//! the probe stage has already hashed and published its rows by the time
//! the build stage's size is known.

use std::ops::Range;

use datafusion::common::{DataFusionError, Result};
use datafusion_proto::protobuf::PhysicalPlanNode;

use super::coalesce::{HashRead, human};
use crate::config::BroadcastSwitch;

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
        let text = text.trim();
        if text.is_empty() {
            return Ok(None);
        }
        let bad = |why: &str| {
            DataFusionError::Configuration(format!(
                "dfx config: `dfx_engine.broadcast_read` is {text:?}: {why}; expected \
                 \"<stage>:<probe stage>:<build stage>,...\""
            ))
        };
        let fields: Vec<&str> = text.split(':').collect();
        let [stage, probe, builds] = fields[..] else {
            return Err(bad("not three fields"));
        };
        let number = |s: &str| s.trim().parse::<u64>().map_err(|_| bad("not a number"));
        let build_stages = builds
            .split(',')
            .filter(|b| !b.trim().is_empty())
            .map(number)
            .collect::<Result<Vec<_>>>()?;
        if build_stages.is_empty() {
            return Err(bad("no build stage"));
        }
        Ok(Some(Self {
            stage_id: number(stage)?,
            probe_stage: number(probe)?,
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

/// The probe stage of the stage `root` (an encoded writer) and the build
/// stages its partitioned joins read, when it can be switched, or why not.
pub fn switchable(root: &PhysicalPlanNode) -> std::result::Result<(u64, Vec<u64>), String> {
    let mut builds = Vec::new();
    let probe = super::split::probe_path(super::split::writer_input(root)?, &mut builds)?;
    if builds.is_empty() {
        return Err("no partitioned join on its probe side".into());
    }
    let builds = builds
        .into_iter()
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok((probe, builds))
}

/// What a stage's inputs published, as a switch is decided from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JoinBytes {
    /// Bytes of each bucket, summed over the build stages' maps.
    pub build_buckets: Vec<u64>,
    /// `probe_maps[m][b]`: bytes of bucket b in the probe stage's map m.
    pub probe_maps: Vec<Vec<u64>>,
}

impl JoinBytes {
    fn build(&self) -> u64 {
        self.build_buckets.iter().sum()
    }

    /// The bytes the slowest of `slots` workers reads as planned: the
    /// largest partition (both sides' bucket), or the stage's share of
    /// every worker, whichever is more.
    fn partitioned_wall(&self, slots: usize) -> u64 {
        let probe: u64 = self.probe_maps.iter().flatten().sum();
        let largest = (0..self.build_buckets.len())
            .map(|b| {
                self.build_buckets[b]
                    + self
                        .probe_maps
                        .iter()
                        .map(|m| m.get(b).copied().unwrap_or(0))
                        .sum::<u64>()
            })
            .max()
            .unwrap_or(0);
        largest.max((self.build() + probe).div_ceil(slots.max(1) as u64))
    }

    /// The same switched: every task reads the build side whole, and the
    /// largest probe map or a worker's share of the probe side.
    fn switched_wall(&self, slots: usize) -> u64 {
        let maps: Vec<u64> = self.probe_maps.iter().map(|m| m.iter().sum()).collect();
        let probe: u64 = maps.iter().sum();
        let largest = maps.iter().copied().max().unwrap_or(0);
        self.build() + largest.max(probe.div_ceil(slots.max(1) as u64))
    }
}

/// Whether the stage `stage_id` (whose partitions come from `reads`, the
/// probe stage `probe` and the build stages `builds` among them, which
/// published `bytes`) switches under `mode` with `slots` tasks at once;
/// and why. `auto` switches a build side of at most its bytes, or one
/// whose stage would end sooner switched: its slowest worker reading
/// fewer bytes (the whole build side and probe maps, against a skewed
/// partition).
pub fn decide(
    stage_id: u64,
    reads: &[HashRead],
    (probe, builds): (u64, &[u64]),
    bytes: &JoinBytes,
    mode: BroadcastSwitch,
    slots: usize,
) -> (Option<BroadcastRead>, String) {
    if let Some(other) = reads
        .iter()
        .find(|r| r.stage_id != probe && !builds.contains(&r.stage_id))
    {
        return (
            None,
            format!(
                "kept partitioned: it also reads stage {} partition by partition",
                other.stage_id
            ),
        );
    }
    let total = bytes.build();
    let named: Vec<String> = builds.iter().map(|b| format!("stage {b}")).collect();
    let sides = named.join(" and ");
    let (partitioned, switched) = (bytes.partitioned_wall(slots), bytes.switched_wall(slots));
    let why = match mode {
        BroadcastSwitch::Off => return (None, String::new()),
        BroadcastSwitch::On => "forced on".to_string(),
        BroadcastSwitch::Auto { bytes: most } if total <= most => {
            format!("at most {}", human(most))
        }
        BroadcastSwitch::Auto { .. } if switched < partitioned => format!(
            "its slowest worker reads {} switched, {} partitioned",
            human(switched),
            human(partitioned)
        ),
        BroadcastSwitch::Auto { bytes: most } => {
            return (
                None,
                format!(
                    "kept partitioned: its build side ({sides}) published {}, above {}, and its \
                     slowest worker would read {} switched, {} partitioned",
                    human(total),
                    human(most),
                    human(switched),
                    human(partitioned)
                ),
            );
        }
    };
    let read = BroadcastRead {
        stage_id,
        probe_stage: probe,
        build_stages: builds.to_vec(),
    };
    let why = format!(
        "switched to broadcast: every task reads its build side ({sides}, {}) whole and \
         stage {probe}'s maps by map ({why})",
        human(total)
    );
    (Some(read), why)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn read(stage_id: u64) -> HashRead {
        HashRead {
            stage_id,
            maps: 2,
            buckets: 2,
            shuffle_dir: PathBuf::from("/s"),
        }
    }

    #[test]
    fn a_setting_round_trips_and_bad_ones_are_refused() -> Result<()> {
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

    const MIB: u64 = 1 << 20;

    /// A build side of `build` bytes a bucket, and a probe side of two
    /// maps, `probe` bytes a bucket each but for `hot` in bucket 0 of map 0.
    fn bytes(build: u64, probe: u64, hot: u64) -> JoinBytes {
        JoinBytes {
            build_buckets: vec![build; 2],
            probe_maps: vec![vec![hot, probe], vec![probe, probe]],
        }
    }

    #[test]
    fn a_small_build_side_switches_and_a_large_one_stays() {
        let reads = [read(3), read(4)];
        let auto = BroadcastSwitch::Auto { bytes: MIB };
        let small = bytes(1000, 10 * MIB, 10 * MIB);
        let (switched, why) = decide(5, &reads, (3, &[4]), &small, auto, 2);
        assert_eq!(switched.expect("switched").format(), "5:3:4", "{why}");
        assert!(why.starts_with("switched to broadcast"), "{why}");
        assert!(why.ends_with("(at most 1.0 MiB)"), "{why}");
        // 16 MiB of build side, probe rows spread evenly: kept.
        let even = bytes(8 * MIB, 10 * MIB, 10 * MIB);
        let (kept, why) = decide(5, &reads, (3, &[4]), &even, auto, 2);
        assert!(kept.is_none());
        assert!(why.contains("above 1.0 MiB"), "{why}");
        let (forced, why) = decide(5, &reads, (3, &[4]), &even, BroadcastSwitch::On, 2);
        assert!(forced.is_some() && why.ends_with("(forced on)"), "{why}");
        let (off, _) = decide(5, &reads, (3, &[4]), &small, BroadcastSwitch::Off, 2);
        assert!(off.is_none());
    }

    #[test]
    fn a_skewed_partition_switches_a_build_side_past_the_threshold() {
        // 16 MiB of build side, past the threshold. A hot key spread over
        // both probe maps: partitioned, one worker reads its 200 MiB and
        // 8 MiB of build side; switched, each reads the build side and
        // one map.
        let reads = [read(3), read(4)];
        let auto = BroadcastSwitch::Auto { bytes: MIB };
        let hot = JoinBytes {
            build_buckets: vec![8 * MIB; 2],
            probe_maps: vec![vec![100 * MIB, MIB], vec![100 * MIB, MIB]],
        };
        let (switched, why) = decide(5, &reads, (3, &[4]), &hot, auto, 2);
        assert!(switched.is_some(), "{why}");
        assert!(
            why.contains("its slowest worker reads 117.0 MiB switched, 208.0 MiB partitioned"),
            "{why}"
        );
        // All in one probe map: no better switched.
        let one_map = bytes(8 * MIB, MIB, 200 * MIB);
        let (kept, why) = decide(5, &reads, (3, &[4]), &one_map, auto, 2);
        assert!(kept.is_none(), "{why}");
    }

    #[test]
    fn a_stage_reading_another_stage_by_partition_stays() {
        let reads = [read(3), read(4), read(7)];
        let (kept, why) = decide(
            5,
            &reads,
            (3, &[4]),
            &bytes(0, 0, 0),
            BroadcastSwitch::On,
            2,
        );
        assert!(kept.is_none());
        assert!(why.contains("stage 7"), "{why}");
    }
}
