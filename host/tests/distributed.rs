//! Distributed runs over real worker processes and the real plugin file,
//! checked against the hand-worked answers of `common` and against local runs.

mod common;

use common::*;
use datafusion::arrow::ipc::reader::StreamReader;

#[tokio::test]
async fn distributed_equals_local_equals_the_hand_checked_answer() {
    let fixture = Fixture::new();
    let host = host();
    let result = host
        .run_distributed(BY_FLAG, &fixture.distributed_spec("shuffle"))
        .await
        .unwrap();
    assert_eq!(rows(&result.batches), by_flag_expected());
    let local = host.run_local(BY_FLAG, &fixture.spec()).await.unwrap();
    assert_eq!(rows(&local), by_flag_expected());

    // One stage, one task per file, each exactly once, in order.
    assert_eq!(result.tasks, vec![(1, 0), (1, 1), (1, 2), (1, 3)]);
    assert_eq!(result.stage_ids(), vec![1]);
    // Every file holds two flags: two partial groups per task, eight in all.
    let per_task: Vec<usize> = result.task_rows.values().copied().collect();
    assert_eq!(per_task, vec![2, 2, 2, 2]);
    assert_eq!(result.task_rows.len(), result.tasks.len());
    assert_eq!(result.task_rows.values().sum::<usize>(), 8);
}

#[tokio::test]
async fn plugin_functions_resolve_on_every_worker_and_the_aggregate_state_survives() {
    let fixture = Fixture::new();
    let host = host();
    let result = host
        .run_distributed(FUNCTIONS, &fixture.distributed_spec("shuffle"))
        .await
        .unwrap();
    assert_eq!(rows(&result.batches), functions_expected());
    assert_eq!(result.tasks.len(), 4);
    let local = host.run_local(FUNCTIONS, &fixture.spec()).await.unwrap();
    assert_eq!(rows(&local), functions_expected());
}

#[tokio::test]
async fn a_union_of_two_aggregates_ships_two_stages_with_their_own_files() {
    let fixture = Fixture::new();
    let host = host();
    let spec = fixture.distributed_spec("shuffle");
    let result = host.run_distributed(UNION, &spec).await.unwrap();
    assert_eq!(rows(&result.batches), union_expected());
    assert_eq!(
        rows(&host.run_local(UNION, &fixture.spec()).await.unwrap()),
        union_expected()
    );

    let expected_tasks: Vec<(u64, usize)> = [1, 2]
        .into_iter()
        .flat_map(|stage| (0..4).map(move |p| (stage, p)))
        .collect();
    assert_eq!(result.tasks, expected_tasks);
    assert_eq!(result.stage_ids(), vec![1, 2]);

    // Each stage's files carry that stage's partial state: the first branch
    // groups by flag, the second by key parity.
    let plugin = plugin();
    let dir = spec.shuffle_dir.as_deref().unwrap();
    for (stage, partition) in &result.tasks {
        let path = plugin.partition_path(dir, *stage, *partition);
        let reader = StreamReader::try_new(std::fs::File::open(&path).unwrap(), None).unwrap();
        let first_field = reader.schema().field(0).name().clone();
        let rows: usize = reader.map(|b| b.unwrap().num_rows()).sum();
        assert_eq!(
            rows,
            result.task_rows[&(*stage, *partition)],
            "{}",
            path.display()
        );
        assert_eq!(
            first_field.contains("l_returnflag"),
            *stage == 1,
            "stage {stage} file {} has first field {first_field}",
            path.display()
        );
    }
}

#[tokio::test]
async fn one_published_file_per_task_and_no_temp_file_left() {
    let fixture = Fixture::new();
    let spec = fixture.distributed_spec("shuffle");
    let result = host().run_distributed(BY_FLAG, &spec).await.unwrap();
    let dir = spec.shuffle_dir.as_deref().unwrap();
    assert_eq!(
        file_names(dir),
        vec![
            "stage-1-part-0.arrow",
            "stage-1-part-1.arrow",
            "stage-1-part-2.arrow",
            "stage-1-part-3.arrow",
            "tasks"
        ]
    );
    for name in file_names(&dir.join("tasks")) {
        assert!(
            !name.contains(".tmp"),
            "temp file {name} left behind in tasks/"
        );
    }
    assert_eq!(result.tasks.len(), 4);
}

#[tokio::test]
async fn no_shuffle_directory_means_no_stage_and_the_right_answer() {
    let fixture = Fixture::new();
    let host = host();
    let plan = host.explain(BY_FLAG, &fixture.spec()).await.unwrap();
    assert!(!plan.contains("ShuffleStageExec"), "{plan}");
    assert!(!plan.contains("<== stage"), "{plan}");
    assert_eq!(
        rows(&host.run_local(BY_FLAG, &fixture.spec()).await.unwrap()),
        by_flag_expected()
    );

    let err = host
        .run_distributed(BY_FLAG, &fixture.spec())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("needs a shuffle directory"),
        "{err}"
    );
}

#[tokio::test]
async fn a_plan_without_aggregate_is_one_whole_stage() {
    let fixture = Fixture::new();
    let sql = "SELECT l_orderkey, l_quantity FROM lineitem WHERE l_tax > 0 ORDER BY l_orderkey";
    let result = host()
        .run_distributed(sql, &fixture.distributed_spec("shuffle"))
        .await
        .unwrap();
    // Taxed rows (hand-checked): keys 2, 4, 5, 6.
    assert_eq!(
        rows(&result.batches),
        vec![
            vec![i(2), f(2.0)],
            vec![i(4), f(4.0)],
            vec![i(5), f(5.0)],
            vec![i(6), f(6.0)]
        ]
    );
    assert_eq!(result.stage_ids(), vec![1]);
    assert_eq!(result.task_rows.values().sum::<usize>(), 4);
}

#[tokio::test]
async fn a_capped_fan_out_still_runs_every_task() {
    let fixture = Fixture::new();
    let host = host().max_workers(Some(1));
    let result = host
        .run_distributed(UNION, &fixture.distributed_spec("shuffle"))
        .await
        .unwrap();
    assert_eq!(rows(&result.batches), union_expected());
    assert_eq!(result.tasks.len(), 8);
    assert_eq!(result.task_rows.len(), 8);
}
