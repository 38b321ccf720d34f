//! Adaptive coalescing through real workers and the real plugin file: a
//! ready stage whose partitions all come from hash reads runs as fewer
//! tasks when they are small, each task reading a run of adjacent buckets,
//! and its other maps are published empty; answers stay those of one
//! process and of the hand-worked fixtures; `dfx_engine.coalesce = off`
//! keeps one task per partition; a lost map of a coalesced group is
//! restored by running the group's task again.

mod common;

use common::*;
use dfx_host::{Decision, SessionSpec};

/// `spec` with the plugin setting `key` = `value`.
fn with_option(mut spec: SessionSpec, key: &str, value: &str) -> SessionSpec {
    spec.engine_options
        .insert(key.to_string(), value.to_string());
    spec
}

/// `spec` with each of the plugin settings `options`.
fn with_options(spec: SessionSpec, options: &[(&str, &str)]) -> SessionSpec {
    options
        .iter()
        .fold(spec, |spec, (key, value)| with_option(spec, key, value))
}

/// The decisions that ran a stage with fewer tasks than planned.
fn coalesced(decisions: &[Decision]) -> Vec<&Decision> {
    decisions
        .iter()
        .filter(|d| d.tasks < d.planned_tasks)
        .collect()
}

/// The maps of `stage` whose tasks `result` ran, in the order they ran.
fn ran_maps(result: &dfx_host::DistributedResult, stage: u64) -> Vec<usize> {
    result
        .tasks
        .iter()
        .filter(|(s, _)| *s == stage)
        .map(|(_, map)| *map)
        .collect()
}

