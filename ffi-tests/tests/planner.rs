//! The plugin's planner seen from a host: where it cuts the plan into stages
//! (both split modes), stage ids by pre-order position (descending into
//! nested stages) equal to the plugin's own numbering, deps and maps that
//! match the plan's shape, and files exactly where the plugin's path
//! functions say.

use std::path::Path;
use std::sync::Arc;

use datafusion::physical_plan::{ExecutionPlan, Partitioning};
use dfx_ffi_tests::fixtures::{
    AGGREGATE_ANSWER, AGGREGATE_SQL, JOIN_ANSWER, JOIN_SQL, SCAN_ANSWER, SCAN_SQL, UNION_ANSWER,
    UNION_SQL, write_lineitem,
};
use dfx_ffi_tests::locate::plugin;
use dfx_ffi_tests::plans::{
    direct_deps, expected_files, plan_display, published_files, run_stages, run_to_table, stages,
};
use dfx_ffi_tests::session::{SPLIT_AGGREGATE, SPLIT_EXCHANGE, SessionOptions, TestSession};

async fn session(root: &Path, split: &str) -> TestSession {
    let options = SessionOptions::distributed(&root.join("shuffle"))
        .with_table("lineitem", &write_lineitem(root))
        .with_split(split);
    TestSession::new(plugin(), &options).await.unwrap()
}

/// Every node of `plan`, in pre-order.
fn nodes(plan: &Arc<dyn ExecutionPlan>, out: &mut Vec<Arc<dyn ExecutionPlan>>) {
    out.push(Arc::clone(plan));
    for child in plan.children() {
        nodes(child, out);
    }
}

/// The exchange split's cuts, checked on the plan: no hash or round-robin
/// repartition is left (each hash one became a hash exchange, round robin is
/// off), and every merge reads a stage.
fn assert_exchange_cuts(plan: &Arc<dyn ExecutionPlan>) {
    let display = plan_display(plan);
    let reader = plugin().reader_node_name().unwrap();
    let mut all = Vec::new();
    nodes(plan, &mut all);
    for node in &all {
        if node.name() == "RepartitionExec" {
            let partitioning = node.properties().output_partitioning();
            assert!(
                !matches!(
                    partitioning,
                    Partitioning::Hash(..) | Partitioning::RoundRobinBatch(_)
                ),
                "a repartition ({partitioning}) survived the exchange split: {display}"
            );
        }
        if matches!(
            node.name(),
            "CoalescePartitionsExec" | "SortPreservingMergeExec"
        ) {
            let child = &node.children()[0];
            assert_eq!(child.name(), reader, "{} in {display}", node.name());
        }
    }
}

