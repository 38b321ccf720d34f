//! The worker pool: real `dfx worker --serve` processes and the real plugin
//! file. A task that must be caught mid-run reads its envelope from a FIFO:
//! the worker blocks in that read until the test opens the other end, so
//! the test knows, without a clock, that the task is running.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use dfx_host::driver::stages::stages;
use dfx_host::session::{SessionSpec, build_session, build_worker_session};
use dfx_host::{Host, WorkerMode};
use dfx_runtime::protocol::{Envelope, TASK_DIR, envelope_path, plan_path};
use dfx_runtime::scheduler::{Scheduler, SchedulerOptions, Task, WorkerCommand};
use dfx_runtime::{Retry, RuntimeError};

/// A scheduler over `host`'s pool, at most `max_workers` at once, one
/// attempt per task: these tests look at what one attempt does (retries
/// have their own tests).
fn pool_scheduler(host: &Host, max_workers: usize) -> Scheduler {
    let options = SchedulerOptions {
        max_workers: Some(max_workers),
        max_attempts: 1,
        ..SchedulerOptions::default()
    };
    Scheduler::new(host.shared_pool(), options)
}

/// A FIFO at `path`: a worker reading it blocks until a writer opens it.
fn fifo(path: &Path) -> PathBuf {
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo runs");
    assert!(made.success(), "mkfifo {}", path.display());
    path.to_path_buf()
}

/// Open `path` for writing on a blocking thread: returns once a worker has
/// opened it for reading, so once that worker is inside its task.
async fn wait_for_reader(path: PathBuf) -> std::fs::File {
    tokio::task::spawn_blocking(move || {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("the FIFO opens for writing")
    })
    .await
    .unwrap()
}

/// Whether process `pid` is running (not ended, not a zombie waiting to be
/// reaped).
fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    stat.rsplit_once(") ")
        .is_some_and(|(_, rest)| !rest.starts_with('Z'))
}

fn kill_9(pid: u32) {
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success(), "kill -KILL {pid}");
}

/// Map 0 of a stage of `sql` that reads no other stage, encoded as the
/// driver does, its envelope written into `<shuffle>/tasks/`.
async fn leaf_task(spec: &SessionSpec, sql: &str) -> Task {
    let plugin = plugin();
    let session = build_session(&plugin, spec).await.unwrap();
    let plan = session.physical_plan(sql).await.unwrap();
    let stage = stages(&plugin, &plan)
        .unwrap()
        .into_iter()
        .find(|s| s.info.deps.is_empty())
        .unwrap();
    let task_dir = spec.shuffle_dir.as_deref().unwrap().join(TASK_DIR);
    std::fs::create_dir_all(&task_dir).unwrap();
    let plan_file = plan_path(&task_dir, stage.stage_id());
    std::fs::write(&plan_file, session.encode(Arc::clone(&stage.plan)).unwrap()).unwrap();
    let envelope = Envelope {
        spec: SessionSpec {
            codec_ids: session.codec_ids(),
            ..spec.clone()
        },
        plan: plan_file,
        stage_id: stage.stage_id(),
        partition: 0,
        attempt: 0,
        added_from: None,
    };
    let path = envelope_path(&task_dir, stage.stage_id(), 0);
    envelope.write(&path).unwrap();
    Task {
        stage_id: stage.stage_id(),
        map: 0,
        envelope: path,
        inline: None,
    }
}