/// Rows in each bucket of a published map file, from its marker.
fn bucket_rows(path: &std::path::Path) -> Vec<u64> {
    read_marker(path)["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["rows"].as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn a_small_stage_runs_as_one_task_and_publishes_its_other_maps_empty() {
    let fixture = Fixture::new();
    let spec = fixture
        .distributed_spec("shuffle")
        .with_target_partitions(4);
    let host = host();
    let result = host.run_distributed(BY_FLAG, &spec).await.unwrap();
    assert_eq!(rows(&result.batches), by_flag_expected());
    let local = host.run_local(BY_FLAG, &fixture.spec()).await.unwrap();
    assert_eq!(rows(&result.batches), rows(&local));

    // The final aggregate reads the partial aggregates' 4 buckets: a few
    // hundred bytes, so one task.
    let decisions = coalesced(&result.decisions);
    assert_eq!(decisions.len(), 1, "{:?}", result.decisions);
    let decision = decisions[0];
    assert_eq!((decision.planned_tasks, decision.tasks), (4, 1));
    assert!(
        decision
            .reason
            .starts_with("coalesced 4 partitions into 1 task(s)"),
        "{}",
        decision.reason
    );
    let stage = decision.stage_id;
    let ran = ran_maps(&result, stage);
    assert_eq!(ran, vec![0]);
    // Every map is published; the head's holds the three groups.
    let dir = spec.shuffle_dir.clone().unwrap();
    let head = bucket_rows(&map_file(&dir, stage, 0));
    assert_eq!(head.iter().sum::<u64>(), 3, "{head:?}");
    for map in 1..4 {
        let path = map_file(&dir, stage, map);
        let marker = read_marker(&path);
        assert_eq!(marker["map"], map, "{}", path.display());
        assert!(
            bucket_rows(&path).iter().all(|&rows| rows == 0),
            "{}",
            path.display()
        );
    }
}

#[tokio::test]
async fn coalescing_turned_off_runs_one_task_per_partition() {
    let fixture = Fixture::new();
    let spec = with_option(
        fixture
            .distributed_spec("shuffle")
            .with_target_partitions(4),
        "coalesce",
        "off",
    );
    let result = host().run_distributed(BY_FLAG, &spec).await.unwrap();
    assert_eq!(rows(&result.batches), by_flag_expected());
    assert!(result.decisions.is_empty(), "{:?}", result.decisions);
    // Every stage ran every one of its maps.
    for stage in &result.stages {
        let ran = result
            .tasks
            .iter()
            .filter(|(s, _)| *s == stage.stage_id)
            .count();
        assert_eq!(ran, stage.maps, "stage {}", stage.stage_id);
    }
}

/// A left join grouped by another column than its key: its stage reads
/// both sides by hash and writes by `a.v`.
const LEFT_JOINED: &str = "SELECT a.v, count(*) AS n, count(b.k) AS matched \
     FROM t a LEFT JOIN t b ON a.k = b.k + 5 GROUP BY a.v ORDER BY a.v";

/// By hand, over `numbers_table(_, 4, 10)`: k = 0..39, v = k % 7; a.k
/// finds b.k = a.k - 5 for k >= 5.
fn left_joined_expected() -> Vec<Vec<Value>> {
    [(0, 6, 5), (1, 6, 5), (2, 6, 5), (3, 6, 5), (4, 6, 5)]
        .into_iter()
        .chain([(5, 5, 5), (6, 5, 5)])
        .map(|(v, n, matched)| vec![i(v), i(n), i(matched)])
        .collect()
}

/// The decision about the stage of `result` reading two stages (the
/// join's).
fn join_decision(result: &dfx_host::DistributedResult) -> &Decision {
    let join = result
        .stages
        .iter()
        .find(|s| s.deps.len() == 2)
        .expect("a stage reading both sides")
        .stage_id;
    result
        .decisions
        .iter()
        .find(|d| d.stage_id == join)
        .unwrap_or_else(|| panic!("no decision for the join: {:?}", result.decisions))
}

/// A left join is partitioned (both sides hash-exchanged): forced on with
/// a target of one byte, its stage runs partitions in pairs, each task
/// reading the same two buckets of both sides.
#[tokio::test]
async fn forced_on_pairs_the_partitions_of_both_sides_of_a_join() {
    let dir = tempfile::tempdir().unwrap();
    let table = numbers_table(dir.path(), 4, 10);
    let spec = SessionSpec::new([("t".to_string(), table)]).with_target_partitions(4);
    // On, and at most a byte a task: every task takes two partitions.
    let distributed = with_option(
        with_option(
            spec.clone().with_shuffle_dir(dir.path().join("shuffle")),
            "coalesce",
            "on",
        ),
        "coalesce_task_bytes",
        "1",
    );
    let host = host();
    let result = host
        .run_distributed(LEFT_JOINED, &distributed)
        .await
        .unwrap();
    assert_eq!(rows(&result.batches), left_joined_expected());
    assert_eq!(
        rows(&result.batches),
        rows(&host.run_local(LEFT_JOINED, &spec).await.unwrap())
    );
    let decision = join_decision(&result);
    assert_eq!((decision.planned_tasks, decision.tasks), (4, 2));
    assert!(
        decision.reason.ends_with("forced on"),
        "{}",
        decision.reason
    );
}

/// A host whose worker deletes `files` once the first attempt of `map` of
/// `stage` has published (only the first attempt's envelope is the file
/// the script matches).
fn losing_after_first_attempt(
    stage: u64,
    map: usize,
    files: &[&std::path::Path],
) -> dfx_host::Host {
    let files: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    host_with_script(&format!(
        r#""$DFX" worker "$1" || exit $?
case "$1" in */task-{stage}-{map}.json) rm -f {} ;; esac"#,
        files.join(" ")
    ))
}

/// That `result` ran map `map` of `stage` twice, the second time because
/// its output was lost.
fn assert_ran_again(result: &dfx_host::DistributedResult, stage: u64, map: usize) {
    assert_eq!(result.attempts[&(stage, map)], 2, "{:?}", result.attempts);
    let again = format!("stage {stage} map {map} attempt 1: run again");
    assert!(
        result.retries.iter().any(|r| r.starts_with(&again)),
        "{:?}",
        result.retries
    );
}

