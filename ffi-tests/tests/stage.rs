//! The exchange's nodes across the boundary: in this separately compiled host
//! the writer and the reader are foreign, display as the FFI wrapper, are
//! found by containment of their names, and run. A writer executed for map m
//! publishes its buckets and marker and returns one summary batch; a reader
//! reads what the maps published and never executes its writer.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_ffi::execution_plan::ForeignExecutionPlan;
use dfx_abi::{DfxStageInfo, FailureClass};
use dfx_ffi_tests::fixtures::{
    AGGREGATE_ANSWER, AGGREGATE_SQL, JOIN_ANSWER, JOIN_SQL, SCAN_SQL, distributed_lineitem,
};
use dfx_ffi_tests::locate::plugin;
use dfx_ffi_tests::plans::{
    expected_files, find_readers, node_display, plan_display, published_files, read_marker,
    run_map, run_partitions, run_stages, run_to_table, stages,
};
use dfx_ffi_tests::session::TestSession;

fn reader_name() -> &'static str {
    plugin()
        .reader_node_name()
        .expect("the plugin names its reader node")
}

/// Every (parent, child) edge of `plan` as the two nodes' displays, in
/// pre-order.
fn edges(plan: &Arc<dyn ExecutionPlan>, out: &mut Vec<(String, String)>) {
    for child in plan.children() {
        out.push((node_display(plan.as_ref()), node_display(child.as_ref())));
        edges(child, out);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_and_reader_are_foreign_and_display_as_the_ffi_wrapper() {
    let dir = tempfile::tempdir().unwrap();
    let session = TestSession::new(plugin(), &distributed_lineitem(dir.path()))
        .await
        .unwrap();
    let plan = session.plan(AGGREGATE_SQL).await.unwrap();
    let display = plan_display(&plan);

    let stages = stages(plugin(), &plan).unwrap();
    assert!(!stages.is_empty(), "{display}");
    for stage in &stages {
        assert_eq!(
            node_display(stage.writer.as_ref()),
            "FFI_ExecutionPlan: ShuffleWriterExec, number_of_children=1"
        );
        assert!(
            stage.writer.is::<ForeignExecutionPlan>(),
            "the writer should be foreign in a separately compiled host"
        );
        assert_eq!(stage.writer.name(), plugin().stage_node_name());
    }
    let readers = find_readers(&plan, reader_name());
    for reader in &readers {
        assert_eq!(
            node_display(reader.as_ref()),
            "FFI_ExecutionPlan: ShuffleReaderExec, number_of_children=1"
        );
        assert!(reader.is::<ForeignExecutionPlan>());
        assert_eq!(reader.name(), reader_name());
    }
    // One tree: the root is never a writer, every writer is the only child of
    // a reader, and every reader's only child is a writer.
    assert!(
        !node_display(plan.as_ref()).contains(plugin().stage_node_name()),
        "{display}"
    );
    assert_eq!(readers.len(), stages.len(), "{display}");
    let mut all = Vec::new();
    edges(&plan, &mut all);
    for (parent, child) in &all {
        assert_eq!(
            child.contains(plugin().stage_node_name()),
            parent.contains(reader_name()),
            "{parent} -> {child} in {display}"
        );
    }
    // The in-process displays never reach this host.
    assert!(!display.contains("ShuffleWriterExec: stage="), "{display}");
    assert!(!display.contains("ShuffleReaderExec: stage="), "{display}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_publishes_its_buckets_and_marker_and_returns_one_summary() {
    let dir = tempfile::tempdir().unwrap();
    let shuffle = dir.path().join("shuffle");
    let session = TestSession::new(plugin(), &distributed_lineitem(dir.path()))
        .await
        .unwrap();
    let plan = session.plan(AGGREGATE_SQL).await.unwrap();
    let runs = run_stages(plugin(), &plan, session.ctx.task_ctx())
        .await
        .unwrap();

    let mut expected = BTreeSet::new();
    for (stage, maps) in &runs {
        let id = stage.info.stage_id;
        assert_eq!(maps.len() as u64, stage.info.maps, "stage {id}");
        for (map, run) in maps.iter().enumerate() {
            // One small batch, one row per bucket, in the writer's schema.
            assert_eq!(run.batches.len(), 1, "stage {id} map {map}");
            assert_eq!(run.batches[0].schema(), stage.writer.schema());
            let buckets: Vec<u64> = run.summary.iter().map(|b| b.bucket).collect();
            assert_eq!(
                buckets,
                (0..stage.info.buckets).collect::<Vec<_>>(),
                "stage {id} map {map}"
            );
            // The map's one file is its buckets' segments, then the marker
            // (alone, when every bucket is empty).
            let file = plugin().bucket_path(&shuffle, id, map, 0).unwrap();
            let total: u64 = run.summary.iter().map(|b| b.bytes).sum();
            for bucket in &run.summary {
                assert_eq!(
                    plugin()
                        .bucket_path(&shuffle, id, map, bucket.bucket as usize)
                        .unwrap(),
                    file,
                    "every bucket of a map is in the map's file"
                );
            }
            assert_eq!(plugin().marker_path(&shuffle, id, map), file);
            // The marker tells the same story as the summary.
            let marker = read_marker(&file).unwrap();
            assert_eq!(marker.bytes, total, "{}", file.display());
            let len = std::fs::metadata(&file).unwrap().len();
            assert!(len > total, "{} holds no marker", file.display());
            assert_eq!(
                (marker.stage_id, marker.map),
                (id, map as u64),
                "{marker:?}"
            );
            assert_eq!(marker.buckets, run.summary, "stage {id} map {map}");
        }
        expected.extend(expected_files(plugin(), &shuffle, id, maps).unwrap());
    }
    // Exactly those files: no temp file left, nothing outside the layout.
    assert_eq!(published_files(&shuffle).unwrap(), expected);
    // All of it is under `stage-*` entries, what the glob names.
    let glob_prefix = plugin().partition_glob().trim_end_matches('*');
    for file in &expected {
        let top = file.strip_prefix(&shuffle).unwrap().components().next();
        let top = top.unwrap().as_os_str().to_string_lossy().into_owned();
        assert!(top.starts_with(glob_prefix), "{}", file.display());
    }

    // The root of the same plan reads them and answers as computed by hand.
    let answer = run_to_table(&plan, session.ctx.task_ctx()).await.unwrap();
    assert_eq!(answer, AGGREGATE_ANSWER);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_foreign_writer_and_reader_report_their_schema_and_partitioning() {
    let dir = tempfile::tempdir().unwrap();
    let session = TestSession::new(plugin(), &distributed_lineitem(dir.path()))
        .await
        .unwrap();
    for sql in [AGGREGATE_SQL, JOIN_SQL, SCAN_SQL] {
        let plan = session.plan(sql).await.unwrap();
        let display = plan_display(&plan);
        for stage in stages(plugin(), &plan).unwrap() {
            let input = &stage.writer.children()[0];
            // One map task per input partition.
            let maps = stage
                .writer
                .properties()
                .output_partitioning()
                .partition_count();
            assert_eq!(maps as u64, stage.info.maps, "{display}");
            assert_eq!(
                input.properties().output_partitioning().partition_count(),
                maps
            );
            assert!(stage.info.buckets >= 1, "{:?}", stage.info);
            // The writer yields the summary, not its input's rows: per bucket
            // its rows, bytes and first byte; the file's size, entity tag
            // and key summary's region.
            let schema = stage.writer.schema();
            let columns: Vec<(&str, &DataType)> = schema
                .fields()
                .iter()
                .map(|f| (f.name().as_str(), f.data_type()))
                .collect();
            assert_eq!(
                columns,
                [
                    ("bucket", &DataType::UInt64),
                    ("rows", &DataType::UInt64),
                    ("bytes", &DataType::UInt64),
                    ("offset", &DataType::UInt64),
                    ("file_bytes", &DataType::UInt64),
                    ("e_tag", &DataType::Utf8),
                    ("keys_offset", &DataType::UInt64),
                    ("keys_bytes", &DataType::UInt64)
                ]
            );
        }
        for reader in find_readers(&plan, reader_name()) {
            let writer = &reader.children()[0];
            let info = plugin().stage_info(writer).unwrap();
            // A reader produces the rows its stage's input produced.
            assert_eq!(reader.schema(), writer.children()[0].schema(), "{display}");
            let partitions = reader.properties().output_partitioning().partition_count() as u64;
            if info.partitioning.starts_with("hash") {
                assert_eq!(partitions, info.buckets, "{info:?} in {display}");
            } else {
                assert_eq!(info.buckets, 1, "{info:?}");
                assert!(
                    partitions == info.maps || partitions == 1,
                    "{partitions} partitions reading {info:?} in {display}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_reads_what_the_maps_published() {
    let dir = tempfile::tempdir().unwrap();
    let session = TestSession::new(plugin(), &distributed_lineitem(dir.path()))
        .await
        .unwrap();
    for (sql, answer) in [(AGGREGATE_SQL, AGGREGATE_ANSWER), (JOIN_SQL, JOIN_ANSWER)] {
        let plan = session.plan(sql).await.unwrap();
        let display = plan_display(&plan);
        // A fresh directory per query: planning names the same stage ids.
        let runs = run_stages(plugin(), &plan, session.ctx.task_ctx())
            .await
            .unwrap();
        for reader in find_readers(&plan, reader_name()) {
            let info = plugin().stage_info(reader.children()[0]).unwrap();
            let (_, maps) = runs
                .iter()
                .find(|(stage, _)| stage.info.stage_id == info.stage_id)
                .unwrap();
            let rows = run_partitions(&reader, session.ctx.task_ctx())
                .await
                .unwrap();
            let rows: Vec<u64> = rows.into_iter().map(|n| n as u64).collect();
            let published: Vec<Vec<u64>> = maps
                .iter()
                .map(|run| run.summary.iter().map(|b| b.rows).collect())
                .collect();
            let expected: Vec<u64> = if info.partitioning.starts_with("hash") {
                // Partition b is bucket b of every map.
                (0..info.buckets as usize)
                    .map(|b| published.iter().map(|m| m[b]).sum())
                    .collect()
            } else if rows.len() as u64 == info.maps && info.maps > 1 {
                // Pass-through: partition m is map m.
                published.iter().map(|m| m.iter().sum()).collect()
            } else {
                // Broadcast: everything as one partition.
                vec![published.iter().flatten().sum()]
            };
            assert_eq!(rows, expected, "{info:?} in {display}");
        }
        assert_eq!(
            run_to_table(&plan, session.ctx.task_ctx()).await.unwrap(),
            answer
        );
        // The next query writes its own stage ids again: start afresh.
        std::fs::remove_dir_all(dir.path().join("shuffle")).unwrap();
    }
}

/// Whether `error` names the marker file of one of `info`'s maps.
fn names_a_marker(error: &str, shuffle: &Path, info: &DfxStageInfo) -> bool {
    (0..info.maps as usize).any(|map| {
        let marker = plugin().marker_path(shuffle, info.stage_id, map);
        error.contains(&marker.display().to_string())
    })
}

fn assert_names_a_marker(error: &str, shuffle: &Path, info: &DfxStageInfo) {
    assert!(
        names_a_marker(error, shuffle, info),
        "no marker of stage {} in: {error}",
        info.stage_id
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_never_executes_its_writer() {
    let dir = tempfile::tempdir().unwrap();
    let shuffle = dir.path().join("shuffle");
    let session = TestSession::new(plugin(), &distributed_lineitem(dir.path()))
        .await
        .unwrap();
    let plan = session.plan(AGGREGATE_SQL).await.unwrap();
    let stages = stages(plugin(), &plan).unwrap();

    // The root before any stage ran: an error naming what is missing, and
    // nothing computed or published behind the driver's back.
    let error = run_to_table(&plan, session.ctx.task_ctx())
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("dfx"), "{error}");
    assert_names_a_marker(&error, &shuffle, &stages[0].info);
    assert!(
        published_files(&shuffle).map_or(true, |files| files.is_empty()),
        "{:?}",
        published_files(&shuffle)
    );

    // A stage run before a stage it reads fails the same way.
    if let Some(stage) = stages.iter().find(|s| !s.info.deps.is_empty()) {
        let error = run_map(&stage.writer, 0, session.ctx.task_ctx())
            .await
            .unwrap_err()
            .to_string();
        let deps: Vec<_> = stages
            .iter()
            .filter(|s| stage.info.deps.contains(&s.info.stage_id))
            .collect();
        assert!(
            deps.iter()
                .any(|dep| names_a_marker(&error, &shuffle, &dep.info)),
            "no marker of stages {:?} in: {error}",
            stage.info.deps
        );
    }
}

/// A reader that misses a published map records the map as lost, for its
/// shuffle location, and a host takes that class as data across the
/// boundary, once: the message is for people, the class is what a driver
/// runs the map again by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_missing_a_map_records_it_lost_for_its_location_until_taken() {
    let dir = tempfile::tempdir().unwrap();
    let shuffle = dir.path().join("shuffle");
    let location = shuffle.display().to_string();
    let session = TestSession::new(plugin(), &distributed_lineitem(dir.path()))
        .await
        .unwrap();
    let plan = session.plan(AGGREGATE_SQL).await.unwrap();
    let runs = run_stages(plugin(), &plan, session.ctx.task_ctx())
        .await
        .unwrap();
    // Every map published: nothing recorded.
    assert_eq!(plugin().take_failures(&location), Ok(Vec::new()));

    // The stage the root reads loses its map 0.
    let read = &runs[0].0.info;
    std::fs::remove_file(plugin().marker_path(&shuffle, read.stage_id, 0)).unwrap();
    let error = run_to_table(&plan, session.ctx.task_ctx())
        .await
        .unwrap_err()
        .to_string();
    assert_names_a_marker(&error, &shuffle, read);

    // Taken by another spelling of the same location, then gone.
    let taken = plugin()
        .take_failures(&format!("file://{location}/"))
        .unwrap();
    assert_eq!(
        FailureClass::lost_maps(&taken),
        vec![(read.stage_id, 0)],
        "{taken:?}"
    );
    assert_eq!(
        FailureClass::most_telling(&taken),
        FailureClass::Lost([read.stage_id, 0])
    );
    assert_eq!(plugin().take_failures(&location), Ok(Vec::new()));
}
