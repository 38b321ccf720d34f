//! What goes wrong, and what the host says: real worker processes (some of
//! them sabotaged by a wrapper script), the real plugin file.

mod common;

use std::sync::Arc;

use common::*;
use datafusion_proto::bytes::physical_plan_to_bytes_with_extension_codec;
use datafusion_proto::physical_plan::DefaultPhysicalExtensionCodec;
use dfx_host::HostError;
use dfx_host::dispatch::{FanOutOptions, Task, WorkerCommand, fan_out};
use dfx_host::envelope::{Envelope, envelope_path, plan_path};
use dfx_host::session::build_session;
use dfx_host::stages::stages;

#[tokio::test]
async fn the_driver_reads_the_workers_output_a_corrupt_file_fails_naming_it() {
    let fixture = Fixture::new();
    // Task 1/2 runs for real, then its published file is overwritten.
    let host = host_with_script(
        r#""$DFX" worker "$1" || exit $?
case "$1" in */task-1-2.json) printf 'not arrow' > "$(dirname "$(dirname "$1")")/stage-1-part-2.arrow" ;; esac"#,
    );
    let err = host
        .run_distributed(BY_FLAG, &fixture.distributed_spec("shuffle"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("stage-1-part-2.arrow"), "{err}");
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
    };
    let err = dfx_host::run_task(&plugin(), &envelope)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("codec ids differ"), "{err}");
    assert!(err.contains("someone_else.physical.v9"), "{err}");
    assert!(err.contains("dfx_engine.physical.v1"), "{err}");
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
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("codec ids differ"), "{stderr}");
    assert!(out.stdout.is_empty(), "no report from a refusing worker");
}

#[tokio::test]
async fn a_stage_encoded_without_the_sessions_codecs_fails_to_encode() {
    let fixture = Fixture::new();
    let plugin = plugin();
    let session = build_session(&plugin, &fixture.distributed_spec("shuffle"))
        .await
        .unwrap();
    let plan = session.physical_plan(BY_FLAG).await.unwrap();
    let stage = stages(&plugin, &plan).remove(0).plan;
    let err = physical_plan_to_bytes_with_extension_codec(
        Arc::clone(&stage),
        &DefaultPhysicalExtensionCodec {},
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("not provided") || err.to_string().contains("not implemented"),
        "{err}"
    );
    // With the session's codecs it encodes, and decodes to a stage again.
    let bytes = session.encode(stage).unwrap();
    let decoded = session.decode(&bytes).unwrap();
    assert!(dfx_host::stages::node_display(decoded.as_ref()).contains("ShuffleStageExec"));
}

#[tokio::test]
async fn an_out_of_range_partition_names_stage_and_partition_with_its_stderr() {
    let fixture = Fixture::new();
    // Task 1/3's envelope is rewritten to ask for a partition the stage lacks.
    let host = host_with_script(
        r#"case "$1" in */task-1-3.json) sed -i 's/"partition": 3/"partition": 99/' "$1" ;; esac
exec "$DFX" worker "$1""#,
    );
    let spec = fixture.distributed_spec("shuffle");
    let err = host.run_distributed(BY_FLAG, &spec).await.unwrap_err();
    let HostError::Workers { total, failures } = &err else {
        panic!("expected worker failures, got {err}");
    };
    assert_eq!(*total, 4);
    assert_eq!(failures.len(), 1, "{err}");
    assert_eq!((failures[0].stage_id, failures[0].partition), (1, 3));
    assert!(failures[0].reason.contains("exited with status 1"), "{err}");
    assert!(
        failures[0].stderr.contains("partition 99 out of range"),
        "{err}"
    );
    let message = err.to_string();
    assert!(message.contains("stage 1 partition 3"), "{message}");
    assert!(message.contains("4 partition(s)"), "{message}");
    assert!(live_processes_mentioning(spec.shuffle_dir.unwrap().to_str().unwrap()).is_empty());
}

#[tokio::test]
async fn a_killed_worker_names_stage_and_partition_and_no_child_survives() {
    let fixture = Fixture::new();
    let host = host_with_script(
        r#"case "$1" in */task-1-1.json) echo "worker 1/1 about to be killed" >&2; kill -KILL $$ ;; esac
exec "$DFX" worker "$1""#,
    );
    let spec = fixture.distributed_spec("shuffle");
    let err = host.run_distributed(BY_FLAG, &spec).await.unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("stage 1 partition 1 was killed by signal 9"),
        "{message}"
    );
    assert!(
        message.contains("worker 1/1 about to be killed"),
        "{message}"
    );
    assert!(
        message.contains("1 of 4 worker task(s) failed"),
        "{message}"
    );
    let marker = spec.shuffle_dir.unwrap();
    assert!(live_processes_mentioning(marker.to_str().unwrap()).is_empty());
}