/// The stage of `sql`'s plan under `spec` that reads two stages (the
/// join's).
async fn planned_join(spec: &SessionSpec, sql: &str) -> u64 {
    let (_, stages) = planned(spec, sql).await;
    stages
        .iter()
        .find(|s| s.info.deps.len() == 2)
        .expect("a stage reading both sides")
        .stage_id()
}

/// The spec of `numbers_table(dir, 4, 10)` planned for eight partitions,
/// and the same publishing into `shuffle` in slices of two partitions.
fn numbers_in_slices_of_two(
    dir: &std::path::Path,
    shuffle: &std::path::Path,
) -> (SessionSpec, SessionSpec) {
    let table = numbers_table(dir, 4, 10);
    let spec = SessionSpec::new([("t".to_string(), table)]).with_target_partitions(8);
    let sliced = with_option(
        spec.clone().with_shuffle_dir(shuffle),
        "partitions_per_task",
        "2",
    );
    (spec, sliced)
}

/// The left join above in slices of two partitions: its stage's two
/// slices read a few KiB, so one task runs all four partitions at once,
/// each reading its own buckets, and publishes the other map empty. The
/// answer is the hand-worked one.
#[tokio::test]
async fn a_stage_of_small_slices_runs_them_in_one_task() {
    let dir = tempfile::tempdir().unwrap();
    let shuffle = dir.path().join("shuffle");
    let (spec, sliced) = numbers_in_slices_of_two(dir.path(), &shuffle);
    let host = host();
    let result = host.run_distributed(LEFT_JOINED, &sliced).await.unwrap();
    assert_eq!(rows(&result.batches), left_joined_expected());
    assert_eq!(
        rows(&result.batches),
        rows(&host.run_local(LEFT_JOINED, &spec).await.unwrap())
    );
    let decision = join_decision(&result);
    let join_stage = decision.stage_id;
    assert_eq!((decision.planned_tasks, decision.tasks), (2, 1));
    assert!(
        decision
            .reason
            .contains("coalesced 2 slices into 1 task(s)"),
        "{}",
        decision.reason
    );
    let ran = ran_maps(&result, join_stage);
    assert_eq!(ran, vec![0]);
    // The head's map holds every group of `a.v`; the others are empty.
    let map = |m: usize| map_file(&shuffle, join_stage, m);
    assert!(bucket_rows(&map(0)).iter().sum::<u64>() > 0);
    assert_eq!(read_marker(&map(1))["map"], 1);
    assert!(bucket_rows(&map(1)).iter().all(|&rows| rows == 0));
    // Turned off, each slice keeps its task.
    let off = with_option(
        sliced.with_shuffle_dir(dir.path().join("shuffle-off")),
        "coalesce",
        "off",
    );
    let result = host.run_distributed(LEFT_JOINED, &off).await.unwrap();
    assert_eq!(rows(&result.batches), left_joined_expected());
    assert!(
        coalesced(&result.decisions).is_empty(),
        "{:?}",
        result.decisions
    );
}

/// The final aggregate finds both maps of the join's coalesced slices lost
/// (the head's and the member's it published empty): the head's task runs
/// again, publishing both, and the query answers as by hand.
#[tokio::test]
async fn a_lost_map_of_coalesced_slices_is_restored_by_their_head() {
    let dir = tempfile::tempdir().unwrap();
    let shuffle = dir.path().join("shuffle");
    let (_, spec) = numbers_in_slices_of_two(dir.path(), &shuffle);
    let join = planned_join(&spec, LEFT_JOINED).await;
    let head = map_file(&shuffle, join, 0);
    let member = map_file(&shuffle, join, 1);
    let host = losing_after_first_attempt(join, 0, &[&head, &member]);
    let result = host.run_distributed(LEFT_JOINED, &spec).await.unwrap();
    assert_eq!(rows(&result.batches), left_joined_expected());
    let decision = join_decision(&result);
    assert_eq!(decision.stage_id, join);
    assert_eq!((decision.planned_tasks, decision.tasks), (2, 1));
    assert_ran_again(&result, join, 0);
    assert!(head.is_file() && member.is_file());
    assert!(bucket_rows(&member).iter().all(|&rows| rows == 0));
}