#[tokio::test]
async fn pool_mode_answers_as_local_with_workers_reused_across_waves_and_queries() {
    let fixture = Fixture::new();
    let host = host().max_workers(Some(2));
    assert_eq!(host.mode(), WorkerMode::Pool, "the pool is the default");
    let local = host.run_local(BY_FLAG, &fixture.spec()).await.unwrap();
    assert_eq!(rows(&local), by_flag_expected());

    let result = host
        .run_distributed(BY_FLAG, &fixture.distributed_spec("q1"))
        .await
        .unwrap();
    assert_eq!(rows(&result.batches), rows(&local));
    assert_eq!(result.worker_mode, WorkerMode::Pool);
    assert!(result.waves.len() >= 2, "{:?}", result.waves);
    assert_eq!(result.task_reports.len(), result.tasks.len());
    for (task, report) in &result.task_reports {
        assert!(report.bytes.is_some(), "{task:?}: {report:?}");
        assert!(report.elapsed_ms.is_some(), "{task:?}: {report:?}");
        assert_eq!(result.task_rows[task], report.rows);
    }
    // More tasks than slots, over several waves, on no more than two
    // processes: the workers served task after task.
    let mut pids: Vec<u32> = result
        .task_reports
        .values()
        .map(|r| r.worker.unwrap())
        .collect();
    pids.sort_unstable();
    pids.dedup();
    assert!(result.tasks.len() > 2, "{:?}", result.tasks);
    assert!(pids.len() <= 2, "{pids:?}");
    assert!(host.pool().started() <= 2, "{}", host.pool().started());
    // A pooled worker is sent each envelope in its request: the driver
    // wrote the stages' plans and no envelope file.
    let q1_tasks = fixture.shuffle_dir("q1").join(TASK_DIR);
    let mut written: Vec<String> = std::fs::read_dir(&q1_tasks)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    written.sort();
    assert!(!written.is_empty());
    assert!(
        written.iter().all(|name| name.ends_with(".plan")),
        "{written:?}"
    );

    // A second query (another shuffle directory, so another session) runs
    // on the same processes.
    let union = host
        .run_distributed(UNION, &fixture.distributed_spec("q2"))
        .await
        .unwrap();
    assert_eq!(rows(&union.batches), union_expected());
    for report in union.task_reports.values() {
        assert!(
            pids.contains(&report.worker.unwrap()),
            "{report:?} {pids:?}"
        );
    }
    assert!(host.pool().started() <= 2, "{}", host.pool().started());

    // Process mode, same answer, one process per task.
    let process = host
        .clone()
        .worker_mode(WorkerMode::Process)
        .run_distributed(BY_FLAG, &fixture.distributed_spec("q3"))
        .await
        .unwrap();
    assert_eq!(rows(&process.batches), rows(&local));
    let q3_tasks = fixture.shuffle_dir("q3").join(TASK_DIR);
    let envelopes = std::fs::read_dir(&q3_tasks)
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().starts_with("task-")
        })
        .count();
    assert_eq!(envelopes, process.tasks.len(), "a file per process task");
    let mut process_pids: Vec<u32> = process
        .task_reports
        .values()
        .map(|r| r.worker.unwrap())
        .collect();
    process_pids.sort_unstable();
    process_pids.dedup();
    assert_eq!(process_pids.len(), process.tasks.len());
}

