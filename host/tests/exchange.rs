//! The exchange, end to end: every join type, windows, set operations,
//! sorts with limits and subqueries, distributed in both split modes over
//! real workers, must answer exactly what one process answers; and the plan
//! shapes that make them right (hash exchanges, single-task stages for joins
//! that need all of their input, broadcast build sides) are checked on the
//! plans themselves.
//!
//! # The fixture
//!
//! Two tables of four Parquet files each, written here, with NULLs in the
//! join keys (so `NOT IN` and outer joins have something to get wrong) and
//! repeated keys (so joins multiply rows):
//!
//! - `a(k int, v int)`: 48 rows, `v = i`, `k = (i·37 mod 101) mod 50`, NULL
//!   when `i mod 9 = 4`;
//! - `b(k int, w int)`: 40 rows, `w = 10·j`, `k = (j·11 mod 61) mod 45`, NULL
//!   when `j mod 7 = 3`.
//!
//! `a.k > b.k + 40` matches some pairs (a.k in 41..49 against b.k below
//! a.k − 40) and leaves most rows of both sides unmatched.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use datafusion::arrow::array::{Array, Int32Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use dfx_host::driver::stages::{Stage, node_display};
use dfx_host::session::{SessionSpec, Split};

/// Files per table.
const FILES: usize = 4;

/// A query, and whether its row order is part of its answer.
struct Query {
    name: &'static str,
    sql: &'static str,
    ordered: bool,
}

const fn q(name: &'static str, sql: &'static str) -> Query {
    Query {
        name,
        sql,
        ordered: false,
    }
}

const fn ordered(name: &'static str, sql: &'static str) -> Query {
    Query {
        name,
        sql,
        ordered: true,
    }
}