/// The root finds the head's map of a coalesced group lost, with a member's
/// (which the head publishes empty): the group's task runs again,
/// publishing both, and the query answers. A member lost alone is no loss:
/// the root, handed its empty layout, reads nothing of it.
#[tokio::test]
async fn a_lost_map_of_a_coalesced_group_is_restored_by_its_head() {
    let fixture = Fixture::new();
    let spec = fixture
        .distributed_spec("shuffle")
        .with_target_partitions(4);
    let (_, stages) = planned(&spec, BY_FLAG).await;
    let last = stages
        .iter()
        .find(|s| !s.info.deps.is_empty())
        .expect("a stage reading another")
        .stage_id();
    let dir = spec.shuffle_dir.clone().unwrap();
    let head = map_file(&dir, last, 0);
    let lost = map_file(&dir, last, 2);
    let host = losing_after_first_attempt(last, 0, &[&head, &lost]);
    let result = host.run_distributed(BY_FLAG, &spec).await.unwrap();
    assert_eq!(rows(&result.batches), by_flag_expected());
    assert_eq!(
        coalesced(&result.decisions).len(),
        1,
        "{:?}",
        result.decisions
    );
    assert_eq!(result.attempts[&(last, 0)], 2, "{:?}", result.attempts);
    assert_eq!(
        result.retries,
        vec![format!(
            "stage {last} map 0 attempt 1: run again, its output was lost (read by the query's \
             root)"
        )]
    );
    assert!(head.is_file(), "the head published its map again");
    assert!(lost.is_file(), "and its member's");
    assert!(bucket_rows(&lost).iter().all(|&rows| rows == 0));
}

/// The table `name` under `dir`: `rows` rows of `k` (`key(row)`) and `v`
/// (1) over `files` Parquet files.
fn keys_table(
    dir: &std::path::Path,
    name: &str,
    files: u64,
    rows: u64,
    key: impl Fn(u64) -> i64,
) -> std::path::PathBuf {
    let table = dir.join(name);
    dfx_host::bench::skew::write_keys_table(&table, files, rows, key).unwrap();
    table
}

/// One key holds 90 % of the probe side's rows: its bucket is far above
/// the others. Whatever coalescing does (off, on, or up to 4 KiB a task,
/// which leaves that bucket alone), the left join answers as by hand.
#[tokio::test]
async fn a_skewed_join_answers_alike_whatever_coalescing_does() {
    const SKEWED: &str = "SELECT count(*) AS n, count(d.k) AS matched, sum(t.v) AS v \
         FROM t LEFT JOIN d ON t.k = d.k";
    let dir = tempfile::tempdir().unwrap();
    // t: key 0 nine thousand times, keys 1..=1000 once, in two files; d:
    // keys 0..=500.
    let t = keys_table(dir.path(), "t", 2, 10_000, |row| {
        row.saturating_sub(8_999) as i64
    });
    let d = keys_table(dir.path(), "d", 1, 501, |row| row as i64);
    let spec =
        SessionSpec::new([("t".to_string(), t), ("d".to_string(), d)]).with_target_partitions(4);
    let host = host();
    let expected = vec![vec![i(10_000), i(9_500), i(10_000)]];
    assert_eq!(
        rows(&host.run_local(SKEWED, &spec).await.unwrap()),
        expected
    );
    let settings: [&[(&str, &str)]; 3] = [
        &[("coalesce", "off")],
        &[("coalesce", "on")],
        &[("coalesce", "auto"), ("coalesce_task_bytes", "4096")],
    ];
    for (run, options) in settings.iter().enumerate() {
        let mut distributed = spec
            .clone()
            .with_shuffle_dir(dir.path().join(format!("shuffle-{run}")));
        for (key, value) in *options {
            distributed = with_option(distributed, key, value);
        }
        let result = host.run_distributed(SKEWED, &distributed).await.unwrap();
        assert_eq!(rows(&result.batches), expected, "{options:?}");
    }
}

