//! What goes wrong, and what the host says: real worker processes (some of
//! them sabotaged by a wrapper script), the real plugin file.

mod common;

use std::sync::Arc;

use common::*;
use datafusion_proto::bytes::physical_plan_to_bytes_with_extension_codec;
use datafusion_proto::physical_plan::DefaultPhysicalExtensionCodec;
use dfx_host::HostError;
use dfx_host::driver::stages::{Stage, StageInfo, node_display, stages};
use dfx_host::session::{SessionSpec, Split, build_session, build_worker_session};
use dfx_host::worker::decode_checked;
use dfx_runtime::protocol::{Envelope, Response, TASK_DIR, TaskInput, envelope_path, plan_path};
use dfx_runtime::scheduler::{
    ProcessExecutor, Scheduler, SchedulerOptions, Task, WorkerCommand, default_max_workers,
};
use dfx_runtime::{FailureClass, Retry, RuntimeError, TaskFailure};

/// The worker failures of a failed run, or a panic naming what it was.
fn worker_failures(err: &HostError) -> (&Option<usize>, &Vec<u64>, usize, &Vec<TaskFailure>) {
    match err {
        HostError::Runtime(RuntimeError::Workers {
            wave,
            stages,
            total,
            failures,
        }) => (wave, stages, *total, failures),
        other => panic!("expected worker failures, got {other}"),
    }
}

/// A scheduler running each task as `command <envelope>`, at most
/// `max_workers` at once (`None`: the default bound).
fn process_scheduler(command: WorkerCommand, max_workers: Option<usize>) -> Scheduler {
    let options = SchedulerOptions {
        max_workers,
        ..SchedulerOptions::default()
    };
    Scheduler::new(Arc::new(ProcessExecutor::new(command)), options)
}

/// Rows in order, no aggregate: in both split modes the stage the driver
/// reads (stage 1) has a map 0 holding rows, in one bucket.
const SORTED: &str = "SELECT l_orderkey, l_quantity FROM lineitem ORDER BY l_orderkey";

/// The stage of `sql`'s plan that reads no other stage and so runs in the
/// first wave (the one over the table), with the plan's other stages.
async fn first_wave_stage(spec: &SessionSpec, sql: &str) -> (StageInfo, Vec<StageInfo>) {
    let (_, found) = planned(spec, sql).await;
    let infos: Vec<StageInfo> = found.into_iter().map(|s| s.info).collect();
    let first = infos
        .iter()
        .find(|s| s.deps.is_empty())
        .expect("a stage reading no other stage")
        .clone();
    (first, infos)
}

/// A stage of `spec`'s plan of `sql` that reads no other stage, encoded into
/// `<task_dir>/stage-S.plan`; returns the stage and the plan file.
async fn encoded_leaf_stage(
    spec: &SessionSpec,
    sql: &str,
    task_dir: &std::path::Path,
) -> (Stage, std::path::PathBuf, Vec<String>) {
    let plugin = plugin();
    let session = build_session(&plugin, spec).await.unwrap();
    let plan = session.physical_plan(sql).await.unwrap();
    let stage = stages(&plugin, &plan)
        .unwrap()
        .into_iter()
        .find(|s| s.info.deps.is_empty())
        .unwrap();
    std::fs::create_dir_all(task_dir).unwrap();
    let plan_file = plan_path(task_dir, stage.stage_id());
    std::fs::write(&plan_file, session.encode(Arc::clone(&stage.plan)).unwrap()).unwrap();
    (stage, plan_file, session.codec_ids())
}

#[tokio::test]
async fn a_deleted_bucket_file_fails_the_final_read_naming_stage_map_bucket_and_file() {
    let fixture = Fixture::new();
    // Stage 1 map 0 runs for real, then its file is deleted: the map's
    // output is lost, so the reader must fail, not recompute it itself. One
    // attempt, so the driver does not run the map again either (that it
    // does, given attempts, is a test of its own in `retries`).
    let host = host_with_script(
        r#""$DFX" worker "$1" || exit $?
case "$1" in */task-1-0.json) rm -f "$(dirname "$(dirname "$1")")"/stage-1/0-map-0.arrow ;; esac"#,
    )
    .max_attempts(1);
    for split in SPLITS {
        let spec = fixture
            .distributed_spec(&format!("shuffle-{split}"))
            .with_split(split);
        let err = host.run_distributed(SORTED, &spec).await.unwrap_err();
        assert!(
            matches!(err, HostError::DataFusion { .. }),
            "{split}: not the final read: {err}"
        );
        let message = err.to_string();
        assert!(
            message.contains("cannot read the stage output"),
            "{message}"
        );
        let missing = plugin()
            .bucket_path(spec.shuffle_dir.as_deref().unwrap(), 1, 0, 0)
            .unwrap();
        assert!(!missing.exists());
        assert!(
            message.contains(missing.to_str().unwrap()),
            "{split}: {message}"
        );
        let lower = message.to_lowercase();
        for part in ["stage 1", "map 0", "bucket 0"] {
            assert!(lower.contains(part), "{split}: no {part:?} in {message}");
        }
    }
}

