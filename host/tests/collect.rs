//! DataFusion's own calls run distributed on a session from
//! `Host::session`: `ctx().sql(q).await?.collect()` runs the stages on real
//! `dfx worker` processes and reads the head here. All 22 TPC-H queries at
//! a tiny scale agree with stock DataFusion; each query's location under
//! the root is removed once read, kept and named when the query fails.

mod common;

use common::*;
use datafusion::physical_plan::ExecutionPlanProperties;
use dfx_host::SessionSpec;
use dfx_host::tpch::compare::{compare, compare_columns, row_order, rows_of};
use dfx_host::tpch::datagen::ensure_dataset;
use dfx_host::tpch::queries::query;
use dfx_host::tpch::runner::run_stock;
use futures::StreamExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_22_tpch_queries_collected_on_a_session_agree_with_stock() {
    let data = tempfile::tempdir().unwrap();
    let (dataset, _) = ensure_dataset(data.path(), 0.01, 2, false).unwrap();
    let root = tempfile::tempdir().unwrap();
    let spec = SessionSpec::new(dataset.tables()).with_shuffle_root(root.path());
    let host = host();
    let session = host.session(&spec).await.unwrap();
    let mut previous: Option<std::sync::Arc<dfx_runtime::QueryRun>> = None;
    let mut tasks = 0;
    for number in 1..=22 {
        let sql = query(number).unwrap().sql;
        let expected = run_stock(sql, &spec).await.unwrap();
        let frame = session.ctx().sql(sql).await.unwrap();
        let order = row_order(frame.logical_plan());
        let batches = frame
            .collect()
            .await
            .unwrap_or_else(|e| panic!("q{number}: {e}"));
        compare_columns(&expected, &batches).unwrap_or_else(|m| panic!("q{number}: {m}"));
        compare(
            &rows_of(&expected).unwrap(),
            &rows_of(&batches).unwrap(),
            &order,
        )
        .unwrap_or_else(|m| panic!("q{number}: {m}"));
        let run = session.last_run().expect("a distributed run");
        // This query's run, not the one before.
        assert!(
            previous
                .as_ref()
                .is_none_or(|p| !std::sync::Arc::ptr_eq(p, &run)),
            "q{number} ran no stage"
        );
        assert!(!run.tasks().is_empty(), "q{number}: no task ran");
        tasks += run.tasks().len();
        // Every task ran in a worker process, none in this one.
        for (task, report) in run.reports() {
            let worker = report.worker.expect("the pool names its worker");
            assert_ne!(worker, std::process::id(), "q{number} {task:?}");
        }
        previous = Some(run);
    }
    eprintln!("22 queries, {tasks} tasks");
    // Each query's location went once its answer was read.
    assert_eq!(
        files_below(root.path()),
        vec![dfx_runtime::shuffle_root::ROOT_MARKER.to_string()],
    );
}

#[tokio::test]
async fn a_stream_and_a_count_run_distributed_and_a_failure_keeps_its_location() {
    let fixture = Fixture::new();
    let root = fixture.shuffle_dir("root");
    let spec = fixture.spec().with_shuffle_root(&root);
    let host = host();
    let session = host.session(&spec).await.unwrap();
    let expected = sorted_rows(&host.run_local(BY_FLAG, &spec).await.unwrap());

    let frame = session.ctx().sql(BY_FLAG).await.unwrap();
    let plan = frame.clone().create_physical_plan().await.unwrap();
    assert_eq!(plan.name(), "DistributedRootExec");
    assert_eq!(plan.output_partitioning().partition_count(), 1);
    let mut stream = frame.execute_stream().await.unwrap();
    let mut batches = Vec::new();
    while let Some(batch) = stream.next().await {
        batches.push(batch.unwrap());
    }
    assert_eq!(sorted_rows(&batches), expected);
    let tasks = session.last_run().unwrap().tasks().len();
    assert!(tasks > 1, "{tasks} tasks");

    let count = session
        .ctx()
        .sql("SELECT * FROM lineitem")
        .await
        .unwrap()
        .count()
        .await
        .unwrap();
    assert_eq!(count, 8);

    // A failure in a task: the location stays, and the error names it.
    let err = session
        .ctx()
        .sql("SELECT CAST(l_returnflag AS INT) FROM lineitem")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap_err()
        .to_string();
    let kept = err
        .lines()
        .find_map(|l| l.strip_prefix("the query's shuffle location is kept for inspection: "))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(std::path::Path::new(kept).starts_with(&root), "{kept}");
    assert!(std::path::Path::new(kept).is_dir(), "{kept}");
}

#[tokio::test]
async fn a_shuffle_dir_holding_stage_output_refuses_a_second_query() {
    let fixture = Fixture::new();
    let spec = fixture.distributed_spec("own");
    let host = host();
    let session = host.session(&spec).await.unwrap();
    let expected = sorted_rows(&host.run_local(BY_FLAG, &spec).await.unwrap());
    let first = session.ctx().sql(BY_FLAG).await.unwrap().collect().await;
    assert_eq!(sorted_rows(&first.unwrap()), expected);
    let err = session
        .ctx()
        .sql(BY_FLAG)
        .await
        .unwrap()
        .collect()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("stage output"), "{err}");
}

#[tokio::test]
async fn a_session_of_a_process_mode_host_runs_a_process_per_task() {
    let fixture = Fixture::new();
    let spec = fixture
        .spec()
        .with_shuffle_root(fixture.shuffle_dir("root"));
    let host = host().worker_mode(dfx_host::WorkerMode::Process);
    let expected = sorted_rows(&host.run_local(BY_FLAG, &spec).await.unwrap());
    let session = host.session(&spec).await.unwrap();
    let batches = session
        .ctx()
        .sql(BY_FLAG)
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(sorted_rows(&batches), expected);
    let run = session.last_run().unwrap();
    assert_eq!(run.executor_name(), "process");
    assert!(run.tasks().len() > 1, "{:?}", run.tasks());
    // No pool: every task was a process of its own.
    assert!(host.pool().pids().is_empty());
}