/// The skewed side of a partitioned join: key 0 in 360,000 rows, keys
/// 1..=40,000 once each, in two files (the second holds the tail); and
/// its other side, every even key of 0..=600,000 (more rows than
/// DataFusion broadcasts, fewer than the skewed side, so it is the build).
fn skewed_join_tables(dir: &std::path::Path) -> SessionSpec {
    skewed_join_tables_in(dir, 2)
}

/// The same tables, `t` in `files` files of equal rows.
fn skewed_join_tables_in(dir: &std::path::Path, files: u64) -> SessionSpec {
    let t = keys_table(dir, "t", files, 400_000, |row| {
        row.saturating_sub(359_999) as i64
    });
    let d = keys_table(dir, "d", 1, 300_001, |row| 2 * row as i64);
    SessionSpec::new([("t".to_string(), t), ("d".to_string(), d)]).with_target_partitions(4)
}

/// By hand: every row of t is counted; key 0's 360,000 rows and the 20,000
/// even keys of the tail find their row of d.
const SKEWED_JOIN: &str = "SELECT count(*) AS n, count(d.k) AS matched, sum(t.v) AS v \
     FROM t LEFT JOIN d ON t.k = d.k";

fn skewed_join_expected() -> Vec<Vec<Value>> {
    vec![vec![i(400_000), i(380_000), i(400_000)]]
}

/// The decisions that split a partition.
fn splits(decisions: &[Decision]) -> Vec<&Decision> {
    decisions
        .iter()
        .filter(|d| d.tasks > d.planned_tasks)
        .collect()
}

/// The join's probe side puts key 0's bucket far above the others. Split
/// (forced on, or `auto` with a least of 1 MiB), that partition is read by
/// two tasks, one per map of the probe stage; the second publishes as an
/// added map that the first names in its marker; the answer is the
/// hand-worked one. `off` keeps every stage as planned.
#[tokio::test]
async fn a_skewed_partition_is_split_among_tasks_by_its_probe_maps() {
    let dir = tempfile::tempdir().unwrap();
    let spec = skewed_join_tables(dir.path());
    let host = host();
    assert_eq!(
        rows(&host.run_local(SKEWED_JOIN, &spec).await.unwrap()),
        skewed_join_expected()
    );
    let settings: [&[(&str, &str)]; 3] = [
        &[("skew_split", "on"), ("coalesce", "off")],
        &[("skew_split_bytes", "1048576"), ("coalesce", "off")],
        &[("skew_split", "off"), ("coalesce", "off")],
    ];
    for (run, options) in settings.iter().enumerate() {
        let shuffle = dir.path().join(format!("shuffle-{run}"));
        // The broadcast switch, tried first, would take this join.
        let mut distributed = with_option(
            spec.clone().with_shuffle_dir(&shuffle),
            "broadcast_switch",
            "off",
        );
        for (key, value) in *options {
            distributed = with_option(distributed, key, value);
        }
        let result = host
            .run_distributed(SKEWED_JOIN, &distributed)
            .await
            .unwrap();
        assert_eq!(rows(&result.batches), skewed_join_expected(), "{options:?}");
        let split = splits(&result.decisions);
        if options.contains(&("skew_split", "off")) {
            assert!(split.is_empty(), "{:?}", result.decisions);
            continue;
        }
        // Only key 0's partition has rows in both maps of the probe stage.
        assert_eq!(split.len(), 1, "{options:?}: {:?}", result.decisions);
        let decision = split[0];
        assert_eq!((decision.planned_tasks, decision.tasks), (4, 5));
        assert!(
            decision.reason.contains("into 2 tasks by its maps"),
            "{}",
            decision.reason
        );
        let stage = decision.stage_id;
        let mut ran = ran_maps(&result, stage);
        ran.sort_unstable();
        assert_eq!(ran, vec![0, 1, 2, 3, 4]);
        // The added map is named by exactly one planned map's marker.
        let naming: Vec<usize> = (0..4)
            .filter(|map| {
                let marker = read_marker(&map_file(&shuffle, stage, *map));
                marker["companions"] == serde_json::json!([4])
            })
            .collect();
        assert_eq!(naming.len(), 1, "{options:?}");
        let added = read_marker(&map_file(&shuffle, stage, 4));
        assert_eq!(added["map"], 4);
        assert!(added.get("companions").is_none(), "{added}");
    }
}