/// Every join type, each with an equi condition and a non-equi one.
const JOINS: &[Query] = &[
    q("inner equi", "SELECT a.v, b.w FROM a JOIN b ON a.k = b.k"),
    q(
        "inner non-equi",
        "SELECT a.v, b.w FROM a JOIN b ON a.k > b.k + 40",
    ),
    q(
        "inner equi with a filter",
        "SELECT a.v, b.w FROM a JOIN b ON a.k = b.k AND a.v * 10 < b.w",
    ),
    q(
        "left equi",
        "SELECT a.v, b.w FROM a LEFT JOIN b ON a.k = b.k",
    ),
    q(
        "left non-equi",
        "SELECT a.v, b.w FROM a LEFT JOIN b ON a.k > b.k + 40",
    ),
    q(
        "right equi",
        "SELECT a.v, b.w FROM a RIGHT JOIN b ON a.k = b.k",
    ),
    q(
        "right non-equi",
        "SELECT a.v, b.w FROM a RIGHT JOIN b ON a.k > b.k + 40",
    ),
    q(
        "full equi",
        "SELECT a.v, b.w FROM a FULL JOIN b ON a.k = b.k",
    ),
    q(
        "full non-equi",
        "SELECT a.v, b.w FROM a FULL JOIN b ON a.k > b.k + 40",
    ),
    q(
        "full non-equi count",
        "select count(*) from a full join b on a.k > b.k + 40",
    ),
    q(
        "left semi equi (EXISTS)",
        "SELECT a.v FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k = a.k)",
    ),
    q(
        "left semi non-equi (EXISTS)",
        "SELECT a.v FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k + 40 < a.k)",
    ),
    q(
        "left anti equi (NOT EXISTS)",
        "SELECT a.v FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.k = a.k)",
    ),
    q(
        "left anti non-equi (NOT EXISTS)",
        "SELECT a.v FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.k + 40 < a.k)",
    ),
    q(
        "semi from the small side equi (IN)",
        "SELECT b.w FROM b WHERE b.k IN (SELECT a.k FROM a)",
    ),
    q(
        "semi from the small side non-equi (EXISTS)",
        "SELECT b.w FROM b WHERE EXISTS (SELECT 1 FROM a WHERE a.k > b.k + 40)",
    ),
    q(
        "semi equi with a correlated filter (IN)",
        "SELECT a.v FROM a WHERE a.k IN (SELECT b.k FROM b WHERE b.w > a.v * 5)",
    ),
    q(
        "anti from the small side equi (NOT EXISTS)",
        "SELECT b.w FROM b WHERE NOT EXISTS (SELECT 1 FROM a WHERE a.k = b.k)",
    ),
    q(
        "anti from the small side non-equi (NOT EXISTS)",
        "SELECT b.w FROM b WHERE NOT EXISTS (SELECT 1 FROM a WHERE a.k > b.k + 40)",
    ),
    q(
        "mark equi (EXISTS ... OR)",
        "SELECT a.v FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k = a.k) OR a.v > 40",
    ),
    q(
        "mark non-equi (EXISTS ... OR)",
        "SELECT a.v FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k + 40 < a.k) OR a.v > 40",
    ),
    // A filtered outer side is the smaller one, so the planner keeps it on
    // the left: the Left* variants of the joins above (the unfiltered ones
    // are swapped into their Right* forms).
    q(
        "small outer side semi equi (EXISTS)",
        "SELECT a.v FROM a WHERE a.v > 38 AND EXISTS (SELECT 1 FROM b WHERE b.k = a.k)",
    ),
    q(
        "small outer side semi non-equi (EXISTS)",
        "SELECT a.v FROM a WHERE a.v > 38 AND EXISTS (SELECT 1 FROM b WHERE b.k + 40 < a.k)",
    ),
    q(
        "small outer side anti equi (NOT EXISTS)",
        "SELECT a.v FROM a WHERE a.v > 38 AND NOT EXISTS (SELECT 1 FROM b WHERE b.k = a.k)",
    ),
    q(
        "small outer side anti non-equi (NOT EXISTS)",
        "SELECT a.v FROM a WHERE a.v > 38 AND NOT EXISTS (SELECT 1 FROM b WHERE b.k + 40 < a.k)",
    ),
    q(
        "small outer side mark equi (EXISTS ... OR)",
        "SELECT a.v FROM a WHERE a.v > 38 AND (EXISTS (SELECT 1 FROM b WHERE b.k = a.k) OR a.v > 44)",
    ),
    q(
        "small outer side mark non-equi (EXISTS ... OR)",
        "SELECT a.v FROM a WHERE a.v > 38 AND \
         (EXISTS (SELECT 1 FROM b WHERE b.k + 40 < a.k) OR a.v > 44)",
    ),
    q(
        "null-aware anti over NULLs (NOT IN)",
        "SELECT a.v FROM a WHERE a.k NOT IN (SELECT k FROM b)",
    ),
    q(
        "null-aware anti without NULLs (NOT IN)",
        "SELECT a.v FROM a WHERE a.k NOT IN (SELECT k FROM b WHERE k IS NOT NULL)",
    ),
    q(
        "null-aware anti count",
        "select count(*) from a where a.k not in (select k from b where k is not null)",
    ),
    q(
        "null-aware anti from the small side (NOT IN)",
        "SELECT b.w FROM b WHERE b.k NOT IN (SELECT k FROM a WHERE k IS NOT NULL AND v > 10)",
    ),
    q(
        "aggregate over an equi join",
        "SELECT a.k, count(*) AS n, sum(b.w) AS s FROM a JOIN b ON a.k = b.k GROUP BY a.k",
    ),
    q(
        "cross join",
        "SELECT a.v, b.w FROM a CROSS JOIN b WHERE a.v < 6",
    ),
    q(
        "cross join aggregate",
        "SELECT count(*) AS n, sum(a.v * b.w) AS s FROM a CROSS JOIN b",
    ),
];

