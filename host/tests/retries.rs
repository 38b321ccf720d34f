//! Retries: a task whose worker died runs again and the query answers; one
//! that finds an upstream map's output lost has that map run again first;
//! an error the worker reports about the task itself is not retried. Which
//! it is comes from the class the worker's response carries, never from its
//! message. Real workers (some behind a wrapper script) and the real plugin
//! file.

mod common;

use common::*;
use dfx_host::{Envelope, Host, HostError, Retry, RuntimeError, WorkerCommand, WorkerMode};

/// The failures of a run whose tasks failed, or a panic naming what it was.
fn worker_failures(err: &HostError) -> &[dfx_host::TaskFailure] {
    match err {
        HostError::Runtime(RuntimeError::Workers { failures, .. }) => failures,
        other => panic!("not a worker failure: {other}"),
    }
}

/// A pooled host whose serving workers are `/bin/sh -c SCRIPT sh --serve`,
/// with `$DFX` the real `dfx` binary.
fn pooled_script(script: &str) -> Host {
    let command = WorkerCommand::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .env("DFX", dfx_bin());
    Host::with_worker(plugin(), command)
}

#[tokio::test]
async fn a_worker_killed_mid_task_is_retried_and_the_query_answers() {
    let fixture = Fixture::new();
    let spec = fixture.distributed_spec("shuffle");
    let (_, stages) = planned(&spec, BY_FLAG).await;
    let leaf = stages.iter().find(|s| s.info.deps.is_empty()).unwrap();
    let s = leaf.stage_id();
    // The first attempt of map 1 is killed; its retry has its own envelope.
    let host = host_with_script(&format!(
        r#"case "$1" in */task-{s}-1.json) echo "attempt 0 killed" >&2; kill -KILL $$ ;; esac
exec "$DFX" worker "$1""#
    ));
    let result = host.run_distributed(BY_FLAG, &spec).await.unwrap();
    assert_eq!(rows(&result.batches), by_flag_expected());
    assert_eq!(result.attempts[&(s, 1)], 2, "{:?}", result.attempts);
    assert_eq!(result.task_reports[&(s, 1)].attempt, 1);
    assert_eq!(result.attempts[&(s, 0)], 1, "{:?}", result.attempts);
    assert_eq!(result.retries.len(), 1, "{:?}", result.retries);
    let retry = &result.retries[0];
    assert!(
        retry.starts_with(&format!(
            "stage {s} map 1 attempt 0: was killed by signal 9"
        )),
        "{retry}"
    );
    // The retry's envelope says which attempt it is.
    let task_dir = spec.shuffle_dir.as_deref().unwrap().join("tasks");
    let again = Envelope::read(&task_dir.join(format!("task-{s}-1.attempt-1.json"))).unwrap();
    assert_eq!((again.stage_id, again.partition, again.attempt), (s, 1, 1));
    let marker = read_marker(
        &spec
            .shuffle_dir
            .as_deref()
            .unwrap()
            .join(format!("stage-{s}/1-map-1.arrow")),
    );
    assert_eq!(marker["map"], 1, "{marker}");
}

#[tokio::test]
async fn a_pooled_worker_killed_mid_task_is_replaced_and_the_task_retried() {
    let fixture = Fixture::new();
    let spec = fixture.distributed_spec("shuffle");
    let once = fixture.root.path().join("killed-once");
    // The first serving worker dies in its first task; every later one
    // serves for real (the request it read is handed on to dfx with the rest).
    let host = pooled_script(&format!(
        r#"read -r request
if [ ! -e {once} ]; then : > {once}; echo "killed in its first task" >&2; kill -KILL $$; fi
{{ printf '%s\n' "$request"; cat; }} | exec "$DFX" worker "$@""#,
        once = once.display()
    ))
    .max_workers(Some(1));
    assert_eq!(host.mode(), WorkerMode::Pool);
    let result = host.run_distributed(BY_FLAG, &spec).await.unwrap();
    assert_eq!(rows(&result.batches), by_flag_expected());
    let first = result.tasks[0];
    assert_eq!(result.attempts[&first], 2, "{:?}", result.attempts);
    assert_eq!(result.retries.len(), 1, "{:?}", result.retries);
    let retry = &result.retries[0];
    let (s, m) = first;
    assert!(
        retry.starts_with(&format!(
            "stage {s} map {m} attempt 0: failed: its worker (pid "
        )),
        "{retry}"
    );
    assert!(retry.contains("was killed by signal 9"), "{retry}");
    assert_eq!(host.pool().started(), 2);
}

