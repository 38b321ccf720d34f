//! A shuffle root: each query of a session in a fresh location under it,
//! removed once its answer is read and kept (named) when the query fails;
//! `dfx gc` removes what a crashed driver left. Through `dfx_host` and the
//! real `dfx` binary, with real workers.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use dfx_host::HostError;
use dfx_runtime::shuffle_root::ROOT_MARKER;

fn dfx(args: &[&str]) -> Output {
    Command::new(dfx_bin())
        .args(args)
        .env("DFX_PLUGIN", plugin_path())
        .output()
        .expect("dfx starts")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Every file and directory below `dir`, and `dir`, last written at `when`.
fn age(dir: &Path, when: SystemTime) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        if entry.file_type().unwrap().is_dir() {
            age(&entry.path(), when);
        } else {
            let file = std::fs::File::options()
                .write(true)
                .open(entry.path())
                .unwrap();
            file.set_modified(when).unwrap();
        }
    }
    std::fs::File::open(dir)
        .unwrap()
        .set_modified(when)
        .unwrap();
}

#[tokio::test]
async fn twenty_queries_under_one_root_leave_nothing_but_its_marker() {
    let fixture = Fixture::new();
    let root = fixture.shuffle_dir("root");
    let spec = fixture.spec().with_shuffle_root(&root);
    let host = host();
    let expected = sorted_rows(&host.run_local(BY_FLAG, &spec).await.unwrap());
    let mut locations = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let result = host.run_distributed(BY_FLAG, &spec).await.unwrap();
        assert_eq!(sorted_rows(&result.batches), expected);
        assert!(result.tasks.len() > 1, "{:?}", result.tasks);
        assert!(
            result
                .shuffle_location
                .starts_with(&format!("{}/q-", root.display())),
            "{}",
            result.shuffle_location
        );
        assert!(!Path::new(&result.shuffle_location).exists());
        locations.insert(result.shuffle_location);
    }
    assert_eq!(locations.len(), 20, "each query its own location");
    assert_eq!(file_names(&root), vec![ROOT_MARKER]);
    host.shutdown().await;
}

#[tokio::test]
async fn a_root_location_is_kept_when_asked_and_a_spec_without_one_runs_under_a_temporary_root() {
    let fixture = Fixture::new();
    let root = fixture.shuffle_dir("root");
    let mut spec = fixture.spec().with_shuffle_root(&root);
    spec.keep_shuffle = true;
    let host = host();
    let kept = host.run_distributed(BY_FLAG, &spec).await.unwrap();
    assert!(Path::new(&kept.shuffle_location).join("stage-1").is_dir());

    // Neither a location nor a root: any number of queries, each in a
    // fresh location of the host's temporary root, removed after it.
    let plain = fixture.spec();
    for _ in 0..3 {
        let result = host.run_distributed(BY_FLAG, &plain).await.unwrap();
        assert_eq!(rows(&result.batches), by_flag_expected());
        assert!(!Path::new(&result.shuffle_location).exists());
    }
    host.shutdown().await;
}

#[tokio::test]
async fn a_failed_query_keeps_its_location_and_the_error_names_it() {
    let fixture = Fixture::new();
    let root = fixture.shuffle_dir("root");
    let spec = fixture.spec().with_shuffle_root(&root);
    let host = host();
    // Fails in the workers, at run time: the flag 'A' is no number.
    let sql = "SELECT CAST(l_returnflag AS INT) AS n, count(*) FROM lineitem GROUP BY 1";
    let err = host.run_distributed(sql, &spec).await.unwrap_err();
    let HostError::LocationKept { location, .. } = &err else {
        panic!("expected the location kept, got {err}");
    };
    assert!(
        err.to_string().contains(&format!(
            "shuffle location is kept for inspection: {location}"
        )),
        "{err}"
    );
    assert!(location.starts_with(&format!("{}/q-", root.display())));
    assert!(Path::new(location).join("tasks").is_dir(), "{location}");
    // The next query of the session still runs, in a location of its own.
    let result = host.run_distributed(BY_FLAG, &spec).await.unwrap();
    assert_eq!(rows(&result.batches), by_flag_expected());
    let left: Vec<String> = file_names(&root);
    assert_eq!(left.len(), 2, "{left:?}");
    host.shutdown().await;
}