/// Windows, set operations, sorts with limits, scalar subqueries.
const OTHERS: &[Query] = &[
    q(
        "window with PARTITION BY",
        "SELECT k, v, row_number() OVER (PARTITION BY k ORDER BY v) AS rn, \
         sum(v) OVER (PARTITION BY k) AS s FROM a",
    ),
    q(
        // The writer below hashes on a function call, which its decode must
        // find among the session's functions (a worker's first, lean decode
        // cannot: see `session::LateTaskContext`).
        "window partitioned by a function",
        "SELECT k, v, row_number() OVER (PARTITION BY abs(k - 20) ORDER BY v) AS rn FROM a",
    ),
    q(
        "window without PARTITION BY",
        "SELECT v, sum(v) OVER (ORDER BY v ROWS BETWEEN 2 PRECEDING AND CURRENT ROW) AS s3, \
         rank() OVER (ORDER BY k) AS r FROM a",
    ),
    q(
        // Each of these reads its literal offset when planned, which a
        // function wrapped across FFI could not give (see the planner's
        // `with_native_functions`).
        "windows with literal arguments (lag, lead, ntile, nth_value)",
        "SELECT v, lag(v, 2) OVER (ORDER BY v) AS l2, lead(v, 1, -1) OVER (ORDER BY v) AS l1, \
         ntile(4) OVER (ORDER BY v) AS quartile, \
         nth_value(v, 2) OVER (PARTITION BY k ORDER BY v) AS second FROM a",
    ),
    q("UNION", "SELECT k FROM a UNION SELECT k FROM b"),
    q("UNION ALL", "SELECT k FROM a UNION ALL SELECT k FROM b"),
    q(
        "UNION ALL of two aggregates",
        "SELECT k, sum(v) AS s FROM a GROUP BY k UNION ALL SELECT k, sum(w) AS s FROM b GROUP BY k",
    ),
    q("INTERSECT", "SELECT k FROM a INTERSECT SELECT k FROM b"),
    q("EXCEPT", "SELECT k FROM a EXCEPT SELECT k FROM b"),
    ordered(
        "ORDER BY + LIMIT",
        "SELECT v, k FROM a ORDER BY v DESC LIMIT 7",
    ),
    ordered(
        "aggregate, ORDER BY + LIMIT",
        "SELECT k, count(*) AS n FROM a GROUP BY k ORDER BY k NULLS FIRST LIMIT 5",
    ),
    ordered(
        "ORDER BY over a join + LIMIT",
        "SELECT a.v, b.w FROM a JOIN b ON a.k = b.k ORDER BY a.v, b.w LIMIT 9",
    ),
    q(
        "uncorrelated scalar subqueries",
        "SELECT v, (SELECT max(w) FROM b) AS m FROM a WHERE v * 10 > (SELECT avg(w) FROM b)",
    ),
    q(
        "correlated scalar subquery",
        "SELECT a.v, (SELECT count(*) FROM b WHERE b.k = a.k) AS n FROM a",
    ),
    q(
        "scalar subquery in a join filter",
        "SELECT a.v FROM a JOIN b ON a.k = b.k WHERE b.w > (SELECT avg(w) FROM b)",
    ),
];

/// Recursive CTEs: the planner seals each one, and it runs whole in one task.
const RECURSIVE: &[Query] = &[
    q(
        "recursive CTE over literals",
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 20) \
         SELECT n FROM r",
    ),
    q(
        // The recursive term reads the work table's columns in another
        // order: a projected read, which the planner makes whole.
        "recursive CTE with a projected work table read",
        "WITH RECURSIVE r(x, y, z) AS (SELECT 1, 2, 3 UNION ALL SELECT z, x + 1, y FROM r \
         WHERE x < 30) SELECT x FROM r",
    ),
    q(
        "recursive CTE joined to a table, UNION",
        "WITH RECURSIVE r(k, d) AS (SELECT k, 0 FROM a WHERE k < 10 UNION \
         SELECT b.k, r.d + 1 FROM r JOIN b ON b.k = r.k + 3 WHERE r.d < 4) SELECT k, d FROM r",
    ),
    q(
        "recursive CTE under a join",
        "SELECT a.k, x.m FROM a JOIN (WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL \
         SELECT n + 1 FROM r WHERE n < 12) SELECT max(n) AS m FROM r) x ON a.k < x.m",
    ),
];

/// The two tables, in a temporary directory.
struct Tables {
    root: tempfile::TempDir,
}

impl Tables {
    fn new() -> Self {
        let root = tempfile::Builder::new()
            .prefix("dfx-exchange-test-")
            .tempdir()
            .unwrap();
        let a: Vec<(Option<i32>, i32)> = (0..48)
            .map(|i| ((i % 9 != 4).then_some((i * 37 % 101) % 50), i))
            .collect();
        let b: Vec<(Option<i32>, i32)> = (0..40)
            .map(|j| ((j % 7 != 3).then_some((j * 11 % 61) % 45), 10 * j))
            .collect();
        write_table(&root.path().join("a"), "v", &a);
        write_table(&root.path().join("b"), "w", &b);
        Self { root }
    }

    fn spec(&self) -> SessionSpec {
        SessionSpec::new([
            ("a".to_string(), self.root.path().join("a")),
            ("b".to_string(), self.root.path().join("b")),
        ])
    }

