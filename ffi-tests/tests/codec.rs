//! The plugin's codec: a stage encoded by this host's chain (host default +
//! the plugin's foreign codec) decodes in another process, displays the same
//! and executes; malformed payloads give dfx's error, never a crash.

use std::path::Path;
use std::sync::Arc;

use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::physical_plan::{
    DefaultPhysicalExtensionCodec, DefaultPhysicalProtoConverter,
};
use dfx_ffi_tests::fixtures::{AGGREGATE_ANSWER, AGGREGATE_SQL, write_lineitem};
use dfx_ffi_tests::locate::plugin;
use dfx_ffi_tests::plans::{find_stages, plan_display, run_in_child, run_to_table};
use dfx_ffi_tests::session::{SessionOptions, TestSession};

const CHILD: &str = env!("CARGO_BIN_EXE_dfx-ffi-child");

async fn stage_of(
    root: &Path,
    sql: &str,
) -> (TestSession, Arc<dyn ExecutionPlan>, Arc<dyn ExecutionPlan>) {
    let options = SessionOptions::distributed(&root.join("shuffle"))
        .with_table("lineitem", &write_lineitem(root));
    let session = TestSession::new(plugin(), &options).await.unwrap();
    let plan = session.plan(sql).await.unwrap();
    let stage = find_stages(&plan, plugin().stage_node_name()).remove(0);
    (session, plan, stage)
}