#[tokio::test]
async fn retries_stop_after_max_attempts_and_say_how_many_were_made() {
    let fixture = Fixture::new();
    let spec = fixture.distributed_spec("shuffle");
    let (_, stages) = planned(&spec, BY_FLAG).await;
    let s = stages
        .iter()
        .find(|s| s.info.deps.is_empty())
        .unwrap()
        .stage_id();
    // Every attempt of map 2 is killed.
    let host = host_with_script(&format!(
        r#"case "$1" in */task-{s}-2.json|*/task-{s}-2.attempt-*.json) kill -KILL $$ ;; esac
exec "$DFX" worker "$1""#
    ))
    .max_attempts(2);
    let err = host.run_distributed(BY_FLAG, &spec).await.unwrap_err();
    let failures = worker_failures(&err);
    assert_eq!(failures.len(), 1, "{err}");
    assert_eq!(failures[0].retry, Retry::Yes);
    assert!(
        err.to_string().contains(&format!(
            "stage {s} map 2 failed 2 attempts; the last was killed by signal 9"
        )),
        "{err}"
    );
}

#[tokio::test]
async fn a_worker_that_exits_with_an_error_and_no_response_is_not_retried() {
    let fixture = Fixture::new();
    let spec = fixture.distributed_spec("shuffle");
    let (s, _) = leaf_and_reader(&spec).await;
    let tried = fixture.root.path().join("tried");
    // Map 3's worker says on stderr what went wrong and exits 1, printing no
    // response; the script notes every attempt it sees.
    let host = host_with_script(&format!(
        r#"echo "$1" >> {tried}
case "$1" in */task-{s}-3*) echo "cannot plan: no such column" >&2; exit 1 ;; esac
exec "$DFX" worker "$1""#,
        tried = tried.display()
    ));
    let err = host.run_distributed(BY_FLAG, &spec).await.unwrap_err();
    assert!(err.to_string().contains("no such column"), "{err}");
    let failures = worker_failures(&err);
    assert_eq!(failures[0].reason, "exited with status 1", "{err}");
    assert_eq!(failures[0].retry, Retry::No, "{err}");
    let log = std::fs::read_to_string(&tried).unwrap();
    let attempts = log
        .lines()
        .filter(|l| l.contains(&format!("task-{s}-3")))
        .count();
    assert_eq!(attempts, 1, "{log}");
}

/// A response whose class is final is not retried, though its message
/// reads like a storage failure and lost output: the class decides.
#[tokio::test]
async fn an_error_the_worker_reports_as_final_is_not_retried_whatever_its_message_says() {
    let fixture = Fixture::new();
    let spec = fixture.distributed_spec("shuffle");
    let (s, _) = leaf_and_reader(&spec).await;
    let tried = fixture.root.path().join("tried");
    let host = host_with_script(&format!(
        r#"echo "$1" >> {tried}
case "$1" in */task-{s}-3*)
  echo '{{"stage_id": {s}, "partition": 3, "error": "I/O failure: No space left on device; the output of stage {s} map 0 is lost", "retry": "final"}}'
  exit 1 ;;
esac
exec "$DFX" worker "$1""#,
        tried = tried.display()
    ));
    let err = host.run_distributed(BY_FLAG, &spec).await.unwrap_err();
    let failures = worker_failures(&err);
    assert_eq!(failures.len(), 1, "{err}");
    assert_eq!((failures[0].stage_id, failures[0].map), (s, 3), "{err}");
    assert_eq!(failures[0].retry, Retry::No, "{err}");
    assert!(
        failures[0]
            .reason
            .starts_with("failed: I/O failure: No space left on device"),
        "{err}"
    );
    let log = std::fs::read_to_string(&tried).unwrap();
    let attempts: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(&format!("task-{s}-")))
        .collect();
    // Map 3 once; no map of the stage ran again.
    assert_eq!(
        attempts
            .iter()
            .filter(|l| l.contains(&format!("task-{s}-3")))
            .count(),
        1,
        "{log}"
    );
    assert!(attempts.iter().all(|l| !l.contains(".attempt-")), "{log}");
}

/// A response classed `io` (storage failed under the task) is retried,
/// though its message says nothing a reader could take for a retry.
#[tokio::test]
async fn an_error_the_worker_reports_as_io_is_retried_and_the_query_answers() {
    let fixture = Fixture::new();
    let spec = fixture.distributed_spec("shuffle");
    let (s, _) = leaf_and_reader(&spec).await;
    // Only the first attempt of map 2 reports; its retry runs for real.
    let host = host_with_script(&format!(
        r#"case "$1" in */task-{s}-2.json)
  echo '{{"stage_id": {s}, "partition": 2, "error": "the store went away", "retry": "io"}}'
  exit 1 ;;
esac
exec "$DFX" worker "$1""#
    ));
    let result = host.run_distributed(BY_FLAG, &spec).await.unwrap();
    assert_eq!(rows(&result.batches), by_flag_expected());
    assert_eq!(result.attempts[&(s, 2)], 2, "{:?}", result.attempts);
    assert_eq!(result.task_reports[&(s, 2)].attempt, 1);
    assert_eq!(
        result.retries,
        vec![format!(
            "stage {s} map 2 attempt 0: failed: the store went away"
        )]
    );
}