    /// A fresh shuffle directory name for one distributed run.
    fn shuffle_dir(&self, split: Split, index: usize) -> PathBuf {
        self.root.path().join(format!("shuffle-{split}-{index}"))
    }
}

/// `rows` as table `dir` with columns `k` (nullable) and `value`, in
/// [`FILES`] Parquet files.
fn write_table(dir: &Path, value: &str, rows: &[(Option<i32>, i32)]) {
    std::fs::create_dir_all(dir).unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int32, true),
        Field::new(value, DataType::Int32, false),
    ]));
    for (file, chunk) in rows.chunks(rows.len().div_ceil(FILES)).enumerate() {
        let columns: Vec<Arc<dyn Array>> = vec![
            Arc::new(Int32Array::from_iter(chunk.iter().map(|r| r.0))),
            Arc::new(Int32Array::from_iter_values(chunk.iter().map(|r| r.1))),
        ];
        let batch = RecordBatch::try_new(Arc::clone(&schema), columns).unwrap();
        let out = std::fs::File::create(dir.join(format!("part-{file}.parquet"))).unwrap();
        let mut writer = ArrowWriter::try_new(out, Arc::clone(&schema), None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
    }
    let written = std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "parquet")
        })
        .count();
    assert_eq!(written, FILES);
}

/// The rows of an answer for comparison: in order when the query orders
/// them (every sort key here is unique), sorted otherwise.
fn answer(batches: &[RecordBatch], ordered: bool) -> Vec<String> {
    if !ordered {
        return sorted_rows(batches);
    }
    let mut out = Vec::new();
    for batch in batches {
        for row in 0..batch.num_rows() {
            out.extend(sorted_rows(&[batch.slice(row, 1)]));
        }
    }
    out
}

/// Run every query of `queries` in one process and distributed in both
/// split modes; every disagreement or failure, named, in one list.
async fn disagreements(queries: &[Query]) -> Vec<String> {
    let tables = Tables::new();
    let host = host();
    let mut problems = Vec::new();
    for (index, query) in queries.iter().enumerate() {
        let local = match host.run_local(query.sql, &tables.spec()).await {
            Ok(batches) => answer(&batches, query.ordered),
            Err(err) => {
                problems.push(format!("{}: local run failed: {err}", query.name));
                continue;
            }
        };
        // The fixture must give every query something to get wrong: rows,
        // except where SQL says none (NOT IN over a list holding NULL).
        let expect_empty = query.name == "null-aware anti over NULLs (NOT IN)";
        if local.is_empty() != expect_empty {
            problems.push(format!(
                "{}: the fixture gives {} local row(s)",
                query.name,
                local.len()
            ));
        }
        for split in SPLITS {
            let mut spec = tables
                .spec()
                .with_split(split)
                .with_shuffle_dir(tables.shuffle_dir(split, index));
            // Through workers: a query over literals runs one partition,
            // which would be kept whole for the driver.
            spec.engine_options
                .insert("collapse_stages".to_string(), "task".to_string());
            match host.run_distributed(query.sql, &spec).await {
                Ok(result) => {
                    assert!(
                        !result.stages.is_empty() && result.tasks.len() >= result.stages.len(),
                        "{}: {:?}",
                        query.name,
                        result.stages
                    );
                    let distributed = answer(&result.batches, query.ordered);
                    if distributed != local {
                        problems.push(format!(
                            "{} [{split}]: {} row(s) distributed, {} local\n  sql: {}\n  \
                             distributed: {:?}\n  local: {:?}",
                            query.name,
                            distributed.len(),
                            local.len(),
                            query.sql,
                            first(&distributed),
                            first(&local)
                        ));
                    }
                }
                Err(err) => problems.push(format!(
                    "{} [{split}]: failed: {}\n  sql: {}",
                    query.name,
                    first_line(&err.to_string()),
                    query.sql
                )),
            }
        }
    }
    problems
}

fn first(rows: &[String]) -> &[String] {
    &rows[..rows.len().min(8)]
}

