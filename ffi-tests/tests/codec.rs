//! The plugin's codec: a plan encoded by this host's chain (host default +
//! the plugin's foreign codec) is cut into its stages, each decodes here
//! and in another process on its own and puts the plan together again, its
//! bytes tell the same stage description as its node, it executes there;
//! malformed payloads give dfx's error, never a crash.

use std::path::Path;
use std::sync::Arc;

use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use datafusion_proto::physical_plan::{
    DefaultPhysicalExtensionCodec, DefaultPhysicalProtoConverter,
};
use dfx_ffi_tests::fixtures::{
    AGGREGATE_ANSWER, AGGREGATE_SQL, JOIN_ANSWER, JOIN_SQL, SCAN_SQL, distributed_lineitem,
};
use dfx_ffi_tests::locate::plugin;
use dfx_ffi_tests::plans::{
    find_readers, find_stages, plan_display, read_marker, run_in_child, run_to_table, stages, waves,
};
use dfx_ffi_tests::session::{Planned, TestSession};

const CHILD: &str = env!("CARGO_BIN_EXE_dfx-ffi-child");

/// A distributing session over the fixture, and `sql` planned in it.
async fn planned(root: &Path, sql: &str) -> (TestSession, Planned) {
    let session = TestSession::new(plugin(), &distributed_lineitem(root))
        .await
        .unwrap();
    let planned = session.planned(sql).await.unwrap();
    (session, planned)
}

/// The descriptions of every writer in `plan` (a whole plan or one stage's
/// subtree), in pre-order.
fn infos(plan: &Arc<dyn ExecutionPlan>) -> Vec<dfx_abi::DfxStageInfo> {
    find_stages(plan, plugin().stage_node_name())
        .iter()
        .map(|writer| plugin().stage_info(writer).unwrap())
        .collect()
}

