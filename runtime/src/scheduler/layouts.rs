//! The layouts of published maps, as their winning attempts reported them:
//! what the driver hands each task of a stage about the stages it reads
//! (`dfx_engine.shuffle_ranges`), so its readers fetch byte ranges without
//! reading markers, and what the adaptive step sizes partitions from.
//!
//! ```text
//! map S/M reports {layout}  ─► book[(S, M)]  (a rerun's report replaces it)
//! task T/N of a stage reading S, each attempt ─► stage options:
//!     shuffle_ranges = {"stages": {"S": [layout of S/0, S/1, ...]}}
//! ```
//!
//! A task is handed only the buckets it reads of a stage its stage reads
//! partition by partition (the plugin's `aligned_deps`): map N runs the
//! slice of partitions from `N * partitions_per_map`, and reads those
//! buckets of each map of S, so its layouts are windows of that slice
//! (O(maps) numbers rather than O(maps x buckets)). A stage an adaptive
//! decision regrouped, split or switched, and the query's head, are handed
//! whole layouts: their tasks read other buckets than their slice's.
//!
//! The query's head is handed the layouts of the stages no stage reads, so
//! the driver's own read makes no marker request either.
//!
//! A stage is left out (its readers read markers) unless every planned map
//! has a layout: a map its coalesced head published empty has an empty one;
//! a stage a skew split added maps to lists them too, and its readers, who
//! expect the planned count, read by marker (the marker names companions).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::{Arc, Mutex};

use dfx_abi::{MapLayout, StageLayouts};

use crate::scheduler::graph::StageInfo;

type Key = (u64, usize);

/// The layout book of one query (see the module doc).
#[derive(Debug, Default)]
pub struct Layouts {
    /// Each stage as planned: its maps, buckets, partitions per map, the
    /// stages it reads and those it reads partition by partition.
    stages: BTreeMap<u64, StageInfo>,
    state: Mutex<Book>,
}

#[derive(Debug, Default)]
struct Book {
    by_map: BTreeMap<Key, Arc<MapLayout>>,
    /// Maps a coalesced task's head publishes empty.
    covered: BTreeSet<Key>,
    /// Stages whose tasks an adaptive decision changed: handed whole
    /// layouts.
    whole: BTreeSet<u64>,
}

