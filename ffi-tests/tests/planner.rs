//! The plugin's planner seen from a host: the split rule, and stage ids by
//! pre-order position equal to the plugin's own numbering.

use std::path::Path;

use dfx_ffi_tests::fixtures::{
    AGGREGATE_ANSWER, AGGREGATE_SQL, SCAN_ANSWER, SCAN_SQL, UNION_ANSWER, UNION_SQL, write_lineitem,
};
use dfx_ffi_tests::locate::plugin;
use dfx_ffi_tests::plans::{find_stages, plan_display, run_partitions, run_to_table};
use dfx_ffi_tests::session::{SessionOptions, TestSession};

async fn session(root: &Path) -> TestSession {
    let options = SessionOptions::distributed(&root.join("shuffle"))
        .with_table("lineitem", &write_lineitem(root));
    TestSession::new(plugin(), &options).await.unwrap()
}

/// Stage ids recomputed by pre-order position equal the ids the plugin gave
/// the nodes, and each stage publishes exactly the files its id names.
async fn check_numbering(sql: &str, expected_stages: usize, answer: &str) {
    let dir = tempfile::tempdir().unwrap();
    let shuffle = dir.path().join("shuffle");
    let session = session(dir.path()).await;
    let plan = session.plan(sql).await.unwrap();
    let stages = find_stages(&plan, plugin().stage_node_name());
    assert_eq!(stages.len(), expected_stages, "{}", plan_display(&plan));

    for (index, stage) in stages.iter().enumerate() {
        let info = plugin().stage_info(stage).unwrap();
        assert_eq!(
            info.stage_id,
            plugin().stage_id(index),
            "stage {index} in pre-order"
        );
        assert_eq!(info.stage_id, 1 + index as u64, "FIRST_STAGE_ID is 1");
        assert_eq!(Path::new(info.shuffle_dir.as_str()), shuffle);
        let rows = run_partitions(stage, session.ctx.task_ctx()).await.unwrap();
        assert_eq!(rows.len() as u64, info.partition_count);
    }
    // Exactly the files the plugin's path function names, nothing else.
    let mut expected: Vec<_> = stages
        .iter()
        .enumerate()
        .flat_map(|(index, stage)| {
            let shuffle = shuffle.clone();
            let count = stage.properties().output_partitioning().partition_count();
            (0..count).map(move |p| plugin().partition_path(&shuffle, plugin().stage_id(index), p))
        })
        .collect();
    expected.sort();
    let mut published: Vec<_> = std::fs::read_dir(&shuffle)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "arrow"))
        .collect();
    published.sort();
    assert_eq!(published, expected);

    // Planning again numbers afresh and agrees; the second run reads the files.
    let again = session.plan(sql).await.unwrap();
    let again_ids: Vec<u64> = find_stages(&again, plugin().stage_node_name())
        .iter()
        .map(|stage| plugin().stage_info(stage).unwrap().stage_id)
        .collect();
    assert_eq!(
        again_ids,
        (0..expected_stages)
            .map(|i| plugin().stage_id(i))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        run_to_table(&again, session.ctx.task_ctx()).await.unwrap(),
        answer
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_aggregate_is_one_stage_numbered_by_the_plugin() {
    check_numbering(AGGREGATE_SQL, 1, AGGREGATE_ANSWER).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_union_all_of_aggregates_is_two_stages_numbered_in_pre_order() {
    check_numbering(UNION_SQL, 2, UNION_ANSWER).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_without_aggregate_is_wrapped_whole() {
    check_numbering(SCAN_SQL, 1, SCAN_ANSWER).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_planner_counts_its_calls_on_the_plugin_side() {
    let dir = tempfile::tempdir().unwrap();
    let session = session(dir.path()).await;
    let before = plugin().counters();
    session.plan(UNION_SQL).await.unwrap();
    let after = plugin().counters();
    // Other tests in this process plan at the same time: at least ours.
    assert!(after.planner_calls > before.planner_calls);
    assert!(after.stages_inserted >= before.stages_inserted + 2);
}

#[test]
fn stage_ids_and_paths_come_from_the_plugin() {
    assert_eq!(plugin().stage_id(0), 1);
    assert_eq!(plugin().stage_id(4), 5);
    let path = plugin().partition_path(Path::new("/q"), 3, 1);
    assert_eq!(path, Path::new("/q/stage-3-part-1.arrow"));
    assert_eq!(plugin().partition_glob(), "stage-*-part-*.arrow");
}