fn first_line(text: &str) -> String {
    text.lines().take(6).collect::<Vec<_>>().join(" / ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_join_type_answers_as_in_one_process_in_both_split_modes() {
    let problems = disagreements(JOINS).await;
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_set_operations_limits_and_subqueries_answer_as_in_one_process() {
    let problems = disagreements(OTHERS).await;
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// What the optimizer turns into an empty relation (`WHERE false`,
/// `LIMIT 0`) still has its columns when the plan crosses into the plugin:
/// answers worked out by hand, in one process and in both splits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_over_an_empty_relation_answer_by_hand() {
    let cases = [
        (
            "SELECT count(*) AS c, sum(a.v) AS s FROM a WHERE 1 = 0",
            vec!["0 | "],
        ),
        (
            "SELECT count(*) AS c, max(x.v) AS m FROM (SELECT * FROM a LIMIT 0) x",
            vec!["0 | "],
        ),
        (
            "SELECT count(*) AS c FROM a LEFT JOIN (SELECT k FROM b WHERE false) e ON a.k = e.k \
             WHERE e.k IS NULL",
            vec!["48"],
        ),
    ];
    let tables = Tables::new();
    let host = host();
    for (n, (sql, expected)) in cases.iter().enumerate() {
        let local = host.run_local(sql, &tables.spec()).await.unwrap();
        assert_eq!(sorted_rows(&local), *expected, "local: {sql}");
        for split in SPLITS {
            let spec = tables
                .spec()
                .with_split(split)
                .with_shuffle_dir(tables.shuffle_dir(split, 1100 + n));
            let result = host.run_distributed(sql, &spec).await.unwrap();
            assert_eq!(sorted_rows(&result.batches), *expected, "[{split}] {sql}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recursive_queries_answer_by_hand_and_as_in_one_process() {
    // 1 + 2 + ... + 20, and 20 rows, worked out by hand.
    let sql = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 20) \
               SELECT sum(n) AS s, count(*) AS c FROM r";
    let tables = Tables::new();
    let host = host();
    let local = host.run_local(sql, &tables.spec()).await.unwrap();
    assert_eq!(sorted_rows(&local), vec!["210 | 20"]);
    for split in SPLITS {
        let mut spec = tables
            .spec()
            .with_split(split)
            .with_shuffle_dir(tables.shuffle_dir(split, 1000));
        // Through a worker: one partition would be kept whole for the driver.
        spec.engine_options
            .insert("collapse_stages".to_string(), "task".to_string());
        let result = host.run_distributed(sql, &spec).await.unwrap();
        assert_eq!(sorted_rows(&result.batches), vec!["210 | 20"], "[{split}]");
        assert!(!result.stages.is_empty(), "[{split}]: no stage");
    }
    let problems = disagreements(RECURSIVE).await;
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

type Node = Arc<dyn ExecutionPlan>;

/// Each node of a plan with the nodes above it (nearest last).
fn walk<'a>(
    plan: &'a Node,
    above: &mut Vec<&'a Node>,
    visit: &mut dyn FnMut(&'a Node, &[&'a Node]),
) {
    visit(plan, above);
    above.push(plan);
    for child in plan.children() {
        walk(child, above, visit);
    }
    above.pop();
}

fn stage_of<'a>(stages: &'a [Stage], plan: &Arc<dyn ExecutionPlan>) -> Option<&'a Stage> {
    stages.iter().find(|s| Arc::ptr_eq(&s.plan, plan))
}

/// Every reader of the plan: its partitions and the stage it reads.
fn readers<'a>(plan: &'a Arc<dyn ExecutionPlan>, stages: &'a [Stage]) -> Vec<(usize, &'a Stage)> {
    let mut found = Vec::new();
    walk(plan, &mut Vec::new(), &mut |node, _| {
        if node_display(node.as_ref()).contains("ShuffleReaderExec") {
            let writer = node.children()[0];
            let stage = stage_of(stages, writer).expect("a reader's child is a writer");
            found.push((node.output_partitioning().partition_count(), stage));
        }
    });
    found
}

/// The plan of `sql` in exchange mode over the fixture.
async fn exchange_plan(tables: &Tables, sql: &str) -> (Arc<dyn ExecutionPlan>, Vec<Stage>) {
    let spec = tables
        .spec()
        .with_split(Split::Exchange)
        .with_shuffle_dir(tables.root.path().join("planned"));
    planned(&spec, sql).await
}

fn render(plan: &Arc<dyn ExecutionPlan>) -> String {
    let mut out = String::new();
    walk(plan, &mut Vec::new(), &mut |node, above| {
        out.push_str(&format!(
            "{:indent$}{} [{} partition(s)]\n",
            "",
            node_display(node.as_ref()),
            node.output_partitioning().partition_count(),
            indent = above.len() * 2
        ));
    });
    out
}