/// The root finds the added map of a split partition lost: its task runs
/// again (its second attempt), and the answer is whole.
#[tokio::test]
async fn a_lost_added_map_of_a_split_partition_runs_again() {
    let dir = tempfile::tempdir().unwrap();
    let shuffle = dir.path().join("shuffle");
    let mut spec = skewed_join_tables(dir.path()).with_shuffle_dir(&shuffle);
    for (key, value) in [
        ("skew_split", "on"),
        ("broadcast_switch", "off"),
        ("coalesce", "off"),
    ] {
        spec = with_option(spec, key, value);
    }
    let join = planned_join(&spec, SKEWED_JOIN).await;
    let lost = map_file(&shuffle, join, 4);
    let host = losing_after_first_attempt(join, 4, &[&lost]);
    let result = host.run_distributed(SKEWED_JOIN, &spec).await.unwrap();
    assert_eq!(rows(&result.batches), skewed_join_expected());
    assert_eq!(splits(&result.decisions).len(), 1, "{:?}", result.decisions);
    assert_ran_again(&result, join, 4);
    assert!(lost.is_file(), "its task published it again");
}

/// The decisions that switched a partitioned join to a broadcast one.
fn switches(decisions: &[Decision]) -> Vec<&Decision> {
    decisions
        .iter()
        .filter(|d| d.reason.starts_with("switched to broadcast"))
        .collect()
}

/// Joins of every kind over the skewed tables, split forced on, then
/// switched to broadcast joins forced on: each answers as in one process.
/// Those whose probe rows stay apart (inner, right, semi and anti joins
/// probed by t, with a partial aggregate above) are split or switched; a
/// full join, which emits its build side's unmatched rows, never is.
#[tokio::test]
async fn joins_of_every_kind_answer_alike_with_their_skewed_partition_split_or_switched() {
    const QUERIES: [(&str, bool); 5] = [
        (
            "SELECT t.k % 7 AS g, count(*) AS n FROM t JOIN d ON t.k = d.k GROUP BY g ORDER BY g",
            true,
        ),
        (
            "SELECT count(*) AS n, sum(t.k) AS s FROM t WHERE t.k IN (SELECT k FROM d)",
            true,
        ),
        (
            "SELECT count(*) AS n, sum(t.k) AS s FROM t \
             WHERE NOT EXISTS (SELECT 1 FROM d WHERE d.k = t.k)",
            true,
        ),
        (
            "SELECT count(*) AS n, count(t.k) AS probed, count(d.k) AS built \
             FROM t FULL JOIN d ON t.k = d.k",
            false,
        ),
        (SKEWED_JOIN, true),
    ];
    type Adapted = fn(&[Decision]) -> Vec<&Decision>;
    let decisions: [(&str, Adapted); 2] = [("skew_split", splits), ("broadcast_switch", switches)];
    let dir = tempfile::tempdir().unwrap();
    let spec = skewed_join_tables(dir.path());
    let host = host();
    let mut run = 0;
    for (sql, adapted_expected) in QUERIES {
        let local = rows(&host.run_local(sql, &spec).await.unwrap());
        for (decision, adapted) in decisions {
            run += 1;
            let mut distributed = spec
                .clone()
                .with_shuffle_dir(dir.path().join(format!("shuffle-{run}")));
            for (key, value) in [
                ("skew_split", "off"),
                ("broadcast_switch", "off"),
                ("coalesce", "off"),
                (decision, "on"),
            ] {
                distributed = with_option(distributed, key, value);
            }
            let result = host.run_distributed(sql, &distributed).await.unwrap();
            assert_eq!(rows(&result.batches), local, "{decision}: {sql}");
            assert_eq!(
                !adapted(&result.decisions).is_empty(),
                adapted_expected,
                "{decision}: {sql}: {:?}",
                result.decisions
            );
        }
    }
}