#[tokio::test]
async fn a_corrupt_bucket_file_fails_the_final_read_naming_it() {
    let fixture = Fixture::new();
    // One attempt: the final read's error is the point, not a rerun.
    let host = host_with_script(
        r#""$DFX" worker "$1" || exit $?
case "$1" in */task-1-0.json) printf 'not arrow' > "$(dirname "$(dirname "$1")")/stage-1/0-map-0.arrow" ;; esac"#,
    )
    .max_attempts(1);
    let spec = fixture.distributed_spec("shuffle");
    let err = host
        .run_distributed(SORTED, &spec)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("stage-1/0-map-0.arrow"), "{err}");
}

#[tokio::test]
async fn a_worker_whose_codec_ids_differ_refuses_before_decoding() {
    let fixture = Fixture::new();
    let dir = fixture.shuffle_dir("shuffle");
    std::fs::create_dir_all(&dir).unwrap();
    // Not a plan at all: a worker that decoded first would fail on the bytes.
    let plan = dir.join("garbage.plan");
    std::fs::write(&plan, b"\x00\x01 definitely not protobuf").unwrap();
    let mut spec = fixture.spec().with_shuffle_dir(&dir);
    spec.codec_ids = vec!["someone_else.physical.v9".to_string()];
    let envelope = Envelope {
        spec,
        plan,
        stage_id: 1,
        partition: 0,
        attempt: 0,
        added_from: None,
    };
    let err = dfx_host::run_task(&plugin(), &envelope)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("codec ids differ"), "{err}");
    assert!(err.contains("someone_else.physical.v9"), "{err}");
    assert!(err.contains("dfx_engine.physical.v5"), "{err}");
    assert!(!err.contains("decode"), "{err}");

    // Same through the binary.
    let path = dir.join("task.json");
    envelope.write(&path).unwrap();
    let out = std::process::Command::new(dfx_bin())
        .arg("worker")
        .arg(&path)
        .env("DFX_PLUGIN", plugin_path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("codec ids differ"), "{stderr}");
    // Its response, on its last stdout line, is the refusal with its class:
    // final, since a worker built the same way would refuse again.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let Ok(Response::Error(error)) = Response::parse_last(&stdout) else {
        panic!("no error response from a refusing worker: {stdout:?}");
    };
    assert_eq!((error.stage_id, error.partition), (Some(1), Some(0)));
    assert!(error.error.contains("codec ids differ"), "{error:?}");
    assert_eq!(error.retry, FailureClass::Final, "{error:?}");
}

#[tokio::test]
async fn a_stage_encoded_without_the_sessions_codecs_fails_to_encode() {
    let fixture = Fixture::new();
    let plugin = plugin();
    let session = build_session(&plugin, &fixture.distributed_spec("shuffle"))
        .await
        .unwrap();
    let plan = session.physical_plan(BY_FLAG).await.unwrap();
    let stage = stages(&plugin, &plan).unwrap().remove(0).plan;
    let err = physical_plan_to_bytes_with_extension_codec(
        Arc::clone(&stage),
        &DefaultPhysicalExtensionCodec {},
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("not provided") || err.to_string().contains("not implemented"),
        "{err}"
    );
    // With the session's codecs the stage cut out of the plan (its readers
    // carrying no stage) encodes again, and decodes to a writer again.
    let planned = session.plan(BY_FLAG).await.unwrap();
    let cut = session.decode(&planned.stages[0]).unwrap();
    let bytes = session.encode(cut).unwrap();
    let decoded = session.decode(&bytes).unwrap();
    assert!(node_display(decoded.as_ref()).contains("ShuffleWriterExec"));
    // The tree put back together is not encoded: its readers hold their
    // writers, and encoding them would nest the stages again.
    let err = session.encode(stage).unwrap_err().to_string();
    assert!(err.contains("holds its stage's writer as a child"), "{err}");
}

