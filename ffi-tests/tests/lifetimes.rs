//! Lifetimes across the boundary: plugin-side objects are released when the
//! host drops what holds them; sessions come and go from several threads;
//! two copies of the plugin file are two independent libraries.
//!
//! Each test counts on its own copy of the plugin file (see
//! `locate::load_copy`), so the other tests of this process do not move its
//! counters.

use std::sync::Arc;

use dfx_abi::Plugin;
use dfx_ffi_tests::fixtures::{
    AGGREGATE_ANSWER, AGGREGATE_SQL, JOIN_ANSWER, JOIN_SQL, write_lineitem,
};
use dfx_ffi_tests::locate::load_copy;
use dfx_ffi_tests::plans::{find_stages, run_stages, run_to_table};
use dfx_ffi_tests::session::{SessionOptions, TestSession};
use futures::StreamExt;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Build a session, plan, drop a writer's stream unpolled, run every stage,
/// run the root's stream half-way and drop it, run the whole query, encode
/// and decode the plan; everything is dropped on return.
async fn exercise(plugin: &Plugin, root: &std::path::Path, sql: &str, answer: &str) {
    let options = SessionOptions::distributed(&root.join("shuffle"))
        .with_table("lineitem", &write_lineitem(root));
    let session = TestSession::new(plugin, &options).await.unwrap();
    let planned = session.planned(sql).await.unwrap();
    let plan = planned.plan;
    assert!(
        plugin.counters().live_objects > 0,
        "a live session holds plugin objects"
    );
    // A writer's stream abandoned before its first poll must release its
    // plugin side too (the deepest stage: it reads no other stage).
    let deepest = find_stages(&plan, plugin.stage_node_name())
        .pop()
        .expect("a distributing session plans stages");
    drop(deepest.execute(0, session.ctx.task_ctx()).unwrap());
    run_stages(plugin, &plan, session.ctx.task_ctx())
        .await
        .unwrap();
    // A reading stream abandoned after one batch, likewise.
    let mut stream = plan.execute(0, session.ctx.task_ctx()).unwrap();
    let _ = stream.next().await;
    drop(stream);
    assert_eq!(
        run_to_table(&plan, session.ctx.task_ctx()).await.unwrap(),
        answer
    );
    // The plan as the planner handed it back (each reader carrying its
    // stage), and each stage cut out of it.
    let bytes = session.encode(Arc::clone(&planned.handed)).unwrap();
    let decoded = session.decode(&bytes).unwrap();
    drop(decoded);
    for stage in &planned.stages {
        drop(session.decode(stage).unwrap());
    }
}

#[test]
fn dropping_sessions_plans_and_streams_releases_every_plugin_object() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = load_copy(&dir.path().join("copy"));
    assert_eq!(plugin.counters().live_objects, 0);
    let runtime = runtime();
    runtime.block_on(exercise(
        &plugin,
        &dir.path().join("q1"),
        AGGREGATE_SQL,
        AGGREGATE_ANSWER,
    ));
    runtime.block_on(exercise(
        &plugin,
        &dir.path().join("q2"),
        JOIN_SQL,
        JOIN_ANSWER,
    ));
    // Dropping the runtime waits for its tasks, so nothing is still in flight.
    drop(runtime);
    let counters = plugin.counters();
    assert!(counters.planner_calls >= 2, "{counters:?}");
    assert_eq!(counters.live_objects, 0, "{counters:?}");
}

#[test]
fn sessions_created_and_dropped_on_several_threads_leak_nothing() {
    const THREADS: usize = 4;
    const ROUNDS: usize = 3;
    let dir = tempfile::tempdir().unwrap();
    let plugin = load_copy(&dir.path().join("copy"));
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            let plugin = &plugin;
            let root = dir.path().join(format!("thread-{thread}"));
            scope.spawn(move || {
                let runtime = runtime();
                for round in 0..ROUNDS {
                    runtime.block_on(exercise(
                        plugin,
                        &root.join(format!("round-{round}")),
                        AGGREGATE_SQL,
                        AGGREGATE_ANSWER,
                    ));
                }
            });
        }
    });
    let counters = plugin.counters();
    assert!(
        counters.planner_calls >= (THREADS * ROUNDS) as u64,
        "{counters:?}"
    );
    assert_eq!(counters.live_objects, 0, "{counters:?}");
}

#[test]
fn two_copies_of_the_plugin_file_are_two_independent_libraries() {
    let dir = tempfile::tempdir().unwrap();
    let first = load_copy(&dir.path().join("first"));
    let second = load_copy(&dir.path().join("second"));
    assert_ne!(first.path(), second.path());
    let runtime = runtime();

    runtime.block_on(exercise(
        &first,
        &dir.path().join("q1"),
        AGGREGATE_SQL,
        AGGREGATE_ANSWER,
    ));
    let (a, b) = (first.counters(), second.counters());
    assert!(a.planner_calls > 0, "{a:?}");
    assert_eq!(
        b.planner_calls, 0,
        "the second copy shares the first's statics: {b:?}"
    );

    runtime.block_on(exercise(
        &second,
        &dir.path().join("q2"),
        JOIN_SQL,
        JOIN_ANSWER,
    ));
    assert_eq!(
        first.counters().planner_calls,
        a.planner_calls,
        "planning on the second moved the first"
    );
    assert!(second.counters().planner_calls > 0);
    drop(runtime);
    assert_eq!(first.counters().live_objects, 0);
    assert_eq!(second.counters().live_objects, 0);
}