impl Layouts {
    /// A book for the stages `infos`.
    pub fn new(infos: &[StageInfo]) -> Self {
        Self {
            stages: infos.iter().map(|i| (i.stage_id, i.clone())).collect(),
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        // A poisoned lock only means a task panicked holding it; the book
        // is still whole (each entry is replaced whole).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Map `key` published `layout` (its winning attempt's report, or a
    /// rerun's, which replaces it: a rerun publishes a file of its own).
    pub fn record(&self, key: Key, layout: Option<&Arc<MapLayout>>) {
        let mut book = self.lock();
        match layout {
            Some(layout) => {
                book.by_map.insert(key, Arc::clone(layout));
            }
            // A worker that reports none: the map is read by its marker.
            None => {
                book.by_map.remove(&key);
            }
        }
    }

    /// Maps `maps` of `stage` are published empty by their coalesced head.
    pub fn cover(&self, stage: u64, maps: impl IntoIterator<Item = usize>) {
        let mut book = self.lock();
        book.covered.extend(maps.into_iter().map(|m| (stage, m)));
    }

    /// The layouts of every map of `stage`, in map order: its planned maps
    /// then any added ones; `None` unless every planned map has one.
    pub fn of_stage(&self, stage: u64) -> Option<Vec<MapLayout>> {
        self.windows_of_stage(stage, None)
    }

    /// [`Layouts::of_stage`], each layout cut to the buckets of `window`
    /// when there is one.
    fn windows_of_stage(&self, stage: u64, window: Option<Range<usize>>) -> Option<Vec<MapLayout>> {
        let info = self.stages.get(&stage)?;
        let (maps, buckets) = (info.maps, info.buckets);
        let book = self.lock();
        let cut = |layout: &MapLayout| match &window {
            Some(window) => layout.window(window.clone()),
            None => layout.clone(),
        };
        let mut layouts = Vec::with_capacity(maps);
        for map in 0.. {
            match book.by_map.get(&(stage, map)) {
                Some(layout) => layouts.push(cut(layout)),
                None if map < maps && book.covered.contains(&(stage, map)) => {
                    layouts.push(cut(&MapLayout::empty(buckets)));
                }
                None if map < maps => return None,
                None => break,
            }
        }
        Some(layouts)
    }

    /// The tasks of `stage` read other buckets than their slices' (an
    /// adaptive decision regrouped, split or switched them): each is
    /// handed whole layouts from now on.
    pub fn hand_whole(&self, stage: u64) {
        self.lock().whole.insert(stage);
    }

    /// The `shuffle_ranges` setting for map `map` of `stage`: the layouts
    /// of the stages it reads that have them, those it reads partition by
    /// partition cut to the buckets of its slice; `None` when none has.
    pub fn setting_for_map(&self, stage: u64, map: usize) -> Option<String> {
        let per_map = self.stages.get(&stage)?.partitions_per_map;
        let slice = (!self.lock().whole.contains(&stage) && per_map > 0)
            .then(|| map * per_map..(map + 1) * per_map);
        self.setting(stage, slice)
    }

    /// The `shuffle_ranges` setting for a task of `stage` that may read
    /// any bucket (the adaptive step's): the whole layouts of the stages it
    /// reads that have them; `None` when none has.
    pub fn setting_for(&self, stage: u64) -> Option<String> {
        self.setting(stage, None)
    }

    /// The layouts of the stages `stage` reads, those it reads partition by
    /// partition cut to `slice`'s buckets when there is one.
    fn setting(&self, stage: u64, slice: Option<Range<usize>>) -> Option<String> {
        let info = self.stages.get(&stage)?;
        let stages: BTreeMap<u64, Vec<MapLayout>> = info
            .deps
            .iter()
            .filter_map(|&dep| {
                let window = slice.clone().filter(|_| info.aligned_deps.contains(&dep));
                Some((dep, self.windows_of_stage(dep, window)?))
            })
            .collect();
        (!stages.is_empty()).then(|| StageLayouts { stages }.format())
    }

    /// The `shuffle_ranges` setting for the query's head, which reads the
    /// stages no other stage reads; `None` when none of them has layouts.
    pub fn setting_for_head(&self) -> Option<String> {
        let read: BTreeSet<u64> = self
            .stages
            .values()
            .flat_map(|info| info.deps.iter().copied())
            .collect();
        let stages: BTreeMap<u64, Vec<MapLayout>> = self
            .stages
            .keys()
            .filter(|stage| !read.contains(stage))
            .filter_map(|&stage| Some((stage, self.of_stage(stage)?)))
            .collect();
        (!stages.is_empty()).then(|| StageLayouts { stages }.format())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(stage_id: u64, maps: usize, deps: Vec<u64>) -> StageInfo {
        StageInfo {
            stage_id,
            shuffle_dir: "/s".into(),
            maps,
            buckets: 2,
            partitions_per_map: 1,
            deps,
            aligned_deps: Vec::new(),
            partitioning: "hash".into(),
        }
    }

    fn layout(rows: u64) -> Arc<MapLayout> {
        Arc::new(MapLayout {
            first_bucket: 0,
            offsets: vec![0, 10],
            bytes: vec![10, 10],
            rows: vec![rows, rows],
            size: 40,
            e_tag: None,
            keys: None,
            owner: None,
        })
    }

    #[test]
    fn a_stage_is_handed_only_once_every_planned_map_has_a_layout() {
        let book = Layouts::new(&[info(1, 1, vec![2]), info(2, 3, vec![])]);
        book.record((2, 0), Some(&layout(1)));
        book.record((2, 2), Some(&layout(3)));
        assert_eq!(book.setting_for(1), None, "map 1 has no layout yet");
        book.cover(2, [1]);
        let handed = StageLayouts::parse(&book.setting_for(1).unwrap())
            .unwrap()
            .unwrap();
        let rows: Vec<u64> = handed.stages[&2].iter().map(|l| l.rows[0]).collect();
        assert_eq!(rows, [1, 0, 3]);
        // A rerun's report replaces the first.
        book.record((2, 0), Some(&layout(7)));
        assert_eq!(book.of_stage(2).unwrap()[0].rows[0], 7);
        // A stage that reads nothing is handed nothing.
        assert_eq!(book.setting_for(2), None);
    }

    #[test]
    fn a_map_is_handed_only_its_slices_buckets_of_a_stage_read_partition_by_partition() {
        // Stage 1 (maps of 2 partitions) reads stage 2 bucket by partition
        // and stage 3 whole (a collected side).
        let mut reader = info(1, 2, vec![2, 3]);
        reader.partitions_per_map = 2;
        reader.aligned_deps = vec![2];
        let book = Layouts::new(&[reader, info(2, 2, vec![]), info(3, 1, vec![])]);
        let four = |rows: u64| {
            Arc::new(MapLayout {
                first_bucket: 0,
                offsets: vec![0, 10, 20, 30],
                bytes: vec![10; 4],
                rows: vec![rows, rows + 1, rows + 2, rows + 3],
                size: 40,
                e_tag: None,
                keys: None,
                owner: None,
            })
        };
        book.record((2, 0), Some(&four(0)));
        book.record((2, 1), Some(&four(10)));
        book.record((3, 0), Some(&layout(5)));
        let handed = |map| {
            StageLayouts::parse(&book.setting_for_map(1, map).unwrap())
                .unwrap()
                .unwrap()
        };
        for (map, buckets) in [(0, 0..2), (1, 2..4)] {
            let layouts = handed(map);
            for (upstream, layout) in layouts.stages[&2].iter().enumerate() {
                assert_eq!(
                    layout.described(),
                    buckets,
                    "map {map} of upstream {upstream}"
                );
                let whole = book.of_stage(2).unwrap()[upstream].clone();
                for bucket in buckets.clone() {
                    assert_eq!(layout.bucket(bucket), whole.bucket(bucket));
                }
            }
            assert_eq!(layouts.stages[&3], book.of_stage(3).unwrap(), "read whole");
        }
        // The adaptive step reads every bucket; and once a decision changes
        // the stage's tasks, each is handed the whole layouts.
        let whole = book.of_stage(2).unwrap();
        let every = StageLayouts::parse(&book.setting_for(1).unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(every.stages[&2], whole);
        book.hand_whole(1);
        assert_eq!(handed(1).stages[&2], whole);
    }

    #[test]
    fn the_head_is_handed_the_stages_no_stage_reads() {
        let book = Layouts::new(&[info(1, 1, vec![2]), info(2, 1, vec![])]);
        assert_eq!(book.setting_for_head(), None, "stage 1 has no layout yet");
        book.record((2, 0), Some(&layout(5)));
        assert_eq!(book.setting_for_head(), None, "stage 2 is read by stage 1");
        book.record((1, 0), Some(&layout(3)));
        let handed = StageLayouts::parse(&book.setting_for_head().unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(handed.stages.keys().copied().collect::<Vec<_>>(), [1]);
        assert_eq!(handed.stages[&1][0].rows[0], 3);
    }
}