#[tokio::test]
async fn a_hash_join_reads_both_sides_through_hash_exchanges() {
    let tables = Tables::new();
    // A full join: the fixture is small enough for DataFusion to collect the
    // build side of an inner join (a broadcast); a full join's unmatched
    // build rows make the split rule partition it on its keys instead.
    let (plan, stages) =
        exchange_plan(&tables, "SELECT a.v, b.w FROM a FULL JOIN b ON a.k = b.k").await;
    let shown = render(&plan);
    assert!(stages.len() >= 3, "{stages:?}\n{shown}");
    let hash_reads: Vec<_> = readers(&plan, &stages)
        .into_iter()
        .filter(|(partitions, stage)| {
            stage.info.partitioning.starts_with("hash(")
                && stage.info.buckets > 1
                && *partitions == stage.info.buckets
        })
        .collect();
    // One per side of the join, each reading bucket b of every map as partition b.
    assert!(hash_reads.len() >= 2, "{stages:?}\n{shown}");
    for (_, stage) in &hash_reads {
        assert_eq!(stage.info.maps, FILES, "{stages:?}\n{shown}");
    }
}

#[tokio::test]
async fn a_window_partitioned_by_a_function_hashes_on_the_call() {
    // The case the lean first decode of a worker cannot handle (see
    // `session::LateTaskContext`); its answer is checked with the others.
    let tables = Tables::new();
    let (plan, stages) = exchange_plan(
        &tables,
        "SELECT k, v, row_number() OVER (PARTITION BY abs(k - 20) ORDER BY v) AS rn FROM a",
    )
    .await;
    assert!(
        stages
            .iter()
            .any(|s| s.info.partitioning.starts_with("hash([abs(")),
        "{stages:?}\n{}",
        render(&plan)
    );
}

#[tokio::test]
async fn a_not_in_join_runs_in_a_single_map_stage() {
    let tables = Tables::new();
    let (plan, stages) = exchange_plan(
        &tables,
        "select count(*) from a where a.k not in (select k from b where k is not null)",
    )
    .await;
    let shown = render(&plan);
    let mut joins = 0;
    walk(&plan, &mut Vec::new(), &mut |node, above| {
        if !node_display(node.as_ref()).contains("HashJoinExec") {
            return;
        }
        joins += 1;
        // The nearest writer above the join: the stage the join runs in.
        let stage = above
            .iter()
            .rev()
            .find_map(|n| stage_of(&stages, n))
            .expect("the join runs in a stage, not in the driver");
        assert_eq!(
            stage.info.maps, 1,
            "a null-aware anti join split over {} maps loses rows\n{shown}",
            stage.info.maps
        );
    });
    assert_eq!(joins, 1, "{shown}");
}

#[tokio::test]
async fn a_cross_join_broadcasts_its_build_side() {
    let tables = Tables::new();
    let (plan, stages) = exchange_plan(
        &tables,
        "SELECT count(*) AS n, sum(a.v * b.w) AS s FROM a CROSS JOIN b",
    )
    .await;
    let shown = render(&plan);
    let mut broadcasts = 0;
    walk(&plan, &mut Vec::new(), &mut |node, _| {
        if !node_display(node.as_ref()).contains("CrossJoinExec") {
            return;
        }
        let build = node.children()[0];
        let probe = node.children()[1];
        assert!(
            node_display(build.as_ref()).contains("ShuffleReaderExec"),
            "{shown}"
        );
        let stage = stage_of(&stages, build.children()[0]).unwrap();
        // Every map of the build stage read as one partition by each probe task.
        assert!(stage.info.maps > 1, "{shown}");
        assert_eq!(build.output_partitioning().partition_count(), 1, "{shown}");
        assert!(probe.output_partitioning().partition_count() > 1, "{shown}");
        broadcasts += 1;
    });
    assert_eq!(broadcasts, 1, "{shown}");
}

