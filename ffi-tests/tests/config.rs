//! The plugin's config extension (`dfx_engine.shuffle_dir`,
//! `dfx_engine.split`), set on the host's session.

use std::path::Path;

use dfx_ffi_tests::fixtures::{
    AGGREGATE_ANSWER, AGGREGATE_SQL, distributed_lineitem, write_lineitem,
};
use dfx_ffi_tests::locate::plugin;
use dfx_ffi_tests::plans::{find_stages, plan_display, run_query, run_to_table, stages};
use dfx_ffi_tests::session::{SPLIT_AGGREGATE, SessionOptions, TestSession};

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

    // The planner saw it: every stage carries the directory.
    let plan = session.plan(AGGREGATE_SQL).await.unwrap();
    let stages = stages(plugin(), &plan).unwrap();
    assert!(!stages.is_empty(), "{}", plan_display(&plan));
    for stage in &stages {
        assert_eq!(Path::new(stage.info.shuffle_dir.as_str()), shuffle);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sql_set_statement_reaches_the_planner() {
    let dir = tempfile::tempdir().unwrap();
    let shuffle = dir.path().join("set-by-sql");
    let options = SessionOptions::default().with_table("lineitem", &write_lineitem(dir.path()));
    let session = TestSession::new(plugin(), &options).await.unwrap();
    // `sql` runs a SET when called; its (empty) frame is not collected: in a
    // distributing session that would plan a stage no driver ran.
    session
        .ctx
        .sql(&format!(
            "SET dfx_engine.shuffle_dir = '{}'",
            shuffle.display()
        ))
        .await
        .unwrap();
    let plan = session.plan(AGGREGATE_SQL).await.unwrap();
    let stages = stages(plugin(), &plan).unwrap();
    assert!(!stages.is_empty(), "{}", plan_display(&plan));
    for stage in &stages {
        assert_eq!(Path::new(stage.info.shuffle_dir.as_str()), shuffle);
    }
}

/// Stages of [`AGGREGATE_SQL`] in a distributing session after `statement`.
async fn stages_after(root: &Path, statement: Option<&str>) -> usize {
    let session = TestSession::new(plugin(), &distributed_lineitem(root))
        .await
        .unwrap();
    if let Some(statement) = statement {
        // Run when called; the empty frame is not collected (see above).
        session.ctx.sql(statement).await.unwrap();
    }
    let plan = session.plan(AGGREGATE_SQL).await.unwrap();
    let answer = run_query(plugin(), &plan, session.ctx.task_ctx())
        .await
        .unwrap();
    assert_eq!(answer, AGGREGATE_ANSWER, "after {statement:?}");
    stages(plugin(), &plan).unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_split_mode_set_on_the_host_reaches_the_planner() {
    let dir = tempfile::tempdir().unwrap();
    // Exchange is the default: a hash stage read by a pass-through stage.
    assert_eq!(stages_after(&dir.path().join("default"), None).await, 2);
    assert_eq!(
        stages_after(
            &dir.path().join("exchange"),
            Some("SET dfx_engine.split = 'exchange'")
        )
        .await,
        2
    );
    // The aggregate split: the partial aggregate is the one stage.
    assert_eq!(
        stages_after(
            &dir.path().join("aggregate"),
            Some("SET dfx_engine.split = 'aggregate'")
        )
        .await,
        1
    );
    // The same through the session's options, as hosts set it.
    let root = dir.path().join("option");
    let options = distributed_lineitem(&root).with_split(SPLIT_AGGREGATE);
    let session = TestSession::new(plugin(), &options).await.unwrap();
    let plan = session.plan(AGGREGATE_SQL).await.unwrap();
    assert_eq!(stages(plugin(), &plan).unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_split_mode_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let session = TestSession::new(plugin(), &distributed_lineitem(dir.path()))
        .await
        .unwrap();
    // Refused when set or, at the latest, when planning: a typo must not
    // silently plan with another rule.
    let set = session.ctx.sql("SET dfx_engine.split = 'exchnage'").await;
    let error = match set {
        Err(err) => err.to_string(),
        Ok(frame) => match frame.collect().await {
            Err(err) => err.to_string(),
            Ok(_) => session
                .plan(AGGREGATE_SQL)
                .await
                .expect_err("an unknown split mode was accepted")
                .to_string(),
        },
    };
    assert!(error.contains("exchnage"), "{error}");
    assert!(error.contains("dfx"), "{error}");
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
        ..SessionOptions::default()
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

#[test]
fn the_plugins_session_settings_are_datafusion_keys_that_keep_each_partition_to_its_files() {
    let settings = plugin().session_settings().unwrap();
    let mut options = datafusion::config::ConfigOptions::new();
    for (key, value) in &settings {
        options
            .set(key, value)
            .unwrap_or_else(|err| panic!("{key}={value} is not a DataFusion setting: {err}"));
    }
    // What a worker running one partition alone depends on: no file is
    // stolen from a sibling partition, and no file is split across two.
    assert!(!options.execution.enable_file_stream_work_stealing);
    assert!(!options.optimizer.repartition_file_scans);
    assert_eq!(
        options.execution.parquet.metadata_size_hint,
        Some(dfx_abi::PARQUET_FOOTER_HINT)
    );
    let keys: Vec<&str> = settings.iter().map(|(key, _)| key.as_str()).collect();
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    assert_eq!(keys, sorted, "in key order");
}