#[tokio::test]
async fn an_out_of_range_map_names_stage_and_map_with_its_stderr_and_stops_the_query() {
    let fixture = Fixture::new();
    let spec = fixture.distributed_spec("shuffle");
    let (first, all) = first_wave_stage(&spec, BY_FLAG).await;
    assert_eq!(first.maps, 4, "{all:?}");
    let s = first.stage_id;
    // Map 3 of the first wave's stage is rewritten to ask for a map the stage lacks.
    let host = host_with_script(&format!(
        r#"case "$1" in */task-{s}-3.json) sed -i 's/"partition": 3/"partition": 99/' "$1" ;; esac
exec "$DFX" worker "$1""#
    ));
    let err = host.run_distributed(BY_FLAG, &spec).await.unwrap_err();
    let (wave, stages, total, failures) = worker_failures(&err);
    assert_eq!(*wave, Some(1));
    assert!(stages.contains(&s), "{err}");
    assert_eq!(failures.len(), 1, "{err}");
    assert_eq!((failures[0].stage_id, failures[0].map), (s, 3));
    // The worker's response says why, and that it is final (another attempt
    // would ask for the same map); its stderr says it too.
    assert!(failures[0].reason.contains("map 99 out of range"), "{err}");
    assert_eq!(failures[0].retry, Retry::No, "{err}");
    assert!(failures[0].stderr.contains("map 99 out of range"), "{err}");
    assert_eq!(
        total,
        all.iter()
            .filter(|st| st.deps.is_empty())
            .map(|st| st.maps)
            .sum::<usize>()
    );
    let message = err.to_string();
    assert!(message.contains(&format!("stage {s} map 3")), "{message}");
    assert!(message.contains("4 map(s)"), "{message}");
    assert!(message.contains("in wave 1"), "{message}");
    // Nothing after the failed wave ran: no stage reading another published.
    let dir = spec.shuffle_dir.clone().unwrap();
    for stage in all.iter().filter(|st| !st.deps.is_empty()) {
        assert!(
            !dir.join(format!("stage-{}", stage.stage_id)).exists(),
            "stage {} ran after a failed wave",
            stage.stage_id
        );
    }
}

#[tokio::test]
async fn a_killed_worker_is_named_by_stage_and_map_with_its_stderr() {
    let fixture = Fixture::new();
    let spec = fixture.distributed_spec("shuffle");
    let (first, _) = first_wave_stage(&spec, BY_FLAG).await;
    let s = first.stage_id;
    let host = host_with_script(&format!(
        r#"case "$1" in */task-{s}-1.json) echo "worker {s}/1 about to be killed" >&2; kill -KILL $$ ;; esac
exec "$DFX" worker "$1""#
    ))
    // One attempt: a retry (its own envelope) would succeed.
    .max_attempts(1);
    let err = host.run_distributed(BY_FLAG, &spec).await.unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains(&format!("stage {s} map 1 was killed by signal 9")),
        "{message}"
    );
    assert!(
        message.contains(&format!("worker {s}/1 about to be killed")),
        "{message}"
    );
    assert!(
        message.contains("1 of 4 worker task(s) failed in wave 1"),
        "{message}"
    );
}

/// Once `run_distributed` has returned, the fan-out has waited for every
/// worker, so a check for survivors then cannot fail. The case to check is a
/// run dropped while a worker is still running, as `dfx tpch --timeout` and
/// Ctrl-C drop it.
#[tokio::test]
async fn dropping_a_distributed_run_mid_wave_kills_its_running_worker() {
    let fixture = Fixture::new();
    let spec = fixture.distributed_spec("shuffle");
    let (first, _) = first_wave_stage(&spec, BY_FLAG).await;
    let s = first.stage_id;
    // Map 1 of the first wave never ends, naming its envelope on its command
    // line (its output is not the driver's pipe, whose closing would end tail
    // by itself); the other maps run for real.
    let host = host_with_script(&format!(
        r#"case "$1" in */task-{s}-1.json) exec tail -f /dev/null "$1" >/dev/null ;; esac
exec "$DFX" worker "$1""#
    ));
    let task_dir = spec.shuffle_dir.as_deref().unwrap().join(TASK_DIR);
    let hanging = envelope_path(&task_dir, s, 1);
    let marker = hanging.to_str().unwrap().to_string();
    let started = {
        let marker = marker.clone();
        tokio::task::spawn_blocking(move || {
            eventually(|| live_processes_mentioning(&marker).len() == 1)
        })
    };
    tokio::select! {
        outcome = host.run_distributed(BY_FLAG, &spec) => {
            panic!("the run ended with a worker that never ends: {:?}", outcome.map(|r| r.rows()))
        }
        started = started => assert!(started.unwrap(), "the hanging worker never started"),
    }
    // The run's future is dropped here, its worker still running.
    assert!(
        eventually(|| live_processes_mentioning(&marker).is_empty()),
        "a worker survived its dropped run: {:?}",
        live_processes_mentioning(&marker)
    );
}