#[tokio::test]
async fn a_pooled_worker_killed_mid_task_fails_that_task_and_is_replaced() {
    let fixture = Fixture::new();
    let host = host().max_workers(Some(1));
    let scratch = fixture.shuffle_dir("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let task = Task {
        stage_id: 7,
        map: 3,
        envelope: fifo(&scratch.join("task-7-3.json")),
        inline: None,
    };
    let tasks = [task.clone()];
    let scheduler = pool_scheduler(&host, 1);
    let run = scheduler.run_tasks(&tasks);
    let kill = async {
        let writer = wait_for_reader(task.envelope.clone()).await;
        // The worker is inside its task, blocked reading the envelope.
        let pids = host.pool().pids();
        assert_eq!(pids.len(), 1, "{pids:?}");
        kill_9(pids[0]);
        (pids[0], writer)
    };
    let (outcome, (pid, _writer)) = tokio::join!(run, kill);
    let err = outcome.unwrap_err();
    let RuntimeError::Workers { failures, .. } = &err else {
        panic!("not a worker failure: {err}");
    };
    assert_eq!(failures.len(), 1, "{err}");
    assert_eq!((failures[0].stage_id, failures[0].map), (7, 3), "{err}");
    // A death says nothing against the task: another attempt may succeed.
    assert_eq!(failures[0].retry, Retry::Yes, "{err}");
    let message = err.to_string();
    assert!(message.contains("stage 7 map 3 failed"), "{message}");
    assert!(
        message.contains(&format!("(pid {pid}) was killed by signal 9 (SIGKILL)")),
        "{message}"
    );
    assert!(host.pool().pids().is_empty(), "{:?}", host.pool().pids());

    // The next query through the same host runs on a fresh worker.
    let result = host
        .run_distributed(BY_FLAG, &fixture.distributed_spec("after"))
        .await
        .unwrap();
    assert_eq!(rows(&result.batches), by_flag_expected());
    assert_eq!(host.pool().started(), 2);
    assert!(result.task_reports.values().all(|r| r.worker != Some(pid)));

    // One killed while idle is replaced before it is given a task.
    let idle = host.pool().pids();
    assert_eq!(idle.len(), 1, "{idle:?}");
    kill_9(idle[0]);
    assert!(eventually(|| !alive(idle[0])), "kill -KILL {}", idle[0]);
    let result = host
        .run_distributed(BY_FLAG, &fixture.distributed_spec("after-idle"))
        .await
        .unwrap();
    assert_eq!(rows(&result.batches), by_flag_expected());
    assert_eq!(host.pool().started(), 3);
}

/// A worker's session is the driver's without the tables: same codecs and
/// partitions, nothing in its catalog (a stage carries its scans whole), and
/// a stage the driver encoded runs in it.
#[tokio::test]
async fn a_worker_session_registers_no_table_and_still_runs_a_stage() {
    let fixture = Fixture::new();
    let spec = fixture.distributed_spec("worker-session");
    let plugin = plugin();
    let driver = build_session(&plugin, &spec).await.unwrap();
    // As the driver ships it: with the partitions it planned for.
    let shipped = spec
        .clone()
        .with_target_partitions(driver.ctx().copied_config().target_partitions());
    let worker = build_worker_session(&plugin, &shipped).await.unwrap();
    assert!(driver.ctx().table_exist("lineitem").unwrap());
    assert!(!worker.ctx().table_exist("lineitem").unwrap());
    assert_eq!(worker.codec_ids(), driver.codec_ids());
    assert_eq!(
        worker.ctx().copied_config().target_partitions(),
        driver.ctx().copied_config().target_partitions()
    );

    let task = leaf_task(&spec, BY_FLAG).await;
    let envelope = Envelope::read(&task.envelope).unwrap();
    let report = dfx_host::run_task(&plugin, &envelope).await.unwrap();
    assert_eq!(report.stage_id, task.stage_id);
    // Map 0 scanned its file and published what it made of it.
    assert!(report.rows > 0, "{report:?}");
    assert!(report.bytes.is_some_and(|bytes| bytes > 0), "{report:?}");
}