#[test]
fn the_codec_id_is_listed() {
    assert_eq!(plugin().codec_id(), "dfx_engine.physical.v5");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_stages_round_trip_through_the_host_chain() {
    let dir = tempfile::tempdir().unwrap();
    for sql in [AGGREGATE_SQL, JOIN_SQL] {
        round_trip(dir.path(), sql).await;
    }
}

/// Every stage of `sql`, and its whole plan, through the host's chain.
async fn round_trip(root: &Path, sql: &str) {
    let (session, planned) = planned(root, sql).await;
    let plan = &planned.plan;
    let all = stages(plugin(), plan).unwrap();
    assert!(
        all.iter().any(|stage| !stage.info.deps.is_empty()),
        "no nested stage to round-trip: {}",
        plan_display(plan)
    );
    assert_eq!(planned.stages.len(), all.len());
    let mut writers = Vec::new();
    for (stage, bytes) in all.iter().zip(&planned.stages) {
        let decoded = session.decode(bytes).unwrap();
        // The stage's own writer keeps its description (id, directory,
        // maps, buckets, deps, partitioning); the stages it reads are cut
        // out beside it.
        assert_eq!(infos(&decoded), vec![stage.info.clone()]);
        // Encoded again, it is the same stage.
        let again = session.decode(&session.encode(Arc::clone(&decoded)).unwrap());
        assert_eq!(plan_display(&again.unwrap()), plan_display(&decoded));
        writers.push(decoded);
    }
    // The whole plan too: decoded with every reader carrying its stage, and
    // put together from its stages as the planner made it.
    let handed = session
        .decode(&session.encode(Arc::clone(&planned.handed)).unwrap())
        .unwrap();
    assert_eq!(plan_display(&handed), plan_display(&planned.handed));
    let reader = plugin().reader_node_name().unwrap();
    let whole = dfx_abi::stages::attach_stages(&handed, reader, &writers).unwrap();
    assert_eq!(plan_display(&whole), plan_display(plan));
    assert_eq!(infos(&whole), infos(plan));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stage_info_and_encoded_stage_info_agree() {
    let dir = tempfile::tempdir().unwrap();
    for sql in [AGGREGATE_SQL, JOIN_SQL, SCAN_SQL] {
        let (_session, planned) = planned(dir.path(), sql).await;
        let all = stages(plugin(), &planned.plan).unwrap();
        assert_eq!(all.len(), planned.stages.len());
        for (stage, bytes) in all.iter().zip(&planned.stages) {
            let from_bytes = plugin().encoded_stage_info(bytes).unwrap();
            assert_eq!(from_bytes, stage.info, "{sql}");
            // One partition a map (the session's default): no slices, as
            // the decoded writer says too.
            let writer = &stage.writer;
            let slices = writer.children()[0].output_partitioning().partition_count()
                > writer.output_partitioning().partition_count();
            assert_eq!(plugin().stage_runs_slices(bytes), Some(Ok(slices)), "{sql}");
            assert!(!slices, "{sql}");
        }
    }
    let (session, planned) = planned(dir.path(), AGGREGATE_SQL).await;
    let bytes = planned.stages[0].clone();
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
    let error = plugin()
        .stage_runs_slices(b"not a plan")
        .unwrap()
        .unwrap_err();
    assert!(error.contains("cannot read the stage's writer"), "{error}");
    // Neither a reader nor the root (a merge) is a stage, encoded or not
    // (as the planner handed them back: a reader carrying its stage).
    let reader = find_readers(&planned.handed, plugin().reader_node_name().unwrap()).remove(0);
    for node in [reader, Arc::clone(&planned.handed)] {
        let display = plan_display(&node);
        assert!(plugin().stage_info(&node).is_err(), "{display}");
        let bytes = session.encode(node).unwrap();
        assert!(
            plugin().encoded_stage_info(&bytes).is_err(),
            "{display} read as a stage"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stages_decode_and_execute_in_another_process() {
    let dir = tempfile::tempdir().unwrap();
    let shuffle = dir.path().join("shuffle");
    for (sql, answer) in [(AGGREGATE_SQL, AGGREGATE_ANSWER), (JOIN_SQL, JOIN_ANSWER)] {
        let (session, planned) = planned(dir.path(), sql).await;
        let plan = planned.plan;
        let all = stages(plugin(), &plan).unwrap();
        // Wave by wave, as a driver: every stage a stage reads first.
        for wave in waves(&all).unwrap() {
            for index in wave {
                let stage = &all[index];
                let bytes = &planned.stages[index];
                let report = run_in_child(Path::new(CHILD), bytes, dir.path())
                    .unwrap_or_else(|err| panic!("stage {}: {err}", stage.info.stage_id));
                let here = session.decode(bytes).unwrap();
                assert_eq!(report.display, plan_display(&here));
                // The child's plugin describes the decoded node and the bytes
                // as this process's describes the node.
                assert_eq!(report.stage_info.as_ref(), Some(&stage.info));
                assert_eq!(report.encoded_stage_info.as_ref(), Some(&stage.info));
                assert_eq!(report.rows.len() as u64, stage.info.maps);
                // Each map's report is what its marker says it published.
                for (map, rows) in report.rows.iter().enumerate() {
                    let marker = plugin().marker_path(&shuffle, stage.info.stage_id, map);
                    let marker = read_marker(&marker).unwrap();
                    let published: u64 = marker.buckets.iter().map(|b| b.rows).sum();
                    assert_eq!(*rows as u64, published, "{marker:?}");
                }
            }
        }
        // This process finishes the query from the child's files.
        assert_eq!(
            run_to_table(&plan, session.ctx.task_ctx()).await.unwrap(),
            answer
        );
        std::fs::remove_dir_all(&shuffle).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_without_the_plugin_codec_cannot_encode_a_stage() {
    let dir = tempfile::tempdir().unwrap();
    let (_session, planned) = planned(dir.path(), AGGREGATE_SQL).await;
    let host_only = DefaultPhysicalExtensionCodec {};
    for stage in stages(plugin(), &planned.plan).unwrap() {
        let result = datafusion_proto::bytes::physical_plan_to_bytes_with_extension_codec(
            stage.writer,
            &host_only,
        );
        assert!(
            result.is_err(),
            "a stage encoded without the plugin's codec"
        );
    }
}

/// A session and the nodes of [`AGGREGATE_SQL`]'s first stage (its writer
/// and a reader), to feed the plugin's codec directly.
struct CodecProbe {
    session: TestSession,
    nodes: Vec<Arc<dyn ExecutionPlan>>,
    _plan: Arc<dyn ExecutionPlan>,
    _dir: tempfile::TempDir,
}

impl CodecProbe {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (session, planned) = planned(dir.path(), AGGREGATE_SQL).await;
        let writer = stages(plugin(), &planned.plan).unwrap().remove(0).writer;
        // A reader as the planner hands it back: carrying its stage.
        let reader = find_readers(&planned.handed, plugin().reader_node_name().unwrap()).remove(0);
        Self {
            session,
            nodes: vec![writer, reader],
            _plan: planned.plan,
            _dir: dir,
        }
    }

    /// The plugin codec's own payload for `node`.
    fn payload(&self, node: &Arc<dyn ExecutionPlan>) -> Vec<u8> {
        let mut payload = Vec::new();
        self.session
            .plugin_codec
            .try_encode(
                Arc::clone(node),
                &mut payload,
                &DefaultPhysicalProtoConverter {},
            )
            .unwrap();
        payload
    }

    /// Decode `payload` with the plugin's codec alone, with `node`'s children.
    fn decode(
        &self,
        node: &Arc<dyn ExecutionPlan>,
        payload: &[u8],
    ) -> datafusion::common::Result<Arc<dyn ExecutionPlan>> {
        let children: Vec<_> = node.children().into_iter().map(Arc::clone).collect();
        self.session.plugin_codec.try_decode(
            payload,
            &children,
            &self.session.ctx.task_ctx(),
            &DefaultPhysicalProtoConverter {},
        )
    }

    /// Decode `payload` as `node`'s, which must fail; return the error.
    fn refused(&self, node: &Arc<dyn ExecutionPlan>, payload: &[u8]) -> String {
        match self.decode(node, payload) {
            Ok(plan) => panic!("payload {payload:02x?} decoded as {}", plan_display(&plan)),
            Err(err) => err.to_string(),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_codec_decodes_its_own_payloads() {
    let probe = CodecProbe::new().await;
    let [writer, reader] = [&probe.nodes[0], &probe.nodes[1]];
    let decoded = probe.decode(writer, &probe.payload(writer)).unwrap();
    assert_eq!(
        plugin().stage_info(&decoded).unwrap(),
        plugin().stage_info(writer).unwrap()
    );
    let decoded = probe.decode(reader, &probe.payload(reader)).unwrap();
    assert_eq!(decoded.name(), reader.name());
    assert_eq!(decoded.schema(), reader.schema());
    // Compared as displayed: hash expressions that crossed FFI never compare
    // equal (DataFusion's `UnKnownColumn` equals nothing, itself included),
    // and each decode wraps its own copy.
    assert_eq!(
        decoded.properties().output_partitioning().to_string(),
        reader.properties().output_partitioning().to_string()
    );
    assert_eq!(
        decoded.properties().equivalence_properties().to_string(),
        reader.properties().equivalence_properties().to_string()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_is_refused_with_dfx_error() {
    let probe = CodecProbe::new().await;
    for node in &probe.nodes {
        let error = probe.refused(node, b"definitely not a stage payload");
        assert!(error.contains("dfx codec"), "{error}");
        assert!(error.contains("not a dfx"), "{error}");
        let error = probe.refused(node, b"");
        assert!(error.contains("dfx codec"), "{error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_truncation_is_refused_with_dfx_error() {
    let probe = CodecProbe::new().await;
    for node in &probe.nodes {
        let payload = probe.payload(node);
        for len in 0..payload.len() {
            let error = probe.refused(node, &payload[..len]);
            assert!(
                error.contains("dfx codec"),
                "{} length {len}: {error}",
                node.name()
            );
        }
        let mut longer = payload.clone();
        longer.push(b'x');
        let error = probe.refused(node, &longer);
        assert!(error.contains("dfx codec"), "{}: {error}", node.name());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_future_payload_version_is_refused_with_dfx_error() {
    let probe = CodecProbe::new().await;
    for node in &probe.nodes {
        let mut payload = probe.payload(node);
        // The frame (documented in the plugin's codec module): 4 bytes of
        // magic, then the payload version as u16 little endian.
        let version = u16::from_le_bytes([payload[4], payload[5]]);
        payload[4..6].copy_from_slice(&(version + 1).to_le_bytes());
        let error = probe.refused(node, &payload);
        assert!(error.contains("dfx codec"), "{error}");
        assert!(
            error.contains(&format!("version {}", version + 1)),
            "{error}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_plan_bytes_are_an_error_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let (session, planned) = planned(dir.path(), AGGREGATE_SQL).await;
    assert!(session.decode(b"\xff\xfe garbage").is_err());
    let bytes = session.encode(planned.handed).unwrap();
    assert!(session.decode(&bytes[..bytes.len() / 2]).is_err());
}