/// Rows each map of `stage` published into `shuffle`, from the markers.
fn map_rows(shuffle: &std::path::Path, stage: u64, maps: usize) -> Vec<u64> {
    (0..maps)
        .map(|map| bucket_rows(&map_file(shuffle, stage, map)).iter().sum())
        .collect()
}

/// The skewed tables' partitioned join, switched to a broadcast join
/// (forced on; `auto` under a threshold above d's published bytes; `auto`
/// at its default threshold, for the skewed partition):
/// the join's stage runs its four planned tasks, each reading d whole and
/// its share of t's two maps whole, so key 0's rows are divided as t's
/// files divide them: 200,000 joined rows from the first file, 160,000 plus
/// the tail's 20,000 from the second. `off` keeps the join partitioned:
/// key 0's rows all in one task.
#[tokio::test]
async fn a_partitioned_join_with_a_small_build_side_runs_as_a_broadcast_join() {
    const JOINED: &str = "SELECT t.k, t.v FROM t JOIN d ON t.k = d.k";
    let dir = tempfile::tempdir().unwrap();
    let spec = skewed_join_tables(dir.path());
    let host = host();
    // The rows as sorted pairs: the tasks' order is not the answer's.
    let pairs = |batches: &[datafusion::arrow::array::RecordBatch]| {
        let mut pairs: Vec<(i64, i64)> = rows(batches)
            .into_iter()
            .map(|row| match row[..] {
                [Value::Int(k), Value::Int(v)] => (k, v),
                _ => panic!("not two integers: {row:?}"),
            })
            .collect();
        pairs.sort_unstable();
        pairs
    };
    let local = pairs(&host.run_local(JOINED, &spec).await.unwrap());
    assert_eq!(local.len(), 380_000);
    // Each setting, and the rows each map of the join's stage publishes
    // when it switches (`None`: kept partitioned).
    type Published = Option<(usize, [u64; 4])>;
    let settings: [(&[(&str, &str)], Published); 5] = [
        (
            &[("broadcast_switch", "on"), ("coalesce", "off")],
            Some((4, [0, 200_000, 0, 180_000])),
        ),
        (
            &[("broadcast_switch_bytes", "67108864"), ("coalesce", "off")],
            Some((4, [0, 200_000, 0, 180_000])),
        ),
        // Coalesced as well (partitions 0..=2 hold one map's share, 3 the
        // other's): each head reads its group's shares of t's maps and d
        // once; the others publish empty.
        (
            &[("broadcast_switch", "on"), ("coalesce", "on")],
            Some((2, [200_000, 0, 0, 180_000])),
        ),
        // `auto`: d publishes more than the threshold, but key 0's
        // partition makes one task read more than any would switched.
        (&[("coalesce", "off")], Some((4, [0, 200_000, 0, 180_000]))),
        (&[("broadcast_switch", "off"), ("coalesce", "off")], None),
    ];
    for (run, (options, switched)) in settings.into_iter().enumerate() {
        let shuffle = dir.path().join(format!("shuffle-{run}"));
        let mut distributed =
            with_option(spec.clone().with_shuffle_dir(&shuffle), "skew_split", "off");
        for (key, value) in options {
            distributed = with_option(distributed, key, value);
        }
        let result = host.run_distributed(JOINED, &distributed).await.unwrap();
        assert!(
            pairs(&result.batches) == local,
            "{options:?}: the answers differ"
        );
        let join = result
            .stages
            .iter()
            .find(|s| s.deps.len() == 2)
            .expect("the join's stage reads two stages");
        let published = map_rows(&shuffle, join.stage_id, join.maps);
        let decided = switches(&result.decisions);
        if let Some((tasks, rows)) = switched {
            assert_eq!(decided.len(), 1, "{options:?}: {:?}", result.decisions);
            assert_eq!((decided[0].planned_tasks, decided[0].tasks), (4, tasks));
            assert_eq!(published, rows, "{options:?}");
            if options == [("coalesce", "off")] {
                assert!(
                    decided[0].reason.contains("its slowest worker reads"),
                    "{}",
                    decided[0].reason
                );
            }
        } else {
            assert!(decided.is_empty(), "{options:?}: {:?}", result.decisions);
            assert!(
                published.iter().any(|&rows| rows >= 360_000),
                "{options:?}: {published:?}"
            );
        }
    }
}