#[tokio::test]
async fn a_task_error_in_serve_mode_is_reported_and_the_same_worker_serves_the_next_task() {
    let fixture = Fixture::new();
    let host = host().max_workers(Some(1));
    let spec = fixture.distributed_spec("shuffle");
    let good = leaf_task(&spec, BY_FLAG).await;

    // The plan file is missing.
    let mut envelope = Envelope::read(&good.envelope).unwrap();
    envelope.plan = fixture.shuffle_dir("shuffle").join("tasks/missing.plan");
    envelope.partition = 1;
    let path = envelope_path(good.envelope.parent().unwrap(), good.stage_id, 1);
    envelope.write(&path).unwrap();
    let missing_plan = Task {
        stage_id: good.stage_id,
        map: 1,
        envelope: path,
        inline: None,
    };
    // The envelope itself is missing: stage and map unknown to the worker.
    let missing_envelope = Task {
        stage_id: good.stage_id,
        map: 2,
        envelope: fixture.shuffle_dir("nowhere.json"),
        inline: None,
    };

    let scheduler = pool_scheduler(&host, 1);
    let err = scheduler
        .run_tasks(&[missing_plan, missing_envelope])
        .await
        .unwrap_err();
    let RuntimeError::Workers { failures, .. } = &err else {
        panic!("not a worker failure: {err}");
    };
    assert_eq!(failures.len(), 2, "{err}");
    // Both are errors about the task itself, reported as final: retrying
    // would read the same missing file.
    assert!(failures.iter().all(|f| f.retry == Retry::No), "{err}");
    let s = good.stage_id;
    assert!(
        failures[0].reason.contains("cannot read plan") && failures[0].reason.contains("missing"),
        "{err}"
    );
    assert!(err.to_string().contains(&format!("stage {s} map 1 failed")));
    assert!(failures[1].reason.contains("cannot read envelope"), "{err}");
    assert!(err.to_string().contains(&format!("stage {s} map 2 failed")));
    let pids = host.pool().pids();
    assert_eq!(pids.len(), 1, "{pids:?}");
    assert_eq!(host.pool().started(), 1);

    let reports = scheduler
        .run_tasks(std::slice::from_ref(&good))
        .await
        .unwrap();
    let report = reports[&(good.stage_id, 0)];
    assert_eq!(report.worker, Some(pids[0]), "the same worker served it");
    assert_eq!(report.rows, 2, "file 0 holds two flags: {report:?}");
    assert_eq!(host.pool().started(), 1);
}

#[tokio::test]
async fn no_worker_survives_dropping_the_last_host_holding_the_pool() {
    let fixture = Fixture::new();
    let host = host().max_workers(Some(2));
    host.run_distributed(BY_FLAG, &fixture.distributed_spec("q"))
        .await
        .unwrap();
    let pids = host.pool().pids();
    assert!(!pids.is_empty());
    assert!(pids.iter().all(|&pid| alive(pid)), "{pids:?}");

    // A clone shares the pool: its workers live while any clone does.
    let clone = host.clone();
    drop(host);
    assert!(pids.iter().all(|&pid| alive(pid)), "{pids:?}");
    drop(clone);
    assert!(
        eventually(|| pids.iter().all(|&pid| !alive(pid))),
        "workers outlived their host: {pids:?}"
    );
}

#[tokio::test]
async fn shutdown_ends_and_reaps_every_idle_worker_and_the_pool_starts_afresh() {
    let fixture = Fixture::new();
    let host = host().max_workers(Some(2));
    let first = host
        .run_distributed(BY_FLAG, &fixture.distributed_spec("q1"))
        .await
        .unwrap();
    let pids = host.pool().pids();
    assert!(!pids.is_empty());
    let ended = host.shutdown().await;
    // Each ended at the end of its input, none had to be killed.
    assert_eq!((ended.exited, ended.killed), (pids.len(), 0), "{ended:?}");
    // Reaped, not merely killed: no /proc entry is left, not even a zombie.
    for pid in &pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "worker {pid} was not reaped"
        );
    }
    assert!(host.pool().pids().is_empty());
    // The next query starts new workers.
    let second = host
        .run_distributed(BY_FLAG, &fixture.distributed_spec("q2"))
        .await
        .unwrap();
    assert_eq!(rows(&first.batches), rows(&second.batches));
    assert!(host.pool().pids().iter().all(|pid| !pids.contains(pid)));
}

