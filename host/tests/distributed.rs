//! Distributed runs over real worker processes and the real plugin file,
//! checked against the hand-worked answers of `common`, against local runs,
//! and against the files the stages publish.

mod common;

use std::collections::BTreeSet;

use common::*;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::ListingTable;
use dfx_abi::PARQUET_FOOTER_HINT;
use dfx_host::session::{Split, build_session};

#[tokio::test]
async fn distributed_equals_local_equals_the_hand_checked_answer_in_both_split_modes() {
    let fixture = Fixture::new();
    let host = host();
    let local = host.run_local(BY_FLAG, &fixture.spec()).await.unwrap();
    assert_eq!(rows(&local), by_flag_expected());
    for split in SPLITS {
        // Every map its own task (tests/adaptive.rs has coalesced ones).
        let spec = one_task_per_partition(fixture.distributed_spec("shuffle").with_split(split));
        let result = host.run_distributed(BY_FLAG, &spec).await.unwrap();
        assert_eq!(rows(&result.batches), by_flag_expected(), "{split}");
        std::fs::remove_dir_all(spec.shuffle_dir.unwrap()).unwrap();

        // Every task of every stage ran exactly once and reported.
        let expected_tasks: BTreeSet<(u64, usize)> = result
            .stages
            .iter()
            .flat_map(|s| (0..s.maps).map(move |m| (s.stage_id, m)))
            .collect();
        let tasks: BTreeSet<(u64, usize)> = result.tasks.iter().copied().collect();
        assert_eq!(tasks.len(), result.tasks.len(), "{split}: a task ran twice");
        assert_eq!(tasks, expected_tasks, "{split}");
        assert_eq!(result.task_rows.len(), result.tasks.len(), "{split}");

        // The stage over the table: one map per file, two partial groups per
        // file (every file holds two flags), eight in all.
        let scan = result
            .stages
            .iter()
            .find(|s| s.deps.is_empty())
            .expect("a stage reading no other stage");
        assert_eq!(scan.maps, 4, "{split}: {:?}", result.stages);
        let scan_rows: usize = (0..scan.maps)
            .map(|m| result.task_rows[&(scan.stage_id, m)])
            .sum();
        assert_eq!(scan_rows, 8, "{split}: {:?}", result.task_rows);
        match split {
            Split::Aggregate => {
                assert_eq!(result.stage_ids(), vec![1], "{:?}", result.stages);
                assert_eq!(result.tasks, vec![(1, 0), (1, 1), (1, 2), (1, 3)]);
                assert_eq!(result.waves, vec![vec![1]]);
                let per_task: Vec<usize> = result.task_rows.values().copied().collect();
                assert_eq!(per_task, vec![2, 2, 2, 2]);
            }
            Split::Exchange => {
                // Partial aggregates, a hash exchange, final aggregates below
                // the merge: at least two stages, the one reading the table
                // in the first wave, the merge's input after it.
                assert!(result.stages.len() >= 2, "{:?}", result.stages);
                assert!(result.waves.len() >= 2, "{:?}", result.waves);
                assert_eq!(result.waves[0], vec![scan.stage_id], "{:?}", result.waves);
                assert_eq!(result.stage_ids()[0], 1);
                assert!(
                    !result.stage(1).unwrap().deps.is_empty(),
                    "the root's stage reads the others: {:?}",
                    result.stages
                );
            }
        }
    }
}