#[tokio::test]
async fn every_failure_of_a_wave_is_reported_together() {
    let fixture = Fixture::new();
    let spec = fixture.distributed_spec("shuffle");
    let (first, _) = first_wave_stage(&spec, BY_FLAG).await;
    let s = first.stage_id;
    let host = host_with_script(&format!(
        r#"case "$1" in */task-{s}-0.json|*/task-{s}-2.json) echo "refusing $1" >&2; exit 3 ;; esac
exec "$DFX" worker "$1""#
    ));
    let err = host.run_distributed(BY_FLAG, &spec).await.unwrap_err();
    let (_, _, _, failures) = worker_failures(&err);
    let tasks: Vec<(u64, usize)> = failures.iter().map(|f| (f.stage_id, f.map)).collect();
    assert_eq!(tasks, vec![(s, 0), (s, 2)]);
    // A worker that exits with an error and prints no response is final, as
    // its exit says.
    assert!(
        failures
            .iter()
            .all(|f| f.reason == "exited with status 3" && f.retry == Retry::No),
        "{err}"
    );
    assert!(
        failures[1].stderr.contains(&format!("task-{s}-2.json")),
        "{err}"
    );
}

#[tokio::test]
async fn a_failure_in_a_later_wave_names_that_wave_after_the_earlier_ones_published() {
    let fixture = Fixture::new();
    // Map 2 of stage 1 must be a task of its own.
    let spec = one_task_per_partition(fixture.distributed_spec("shuffle"));
    let (first, all) = first_wave_stage(&spec, BY_FLAG).await;
    // The stage the driver reads (stage 1) reads the table's stage: wave 2.
    assert!(all[0].deps.contains(&first.stage_id), "{all:?}");
    let host = host_with_script(
        r#"case "$1" in */task-1-2.json) echo "stage 1 fails" >&2; exit 4 ;; esac
exec "$DFX" worker "$1""#,
    );
    let err = host.run_distributed(BY_FLAG, &spec).await.unwrap_err();
    let (wave, _, _, failures) = worker_failures(&err);
    assert_eq!(*wave, Some(2), "{err}");
    assert_eq!((failures[0].stage_id, failures[0].map), (1, 2), "{err}");
    assert!(err.to_string().contains("in wave 2 (stages [1])"), "{err}");
    // The first wave's maps all committed before the second started.
    let plugin = plugin();
    let dir = spec.shuffle_dir.as_deref().unwrap();
    for map in 0..first.maps {
        assert!(plugin.marker_path(dir, first.stage_id, map).is_file());
    }
}

