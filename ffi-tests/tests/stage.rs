//! Nodes across the boundary: in this separately compiled host the stage
//! node is foreign, displays as the FFI wrapper, is found by containment of
//! its name, and runs.

use datafusion_ffi::execution_plan::ForeignExecutionPlan;
use dfx_ffi_tests::fixtures::{AGGREGATE_ANSWER, AGGREGATE_SQL, write_lineitem};
use dfx_ffi_tests::locate::plugin;
use dfx_ffi_tests::plans::{find_stages, node_display, plan_display, run_partitions, run_to_table};
use dfx_ffi_tests::session::{SessionOptions, TestSession};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stage_node_is_foreign_and_displays_as_the_ffi_wrapper() {
    let dir = tempfile::tempdir().unwrap();
    let shuffle = dir.path().join("shuffle");
    let options =
        SessionOptions::distributed(&shuffle).with_table("lineitem", &write_lineitem(dir.path()));
    let session = TestSession::new(plugin(), &options).await.unwrap();
    let plan = session.plan(AGGREGATE_SQL).await.unwrap();

    let stages = find_stages(&plan, plugin().stage_node_name());
    assert_eq!(stages.len(), 1, "{}", plan_display(&plan));
    let stage = &stages[0];
    assert_eq!(
        node_display(stage.as_ref()),
        "FFI_ExecutionPlan: ShuffleStageExec, number_of_children=1"
    );
    assert!(
        stage.is::<ForeignExecutionPlan>(),
        "the stage node should be foreign in a separately compiled host"
    );
    assert_eq!(stage.name(), plugin().stage_node_name());
    // The in-process display never reaches this host.
    assert!(
        !plan_display(&plan).contains("ShuffleStageExec: stage="),
        "{}",
        plan_display(&plan)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_executes_across_the_boundary_and_publishes_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let shuffle = dir.path().join("shuffle");
    let options =
        SessionOptions::distributed(&shuffle).with_table("lineitem", &write_lineitem(dir.path()));
    let session = TestSession::new(plugin(), &options).await.unwrap();
    let plan = session.plan(AGGREGATE_SQL).await.unwrap();
    let stage = find_stages(&plan, plugin().stage_node_name()).remove(0);
    let info = plugin().stage_info(&stage).unwrap();

    let rows = run_partitions(&stage, session.ctx.task_ctx())
        .await
        .unwrap();
    assert_eq!(rows.len() as u64, info.partition_count);
    // Partial aggregates: each flag appears at most once per partition, and
    // every flag somewhere.
    assert!(rows.iter().all(|&n| n <= 3), "{rows:?}");
    assert!(rows.iter().sum::<usize>() >= 3, "{rows:?}");
    for partition in 0..rows.len() {
        let file = plugin().partition_path(&shuffle, info.stage_id, partition);
        assert!(file.exists(), "{} was not published", file.display());
    }
    // The whole query now reads the files and answers as computed by hand.
    let answer = run_to_table(&plan, session.ctx.task_ctx()).await.unwrap();
    assert_eq!(answer, AGGREGATE_ANSWER);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_foreign_stage_reports_its_schema_and_partitioning() {
    let dir = tempfile::tempdir().unwrap();
    let shuffle = dir.path().join("shuffle");
    let options =
        SessionOptions::distributed(&shuffle).with_table("lineitem", &write_lineitem(dir.path()));
    let session = TestSession::new(plugin(), &options).await.unwrap();
    let plan = session.plan(AGGREGATE_SQL).await.unwrap();
    let stage = find_stages(&plan, plugin().stage_node_name()).remove(0);
    let child = &stage.children()[0];
    // Stage partitioning is its child's; its schema is its child's.
    assert_eq!(stage.schema(), child.schema());
    assert_eq!(
        stage.properties().output_partitioning().partition_count(),
        child.properties().output_partitioning().partition_count()
    );
}