#[tokio::test]
async fn a_scalar_subquerys_aggregate_is_computed_by_each_task_that_reads_it() {
    // avg(l_quantity) over 1..8 is 4.5: the orders of quantities 5 to 8.
    const ABOVE_AVERAGE: &str = "SELECT l_orderkey FROM lineitem \
        WHERE l_quantity > (SELECT avg(l_quantity) FROM lineitem) ORDER BY l_orderkey";
    let expected = vec![vec![i(5)], vec![i(6)], vec![i(7)], vec![i(8)]];
    let fixture = Fixture::new();
    let host = host();
    let local = host
        .run_local(ABOVE_AVERAGE, &fixture.spec())
        .await
        .unwrap();
    assert_eq!(rows(&local), expected);
    let spec = one_task_per_partition(fixture.distributed_spec("shuffle"));
    let result = host.run_distributed(ABOVE_AVERAGE, &spec).await.unwrap();
    assert_eq!(rows(&result.batches), expected);
    // Two stages of a task per file: the partial averages, and the filter,
    // each of whose four tasks finishes the average from the four partial
    // rows. No stage of one task holds the average alone.
    assert_eq!(result.stages.len(), 2, "{:?}", result.stages);
    let partial = result
        .stages
        .iter()
        .find(|s| s.deps.is_empty())
        .expect("a stage reading no other stage");
    let filter = result.stage(1).unwrap();
    assert_eq!(filter.deps, vec![partial.stage_id], "{:?}", result.stages);
    assert_eq!((partial.maps, filter.maps), (4, 4), "{:?}", result.stages);
    let partial_rows: usize = (0..partial.maps)
        .map(|m| result.task_rows[&(partial.stage_id, m)])
        .sum();
    assert_eq!(partial_rows, 4, "{:?}", result.task_rows);
}

#[tokio::test]
async fn a_stage_runs_only_after_every_stage_it_reads() {
    let fixture = Fixture::new();
    let result = host()
        .run_distributed(UNION, &fixture.distributed_spec("shuffle"))
        .await
        .unwrap();
    assert_eq!(rows(&result.batches), union_expected());
    let wave_of = |stage: u64| {
        result
            .waves
            .iter()
            .position(|w| w.contains(&stage))
            .unwrap()
    };
    for stage in &result.stages {
        for dep in &stage.deps {
            assert!(
                wave_of(*dep) < wave_of(stage.stage_id),
                "stage {} ran in wave {} but reads stage {dep} of wave {}",
                stage.stage_id,
                wave_of(stage.stage_id),
                wave_of(*dep)
            );
        }
    }
    // Tasks were dispatched wave by wave.
    let waves_in_dispatch_order: Vec<usize> = result
        .tasks
        .iter()
        .map(|(stage, _)| wave_of(*stage))
        .collect();
    let mut sorted = waves_in_dispatch_order.clone();
    sorted.sort();
    assert_eq!(waves_in_dispatch_order, sorted);
}

#[tokio::test]
async fn plugin_functions_resolve_on_every_worker_and_the_aggregate_state_survives() {
    let fixture = Fixture::new();
    let host = host();
    for split in SPLITS {
        let spec = fixture
            .distributed_spec(&format!("shuffle-{split}"))
            .with_split(split);
        let result = host.run_distributed(FUNCTIONS, &spec).await.unwrap();
        assert_eq!(rows(&result.batches), functions_expected(), "{split}");
    }
    let local = host.run_local(FUNCTIONS, &fixture.spec()).await.unwrap();
    assert_eq!(rows(&local), functions_expected());
}

#[tokio::test]
async fn a_union_of_two_aggregates_ships_two_stages_with_their_own_files() {
    let fixture = Fixture::new();
    let host = host();
    let spec = fixture
        .distributed_spec("shuffle")
        .with_split(Split::Aggregate);
    let result = host.run_distributed(UNION, &spec).await.unwrap();
    assert_eq!(rows(&result.batches), union_expected());
    assert_eq!(
        rows(&host.run_local(UNION, &fixture.spec()).await.unwrap()),
        union_expected()
    );

    let expected_tasks: Vec<(u64, usize)> = [1, 2]
        .into_iter()
        .flat_map(|stage| (0..4).map(move |m| (stage, m)))
        .collect();
    assert_eq!(result.tasks, expected_tasks);
    assert_eq!(result.stage_ids(), vec![1, 2]);
    assert_eq!(result.waves, vec![vec![1, 2]]);

    // Each map's marker accounts for the rows its worker reported, and
    // closes the map's one file, which every map publishes (an empty one
    // too: the marker alone).
    let plugin = plugin();
    let dir = spec.shuffle_dir.as_deref().unwrap();
    for (stage, map) in &result.tasks {
        let marker_path = plugin.marker_path(dir, *stage, *map);
        let marker = read_marker(&marker_path);
        assert_eq!(marker["stage_id"], *stage, "{}", marker_path.display());
        assert_eq!(marker["map"], *map, "{}", marker_path.display());
        let mut rows = 0;
        for bucket in marker["buckets"].as_array().unwrap() {
            rows += bucket["rows"].as_u64().unwrap() as usize;
        }
        let file = plugin.bucket_path(dir, *stage, *map, 0).unwrap();
        assert_eq!(file, marker_path);
        assert_eq!(
            rows,
            result.task_rows[&(*stage, *map)],
            "{}",
            marker_path.display()
        );
    }
}

