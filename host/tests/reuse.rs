//! A shuffle directory that already holds stage output is refused before
//! anything is built or run. Alone in its test binary: it reads the plugin's
//! process-wide counters, which another test planning at the same time would
//! move.

mod common;

use common::*;

#[tokio::test]
async fn a_reused_shuffle_directory_is_refused_before_anything_is_built_or_run() {
    let fixture = Fixture::new();
    let spec = fixture.distributed_spec("shuffle");
    let dir = spec.shuffle_dir.clone().unwrap();
    std::fs::create_dir_all(dir.join("stage-1")).unwrap();
    // Output left by an earlier query (its content does not matter: it is
    // never opened), next to a file of the caller's that is not stage output.
    std::fs::write(dir.join("stage-1").join("0-map-0.arrow"), b"{}").unwrap();
    std::fs::write(dir.join("notes.txt"), b"mine").unwrap();

    let host = host();
    let before = host.plugin().counters();
    let err = host
        .run_distributed(BY_FLAG, &spec)
        .await
        .unwrap_err()
        .to_string();
    let after = host.plugin().counters();

    assert!(err.contains("already holds stage output"), "{err}");
    assert!(err.contains("[\"stage-1\"]"), "{err}");
    assert!(err.contains("previous query's results"), "{err}");
    assert!(err.contains("one shuffle directory per query"), "{err}");
    // Nothing planned (no session asked the planner), nothing dispatched.
    assert_eq!(after.planner_calls, before.planner_calls);
    assert_eq!(after.stages_encoded, before.stages_encoded);
    // The driver's lock file is the one thing it added.
    assert_eq!(
        file_names(&dir),
        vec![".dfx-driver.lock", "notes.txt", "stage-1"]
    );

    // Only stage output counts: the caller's own files are not a reason to refuse.
    let other = fixture.shuffle_dir("mine");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("notes.txt"), b"mine").unwrap();
    let spec = fixture.spec().with_shuffle_dir(&other);
    let result = host.run_distributed(BY_FLAG, &spec).await.unwrap();
    assert_eq!(rows(&result.batches), by_flag_expected());

    // A second run in the directory the first one used is refused too, with
    // every stage directory the first one left named.
    let err = host
        .run_distributed(BY_FLAG, &spec)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("already holds stage output"), "{err}");
    for stage in result.stage_ids() {
        assert!(err.contains(&format!("\"stage-{stage}\"")), "{err}");
    }
}

#[tokio::test]
async fn a_second_driver_on_a_directory_another_driver_holds_is_refused() {
    let fixture = Fixture::new();
    let spec = fixture.distributed_spec("shuffle");
    let dir = spec.shuffle_dir.clone().unwrap();
    // Another driver (this lock is the one every dfx driver takes, Rust or
    // Python) holds the empty directory: no stage output yet, so only the
    // lock can tell the two apart.
    let other = dfx_host::DriverLock::acquire(&dir).unwrap();
    let host = host();
    let err = host
        .run_distributed(BY_FLAG, &spec)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("is in use"), "{err}");
    assert!(
        err.contains(&format!("another driver (pid {})", std::process::id())),
        "{err}"
    );
    assert_eq!(file_names(&dir), vec![".dfx-driver.lock"]);
    // Once it is released the directory is free, and the run answers.
    drop(other);
    let result = host.run_distributed(BY_FLAG, &spec).await.unwrap();
    assert_eq!(rows(&result.batches), by_flag_expected());
}