#[tokio::test]
async fn dropping_a_scheduler_run_kills_every_worker() {
    let fixture = Fixture::new();
    let dir = fixture.shuffle_dir("scratch");
    std::fs::create_dir_all(&dir).unwrap();
    let tasks: Vec<Task> = (0..3)
        .map(|map| {
            let envelope = envelope_path(&dir, 1, map);
            std::fs::write(&envelope, b"{}").unwrap();
            Task {
                stage_id: 1,
                map,
                envelope,
                inline: None,
            }
        })
        .collect();
    // Workers that never end, each naming its envelope on its command line.
    // Their output is not the driver's pipe: tail exits by itself once the
    // reader of a pipe it writes to has gone, which would pass for a kill.
    let command = WorkerCommand::new("/bin/sh")
        .arg("-c")
        .arg(r#"exec tail -f /dev/null "$1" >/dev/null"#)
        .arg("sh");
    let marker = dir.to_str().unwrap().to_string();
    let scheduler = process_scheduler(command, Some(3));
    let run = scheduler.run_tasks(&tasks);
    let all_started = async {
        let marker = marker.clone();
        tokio::task::spawn_blocking(move || {
            eventually(|| live_processes_mentioning(&marker).len() == 3)
        })
        .await
        .unwrap()
    };
    tokio::select! {
        outcome = run => panic!("the run ended on its own: {outcome:?}"),
        started = all_started => assert!(started, "three workers never started"),
    }
    // The run's future is dropped here, as on an error or Ctrl-C upstream.
    assert!(
        eventually(|| live_processes_mentioning(&marker).is_empty()),
        "workers survived their driver: {:?}",
        live_processes_mentioning(&marker)
    );
}

#[tokio::test]
async fn the_default_bound_keeps_workers_to_the_cores() {
    let fixture = Fixture::new();
    let dir = fixture.shuffle_dir("bounded");
    std::fs::create_dir_all(&dir).unwrap();
    let cores = default_max_workers();
    let tasks: Vec<Task> = (0..cores + 2)
        .map(|map| Task {
            stage_id: 1,
            map,
            envelope: envelope_path(&dir, 1, map),
            inline: None,
        })
        .collect();
    // Each worker notes its start, waits, and notes its end: at no time are
    // more than `cores` of them between the two.
    let log = dir.join("log");
    let command = WorkerCommand::new("/bin/sh")
        .arg("-c")
        .arg(format!(
            r#"echo start >> {log}; sleep 0.3; echo end >> {log}; exit 1"#,
            log = log.display()
        ))
        .arg("sh");
    let err = process_scheduler(command, None)
        .run_tasks(&tasks)
        .await
        .unwrap_err();
    assert!(matches!(err, RuntimeError::Workers { .. }), "{err}");
    let mut running = 0usize;
    let mut peak = 0;
    for line in std::fs::read_to_string(&log).unwrap().lines() {
        match line {
            "start" => running += 1,
            _ => running -= 1,
        }
        peak = peak.max(running);
    }
    assert!(peak <= cores, "{peak} workers at once on {cores} core(s)");
}

#[tokio::test]
async fn a_stage_whose_shuffle_directory_differs_from_the_spec_is_refused_before_decoding() {
    let fixture = Fixture::new();
    let plugin = plugin();
    // A stage planned to publish into `elsewhere`...
    let elsewhere = fixture.distributed_spec("elsewhere");
    let task_dir = fixture.shuffle_dir("scratch");
    let (stage, plan_file, codec_ids) = encoded_leaf_stage(&elsewhere, BY_FLAG, &task_dir).await;

    // ...shipped in an envelope whose spec names `shuffle` (codec ids right).
    let mut spec = fixture.distributed_spec("shuffle");
    spec.codec_ids = codec_ids.clone();
    let envelope = Envelope {
        spec,
        plan: plan_file.clone(),
        stage_id: stage.stage_id(),
        partition: 0,
        attempt: 0,
        added_from: None,
    };
    let err = dfx_host::run_task(&plugin, &envelope)
        .await
        .unwrap_err()
        .to_string();
    // The worker's checks read the stage's location from its bytes and
    // refuse it before anything is decoded, naming both locations.
    assert!(
        err.contains(&format!(
            "refusing a stage whose shuffle directory differs from the envelope's: the stage \
             names {}, the envelope's spec {}",
            fixture.shuffle_dir("elsewhere").display(),
            fixture.shuffle_dir("shuffle").display()
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!("stage {} map 0", stage.stage_id())),
        "{err}"
    );
    // The plugin's vet refuses the same bytes on its own, at the writer.
    let bytes = std::fs::read(&plan_file).unwrap();
    let tables = envelope.spec.table_roots();
    let shuffle = fixture.shuffle_dir("shuffle").display().to_string();
    let vetted = plugin
        .vet_stage(&bytes, &tables, &shuffle)
        .unwrap_err()
        .strip_backtrace();
    assert!(vetted.contains("refusing the stage"), "{vetted}");
    assert!(
        vetted.contains(&format!(
            "stage {} (at plan.extension) publishes into {}, not the spec's shuffle location {}",
            stage.stage_id(),
            fixture.shuffle_dir("elsewhere").display(),
            fixture.shuffle_dir("shuffle").display()
        )),
        "{vetted}"
    );
    assert!(
        !fixture.shuffle_dir("elsewhere").exists(),
        "the refused stage wrote output"
    );
    assert!(
        !fixture.shuffle_dir("shuffle").exists(),
        "the refused stage wrote output"
    );

    // An envelope naming another stage than the plan holds is refused too.
    let mut wrong_id = envelope.clone();
    wrong_id.spec = elsewhere.clone();
    wrong_id.spec.codec_ids = codec_ids.clone();
    wrong_id.stage_id = stage.stage_id() + 10;
    let err = dfx_host::run_task(&plugin, &wrong_id)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!(
            "holds stage {}, not the envelope's stage {}",
            stage.stage_id(),
            stage.stage_id() + 10
        )),
        "{err}"
    );

    // The same envelope with the stage's own directory runs: two partial
    // groups in file 0, published with the map's marker.
    let mut good = envelope.clone();
    good.spec = elsewhere.clone();
    good.spec.codec_ids = codec_ids;
    let report = dfx_host::run_task(&plugin, &good).await.unwrap();
    assert_eq!(
        (report.stage_id, report.partition, report.rows),
        (stage.stage_id(), 0, 2)
    );
    assert!(
        plugin
            .marker_path(
                elsewhere.shuffle_dir.as_deref().unwrap(),
                stage.stage_id(),
                0
            )
            .is_file()
    );
}

