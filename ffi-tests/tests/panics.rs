//! A panic inside the plugin in the middle of a query becomes an error that
//! names dfx; the host survives and its next query in the same process works.
//!
//! `datafusion-ffi` does not catch unwinds in its `extern "C"` functions, so
//! without the plugin's guards (`dfx_plugin::guard`) each of these tests would
//! abort the test process instead of failing. The panic comes from
//! `dfx_test_panic(x, at)`, a function only the `test-hooks` build registers:
//! it panics on the row where `x = at`. Row `l_quantity = 7` is in the second
//! fixture file, so the first partition (map) produces rows before it.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use datafusion::physical_plan::ExecutionPlan;
use dfx_ffi_tests::fixtures::{
    AGGREGATE_ANSWER, AGGREGATE_SQL, distributed_lineitem, write_lineitem,
};
use dfx_ffi_tests::locate::{TEST_HOOKS_ENV, test_hooks_plugin, test_hooks_plugin_path};
use dfx_ffi_tests::plans::{run_stage, run_stages, stages};
use dfx_ffi_tests::session::{SessionOptions, TestSession};
use futures::StreamExt;

const CHILD: &str = env!("CARGO_BIN_EXE_dfx-ffi-child");

/// Every row of the second fixture file, through the panicking function.
const LOCAL_SQL: &str = "SELECT dfx_test_panic(CAST(l_quantity AS BIGINT), 7) AS q FROM lineitem";

/// The same function inside the stage's partial aggregate.
const STAGE_SQL: &str = "SELECT l_returnflag, sum(dfx_test_panic(CAST(l_quantity AS BIGINT), 7)) AS q \
     FROM lineitem GROUP BY l_returnflag ORDER BY l_returnflag";

/// What the error of a caught panic says: dfx, where, and the panic's own message.
fn assert_caught(error: &str) {
    for expected in [
        "dfx plugin panicked in",
        "dfx_test_panic",
        "dfx_test_panic met 7, as the test asked",
    ] {
        assert!(
            error.contains(expected),
            "expected `{expected}` in: {error}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_a_local_query_is_an_error_after_rows_and_the_next_query_runs() {
    let dir = tempfile::tempdir().unwrap();
    let options = SessionOptions::default().with_table("lineitem", &write_lineitem(dir.path()));
    let session = TestSession::new(test_hooks_plugin(), &options)
        .await
        .unwrap();
    let plan = session.plan(LOCAL_SQL).await.unwrap();
    let partitions = plan.properties().output_partitioning().partition_count();
    assert_eq!(partitions, 2, "one partition per fixture file");

    let mut rows_before = 0;
    let mut error = None;
    for partition in 0..partitions {
        let mut stream = plan.execute(partition, session.ctx.task_ctx()).unwrap();
        while let Some(item) = stream.next().await {
            match item {
                Ok(batch) => rows_before += batch.num_rows(),
                Err(err) => error = error.or(Some(err.to_string())),
            }
        }
    }
    assert_caught(&error.expect("the query fails"));
    assert_eq!(
        rows_before, 4,
        "the first file's rows came before the panic"
    );

    // Same process, same session: the next query answers.
    let answer = session.run_sql(AGGREGATE_SQL).await.unwrap();
    assert_eq!(answer, AGGREGATE_ANSWER);
    let again = session.run_sql(LOCAL_SQL).await.unwrap_err().to_string();
    assert_caught(&again);
}

/// The stage that scans (it reads no other stage), where the function runs.
fn scan_stage(plan: &Arc<dyn ExecutionPlan>) -> dfx_ffi_tests::plans::Stage {
    stages(test_hooks_plugin(), plan)
        .unwrap()
        .into_iter()
        .find(|stage| stage.info.deps.is_empty())
        .expect("a stage reads the table")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_inside_a_stage_fails_its_map_publishes_nothing_and_the_host_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let shuffle = dir.path().join("shuffle");
    let session = TestSession::new(test_hooks_plugin(), &distributed_lineitem(dir.path()))
        .await
        .unwrap();
    let plan = session.plan(STAGE_SQL).await.unwrap();
    let stage = scan_stage(&plan);
    assert_eq!(stage.info.maps, 2, "one map per fixture file");

    let error = run_stage(&stage, session.ctx.task_ctx())
        .await
        .unwrap_err()
        .to_string();
    assert_caught(&error);
    // Map 0 ran and published; map 1 panicked and published nothing.
    let marker = |map| test_hooks_plugin().marker_path(&shuffle, stage.info.stage_id, map);
    assert!(marker(0).exists(), "map 0 published before the panic");
    assert!(!marker(1).exists(), "a panicking map publishes no marker");
    assert_no_temp_files(&shuffle);

    // The whole query through the driver's path fails the same way.
    let error = session.run_sql(STAGE_SQL).await.unwrap_err().to_string();
    assert_caught(&error);

    // And the process runs the next distributed query.
    let next = tempfile::tempdir().unwrap();
    let session = TestSession::new(test_hooks_plugin(), &distributed_lineitem(next.path()))
        .await
        .unwrap();
    let plan = session.plan(AGGREGATE_SQL).await.unwrap();
    run_stages(test_hooks_plugin(), &plan, session.ctx.task_ctx())
        .await
        .unwrap();
    assert_eq!(
        session.run_sql(AGGREGATE_SQL).await.unwrap(),
        AGGREGATE_ANSWER
    );
}

/// No temp file is left anywhere under `dir`: a panicking map's are removed.
fn assert_no_temp_files(dir: &Path) {
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                assert!(!name.ends_with(".tmp"), "left behind: {}", path.display());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_process_whose_stage_panics_exits_with_an_error_not_a_signal() {
    let dir = tempfile::tempdir().unwrap();
    let session = TestSession::new(test_hooks_plugin(), &distributed_lineitem(dir.path()))
        .await
        .unwrap();
    let plan = session.plan(STAGE_SQL).await.unwrap();
    let bytes = session.encode(scan_stage(&plan).writer).unwrap();
    let file = dir.path().join("stage.bin");
    std::fs::write(&file, bytes).unwrap();

    let output = Command::new(CHILD)
        .arg("run")
        .arg(&file)
        .env("DFX_PLUGIN", test_hooks_plugin_path())
        .env_remove(TEST_HOOKS_ENV)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    // An abort would end the child by SIGABRT, with no exit code.
    assert_eq!(
        output.status.code(),
        Some(1),
        "{:?}: {stderr}",
        output.status
    );
    assert_caught(&stderr);
    // Said once, by the error: the plugin's hook kept Rust's own
    // `thread '...' panicked at` report out of stderr.
    assert!(!stderr.contains("panicked at"), "{stderr}");
    assert_eq!(
        stderr.matches("dfx_test_panic met 7").count(),
        1,
        "{stderr}"
    );
}
