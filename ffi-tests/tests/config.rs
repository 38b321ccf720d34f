//! The plugin's config extension, set on the host's session.

use std::path::Path;

use dfx_ffi_tests::fixtures::{AGGREGATE_ANSWER, AGGREGATE_SQL, write_lineitem};
use dfx_ffi_tests::locate::plugin;
use dfx_ffi_tests::plans::{find_stages, plan_display, run_to_table};
use dfx_ffi_tests::session::{SessionOptions, TestSession};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shuffle_dir_set_on_the_host_reaches_the_planner() {
    let dir = tempfile::tempdir().unwrap();
    let shuffle = dir.path().join("shuffle");
    let options =
        SessionOptions::distributed(&shuffle).with_table("lineitem", &write_lineitem(dir.path()));
    let session = TestSession::new(plugin(), &options).await.unwrap();

    // The host lists the key among its options (DataFusion 55.2 shows the FFI
    // extension's full keys; a host may also spell it under the
    // `datafusion_ffi.` namespace, and the plugin accepts both).
    let entries = session.ctx.state().config_options().entries();
    let entry = entries
        .iter()
        .find(|entry| {
            entry.key == "dfx_engine.shuffle_dir"
                || entry.key == "datafusion_ffi.dfx_engine.shuffle_dir"
        })
        .unwrap_or_else(|| {
            panic!(
                "no namespaced key among {:?}",
                entries.iter().map(|e| &e.key).collect::<Vec<_>>()
            )
        });
    assert_eq!(entry.value.as_deref(), Some(shuffle.to_str().unwrap()));

    // The planner saw it: the stage carries the directory.
    let plan = session.plan(AGGREGATE_SQL).await.unwrap();
    let stages = find_stages(&plan, plugin().stage_node_name());
    assert_eq!(stages.len(), 1, "{}", plan_display(&plan));
    let info = plugin().stage_info(&stages[0]).unwrap();
    assert_eq!(Path::new(info.shuffle_dir.as_str()), shuffle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sql_set_statement_reaches_the_planner() {
    let dir = tempfile::tempdir().unwrap();
    let shuffle = dir.path().join("set-by-sql");
    let options = SessionOptions::default().with_table("lineitem", &write_lineitem(dir.path()));
    let session = TestSession::new(plugin(), &options).await.unwrap();
    session
        .ctx
        .sql(&format!(
            "SET dfx_engine.shuffle_dir = '{}'",
            shuffle.display()
        ))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let plan = session.plan(AGGREGATE_SQL).await.unwrap();
    let stages = find_stages(&plan, plugin().stage_node_name());
    assert_eq!(stages.len(), 1, "{}", plan_display(&plan));
    assert_eq!(
        Path::new(
            plugin()
                .stage_info(&stages[0])
                .unwrap()
                .shuffle_dir
                .as_str()
        ),
        shuffle
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_key_under_dfx_engine_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let options = SessionOptions::default().with_table("lineitem", &write_lineitem(dir.path()));
    let session = TestSession::new(plugin(), &options).await.unwrap();
    // The FFI options accept any key when set; the plugin refuses it when it
    // reads its config, at the latest when planning. Either is an error that
    // names the key: a typo must not silently run a query in one process.
    let set = session
        .ctx
        .sql("SET dfx_engine.shufle_dir = '/tmp/typo'")
        .await;
    let error = match set {
        Err(err) => err.to_string(),
        Ok(frame) => match frame.collect().await {
            Err(err) => err.to_string(),
            Ok(_) => session
                .plan(AGGREGATE_SQL)
                .await
                .expect_err("an unknown dfx key was accepted")
                .to_string(),
        },
    };
    assert!(error.contains("shufle_dir"), "{error}");
    assert!(error.contains("dfx"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_shuffle_dir_inserts_no_stage_and_runs_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let options = SessionOptions {
        shuffle_dir: Some(String::new()),
        tables: Vec::new(),
    }
    .with_table("lineitem", &write_lineitem(dir.path()));
    let session = TestSession::new(plugin(), &options).await.unwrap();
    let plan = session.plan(AGGREGATE_SQL).await.unwrap();
    assert!(
        find_stages(&plan, plugin().stage_node_name()).is_empty(),
        "{}",
        plan_display(&plan)
    );
    assert_eq!(
        run_to_table(&plan, session.ctx.task_ctx()).await.unwrap(),
        AGGREGATE_ANSWER
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_shuffle_dir_at_all_inserts_no_stage() {
    let dir = tempfile::tempdir().unwrap();
    let options = SessionOptions::default().with_table("lineitem", &write_lineitem(dir.path()));
    let session = TestSession::new(plugin(), &options).await.unwrap();
    let plan = session.plan(AGGREGATE_SQL).await.unwrap();
    assert!(
        find_stages(&plan, plugin().stage_node_name()).is_empty(),
        "{}",
        plan_display(&plan)
    );
}