/// The skewed join in slices of two partitions, its probe side in four
/// files (two maps of two). Split (forced on, or `auto` with a least of
/// 1 MiB), key 0's partition runs as two parts inside its slice's task,
/// one per probe map, and no task is added; the answer is the hand-worked
/// one. `off` keeps every stage as planned.
#[tokio::test]
async fn a_skewed_partition_of_a_slice_runs_as_parts_inside_its_task() {
    let dir = tempfile::tempdir().unwrap();
    let spec = skewed_join_tables_in(dir.path(), 4);
    let host = host();
    let settings: [&[(&str, &str)]; 3] = [
        &[("skew_split", "on")],
        &[("skew_split_bytes", "1048576")],
        &[("skew_split", "off")],
    ];
    for (run, options) in settings.iter().enumerate() {
        let sliced = with_options(
            spec.clone(),
            &[
                ("partitions_per_task", "2"),
                ("coalesce", "off"),
                ("broadcast_switch", "off"),
            ],
        );
        let distributed = with_options(
            sliced.with_shuffle_dir(dir.path().join(format!("shuffle-{run}"))),
            options,
        );
        let result = host
            .run_distributed(SKEWED_JOIN, &distributed)
            .await
            .unwrap();
        assert_eq!(rows(&result.batches), skewed_join_expected(), "{options:?}");
        assert!(
            splits(&result.decisions).is_empty(),
            "{:?}",
            result.decisions
        );
        let split: Vec<&Decision> = result
            .decisions
            .iter()
            .filter(|d| d.reason.contains("parts inside its task"))
            .collect();
        if options.contains(&("skew_split", "off")) {
            assert!(split.is_empty(), "{:?}", result.decisions);
            continue;
        }
        // Only key 0's partition has rows in both maps of the probe stage.
        assert_eq!(split.len(), 1, "{options:?}: {:?}", result.decisions);
        assert_eq!((split[0].planned_tasks, split[0].tasks), (2, 2));
        assert!(
            split[0]
                .reason
                .contains("into 2 parts inside its task by its maps"),
            "{}",
            split[0].reason
        );
    }
}

/// The skewed join in slices of two and of four partitions, every decision
/// forced on: a stage of slices runs as planned, and the answer is the
/// hand-worked one.
#[tokio::test]
async fn a_skewed_join_in_slices_answers_as_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    let spec = skewed_join_tables(dir.path());
    let host = host();
    for per_task in ["2", "4"] {
        let mut sliced = spec
            .clone()
            .with_shuffle_dir(dir.path().join(format!("shuffle-{per_task}")));
        for (key, value) in [
            ("partitions_per_task", per_task),
            ("skew_split", "on"),
            ("coalesce", "on"),
            ("broadcast_switch", "on"),
        ] {
            sliced = with_option(sliced, key, value);
        }
        let result = host.run_distributed(SKEWED_JOIN, &sliced).await.unwrap();
        assert_eq!(
            rows(&result.batches),
            skewed_join_expected(),
            "{per_task} a task"
        );
        assert!(
            splits(&result.decisions).is_empty(),
            "{:?}",
            result.decisions
        );
    }
}