/// Stage ids recomputed by pre-order position equal the ids the plugin gave
/// the writers, deps and maps match the plan, each stage publishes exactly
/// the files the plugin's path functions name, and the root then answers.
async fn check_numbering(sql: &str, split: &str, expected_stages: usize, answer: &str) {
    let dir = tempfile::tempdir().unwrap();
    let shuffle = dir.path().join("shuffle");
    let session = session(dir.path(), split).await;
    let plan = session.plan(sql).await.unwrap();
    let display = plan_display(&plan);
    // `stages` checks stage_info's id against plugin.stage_id(position).
    let found = stages(plugin(), &plan).unwrap_or_else(|err| panic!("{err}\n{display}"));
    assert_eq!(found.len(), expected_stages, "{split}: {display}");
    if split == SPLIT_EXCHANGE {
        assert_exchange_cuts(&plan);
    }

    for (index, stage) in found.iter().enumerate() {
        let info = &stage.info;
        assert_eq!(info.stage_id, 1 + index as u64, "FIRST_STAGE_ID is 1");
        assert_eq!(Path::new(info.shuffle_dir.as_str()), shuffle);
        assert_eq!(
            info.maps as usize,
            stage
                .writer
                .properties()
                .output_partitioning()
                .partition_count(),
            "{info:?}"
        );
        // Deps: the writers met first below this one, ascending.
        assert_eq!(
            info.deps.to_vec(),
            direct_deps(plugin(), &stage.writer).unwrap(),
            "{info:?} in {display}"
        );
        assert!(info.deps.iter().all(|&dep| dep > info.stage_id), "{info:?}");
        assert!(!info.partitioning.is_empty(), "{info:?}");
        if info.partitioning.starts_with("hash") {
            assert!(
                info.partitioning.contains(&format!(", {})", info.buckets)),
                "{info:?}"
            );
        }
    }

    let runs = run_stages(plugin(), &plan, session.ctx.task_ctx())
        .await
        .unwrap();
    // Exactly the files the plugin's path functions name, nothing else.
    let mut expected = std::collections::BTreeSet::new();
    for (stage, maps) in &runs {
        expected.extend(expected_files(plugin(), &shuffle, stage.info.stage_id, maps).unwrap());
    }
    assert_eq!(published_files(&shuffle).unwrap(), expected);

    // Planning again numbers afresh and agrees; its root reads the files.
    let again = session.plan(sql).await.unwrap();
    let again_infos: Vec<_> = stages(plugin(), &again)
        .unwrap()
        .into_iter()
        .map(|stage| stage.info)
        .collect();
    let infos: Vec<_> = runs.iter().map(|(stage, _)| stage.info.clone()).collect();
    assert_eq!(again_infos, infos);
    assert_eq!(
        run_to_table(&again, session.ctx.task_ctx()).await.unwrap(),
        answer
    );
    // And so does the root of the plan the stages came from.
    assert_eq!(
        run_to_table(&plan, session.ctx.task_ctx()).await.unwrap(),
        answer
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_aggregate_is_a_hash_stage_read_by_a_pass_through_stage() {
    check_numbering(AGGREGATE_SQL, SPLIT_EXCHANGE, 2, AGGREGATE_ANSWER).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_union_all_of_aggregates_nests_two_stages_numbered_in_pre_order() {
    // DataFusion plans this union as an `InterleaveExec` over two
    // hash-partitioned aggregates, each reading its own hash stage. A host
    // would rebuild that interleave over foreign readers when it decodes the
    // plan, and refuse it (partitionings that crossed FFI never compare
    // equal), so the split rule turns it into a hash exchange over a union:
    // the two aggregate stages, that exchange, and the head's pass-through.
    check_numbering(UNION_SQL, SPLIT_EXCHANGE, 4, UNION_ANSWER).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_without_repartition_is_one_pass_through_stage() {
    check_numbering(SCAN_SQL, SPLIT_EXCHANGE, 1, SCAN_ANSWER).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_is_cut_into_stages_that_answer_as_one_process() {
    // How the join is cut (broadcast or hashed on both sides) is the
    // planner's choice; the numbering, deps, files and answer are checked.
    let dir = tempfile::tempdir().unwrap();
    let probe = session(dir.path(), SPLIT_EXCHANGE).await;
    let plan = probe.plan(JOIN_SQL).await.unwrap();
    let count = stages(plugin(), &plan).unwrap().len();
    assert!(count >= 2, "{}", plan_display(&plan));
    check_numbering(JOIN_SQL, SPLIT_EXCHANGE, count, JOIN_ANSWER).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aggregate_split_makes_one_stage_per_topmost_partial_aggregate() {
    check_numbering(AGGREGATE_SQL, SPLIT_AGGREGATE, 1, AGGREGATE_ANSWER).await;
    check_numbering(UNION_SQL, SPLIT_AGGREGATE, 2, UNION_ANSWER).await;
    check_numbering(SCAN_SQL, SPLIT_AGGREGATE, 1, SCAN_ANSWER).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_planner_counts_its_calls_on_the_plugin_side() {
    let dir = tempfile::tempdir().unwrap();
    let session = session(dir.path(), SPLIT_EXCHANGE).await;
    let before = plugin().counters();
    let plan = session.plan(JOIN_SQL).await.unwrap();
    let after = plugin().counters();
    let found = stages(plugin(), &plan).unwrap().len() as u64;
    // Other tests in this process plan at the same time: at least ours.
    assert!(after.planner_calls > before.planner_calls);
    assert!(after.stages_inserted >= before.stages_inserted + found);
}

#[test]
fn stage_ids_and_paths_come_from_the_plugin() {
    assert_eq!(plugin().stage_id(0), 1);
    assert_eq!(plugin().stage_id(4), 5);
    assert_eq!(
        plugin().marker_path(Path::new("/q"), 3, 1),
        Path::new("/q/stage-3/1-map-1.arrow")
    );
    assert_eq!(
        plugin().bucket_path(Path::new("/q"), 3, 1, 2).unwrap(),
        Path::new("/q/stage-3/1-map-1.arrow")
    );
    assert_eq!(plugin().partition_glob(), "stage-*");
}