#[tokio::test]
async fn a_worker_reports_on_its_last_stdout_line() {
    let fixture = Fixture::new();
    for split in SPLITS {
        let spec = fixture
            .distributed_spec(&format!("shuffle-{split}"))
            .with_split(split);
        let task_dir = spec.shuffle_dir.as_deref().unwrap().join("tasks");
        let (stage, plan_file, codec_ids) = encoded_leaf_stage(&spec, BY_FLAG, &task_dir).await;
        let mut shipped = spec.clone();
        shipped.codec_ids = codec_ids;
        let path = envelope_path(&task_dir, stage.stage_id(), 2);
        Envelope {
            spec: shipped,
            plan: plan_file,
            stage_id: stage.stage_id(),
            partition: 2,
            attempt: 0,
            added_from: None,
        }
        .write(&path)
        .unwrap();
        let out = std::process::Command::new(dfx_bin())
            .arg("worker")
            .arg(&path)
            .env("DFX_PLUGIN", plugin_path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{split}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let last = stdout.lines().rev().find(|l| !l.trim().is_empty()).unwrap();
        let report: serde_json::Value = serde_json::from_str(last).unwrap();
        // File 2 holds two flags: two partial groups, whichever buckets they land in.
        let expected_keys = [
            "bytes",
            "elapsed_ms",
            "layout",
            "partition",
            "rows",
            "stage_id",
        ];
        assert_eq!(
            report.as_object().unwrap().keys().collect::<Vec<_>>(),
            expected_keys,
            "{split}: {report}"
        );
        assert_eq!(report["stage_id"], stage.stage_id(), "{split}");
        assert_eq!(report["partition"], 2, "{split}");
        assert_eq!(report["rows"], 2, "{split}");
        // Where each bucket lies in the map's file, for the stage's readers.
        let layout = &report["layout"];
        let rows: u64 = layout["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_u64().unwrap())
            .sum();
        assert_eq!(rows, 2, "{split}: {report}");
        assert_eq!(
            layout["bytes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap())
                .sum::<u64>(),
            report["bytes"].as_u64().unwrap(),
            "{split}: {report}"
        );
        // Two rows were published, so some bytes were: those of the files
        // the marker lists, summed.
        let marker = read_marker(
            &spec
                .shuffle_dir
                .as_deref()
                .unwrap()
                .join(format!("stage-{}", stage.stage_id()))
                .join("2-map-2.arrow"),
        );
        let marker_bytes: u64 = marker["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["bytes"].as_u64().unwrap())
            .sum();
        assert!(marker_bytes > 0, "{split}: {marker}");
        assert_eq!(report["bytes"], marker_bytes, "{split}: {marker}");
        assert!(report["elapsed_ms"].as_f64().unwrap() >= 0.0, "{split}");
        if split == Split::Aggregate {
            assert_eq!(stage.stage_id(), 1);
        }
    }
}

#[tokio::test]
async fn a_spec_with_zero_target_partitions_is_refused() {
    let fixture = Fixture::new();
    let spec = fixture.spec().with_target_partitions(0);
    let Err(err) = build_session(&plugin(), &spec).await else {
        panic!("a session was built for zero partitions");
    };
    let err = err.to_string();
    assert!(
        err.contains("target_partitions must be at least 1, got 0"),
        "{err}"
    );
}

#[tokio::test]
async fn a_recursive_query_reading_outside_the_specs_tables_is_refused_inside_its_seal() {
    // The recursive query travels sealed, as one payload of the plugin's
    // own: the vet must open it and walk it as it walks a stage.
    let sql = "WITH RECURSIVE r(k) AS (SELECT 1 UNION ALL SELECT r.k + 1 FROM r \
               JOIN lineitem ON lineitem.l_orderkey = r.k WHERE r.k < 5) SELECT count(*) FROM r";
    let fixture = Fixture::new();
    let plugin = plugin();
    let mut spec = fixture.distributed_spec("shuffle");
    // A stage to vet: a plan this narrow would be kept whole for the driver.
    spec.engine_options
        .insert("collapse_stages".to_string(), "task".to_string());
    let task_dir = fixture.shuffle_dir("scratch");
    let (_, plan_file, _) = encoded_leaf_stage(&spec, sql, &task_dir).await;
    let bytes = std::fs::read(&plan_file).unwrap();
    let shuffle = spec.shuffle_dir.as_deref().unwrap().display().to_string();
    let tables = spec.table_roots();
    plugin.vet_stage(&bytes, &tables, &shuffle).unwrap();

    let other = fixture.shuffle_dir("other-table");
    let err = plugin
        .vet_stage(&bytes, std::slice::from_ref(&other), &shuffle)
        .unwrap_err()
        .strip_backtrace();
    assert!(err.contains("refusing the stage"), "{err}");
    assert!(
        err.contains("in the sealed recursive query at plan."),
        "{err}"
    );
    assert!(err.contains("under none of the spec's tables"), "{err}");
}

#[tokio::test]
async fn a_stage_reading_outside_the_specs_tables_is_refused_before_it_runs() {
    let fixture = Fixture::new();
    let plugin = plugin();
    let spec = fixture.distributed_spec("shuffle");
    let task_dir = fixture.shuffle_dir("scratch");
    let (stage, plan_file, codec_ids) = encoded_leaf_stage(&spec, BY_FLAG, &task_dir).await;
    let bytes = std::fs::read(&plan_file).unwrap();
    let shuffle = spec.shuffle_dir.as_deref().unwrap().display().to_string();
    let tables = spec.table_roots();

    // The stage as planned reads only the spec's table.
    plugin.vet_stage(&bytes, &tables, &shuffle).unwrap();

    // The same bytes, for a worker whose spec names another table directory:
    // every file of the scan is named, the first at least.
    let other = fixture.shuffle_dir("other-table");
    std::fs::create_dir_all(&other).unwrap();
    // A real table (the worker lists it when it builds its session).
    let first = std::fs::read_dir(fixture.table_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "parquet"))
        .unwrap();
    std::fs::copy(&first, other.join("0.parquet")).unwrap();
    let err = plugin
        .vet_stage(&bytes, std::slice::from_ref(&other), &shuffle)
        .unwrap_err()
        .strip_backtrace();
    assert!(err.contains("refusing the stage"), "{err}");
    assert!(err.contains("under none of the spec's tables"), "{err}");
    assert!(
        err.contains(&format!("{}", fixture.table_dir().display())),
        "{err}"
    );

    // Through a worker: the envelope's spec names the other directory as
    // its table, so the worker refuses, and nothing is published.
    let mut shipped = spec.clone();
    shipped.codec_ids = codec_ids;
    shipped.tables = [("lineitem".to_string(), other.clone().into())].into();
    let envelope = Envelope {
        spec: shipped,
        plan: plan_file,
        stage_id: stage.stage_id(),
        partition: 0,
        attempt: 0,
        added_from: None,
    };
    let err = dfx_host::run_task(&plugin, &envelope)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("under none of the spec's tables"), "{err}");
    assert!(
        err.contains(&format!("stage {} map 0", stage.stage_id())),
        "{err}"
    );
    assert!(
        !spec
            .shuffle_dir
            .as_deref()
            .unwrap()
            .join(format!("stage-{}", stage.stage_id()))
            .exists(),
        "the refused stage published output"
    );
}

#[tokio::test]
async fn a_plan_holding_a_sink_is_refused_by_the_worker_before_it_runs() {
    let fixture = Fixture::new();
    let plugin = plugin();
    let spec = fixture.distributed_spec("shuffle");
    // A dfx session plans no COPY (its logical plan crosses FFI as protobuf,
    // which carries no file format), so the sink is planned by plain
    // DataFusion and encoded with its own codec: bytes any host decodes.
    let ctx = datafusion::prelude::SessionContext::new();
    ctx.register_parquet(
        "lineitem",
        fixture.table_dir().display().to_string(),
        Default::default(),
    )
    .await
    .unwrap();
    let out = fixture.shuffle_dir("written");
    let sql = format!(
        "COPY (SELECT l_returnflag FROM lineitem) TO '{}/' STORED AS PARQUET",
        out.display()
    );
    let plan = ctx
        .sql(&sql)
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    let bytes =
        physical_plan_to_bytes_with_extension_codec(plan, &DefaultPhysicalExtensionCodec {})
            .unwrap();
    let tables = spec.table_roots();
    let shuffle = spec.shuffle_dir.as_deref().unwrap().display().to_string();
    let err = plugin
        .vet_stage(&bytes, &tables, &shuffle)
        .unwrap_err()
        .strip_backtrace();
    assert!(err.contains("it holds a sink (parquetSink"), "{err}");

    // Shipped to a worker in an envelope, it is refused before decoding:
    // its root is no dfx writer, so the worker's first look at the bytes
    // (which stage, which location) finds no stage in them.
    let task_dir = fixture.shuffle_dir("scratch");
    std::fs::create_dir_all(&task_dir).unwrap();
    let plan_file = task_dir.join("sink.plan");
    std::fs::write(&plan_file, &bytes).unwrap();
    let session = build_session(&plugin, &spec).await.unwrap();
    let mut shipped = spec.clone();
    shipped.codec_ids = session.codec_ids();
    let envelope = Envelope {
        spec: shipped,
        plan: plan_file.clone(),
        stage_id: 1,
        partition: 0,
        attempt: 0,
        added_from: None,
    };
    let err = dfx_host::run_task(&plugin, &envelope)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("stage 1 map 0: plan {}", plan_file.display())),
        "{err}"
    );
    assert!(err.contains("not a dfx stage"), "{err}");
    assert!(!out.exists(), "the sink wrote {}", out.display());
}

