//! Tables of many files: each task carries only the files its map reads,
//! and the answers stay those of one process.
//!
//! The tables are the shared `numbers_table` (`k` = 0, 1, 2, ... across
//! files, `v = k % 7`), one Parquet file per partition, so a scan stage has
//! one map per file.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use common::*;
use dfx_host::session::{SessionSpec, TableDefinition, build_session};
use dfx_runtime::protocol::{Envelope, TaskInput, check_task, plan_path, stage_file};
use dfx_runtime::scheduler::EncodedStage;

/// Files of the many-file table: a stage of this many maps.
const FILES: u64 = 120;

/// Rows per file.
const ROWS: u64 = 2;

/// A second table of `files` files whose keys follow the first's.
fn second_table(root: &Path, files: u64) -> std::path::PathBuf {
    let dir = root.join("second");
    std::fs::create_dir_all(&dir).unwrap();
    let made = numbers_table(&dir, files, ROWS);
    assert!(made.ends_with("t"));
    made
}

fn spec(tables: &[(&str, &Path)]) -> SessionSpec {
    SessionSpec::new(tables.iter().map(|(name, dir)| {
        (
            name.to_string(),
            TableDefinition::parquet(dir.display().to_string()),
        )
    }))
}

/// The names of the table files `bytes` mention (`part-<n>.parquet`, under
/// the table directory `table`).
fn files_named(bytes: &[u8], table: &Path) -> Vec<String> {
    let prefix = format!("{}/part-", table.display());
    let prefix = prefix.trim_start_matches('/').as_bytes().to_vec();
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(start) = bytes[at..]
        .windows(prefix.len())
        .position(|w| w == prefix.as_slice())
    {
        let begin = at + start + prefix.len();
        let digits = bytes[begin..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        found.push(format!(
            "part-{}.parquet",
            std::str::from_utf8(&bytes[begin..begin + digits]).unwrap()
        ));
        at = begin + digits;
    }
    found
}

#[tokio::test]
async fn a_distributed_query_over_many_files_agrees_with_one_process() {
    let root = tempfile::tempdir().unwrap();
    let t = numbers_table(root.path(), FILES, ROWS);
    let u = second_table(root.path(), FILES / 2);
    let d = numbers_table(&root.path().join("dim"), 1, 7);
    let host = host();
    let spec = spec(&[("t", &t), ("u", &u), ("d", &d)]);
    let rows = (FILES * ROWS) as i64;
    let queries = [
        // One scan stage of FILES maps, a pass-through into the root.
        "SELECT count(*) AS n, sum(k) AS total FROM t".to_string(),
        // A union of two many-file scans in one stage: map m reads t's
        // partition m, or u's partition m - FILES.
        "SELECT count(*) AS n, sum(k) AS total FROM \
         (SELECT k FROM t UNION ALL SELECT k FROM u)"
            .to_string(),
        // A broadcast join in the stage of the scan of t: every map builds
        // d whole and probes its own file of t.
        "SELECT t.v, count(*) AS n, sum(t.k) AS total FROM t JOIN d ON t.v = d.k \
         GROUP BY t.v ORDER BY t.v"
            .to_string(),
    ];
    // Checked by hand on the first query: k runs 0 .. rows - 1.
    let local = host.run_local(&queries[0], &spec).await.unwrap();
    assert_eq!(
        sorted_rows(&local),
        [format!("{rows} | {}", rows * (rows - 1) / 2)]
    );
    for sql in &queries {
        let expected = sorted_rows(&host.run_local(sql, &spec).await.unwrap());
        for split in SPLITS {
            let dir = tempfile::tempdir_in(root.path()).unwrap().keep();
            let spec = spec.clone().with_shuffle_dir(&dir).with_split(split);
            let result = host.run_distributed(sql, &spec).await.unwrap();
            assert_eq!(sorted_rows(&result.batches), expected, "{split:?}: {sql}");
            let maps = result.stages.iter().map(|s| s.maps).max().unwrap();
            assert!(maps >= FILES as usize, "{split:?}: {sql}: {maps} maps");
        }
    }
}

#[tokio::test]
async fn each_task_plan_names_only_its_own_file() {
    let root = tempfile::tempdir().unwrap();
    let t = numbers_table(root.path(), FILES, ROWS);
    let shuffle = root.path().join("shuffle");
    let spec = spec(&[("t", &t)]).with_shuffle_dir(&shuffle);
    let plugin = plugin();
    let session = build_session(&plugin, &spec).await.unwrap();
    let sql = "SELECT count(*) AS n FROM t WHERE v < 5";
    let plan = session.physical_plan(sql).await.unwrap();
    let stages = dfx_host::driver::stages::stages(&plugin, &plan).unwrap();
    let scan = stages
        .iter()
        .find(|s| s.info.maps == FILES as usize)
        .expect("a stage of one map per file");
    let whole = session.encode(Arc::clone(&scan.plan)).unwrap();
    // The stage as a whole names every file: what each task carried before.
    assert_eq!(files_named(&whole, &t).len(), FILES as usize);

    let encoded = vec![EncodedStage {
        info: scan.info.clone(),
        bytes: whole.clone(),
    }];
    let cut = stage_file::cut_stages(&plugin, encoded).unwrap();
    let task_dir = shuffle.join("tasks");
    std::fs::create_dir_all(&task_dir).unwrap();
    let plan_file = plan_path(&task_dir, scan.stage_id());
    std::fs::write(&plan_file, &cut[0].bytes).unwrap();

    let shipped = SessionSpec {
        codec_ids: session.codec_ids(),
        ..spec.clone()
    };
    let envelope = |map: usize| Envelope {
        spec: shipped.clone(),
        plan: plan_file.clone(),
        stage_id: scan.stage_id(),
        partition: map,
        attempt: 0,
        added_from: None,
    };
    let mut readers: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    let mut largest = 0;
    for map in 0..FILES as usize {
        let task = TaskInput::read(&plugin, envelope(map)).unwrap();
        let named = files_named(&task.plan, &t);
        assert_eq!(named.len(), 1, "map {map} names {named:?}");
        readers.entry(named[0].clone()).or_default().push(map);
        largest = largest.max(task.plan.len());
        check_task(&plugin, &task, &session.codec_ids(), true).unwrap();
        // By value, as a worker on another node gets it (this map's part
        // of the stage file): the same plan.
        let copy = stage_file::read_one_map(&plan_file, map as u64).unwrap();
        assert!(copy.len() * 10 < cut[0].bytes.len(), "map {map}");
        let by_value = TaskInput::from_bytes(&plugin, envelope(map), copy).unwrap();
        assert_eq!(by_value.plan, task.plan, "map {map}");
    }
    // Every file is read by exactly one map.
    assert_eq!(readers.len(), FILES as usize);
    assert!(readers.values().all(|maps| maps.len() == 1));
    // A task's plan is a small part of the whole stage's.
    assert!(
        largest * 10 < whole.len(),
        "{largest} bytes per task, {} for the stage",
        whole.len()
    );

    // A plan cut for map 1 is refused for map 0, by the vet and when run.
    let other = TaskInput::read(&plugin, envelope(1)).unwrap();
    let misfiled = TaskInput {
        envelope: envelope(0),
        ..other
    };
    let err = check_task(&plugin, &misfiled, &session.codec_ids(), true).unwrap_err();
    assert!(err.contains("cut for map 1, not for map 0"), "{err}");
    // And a map the stage file lacks is named.
    let err = TaskInput::read(&plugin, envelope(FILES as usize))
        .unwrap_err()
        .to_string();
    assert!(err.contains(&format!("map {FILES} out of range")), "{err}");
}