#[test]
fn the_codec_id_is_listed() {
    assert_eq!(plugin().codec_id(), "dfx_engine.physical.v1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_round_trips_through_the_host_chain() {
    let dir = tempfile::tempdir().unwrap();
    let (session, _plan, stage) = stage_of(dir.path(), AGGREGATE_SQL).await;
    let bytes = session.encode(Arc::clone(&stage)).unwrap();
    let decoded = session.decode(&bytes).unwrap();
    assert_eq!(plan_display(&decoded), plan_display(&stage));
    assert_eq!(
        plugin().stage_info(&decoded).unwrap(),
        plugin().stage_info(&stage).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_decodes_and_executes_in_another_process() {
    let dir = tempfile::tempdir().unwrap();
    let shuffle = dir.path().join("shuffle");
    let (session, plan, stage) = stage_of(dir.path(), AGGREGATE_SQL).await;
    let info = plugin().stage_info(&stage).unwrap();
    let bytes = session.encode(Arc::clone(&stage)).unwrap();

    let report =
        run_in_child(Path::new(CHILD), &bytes, dir.path()).unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(report.display, plan_display(&stage));
    assert_eq!(report.rows.len() as u64, info.partition_count);
    // The child published every partition; this process finishes the query
    // from those files.
    for partition in 0..report.rows.len() {
        assert!(
            plugin()
                .partition_path(&shuffle, info.stage_id, partition)
                .exists()
        );
    }
    assert_eq!(
        run_to_table(&plan, session.ctx.task_ctx()).await.unwrap(),
        AGGREGATE_ANSWER
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_reads_stage_id_and_directory_from_encoded_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (session, _plan, stage) = stage_of(dir.path(), AGGREGATE_SQL).await;
    let info = plugin().stage_info(&stage).unwrap();
    let bytes = session.encode(Arc::clone(&stage)).unwrap();
    let payload = plugin().encoded_stage_info(&bytes).unwrap();
    assert_eq!(payload.stage_id, info.stage_id);
    assert_eq!(payload.shuffle_dir, info.shuffle_dir);
    // Bytes that are not an encoded stage are an error, not a crash.
    let error = plugin()
        .encoded_stage_info(b"not a plan")
        .unwrap_err()
        .to_string();
    assert!(error.contains("dfx"), "{error}");
    assert!(
        plugin()
            .encoded_stage_info(&bytes[..bytes.len() / 2])
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_without_the_plugin_codec_cannot_encode_a_stage() {
    let dir = tempfile::tempdir().unwrap();
    let (_session, _plan, stage) = stage_of(dir.path(), AGGREGATE_SQL).await;
    let host_only = DefaultPhysicalExtensionCodec {};
    let result =
        datafusion_proto::bytes::physical_plan_to_bytes_with_extension_codec(stage, &host_only);
    assert!(
        result.is_err(),
        "a stage encoded without the plugin's codec"
    );
}

/// A session and the stage of [`AGGREGATE_SQL`], to feed the plugin's codec.
struct CodecProbe {
    session: TestSession,
    stage: Arc<dyn ExecutionPlan>,
    _dir: tempfile::TempDir,
}

impl CodecProbe {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (session, _plan, stage) = stage_of(dir.path(), AGGREGATE_SQL).await;
        Self {
            session,
            stage,
            _dir: dir,
        }
    }

    /// The plugin codec's own payload for the stage.
    fn payload(&self) -> Vec<u8> {
        let mut payload = Vec::new();
        self.session
            .plugin_codec
            .try_encode(
                Arc::clone(&self.stage),
                &mut payload,
                &DefaultPhysicalProtoConverter {},
            )
            .unwrap();
        payload
    }

    /// Decode `payload` with the plugin's codec alone; return its error.
    fn refused(&self, payload: &[u8]) -> String {
        let child = Arc::clone(self.stage.children()[0]);
        let result = self.session.plugin_codec.try_decode(
            payload,
            &[child],
            &self.session.ctx.task_ctx(),
            &DefaultPhysicalProtoConverter {},
        );
        match result {
            Ok(plan) => panic!("payload {payload:02x?} decoded as {}", plan_display(&plan)),
            Err(err) => err.to_string(),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_codec_decodes_its_own_payload() {
    let probe = CodecProbe::new().await;
    let child = Arc::clone(probe.stage.children()[0]);
    let decoded = probe
        .session
        .plugin_codec
        .try_decode(
            &probe.payload(),
            &[child],
            &probe.session.ctx.task_ctx(),
            &DefaultPhysicalProtoConverter {},
        )
        .unwrap();
    assert_eq!(
        plugin().stage_info(&decoded).unwrap(),
        plugin().stage_info(&probe.stage).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_is_refused_with_dfx_error() {
    let probe = CodecProbe::new().await;
    let error = probe.refused(b"definitely not a stage payload");
    assert!(error.contains("dfx codec"), "{error}");
    assert!(error.contains("not a dfx stage payload"), "{error}");
    let error = probe.refused(b"");
    assert!(error.contains("dfx codec"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_truncation_is_refused_with_dfx_error() {
    let probe = CodecProbe::new().await;
    let payload = probe.payload();
    for len in 0..payload.len() {
        let error = probe.refused(&payload[..len]);
        assert!(error.contains("dfx codec"), "length {len}: {error}");
    }
    let mut longer = payload.clone();
    longer.push(b'x');
    let error = probe.refused(&longer);
    assert!(error.contains("dfx codec"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_future_payload_version_is_refused_with_dfx_error() {
    let probe = CodecProbe::new().await;
    let mut payload = probe.payload();
    // The frame (documented in the plugin's codec module): 4 bytes of magic,
    // then the payload version as u16 little endian.
    let version = u16::from_le_bytes([payload[4], payload[5]]);
    payload[4..6].copy_from_slice(&(version + 1).to_le_bytes());
    let error = probe.refused(&payload);
    assert!(error.contains("dfx codec"), "{error}");
    assert!(
        error.contains(&format!("version {}", version + 1)),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_plan_bytes_are_an_error_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let (session, _plan, stage) = stage_of(dir.path(), AGGREGATE_SQL).await;
    assert!(session.decode(b"\xff\xfe garbage").is_err());
    let bytes = session.encode(stage).unwrap();
    assert!(session.decode(&bytes[..bytes.len() / 2]).is_err());
}