/// A response classed `{"lost": [U, M]}` has map M of stage U run again
/// before the task's next attempt, though its message names no map.
#[tokio::test]
async fn an_error_the_worker_reports_as_lost_output_runs_that_map_again_first() {
    let fixture = Fixture::new();
    let spec = fixture.distributed_spec("shuffle");
    let (u, r) = leaf_and_reader(&spec).await;
    let tried = fixture.root.path().join("tried");
    // The first attempt of the reader's map 0 says map 1 of stage U is lost.
    let host = host_with_script(&format!(
        r#"echo "$1" >> {tried}
case "$1" in */task-{r}-0.json)
  echo '{{"stage_id": {r}, "partition": 0, "error": "an input went missing", "retry": {{"lost": [{u}, 1]}}}}'
  exit 1 ;;
esac
exec "$DFX" worker "$1""#,
        tried = tried.display()
    ));
    let result = host.run_distributed(BY_FLAG, &spec).await.unwrap();
    assert_eq!(rows(&result.batches), by_flag_expected());
    assert_eq!(result.attempts[&(u, 1)], 2, "{:?}", result.attempts);
    assert_eq!(result.attempts[&(r, 0)], 2, "{:?}", result.attempts);
    assert_eq!(result.task_reports[&(u, 1)].attempt, 1);
    // The rerun of U/1 ran before the reader's second attempt.
    let log = std::fs::read_to_string(&tried).unwrap();
    let at = |name: &str| {
        log.lines()
            .position(|l| l.ends_with(name))
            .unwrap_or_else(|| panic!("{name} never ran:\n{log}"))
    };
    assert!(
        at(&format!("task-{u}-1.attempt-1.json")) < at(&format!("task-{r}-0.attempt-1.json")),
        "{log}"
    );
    let retries = result.retries.join("\n");
    assert!(
        retries.contains(&format!(
            "stage {u} map 1 attempt 1: run again, its output was lost (read by stage {r} map 0)"
        )),
        "{retries}"
    );
}

/// Map 0 of the table's stage loses its output after the first wave: a
/// reader's attempt reports lost output naming it, the map runs again (its
/// attempt 1), then the readers, and the query answers.
#[tokio::test]
async fn lost_upstream_output_is_run_again_then_the_task() {
    let fixture = Fixture::new();
    let spec = fixture.distributed_spec("shuffle");
    let (_, stages) = planned(&spec, BY_FLAG).await;
    assert!(stages.len() >= 2, "two waves needed: {stages:?}");
    let leaf = stages.iter().find(|s| s.info.deps.is_empty()).unwrap();
    let reader = stages
        .iter()
        .find(|s| s.info.deps.contains(&leaf.stage_id()))
        .unwrap();
    let (u, r) = (leaf.stage_id(), reader.stage_id());
    let dir = spec.shuffle_dir.clone().unwrap();
    let published = map_file(&dir, u, 0);
    // The reader's first attempt removes the file of upstream map 0 first.
    let host = host_with_script(&format!(
        r#"case "$1" in */task-{r}-0.json) rm -f {published} ;; esac
exec "$DFX" worker "$1""#,
        published = published.display()
    ));
    let result = host.run_distributed(BY_FLAG, &spec).await.unwrap();
    assert_eq!(rows(&result.batches), by_flag_expected());
    assert!(published.is_file(), "the rerun published the map again");
    assert_eq!(read_marker(&published)["map"], 0);
    assert_eq!(result.attempts[&(u, 0)], 2, "{:?}", result.attempts);
    // A reader that saw the loss ran twice.
    assert!(
        result
            .attempts
            .iter()
            .any(|(&(stage, _), &made)| stage == r && made == 2),
        "{:?}",
        result.attempts
    );
    assert_eq!(result.task_reports[&(u, 0)].attempt, 1);
    let retries = result.retries.join("\n");
    // Every reader of the wave may see the loss; whichever meets it first
    // runs the map again, once, for all of them.
    let rerun = format!(
        "stage {u} map 0 attempt 1: run again, its output was lost (read by stage {r} map "
    );
    assert_eq!(retries.matches(&rerun).count(), 1, "{retries}");
    assert!(retries.contains(&format!("stage {r} map ")), "{retries}");
}

