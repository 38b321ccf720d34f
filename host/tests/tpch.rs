//! `dfx tpch` and `dfx bench overhead` on the real plugin file and the real
//! `dfx` binary, at a tiny scale (0.01, two partitions) so a debug build
//! stays quick: all 22 queries, distributed in both split modes, agree with
//! the single-process answers, also with every decision of the plugin forced
//! on or off.
//!
//! Row counts at scale 0.01 are the TPC-H cardinalities times 0.01 (nation
//! and region are fixed); lineitem's count is not a formula, so it is checked
//! against tpchgen's own generator and against orders (every order has
//! between one and seven lines).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use datafusion::parquet::file::reader::{FileReader, SerializedFileReader};
use dfx_host::SessionSpec;
use dfx_host::session::Split;
use dfx_host::tpch::datagen::{
    COMPLETE_MARKER, Provenance, TABLES, dataset_dir, ensure_dataset, part_path,
};
use dfx_host::tpch::report::{Outcome, QueryReport};
use dfx_host::tpch::runner::run_query;
use dfx_runtime::ShuffleDurability;
use tpchgen::generators::{LineItemGenerator, OrderGenerator};

const SCALE: f64 = 0.01;
const PARTITIONS: usize = 2;

/// Rows in one Parquet file, from its footer.
fn parquet_rows(path: &Path) -> i64 {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    SerializedFileReader::new(file)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .metadata()
        .file_metadata()
        .num_rows()
}

fn modified(path: &Path) -> SystemTime {
    std::fs::metadata(path).and_then(|m| m.modified()).unwrap()
}

#[test]
fn generates_one_file_per_partition_with_tpch_row_counts() {
    let data = tempfile::tempdir().unwrap();
    let (dataset, how) = ensure_dataset(data.path(), SCALE, PARTITIONS, false).unwrap();
    assert_eq!(how, Provenance::Generated);
    assert_eq!(dataset.root, data.path().join("sf0.01-p2"));
    assert!(dataset.root.join(COMPLETE_MARKER).is_file());

    let expected: BTreeMap<&str, i64> = [
        ("nation", 25),
        ("region", 5),
        ("part", 2_000),
        ("supplier", 100),
        ("partsupp", 8_000),
        ("customer", 1_500),
        ("orders", 15_000),
    ]
    .into();
    for table in TABLES {
        let files = if matches!(table, "nation" | "region") {
            1
        } else {
            PARTITIONS
        };
        let mut names: Vec<String> = std::fs::read_dir(dataset.table_dir(table))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let wanted: Vec<String> = (1..=files).map(|i| format!("part-{i}.parquet")).collect();
        assert_eq!(names, wanted, "files of {table}");
        let total: i64 = (1..=files)
            .map(|i| parquet_rows(&part_path(&dataset.root, table, i)))
            .sum();
        if let Some(&rows) = expected.get(table) {
            assert_eq!(total, rows, "rows of {table}");
        }
    }

    // Each orders part holds the rows tpchgen assigns to that part, and each
    // lineitem part exactly the lines of those orders.
    for part in 1..=PARTITIONS {
        let orders = parquet_rows(&part_path(&dataset.root, "orders", part));
        assert_eq!(
            orders,
            OrderGenerator::calculate_row_count(SCALE, part as i32, PARTITIONS as i32)
        );
        let lines = parquet_rows(&part_path(&dataset.root, "lineitem", part));
        let generated = LineItemGenerator::new(SCALE, part as i32, PARTITIONS as i32)
            .iter()
            .count() as i64;
        assert_eq!(lines, generated, "lineitem part {part}");
        assert!(
            (orders..=7 * orders).contains(&lines),
            "{lines} lines for {orders} orders"
        );
    }
}