#[tokio::test]
async fn every_map_publishes_one_file_and_nothing_else() {
    let fixture = Fixture::new();
    let plugin = plugin();
    for split in SPLITS {
        let spec = fixture
            .distributed_spec(&format!("shuffle-{split}"))
            .with_split(split);
        let result = host().run_distributed(BY_FLAG, &spec).await.unwrap();
        let dir = spec.shuffle_dir.as_deref().unwrap();
        // The driver's lock, the envelopes, the stages' output.
        let mut expected: Vec<String> = vec![".dfx-driver.lock".to_string(), "tasks".to_string()];
        expected.extend(
            result
                .stages
                .iter()
                .map(|s| format!("stage-{}", s.stage_id)),
        );
        expected.sort();
        assert_eq!(file_names(dir), expected, "{split}");

        // Below the stage directories: a file per map, closed by its
        // marker, no temp file left behind.
        let mut wanted = Vec::new();
        for stage in &result.stages {
            for map in 0..stage.maps {
                let marker = plugin.marker_path(dir, stage.stage_id, map);
                wanted.push(marker.clone());
                let entries = read_marker(&marker)["buckets"].as_array().unwrap().clone();
                assert_eq!(entries.len(), stage.buckets, "{}", marker.display());
                for entry in entries {
                    if entry["rows"].as_u64().unwrap() > 0 {
                        let bucket = entry["bucket"].as_u64().unwrap() as usize;
                        let file = plugin
                            .bucket_path(dir, stage.stage_id, map, bucket)
                            .unwrap();
                        if !wanted.contains(&file) {
                            wanted.push(file);
                        }
                    }
                }
            }
        }
        let mut wanted: Vec<String> = wanted
            .iter()
            .map(|p| p.strip_prefix(dir).unwrap().to_string_lossy().into_owned())
            .collect();
        for name in files_below(&dir.join("tasks")) {
            wanted.push(format!("tasks/{name}"));
        }
        wanted.push(".dfx-driver.lock".to_string());
        wanted.sort();
        assert_eq!(files_below(dir), wanted, "{split}");
        for name in files_below(&dir.join("tasks")) {
            assert!(
                name.starts_with("task-") || name.ends_with(".plan"),
                "{split}: unexpected {name} in tasks/"
            );
        }
    }
}

/// A table reads Parquet footers with dfx's hint for local files, not
/// DataFusion's object-store default: the scan's format is what every stage's
/// scan node is planned from, so the workers that decode it use it too.
#[tokio::test]
async fn a_table_reads_parquet_footers_with_the_local_hint() {
    let fixture = Fixture::new();
    let session = build_session(&plugin(), &fixture.spec()).await.unwrap();
    let table = session.ctx().table_provider("lineitem").await.unwrap();
    let listing = table
        .downcast_ref::<ListingTable>()
        .expect("a directory of Parquet files is a listing table");
    let format = listing
        .options()
        .format
        .downcast_ref::<ParquetFormat>()
        .expect("read as Parquet");
    assert_eq!(format.metadata_size_hint(), Some(PARQUET_FOOTER_HINT));
    // Smaller than DataFusion's own default, or the setting would be moot.
    let default = ParquetFormat::default().metadata_size_hint();
    assert!(
        default.is_some_and(|hint| hint > PARQUET_FOOTER_HINT),
        "{default:?}"
    );
}