#[tokio::test]
async fn the_driver_runs_only_what_sits_above_the_stages() {
    let tables = Tables::new();
    for sql in [
        "SELECT a.v, b.w FROM a JOIN b ON a.k = b.k",
        "SELECT k, count(*) FROM a GROUP BY k",
        "SELECT v FROM a ORDER BY v",
    ] {
        let (plan, stages) = exchange_plan(&tables, sql).await;
        let shown = render(&plan);
        // No table is scanned by the head: every path from the root meets a
        // reader before it meets a leaf.
        fn head_reads_a_table(node: &Arc<dyn ExecutionPlan>) -> bool {
            if node_display(node.as_ref()).contains("ShuffleReaderExec") {
                return false;
            }
            let children = node.children();
            children.is_empty() || children.into_iter().any(head_reads_a_table)
        }
        assert!(!head_reads_a_table(&plan), "{sql}\n{shown}");
        assert_eq!(stages[0].stage_id(), 1, "{sql}");
    }
}

#[tokio::test]
async fn the_join_queries_plan_every_join_type() {
    let tables = Tables::new();
    let mut seen = std::collections::BTreeSet::new();
    for query in JOINS {
        let (plan, _) = exchange_plan(&tables, query.sql).await;
        walk(&plan, &mut Vec::new(), &mut |node, _| {
            let line = node_display(node.as_ref());
            let kind = line.split(':').next().unwrap_or_default().to_string();
            if let Some((_, rest)) = line.split_once("join_type=") {
                let join_type = rest.split([',', ' ']).next().unwrap_or_default();
                seen.insert(format!("{kind} {join_type}"));
            } else if kind.contains("Join") {
                seen.insert(kind);
            }
        });
    }
    // Every join type, as a hash join (equi) and as a nested loop join
    // (non-equi): a query list that lost one would pass without testing it.
    let mut missing = Vec::new();
    for kind in ["HashJoinExec", "NestedLoopJoinExec"] {
        for join_type in [
            "Inner",
            "Left",
            "Right",
            "Full",
            "LeftSemi",
            "LeftAnti",
            "RightSemi",
            "RightAnti",
            "LeftMark",
            "RightMark",
        ] {
            let name = format!("{kind} {join_type}");
            if !seen.contains(&name) {
                missing.push(name);
            }
        }
    }
    if !seen.contains("CrossJoinExec") {
        missing.push("CrossJoinExec".to_string());
    }
    assert!(
        missing.is_empty(),
        "not planned: {missing:?}; seen: {seen:?}"
    );
}

/// Sizes of every published map file under `dir`, summed.
fn bucket_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            total += bucket_bytes(&path);
        } else if path.extension().is_some_and(|e| e == "arrow") {
            total += std::fs::metadata(&path).unwrap().len();
        }
    }
    total
}

#[tokio::test]
async fn bucket_files_are_compressed_as_the_session_says_and_local_ones_not_by_default() {
    use dfx_host::session::ShuffleCompression;
    let tables = Tables::new();
    let host = host();
    // 100 000 rows sorted in their stage cross a pass-through exchange
    // whole. Column `k` is one repeated value (LZ4 shrinks it to almost
    // nothing), `v` distinct integers.
    let rows: Vec<(Option<i32>, i32)> = (0..100_000).map(|i| (Some(7), i)).collect();
    write_table(&tables.root.path().join("c"), "v", &rows);
    let sql = "SELECT k, v FROM c ORDER BY v";
    let mut bytes = Vec::new();
    let mut answers = Vec::new();
    for (index, compression) in [
        ShuffleCompression::Lz4,
        ShuffleCompression::None,
        ShuffleCompression::Auto,
    ]
    .into_iter()
    .enumerate()
    {
        let dir = tables.shuffle_dir(Split::Exchange, 100 + index);
        let mut spec = tables.spec();
        spec.tables
            .insert("c".to_string(), tables.root.path().join("c").into());
        let spec = spec
            .with_shuffle_dir(&dir)
            .with_shuffle_compression(compression);
        let result = host.run_distributed(sql, &spec).await.unwrap();
        answers.push(answer(&result.batches, true));
        bytes.push(bucket_bytes(&dir));
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[0], answers[2]);
    assert!(
        bytes[0] > 0 && bytes[0] * 3 / 2 < bytes[1],
        "LZ4 {} bytes, uncompressed {} bytes",
        bytes[0],
        bytes[1]
    );
    // The default for a local directory is no compression (the S3 test
    // reads back LZ4 objects, the default there).
    assert_eq!(bytes[2], bytes[1], "auto wrote {} bytes", bytes[2]);
}