#[test]
fn a_complete_dataset_is_reused_and_an_unmarked_one_redone() {
    let data = tempfile::tempdir().unwrap();
    let (first, how) = ensure_dataset(data.path(), SCALE, PARTITIONS, false).unwrap();
    assert_eq!(how, Provenance::Generated);
    let lineitem = part_path(&first.root, "lineitem", 1);
    let stamp = modified(&lineitem);

    let (again, how) = ensure_dataset(data.path(), SCALE, PARTITIONS, false).unwrap();
    assert_eq!((again, how), (first.clone(), Provenance::Cached));
    assert_eq!(modified(&lineitem), stamp, "a cached file was rewritten");

    // An interrupted generation: files without the marker are not trusted.
    std::fs::remove_file(first.root.join(COMPLETE_MARKER)).unwrap();
    std::fs::write(&lineitem, b"truncated").unwrap();
    let (_, how) = ensure_dataset(data.path(), SCALE, PARTITIONS, false).unwrap();
    assert_eq!(how, Provenance::Generated);
    assert!(parquet_rows(&lineitem) > 0);

    // Another partition count is another dataset beside it.
    let (other, how) = ensure_dataset(data.path(), SCALE, 3, false).unwrap();
    assert_eq!(how, Provenance::Generated);
    assert_eq!(other.root, dataset_dir(data.path(), SCALE, 3));
    assert!(part_path(&other.root, "orders", 3).is_file());
    // Nothing else is left in the data directory (no staging directories).
    let mut entries: Vec<String> = std::fs::read_dir(data.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    entries.sort();
    assert_eq!(entries, ["sf0.01-p2", "sf0.01-p3"]);
}

#[test]
fn invalid_scale_or_partitions_are_refused() {
    let data = tempfile::tempdir().unwrap();
    for (scale, partitions) in [(0.0, 2), (-1.0, 2), (f64::NAN, 2), (0.01, 0)] {
        let err = ensure_dataset(data.path(), scale, partitions, false).unwrap_err();
        assert!(
            err.to_string().contains("must be"),
            "scale {scale} partitions {partitions}: {err}"
        );
    }
}

/// Every TPC-H query, distributed under `split` and in one process; the
/// answers must agree. Every disagreement or failure is collected, so one
/// run names them all.
async fn all_queries_agree(split: Split) -> Vec<QueryReport> {
    all_queries_agree_with(split, PARTITIONS, &[], &[]).await
}

/// [`all_queries_agree`] at `partitions`, with plugin settings `options`.
async fn all_queries_agree_with(
    split: Split,
    partitions: usize,
    options: &[(&str, &str)],
    datafusion_options: &[(&str, &str)],
) -> Vec<QueryReport> {
    let durability = ShuffleDurability::ObjectStore;
    all_queries_agree_kept(split, partitions, options, datafusion_options, durability).await
}

/// [`all_queries_agree_with`], with the map files kept as `durability` says.
async fn all_queries_agree_kept(
    split: Split,
    partitions: usize,
    options: &[(&str, &str)],
    datafusion_options: &[(&str, &str)],
    durability: ShuffleDurability,
) -> Vec<QueryReport> {
    let data = tempfile::tempdir().unwrap();
    let (dataset, _) = ensure_dataset(data.path(), SCALE, PARTITIONS, false).unwrap();
    let mut spec = SessionSpec::new(dataset.tables())
        .with_target_partitions(partitions)
        .with_split(split);
    spec.shuffle_durability = durability;
    for (key, value) in options {
        spec.engine_options
            .insert(key.to_string(), value.to_string());
    }
    for (key, value) in datafusion_options {
        spec.datafusion_options
            .insert(key.to_string(), value.to_string());
    }
    let host = common::host();
    let mut reports = Vec::new();
    let mut problems = Vec::new();
    for query in 1..=22 {
        let report = run_query(&host, &spec, query, 1, Duration::from_secs(300))
            .await
            .unwrap();
        if report.outcome != Outcome::Agree {
            problems.push(format!("q{query}: {}", report.outcome.label()));
        } else {
            let (stages, tasks) = (report.stages.unwrap(), report.tasks.unwrap());
            // No stage is a plan kept whole for the driver: no task ran.
            assert!(
                tasks >= stages && (stages >= 1 || tasks == 0),
                "q{query}: {report:?}"
            );
            assert!(report.ratio.is_some(), "q{query}");
        }
        reports.push(report);
    }
    assert!(
        problems.is_empty(),
        "split {split}, {options:?}: {} of 22 queries:\n{}",
        problems.len(),
        problems.join("\n")
    );
    reports
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_22_queries_agree_distributed_and_local_split_at_every_exchange() {
    let reports = all_queries_agree(Split::Exchange).await;
    // Q1 aggregates one table: partial aggregates, a hash exchange, the final
    // aggregates below the merge: more than the aggregate split's one stage.
    assert!(reports[0].stages.unwrap() >= 2, "{:?}", reports[0]);
    // TPC-H's answer sizes at any scale (Q1 four groups, Q6 one sum).
    assert_eq!(reports[0].rows, Some(4));
    assert_eq!(reports[5].rows, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_22_queries_agree_distributed_and_local_split_at_aggregates() {
    let reports = all_queries_agree(Split::Aggregate).await;
    // The aggregate split: one stage per topmost partial aggregate (Q1 and Q6
    // have one), one task per partition.
    for query in [1, 6] {
        let report = &reports[query - 1];
        assert_eq!(report.stages, Some(1), "q{query}: {report:?}");
        assert_eq!(report.tasks, Some(PARTITIONS), "q{query}: {report:?}");
    }
}

/// Every decision the plugin makes per query forced on (at four
/// partitions, so coalesced groups sit beside each other) or off.
const DECISIONS_ON: [(&str, &str); 4] = [
    ("join_filters", "on"),
    ("coalesce", "on"),
    ("skew_split", "on"),
    ("broadcast_switch", "on"),
];
const DECISIONS_OFF: [(&str, &str); 4] = [
    ("join_filters", "off"),
    ("coalesce", "off"),
    ("skew_split", "off"),
    ("broadcast_switch", "off"),
];

/// DataFusion partitions every hash join, however small its build side:
/// at this scale it would collect every one, and the decisions about
/// partitioned joins would find none.
const PARTITIONED_JOINS: [(&str, &str); 2] = [
    (
        "datafusion.optimizer.hash_join_single_partition_threshold",
        "0",
    ),
    (
        "datafusion.optimizer.hash_join_single_partition_threshold_rows",
        "0",
    ),
];

/// How many stages of all `reports` were adapted with a reason starting
/// with `prefix`.
fn decided(reports: &[QueryReport], prefix: &str) -> usize {
    reports
        .iter()
        .flat_map(|r| &r.decisions)
        .filter(|d| {
            d.split_once(": ")
                .is_some_and(|(_, why)| why.starts_with(prefix))
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_22_queries_agree_with_every_decision_forced_on_split_at_every_exchange() {
    let reports =
        all_queries_agree_with(Split::Exchange, 4, &DECISIONS_ON, &PARTITIONED_JOINS).await;
    // Forced on, every partitioned join that can switch does.
    assert!(
        decided(&reports, "switched to broadcast") >= 5,
        "{reports:?}"
    );
}

/// Skew splitting forced on where the broadcast switch, which comes
/// first, is off: every partitioned join whose partition can be split is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_22_queries_agree_with_partitioned_joins_cut_by_probe_maps_split_at_every_exchange() {
    let options = [("skew_split", "on"), ("broadcast_switch", "off")];
    let reports = all_queries_agree_with(Split::Exchange, 4, &options, &PARTITIONED_JOINS).await;
    assert!(decided(&reports, "split partition") >= 5, "{reports:?}");
    assert_eq!(decided(&reports, "switched to broadcast"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_22_queries_agree_with_every_decision_forced_off_split_at_every_exchange() {
    let reports =
        all_queries_agree_with(Split::Exchange, 4, &DECISIONS_OFF, &PARTITIONED_JOINS).await;
    assert!(
        reports.iter().all(|r| r.decisions.is_empty()),
        "{reports:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_22_queries_agree_with_every_decision_forced_on_split_at_aggregates() {
    all_queries_agree_with(Split::Aggregate, 4, &DECISIONS_ON, &[]).await;
}

#[test]
fn the_cli_prints_the_table_writes_json_and_exits_zero() {
    let data = tempfile::tempdir().unwrap();
    let json = data.path().join("tpch.json");
    let chart = data.path().join("tpch.svg");
    let output = std::process::Command::new(common::dfx_bin())
        .args([
            "tpch",
            "--scale",
            "0.01",
            "--partitions",
            "2",
            "--queries",
            "6,14",
        ])
        .args(["--runs", "1", "--data-dir"])
        .arg(data.path())
        .arg("--json")
        .arg(&json)
        .arg("--plot")
        .arg(&chart)
        // Uncompressed bucket files must read back to the same answers.
        .args(["--shuffle-compression", "none"])
        .env("DFX_PLUGIN", common::plugin_path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("split exchange"), "{stdout}");
    assert!(stdout.contains("shuffle compression none"), "{stdout}");
    assert!(stdout.contains("| q6 | 1 |"), "{stdout}");
    assert!(stdout.contains("| q14 | 1 |"), "{stdout}");
    assert!(stdout.contains("geometric mean"), "{stdout}");
    let figures: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(figures["queries"].as_array().map(Vec::len), Some(2));
    assert_eq!(figures["mismatches"], 0);
    assert_eq!(figures["queries"][0]["outcome"]["kind"], "agree");
    assert_eq!(figures["shuffle_compression"], "none");
    // All three columns: stock DataFusion, dfx in one process, distributed.
    for column in ["stock_ms", "local_ms", "distributed_ms"] {
        assert!(
            figures["queries"][1][column]
                .as_f64()
                .is_some_and(|ms| ms > 0.0),
            "{column}: {figures}"
        );
    }
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(svg.contains("q6") && svg.contains("q14"), "{svg}");
}

/// Each step is timed (a clock left out reads zero), the sum is the sum of
/// the steps, the table shows what the JSON holds, and no step a worker runs
/// in-process takes longer than a whole real worker (a unit slip would).
#[test]
fn bench_overhead_measures_every_step() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("overhead.json");
    let output = std::process::Command::new(common::dfx_bin())
        .args(["bench", "overhead", "--tasks", "2", "--json"])
        .arg(&json)
        .env("DFX_PLUGIN", common::plugin_path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["tasks"], 2, "{report}");
    let steps: Vec<(String, f64)> = report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s[0].as_str().unwrap().to_string(), s[1].as_f64().unwrap()))
        .collect();
    let names: Vec<&str> = steps.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "process start",
            "plugin load + handshake",
            "session build",
            "decode",
            "execute",
            "report + exit",
        ]
    );
    let real = report["real_worker_ms"].as_f64().unwrap();
    assert!(real.is_finite() && real > 0.0, "{report}");
    for (name, ms) in &steps {
        assert!(
            ms.is_finite() && *ms > 0.0,
            "{name} was not timed: {report}"
        );
        // The table shows the JSON's figure.
        assert!(
            stdout.contains(&format!("| {name} | {ms:.2} |")),
            "{name} {ms:.2} not in\n{stdout}"
        );
    }
    for (name, ms) in &steps[1..5] {
        assert!(
            *ms < real,
            "{name} took {ms} ms, more than a whole real worker ({real} ms): {report}"
        );
    }
    let sum: f64 = steps.iter().map(|(_, ms)| ms).sum();
    let total = report["total_ms"].as_f64().unwrap();
    assert!((total - sum).abs() < 1e-9, "{total} is not the sum {sum}");
    assert!(
        stdout.contains(&format!("| **sum of steps** | **{total:.2}** |")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("| real `dfx worker`, spawn to exit | {real:.2} |")),
        "{stdout}"
    );
}

/// Slices: each task runs `per_task` of the stage's partitions at once and
/// publishes one map file for them (`dfx_engine.partitions_per_task`).
fn sliced(per_task: &'static str) -> [(&'static str, &'static str); 1] {
    [("partitions_per_task", per_task)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_22_queries_agree_with_slices_of_two_partitions_split_at_every_exchange() {
    let reports = all_queries_agree_with(Split::Exchange, 4, &sliced("2"), &[]).await;
    // Q1: the scan of two files is one task of its two partitions, the
    // final aggregate's four partitions two tasks of two.
    assert_eq!(reports[0].stages, Some(2), "{:?}", reports[0]);
    assert_eq!(reports[0].tasks, Some(3), "{:?}", reports[0]);
    // Some join stage's two small slices run in one task.
    let coalesced = reports
        .iter()
        .flat_map(|r| &r.decisions)
        .filter(|d| d.contains("coalesced 2 slices into 1 task(s)"))
        .count();
    assert!(coalesced > 0, "{reports:?}");
}

/// Two partitions in slices of two: every operator of every query runs at
/// most two partitions, so each query runs whole. Under `task` that is one
/// stage of one task, which a worker runs, pipelining the whole plan as one
/// process does (under `auto`, the driver runs it: the other tests' small
/// plans take that path).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_22_queries_agree_as_one_stage_when_no_wider_than_a_task() {
    let options: Vec<_> = sliced("2")
        .into_iter()
        .chain([("collapse_stages", "task")])
        .collect();
    let reports = all_queries_agree_with(Split::Exchange, 2, &options, &[]).await;
    for report in &reports {
        assert_eq!(report.stages, Some(1), "{report:?}");
        assert_eq!(report.tasks, Some(1), "{report:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_22_queries_agree_with_uneven_slices_split_at_aggregates() {
    // Five partitions after an exchange, in slices of two: maps of two, two
    // and one.
    let reports = all_queries_agree_with(Split::Aggregate, 5, &sliced("2"), &[]).await;
    // Q1 is one stage over the two files: one task of both.
    assert_eq!(reports[0].stages, Some(1), "{:?}", reports[0]);
    assert_eq!(reports[0].tasks, Some(1), "{:?}", reports[0]);
    // Q6 runs no more than the two files' partitions, a slice: kept whole,
    // by the driver when it has the two cores, else as one stage of one task.
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let whole = if cores >= 2 { 0 } else { 1 };
    assert_eq!(reports[5].stages, Some(whole), "{:?}", reports[5]);
    assert_eq!(reports[5].tasks, Some(whole), "{:?}", reports[5]);
}

/// Eight partitions in slices of two, every decision but coalescing
/// forced on (a coalesced stage holds its rows in one map, so nothing
/// reading it could be split by its maps): some slice runs a partition as
/// parts inside its task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_22_queries_agree_in_slices_of_two_with_their_partitions_split_inside_tasks() {
    let options: Vec<_> = DECISIONS_ON
        .into_iter()
        .filter(|(key, _)| *key != "coalesce")
        .chain([("coalesce", "off")])
        .chain(sliced("2"))
        .collect();
    let reports = all_queries_agree_with(Split::Exchange, 8, &options, &PARTITIONED_JOINS).await;
    assert!(
        decided(&reports, "each task runs a slice") >= 22,
        "{reports:?}"
    );
    let every: Vec<&String> = reports.iter().flat_map(|r| &r.decisions).collect();
    let split = every
        .iter()
        .filter(|d| d.contains("parts inside its task by its maps"))
        .count();
    assert!(split > 0, "{every:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_22_queries_agree_with_one_task_per_stage_and_every_decision_forced_on() {
    // Kept as stages: a plan no wider than a task would run as one stage,
    // with no decision to make.
    let options: Vec<_> = DECISIONS_ON
        .into_iter()
        .chain(sliced("4"))
        .chain([("collapse_stages", "off")])
        .collect();
    let reports = all_queries_agree_with(Split::Exchange, 4, &options, &PARTITIONED_JOINS).await;
    // A stage of slices is decided by slice, and says so: no join is
    // switched and no task added (a split partition runs inside its task).
    assert!(
        decided(&reports, "each task runs a slice") >= 22,
        "{reports:?}"
    );
    let every: Vec<&String> = reports.iter().flat_map(|r| &r.decisions).collect();
    assert!(
        every.iter().all(|d| !d.contains("switched to broadcast")),
        "{every:?}"
    );
    assert!(
        every.iter().all(|d| !d.contains("tasks by its maps")),
        "{every:?}"
    );
    // Q6 scans one table and sums: one stage of one task.
    assert_eq!(reports[5].tasks, Some(1), "{:?}", reports[5]);
}

/// Map files kept on the disks of the pool workers that wrote them, each
/// reader streaming its inputs from their map servers over Arrow Flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_22_queries_agree_with_maps_served_by_their_workers_split_at_every_exchange() {
    let local = ShuffleDurability::Local;
    let reports = all_queries_agree_kept(Split::Exchange, PARTITIONS, &[], &[], local).await;
    assert!(reports[0].stages.unwrap() >= 2, "{:?}", reports[0]);
}

/// The same, in slices of two partitions (a slice's partitions share one
/// stream of each upstream map), split at aggregates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_22_queries_agree_with_maps_served_by_their_workers_in_slices_split_at_aggregates() {
    let local = ShuffleDurability::Local;
    all_queries_agree_kept(Split::Aggregate, 4, &sliced("2"), &[], local).await;
}

/// Map files in the location and, copied, on the disks of the workers that
/// wrote them: readers stream from the workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_22_queries_agree_with_maps_also_copied_to_their_workers_split_at_every_exchange() {
    let both = ShuffleDurability::Both;
    all_queries_agree_kept(Split::Exchange, PARTITIONS, &[], &[], both).await;
}

/// Maps on the workers' disks with every decision forced on: joins
/// switched to broadcasts, stages coalesced, filters on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_22_queries_agree_with_maps_served_and_every_decision_forced_on() {
    let local = ShuffleDurability::Local;
    let reports =
        all_queries_agree_kept(Split::Exchange, 4, &DECISIONS_ON, &PARTITIONED_JOINS, local).await;
    assert!(
        decided(&reports, "switched to broadcast") >= 1,
        "{reports:?}"
    );
}

/// The skew split forced on, the switch off: no partition is split (its
/// parts would find their companions by the maps' markers, which only the
/// workers holding them can read), and each stage says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_22_queries_agree_with_maps_served_and_the_skew_split_forced_on() {
    let local = ShuffleDurability::Local;
    let options = [
        ("join_filters", "on"),
        ("coalesce", "on"),
        ("skew_split", "on"),
        ("broadcast_switch", "off"),
    ];
    let reports =
        all_queries_agree_kept(Split::Exchange, 4, &options, &PARTITIONED_JOINS, local).await;
    assert_eq!(decided(&reports, "split partition"), 0);
    let said = reports
        .iter()
        .flat_map(|r| &r.decisions)
        .filter(|d| d.contains("no partition is split: the maps stay on the disks"))
        .count();
    assert!(said >= 1, "{reports:?}");
}