#[tokio::test]
async fn dropping_a_pooled_run_mid_task_kills_its_worker() {
    let fixture = Fixture::new();
    let host = host().max_workers(Some(1));
    let scratch = fixture.shuffle_dir("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let tasks = [Task {
        stage_id: 1,
        map: 0,
        envelope: fifo(&scratch.join("task-1-0.json")),
        inline: None,
    }];
    let scheduler = pool_scheduler(&host, 1);
    let run = scheduler.run_tasks(&tasks);
    let in_task = async {
        let writer = wait_for_reader(tasks[0].envelope.clone()).await;
        (writer, host.pool().pids())
    };
    // The writer stays open, so the worker could never finish on its own.
    let (_writer, pids) = tokio::select! {
        outcome = run => panic!("a task blocked on its envelope ended: {outcome:?}"),
        in_task = in_task => in_task,
    };
    assert_eq!(pids.len(), 1, "{pids:?}");
    // The run is dropped: its worker was killed, not put back in the pool.
    assert!(
        eventually(|| !alive(pids[0])),
        "a busy worker outlived its dropped run: {pids:?}"
    );
    assert!(host.pool().pids().is_empty(), "{:?}", host.pool().pids());
    assert_eq!(host.pool().started(), 1);
}

#[tokio::test]
async fn stderr_a_pooled_worker_writes_during_a_task_is_attributed_to_that_task() {
    let fixture = Fixture::new();
    let scratch = fixture.shuffle_dir("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    // A stand-in serving worker: answers its first task, dies in its second.
    let script = r#"[ "$1" = --serve ] || exit 64
echo "serving" >&2
read -r request
echo "first task" >&2
echo "a library's stray line"
echo '{"stage_id": 1, "partition": 0, "rows": 0}'
read -r request
echo "second task: about to die" >&2
echo "half a line"
kill -KILL $$"#;
    let command = WorkerCommand::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .arg("sh");
    let host = Host::with_worker(plugin(), command).max_workers(Some(1));
    let tasks: Vec<Task> = (0..2)
        .map(|map| Task {
            stage_id: 1,
            map,
            envelope: envelope_path(&scratch, 1, map),
            inline: None,
        })
        .collect();
    let err = pool_scheduler(&host, 1)
        .run_tasks(&tasks)
        .await
        .unwrap_err();
    let RuntimeError::Workers { failures, .. } = &err else {
        panic!("not a worker failure: {err}");
    };
    assert_eq!(failures.len(), 1, "{err}");
    let failure = &failures[0];
    assert_eq!((failure.stage_id, failure.map), (1, 1), "{err}");
    assert!(failure.reason.contains("killed by signal 9"), "{err}");
    assert!(
        failure.stderr.contains("second task: about to die"),
        "{err}"
    );
    assert!(failure.stderr.contains("half a line"), "{err}");
    assert!(!failure.stderr.contains("stray"), "{err}");
}

#[test]
fn dfx_worker_serve_answers_each_request_with_one_line_and_exits_at_end_of_input() {
    use std::io::{BufRead, BufReader, Write};
    let fixture = Fixture::new();
    let mut worker = std::process::Command::new(dfx_bin())
        .args(["worker", "--serve"])
        .env("DFX_PLUGIN", plugin_path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = worker.stdin.take().unwrap();
    let mut stdout = BufReader::new(worker.stdout.take().unwrap());
    let mut ask = |line: &str| -> serde_json::Value {
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
        let mut response = String::new();
        stdout.read_line(&mut response).unwrap();
        serde_json::from_str(&response).unwrap_or_else(|e| panic!("{response:?}: {e}"))
    };
    let missing = fixture.shuffle_dir("missing.json");
    let response = ask(&format!(
        r#"{{"envelope": {:?}}}"#,
        missing.to_str().unwrap()
    ));
    assert_eq!(response["stage_id"], serde_json::Value::Null, "{response}");
    assert_eq!(response["partition"], serde_json::Value::Null, "{response}");
    assert!(
        response["error"]
            .as_str()
            .unwrap()
            .contains("cannot read envelope"),
        "{response}"
    );
    // The class travels with the error, as data: a missing envelope stays
    // missing, so no driver should try again.
    assert_eq!(response["retry"], "final", "{response}");
    let response = ask("not json");
    assert!(
        response["error"]
            .as_str()
            .unwrap()
            .contains("cannot read the request"),
        "{response}"
    );
    assert_eq!(response["retry"], "final", "{response}");
    drop(stdin);
    let status = worker.wait().unwrap();
    assert!(status.success(), "{status}");
}

/// `dfx bench overhead` times a task in both modes side by side: every case
/// timed, each row of the table the JSON's figures.
#[cfg(feature = "cli-extras")]
#[test]
fn bench_overhead_puts_process_and_pool_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("overhead.json");
    let output = std::process::Command::new(dfx_bin())
        .args(["bench", "overhead", "--tasks", "3", "--json"])
        .arg(&json)
        .env("DFX_PLUGIN", plugin_path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let modes = report["modes"].as_array().unwrap();
    let names: Vec<&str> = modes.iter().map(|m| m["mode"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "process: `dfx worker` per task",
            "pool: warm worker, same query",
            "pool: warm worker, first task of a new query",
            "pool: first task of a new worker",
        ]
    );
    for mode in modes {
        let figure = |key: &str| mode[key].as_f64().unwrap_or(f64::NAN);
        let (median, p90, worker) = (
            figure("median_ms"),
            figure("p90_ms"),
            figure("worker_median_ms"),
        );
        assert_eq!(mode["tasks"], 3, "{mode}");
        assert!(median.is_finite() && median > 0.0, "{mode}");
        assert!(worker.is_finite() && worker > 0.0, "{mode}");
        assert!(p90 >= median, "{mode}");
        assert!(
            stdout.contains(&format!(
                "| {} | 3 | {median:.2} | {p90:.2} | {worker:.2} |",
                mode["mode"].as_str().unwrap()
            )),
            "{mode} not in\n{stdout}"
        );
    }
}

#[tokio::test]
async fn a_serving_session_runs_each_map_of_a_stage_from_one_decode_and_no_map_twice() {
    let fixture = Fixture::new();
    let spec = fixture.distributed_spec("kept");
    let plugin = plugin();
    let session = build_session(&plugin, &spec).await.unwrap();
    // The stages as a driver ships them: cut out of the encoded plan.
    let encoded = session.plan(BY_FLAG).await.unwrap().stages;
    assert!(
        encoded.len() >= 2,
        "BY_FLAG has a stage below the root stage"
    );
    let (one, other) = (&encoded[0], &encoded[1]);

    let at = Some(std::time::SystemTime::now());
    let map_0 = session.decode_stage_for_map(one, at, 0).unwrap();
    let map_1 = session.decode_stage_for_map(one, at, 1).unwrap();
    assert!(
        Arc::ptr_eq(&map_0, &map_1),
        "the next map of the same stage runs from the kept plan"
    );
    let map_0_again = session.decode_stage_for_map(one, at, 0).unwrap();
    assert!(
        !Arc::ptr_eq(&map_0, &map_0_again),
        "a map already run from the kept plan gets a fresh decode"
    );
    let other_0 = session.decode_stage_for_map(other, at, 0).unwrap();
    assert!(
        !Arc::ptr_eq(&map_0_again, &other_0),
        "another stage decodes"
    );
    let one_1 = session.decode_stage_for_map(one, at, 1).unwrap();
    assert!(
        !Arc::ptr_eq(&map_0_again, &one_1),
        "only the last stage is kept: coming back to the first decodes it again"
    );
    session.forget_stage();
    let after = session.decode_stage_for_map(one, at, 2).unwrap();
    assert!(
        !Arc::ptr_eq(&one_1, &after),
        "a forgotten stage is decoded anew"
    );
    let later = at.map(|t| t + std::time::Duration::from_secs(1));
    let rewritten = session.decode_stage_for_map(one, later, 3).unwrap();
    assert!(
        !Arc::ptr_eq(&after, &rewritten),
        "the same bytes in a plan file written later (a later query) decode anew"
    );
    let unknown = session.decode_stage_for_map(one, None, 4).unwrap();
    let unknown_again = session.decode_stage_for_map(one, None, 5).unwrap();
    assert!(
        !Arc::ptr_eq(&unknown, &unknown_again),
        "without the plan file's time nothing is kept"
    );
}
