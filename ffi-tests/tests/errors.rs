//! Errors and panics inside the plugin reach the host as errors, message
//! intact, and the host survives.

use dfx_ffi_tests::fixtures::{AGGREGATE_SQL, distributed_lineitem};
use dfx_ffi_tests::locate::{plugin, test_hooks_plugin};
use dfx_ffi_tests::plans::{run_stages, run_to_table};
use dfx_ffi_tests::session::TestSession;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_bucket_file_reaches_the_host_with_its_message_intact() {
    let dir = tempfile::tempdir().unwrap();
    let shuffle = dir.path().join("shuffle");
    let session = TestSession::new(plugin(), &distributed_lineitem(dir.path()))
        .await
        .unwrap();
    let plan = session.plan(AGGREGATE_SQL).await.unwrap();
    let runs = run_stages(plugin(), &plan, session.ctx.task_ctx())
        .await
        .unwrap();

    // A published bucket of the stage the root reads (the first in pre-order).
    let (stage, maps) = &runs[0];
    let (map, bucket) = maps
        .iter()
        .enumerate()
        .find_map(|(map, run)| {
            run.summary
                .iter()
                .find(|b| b.rows > 0)
                .map(|b| (map, b.bucket as usize))
        })
        .expect("the stage published a non-empty bucket");
    let corrupt = plugin()
        .bucket_path(&shuffle, stage.info.stage_id, map, bucket)
        .unwrap();
    // Garbage over the segments, the marker closing the file left whole:
    // the sizes it records pass, so the error is about the content.
    let mut bytes = std::fs::read(&corrupt).unwrap();
    let segments = dfx_abi::map_marker_range(&bytes).unwrap().start;
    let garbage = b"these bytes are not an Arrow IPC stream ".iter().cycle();
    for (byte, junk) in bytes[..segments].iter_mut().zip(garbage) {
        *byte = *junk;
    }
    std::fs::write(&corrupt, bytes).unwrap();
    let error = run_to_table(&plan, session.ctx.task_ctx())
        .await
        .unwrap_err()
        .to_string();
    // The plugin's message crosses intact: dfx, the stage, map, bucket, the
    // file and what is wrong with it.
    for expected in [
        "dfx".to_string(),
        format!("stage {}", stage.info.stage_id),
        format!("map {map}"),
        // Whichever of the map's buckets is read first: they share its file.
        "bucket".to_string(),
        corrupt.display().to_string(),
        "Arrow IPC".to_string(),
    ] {
        assert!(
            error.contains(&expected),
            "expected `{expected}` in: {error}"
        );
    }
}

#[test]
fn the_shipped_plugin_has_no_panic_in_its_probe() {
    let error = plugin().panic_probe().unwrap_err().to_string();
    assert!(
        error.contains("built without its test-hooks feature"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_inside_the_plugin_becomes_an_error_and_the_host_survives() {
    let hooks = test_hooks_plugin();
    for _ in 0..2 {
        let error = hooks.panic_probe().unwrap_err().to_string();
        assert!(error.contains("panicked"), "{error}");
        assert!(
            error.contains("the panic probe fired inside the plugin"),
            "{error}"
        );
    }
    // The process, and the plugin, still work.
    assert_eq!(hooks.stage_id(0), 1);
    let dir = tempfile::tempdir().unwrap();
    let session = TestSession::new(hooks, &distributed_lineitem(dir.path()))
        .await
        .unwrap();
    let answer = session.run_sql(AGGREGATE_SQL).await.unwrap();
    assert_eq!(answer, dfx_ffi_tests::fixtures::AGGREGATE_ANSWER);
}
