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
//! ([`super::skew_split`] states which operators allow it): every join on the
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

use datafusion_proto::protobuf::PhysicalPlanNode;

use crate::adapt::coalesce::{HashRead, human};
use crate::config::BroadcastSwitch;
use crate::read_settings::BroadcastRead;

/// The probe stage of the stage `root` (an encoded writer) and the build
/// stages its partitioned joins read, when it can be switched, or why not.
pub fn switchable(root: &PhysicalPlanNode) -> std::result::Result<(u64, Vec<u64>), String> {
    let mut builds = Vec::new();
    let probe = super::skew_split::probe_path(super::skew_split::writer_input(root)?, &mut builds)?;
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