#[tokio::test]
async fn every_failure_is_reported_together() {
    let fixture = Fixture::new();
    let host = host_with_script(
        r#"case "$1" in */task-1-0.json|*/task-1-2.json) echo "refusing $1" >&2; exit 3 ;; esac
exec "$DFX" worker "$1""#,
    );
    let err = host
        .run_distributed(BY_FLAG, &fixture.distributed_spec("shuffle"))
        .await
        .unwrap_err();
    let HostError::Workers { failures, .. } = &err else {
        panic!("expected worker failures, got {err}");
    };
    let tasks: Vec<(u64, usize)> = failures.iter().map(|f| (f.stage_id, f.partition)).collect();
    assert_eq!(tasks, vec![(1, 0), (1, 2)]);
    assert!(
        failures.iter().all(|f| f.reason == "exited with status 3"),
        "{err}"
    );
    assert!(failures[1].stderr.contains("task-1-2.json"), "{err}");
}

#[tokio::test]
async fn dropping_the_fan_out_kills_every_worker() {
    let fixture = Fixture::new();
    let dir = fixture.shuffle_dir("scratch");
    std::fs::create_dir_all(&dir).unwrap();
    let tasks: Vec<Task> = (0..3)
        .map(|partition| {
            let envelope = envelope_path(&dir, 1, partition);
            std::fs::write(&envelope, b"{}").unwrap();
            Task {
                stage_id: 1,
                partition,
                envelope,
            }
        })
        .collect();
    // Workers that never end, each naming its envelope on its command line.
    let command = WorkerCommand::new("/bin/sh")
        .arg("-c")
        .arg(r#"exec tail -f /dev/null "$1""#)
        .arg("sh");
    let marker = dir.to_str().unwrap().to_string();
    let options = FanOutOptions::default();
    let fan = fan_out(&command, &tasks, &options);
    let all_started = async {
        let marker = marker.clone();
        tokio::task::spawn_blocking(move || {
            eventually(|| live_processes_mentioning(&marker).len() == 3)
        })
        .await
        .unwrap()
    };
    tokio::select! {
        outcome = fan => panic!("the fan-out ended on its own: {outcome:?}"),
        started = all_started => assert!(started, "three workers never started"),
    }
    // The fan-out future is dropped here, as on an error or Ctrl-C upstream.
    assert!(
        eventually(|| live_processes_mentioning(&marker).is_empty()),
        "workers survived their driver: {:?}",
        live_processes_mentioning(&marker)
    );
}

#[tokio::test]
async fn a_decoded_stage_whose_shuffle_directory_differs_from_the_spec_is_refused() {
    let fixture = Fixture::new();
    let plugin = plugin();
    // A stage planned to publish into `elsewhere`...
    let elsewhere = fixture.distributed_spec("elsewhere");
    let session = build_session(&plugin, &elsewhere).await.unwrap();
    let plan = session.physical_plan(BY_FLAG).await.unwrap();
    let stage = stages(&plugin, &plan).remove(0);
    let task_dir = fixture.shuffle_dir("scratch");
    std::fs::create_dir_all(&task_dir).unwrap();
    let plan_file = plan_path(&task_dir, stage.stage_id);
    std::fs::write(&plan_file, session.encode(stage.plan).unwrap()).unwrap();

    // ...shipped in an envelope whose spec names `shuffle` (codec ids right).
    let mut spec = fixture.distributed_spec("shuffle");
    spec.codec_ids = session.codec_ids();
    let envelope = Envelope {
        spec,
        plan: plan_file,
        stage_id: 1,
        partition: 0,
    };
    let err = dfx_host::run_task(&plugin, &envelope)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("shuffle directory differs"), "{err}");
    assert!(err.contains("stage 1 partition 0"), "{err}");
    assert!(
        !fixture.shuffle_dir("elsewhere").exists(),
        "the refused stage wrote output"
    );
    assert!(
        !fixture.shuffle_dir("shuffle").exists(),
        "the refused stage wrote output"
    );

    // The same envelope with the stage's own directory runs.
    let mut good = envelope.clone();
    good.spec = elsewhere.clone();
    good.spec.codec_ids = session.codec_ids();
    let report = dfx_host::run_task(&plugin, &good).await.unwrap();
    assert_eq!((report.stage_id, report.partition, report.rows), (1, 0, 2));
    assert!(
        plugin
            .partition_path(elsewhere.shuffle_dir.as_deref().unwrap(), 1, 0)
            .is_file()
    );
}

#[tokio::test]
async fn a_worker_reports_on_its_last_stdout_line() {
    let fixture = Fixture::new();
    let plugin = plugin();
    let spec = fixture.distributed_spec("shuffle");
    let session = build_session(&plugin, &spec).await.unwrap();
    let plan = session.physical_plan(BY_FLAG).await.unwrap();
    let stage = stages(&plugin, &plan).remove(0);
    let task_dir = spec.shuffle_dir.as_deref().unwrap().join("tasks");
    std::fs::create_dir_all(&task_dir).unwrap();
    let plan_file = plan_path(&task_dir, 1);
    std::fs::write(&plan_file, session.encode(stage.plan).unwrap()).unwrap();
    let mut shipped = spec.clone();
    shipped.codec_ids = session.codec_ids();
    let path = envelope_path(&task_dir, 1, 2);
    Envelope {
        spec: shipped,
        plan: plan_file,
        stage_id: 1,
        partition: 2,
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
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().rev().find(|l| !l.trim().is_empty()).unwrap();
    let report: serde_json::Value = serde_json::from_str(last).unwrap();
    assert_eq!(
        report,
        serde_json::json!({"stage_id": 1, "partition": 2, "rows": 2})
    );
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