#[tokio::test]
async fn a_shuffle_dir_is_still_one_querys_and_never_beside_a_root() {
    let fixture = Fixture::new();
    let spec = fixture.distributed_spec("mine");
    let host = host();
    host.run_distributed(BY_FLAG, &spec).await.unwrap();
    let err = host
        .run_distributed(BY_FLAG, &spec)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("already holds stage output"), "{err}");
    // Its own location stays after the answer.
    assert!(fixture.shuffle_dir("mine").join("stage-1").is_dir());

    let both = spec.with_shuffle_root(fixture.shuffle_dir("root"));
    let err = host
        .run_distributed(BY_FLAG, &both)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("sets both shuffle_dir"), "{err}");
    assert!(!fixture.shuffle_dir("root").exists());
    host.shutdown().await;
}

#[test]
fn dfx_run_under_a_root_removes_each_location_and_dfx_gc_removes_only_stale_ones() {
    let fixture = Fixture::new();
    let root = fixture.shuffle_dir("root");
    let root_arg = root.display().to_string();
    let table = format!("lineitem={}", fixture.table_dir().display());
    let two = format!("{BY_FLAG}; {BY_FLAG}");
    let out = dfx(&[
        "run",
        "--table",
        &table,
        "--format",
        "csv",
        "--shuffle-root",
        &root_arg,
        &two,
    ]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        stderr.matches("(under the shuffle root, removed)").count(),
        2,
        "{stderr}"
    );
    assert_eq!(file_names(&root), vec![ROOT_MARKER]);

    let both = dfx(&[
        "run",
        "--table",
        &table,
        "--shuffle-dir",
        &fixture.shuffle_dir("mine").display().to_string(),
        "--shuffle-root",
        &root_arg,
        BY_FLAG,
    ]);
    assert!(!both.status.success());
    assert!(text(&both.stderr).contains("sets both shuffle_dir"));

    // A crashed driver's location of long ago, and one being written now.
    let stale = root.join("q-1000-00aa");
    std::fs::create_dir_all(stale.join("stage-1")).unwrap();
    std::fs::write(stale.join("stage-1/0-map-0.arrow"), b"0123456789").unwrap();
    age(&stale, UNIX_EPOCH + Duration::from_secs(1));
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let fresh = root.join(format!("q-{}-00bb", now.as_millis()));
    std::fs::create_dir_all(fresh.join("stage-1")).unwrap();

    let dry = dfx(&["gc", &root_arg, "--dry-run"]);
    assert!(dry.status.success(), "{}", text(&dry.stderr));
    let stdout = text(&dry.stdout);
    assert!(
        stdout.contains(&format!("would remove {} (10 bytes)", stale.display())),
        "{stdout}"
    );
    assert!(stale.exists());

    let gc = dfx(&["gc", &root_arg, "--older-than", "1h"]);
    let stdout = text(&gc.stdout);
    assert!(gc.status.success(), "{}", text(&gc.stderr));
    assert!(
        stdout.contains(&format!("removed {} (10 bytes)", stale.display())),
        "{stdout}"
    );
    assert!(
        stdout.contains("removed 1 stale query location(s)"),
        "{stdout}"
    );
    assert!(!stale.exists() && fresh.exists());

    // A directory no root was made in is refused, and left as it is.
    let other = fixture.shuffle_dir("other");
    std::fs::create_dir_all(other.join("q-1000-00aa")).unwrap();
    let refused = dfx(&["gc", &other.display().to_string()]);
    let stderr = text(&refused.stderr);
    assert!(!refused.status.success());
    assert!(stderr.contains("is not a dfx shuffle root"), "{stderr}");
    assert!(other.join("q-1000-00aa").exists());
}