/// The stage the driver reads loses a map's file after it published: the
/// root's read misses it, the plugin records that map as lost, and the
/// driver runs it again (its next attempt) and reads the root again.
#[tokio::test]
async fn a_map_the_root_finds_lost_runs_again_and_the_query_answers() {
    const SORTED: &str = "SELECT l_orderkey, l_quantity FROM lineitem ORDER BY l_orderkey";
    let fixture = Fixture::new();
    let spec = fixture.distributed_spec("shuffle");
    // Only the first attempt's file is deleted; the rerun's envelope is
    // another file (`task-1-0.attempt-1.json`).
    let host = host_with_script(
        r#""$DFX" worker "$1" || exit $?
case "$1" in */task-1-0.json) rm -f "$(dirname "$(dirname "$1")")"/stage-1/0-map-0.arrow ;; esac"#,
    );
    let local = host.run_local(SORTED, &fixture.spec()).await.unwrap();
    let result = host.run_distributed(SORTED, &spec).await.unwrap();
    assert_eq!(rows(&result.batches), rows(&local));
    assert_eq!(result.attempts[&(1, 0)], 2, "{:?}", result.attempts);
    assert_eq!(result.task_reports[&(1, 0)].attempt, 1);
    assert_eq!(
        result.retries,
        vec!["stage 1 map 0 attempt 1: run again, its output was lost (read by the query's root)"]
    );
    let map_file = spec
        .shuffle_dir
        .as_deref()
        .unwrap()
        .join("stage-1/0-map-0.arrow");
    assert_eq!(read_marker(&map_file)["map"], 0);
}

/// `spec` with each task running `n` partitions.
fn in_slices(mut spec: dfx_host::SessionSpec, n: usize) -> dfx_host::SessionSpec {
    spec.engine_options
        .insert("partitions_per_task".to_string(), n.to_string());
    spec
}

/// A task of a slice whose worker dies runs its whole slice again, and a
/// slice whose output a reader finds lost is run again before the reader:
/// the answer is the one-process answer either way.
#[tokio::test]
async fn a_killed_slice_is_retried_and_a_lost_slice_run_again() {
    let fixture = Fixture::new();
    let spec = in_slices(fixture.distributed_spec("shuffle"), 2);
    let (u, r) = leaf_and_reader(&spec).await;
    let (_, stages) = planned(&spec, BY_FLAG).await;
    let leaf = stages.iter().find(|s| s.stage_id() == u).unwrap();
    // Four files in slices of two: two maps.
    assert_eq!(leaf.info.maps, 2, "{:?}", leaf.info);
    let dir = spec.shuffle_dir.clone().unwrap();
    let published = map_file(&dir, u, 1);
    // Map 1's first attempt is killed; the reader's first attempt then
    // removes map 1's file before it reads.
    let host = host_with_script(&format!(
        r#"case "$1" in
*/task-{u}-1.json) kill -KILL $$ ;;
*/task-{r}-0.json) rm -f {published} ;;
esac
exec "$DFX" worker "$1""#,
        published = published.display()
    ));
    let result = host.run_distributed(BY_FLAG, &spec).await.unwrap();
    assert_eq!(rows(&result.batches), by_flag_expected());
    // Killed, retried, then run again for the lost output.
    assert_eq!(result.attempts[&(u, 1)], 3, "{:?}", result.attempts);
    assert_eq!(result.task_reports[&(u, 1)].attempt, 2);
    let retries = result.retries.join("\n");
    assert!(
        retries.contains(&format!(
            "stage {u} map 1 attempt 0: was killed by signal 9"
        )),
        "{retries}"
    );
    assert!(
        retries.contains(&format!(
            "stage {u} map 1 attempt 2: run again, its output was lost (read by stage {r} map "
        )),
        "{retries}"
    );
    assert_eq!(read_marker(&published)["map"], 1);
}

/// A plan no wider than a task is one stage (`collapse_stages`): a worker
/// that dies in its one task costs a rerun of the whole query's task, and
/// the answer is still the one-process answer.
#[tokio::test]
async fn a_plan_run_as_one_stage_is_retried_whole_when_its_worker_dies() {
    let fixture = Fixture::new();
    let spec = in_slices(fixture.distributed_spec("shuffle"), 64);
    let (_, stages) = planned(&spec, BY_FLAG).await;
    assert_eq!(stages.len(), 1, "{:?}", stages[0].info);
    assert_eq!(stages[0].info.maps, 1, "{:?}", stages[0].info);
    let s = stages[0].stage_id();
    let host = host_with_script(&format!(
        r#"case "$1" in */task-{s}-0.json) kill -KILL $$ ;; esac
exec "$DFX" worker "$1""#
    ));
    let result = host.run_distributed(BY_FLAG, &spec).await.unwrap();
    assert_eq!(rows(&result.batches), by_flag_expected());
    assert_eq!(result.stages.len(), 1);
    assert_eq!(result.attempts[&(s, 0)], 2, "{:?}", result.attempts);
    assert_eq!(result.retries.len(), 1, "{:?}", result.retries);
    assert!(
        result.retries[0].starts_with(&format!(
            "stage {s} map 0 attempt 0: was killed by signal 9"
        )),
        "{:?}",
        result.retries
    );
}