#[tokio::test]
async fn a_session_vets_the_same_stage_once_and_never_remembers_a_refusal() {
    let fixture = Fixture::new();
    let plugin = plugin();
    let spec = fixture.distributed_spec("shuffle");
    let task_dir = fixture.shuffle_dir("scratch");
    let (stage, plan_file, codec_ids) = encoded_leaf_stage(&spec, BY_FLAG, &task_dir).await;
    let mut shipped = spec.clone();
    shipped.codec_ids = codec_ids;
    let envelope = Envelope {
        spec: shipped.clone(),
        plan: plan_file,
        stage_id: stage.stage_id(),
        partition: 0,
        attempt: 0,
        added_from: None,
    };
    let task = TaskInput::read(&plugin, envelope.clone()).unwrap();

    // Refused by the vet (its table is elsewhere in this worker's spec): a
    // refusal is not remembered, so the same bytes are vetted again.
    let other = fixture.shuffle_dir("other-table");
    std::fs::create_dir_all(&other).unwrap();
    let refusing = {
        let mut envelope = envelope.clone();
        envelope.spec.tables = [("lineitem".to_string(), other.into())].into();
        TaskInput::read(&plugin, envelope).unwrap()
    };
    let session = build_worker_session(&plugin, &shipped).await.unwrap();
    for _ in 0..2 {
        let err = decode_checked(&session, &refusing).unwrap_err().to_string();
        assert!(err.contains("under none of the spec's tables"), "{err}");
        assert!(!session.is_vetted(&refusing.plan));
    }

    // Passed once, remembered for the bytes: the next map of the stage is
    // not vetted again.
    decode_checked(&session, &task).unwrap();
    assert!(session.is_vetted(&task.plan));
    // Other bytes (even a prefix of vetted ones) are vetted on their own.
    assert!(!session.is_vetted(&task.plan[..10]));
}