#[tokio::test]
async fn no_shuffle_directory_means_no_stage_and_the_right_answer() {
    let fixture = Fixture::new();
    let host = host();
    let plan = host.explain(BY_FLAG, &fixture.spec()).await.unwrap();
    assert!(!plan.contains("ShuffleWriterExec"), "{plan}");
    assert!(!plan.contains("ShuffleReaderExec"), "{plan}");
    assert!(!plan.contains("<== stage"), "{plan}");
    assert_eq!(
        rows(&host.run_local(BY_FLAG, &fixture.spec()).await.unwrap()),
        by_flag_expected()
    );

    // Distributed, it runs under the host's temporary root.
    let result = host
        .run_distributed(BY_FLAG, &fixture.spec())
        .await
        .unwrap();
    assert_eq!(rows(&result.batches), by_flag_expected());
    assert!(!std::path::Path::new(&result.shuffle_location).exists());
}

#[tokio::test]
async fn a_plan_without_aggregate_is_one_whole_stage_in_aggregate_mode() {
    let fixture = Fixture::new();
    let sql = "SELECT l_orderkey, l_quantity FROM lineitem WHERE l_tax > 0 ORDER BY l_orderkey";
    // Taxed rows (hand-checked): keys 2, 4, 5, 6.
    let expected = vec![
        vec![i(2), f(2.0)],
        vec![i(4), f(4.0)],
        vec![i(5), f(5.0)],
        vec![i(6), f(6.0)],
    ];
    for split in SPLITS {
        let spec = fixture
            .distributed_spec(&format!("shuffle-{split}"))
            .with_split(split);
        let result = host().run_distributed(sql, &spec).await.unwrap();
        assert_eq!(rows(&result.batches), expected, "{split}");
        if split == Split::Aggregate {
            assert_eq!(result.stage_ids(), vec![1]);
            assert_eq!(result.task_rows.values().sum::<usize>(), 4);
        }
    }
}

#[tokio::test]
async fn a_capped_fan_out_still_runs_every_task() {
    let fixture = Fixture::new();
    let host = host().max_workers(Some(1));
    let spec = one_task_per_partition(fixture.distributed_spec("shuffle"));
    let result = host.run_distributed(BY_FLAG, &spec).await.unwrap();
    assert_eq!(rows(&result.batches), by_flag_expected());
    let maps: usize = result.stages.iter().map(|s| s.maps).sum();
    assert!(result.waves.len() >= 2, "{:?}", result.waves);
    assert_eq!(result.tasks.len(), maps);
    assert_eq!(result.task_rows.len(), maps);
}

/// A window partitioned by a column the filter makes constant: the plan
/// sorts on the other key only, so the exchange below the window must keep
/// the constant, or the window decoded in a worker refuses its input
/// ("All partition by columns should have an ordering").
#[tokio::test]
async fn a_window_over_a_filtered_constant_key_runs_distributed() {
    let fixture = Fixture::new();
    let host = host();
    let sql = "SELECT l_returnflag, l_orderkey, \
               avg(l_quantity) OVER (PARTITION BY l_returnflag, l_orderkey) AS a \
               FROM lineitem WHERE l_returnflag = 'A'";
    let expected = vec![
        "A | 1 | 1.0".to_string(),
        "A | 3 | 3.0".to_string(),
        "A | 7 | 7.0".to_string(),
    ];
    let local = host.run_local(sql, &fixture.spec()).await.unwrap();
    assert_eq!(sorted_rows(&local), expected);
    for split in SPLITS {
        let spec = fixture
            .distributed_spec(&format!("window-{split}"))
            .with_split(split);
        let result = host.run_distributed(sql, &spec).await.unwrap();
        assert_eq!(sorted_rows(&result.batches), expected, "{split}");
    }
}
