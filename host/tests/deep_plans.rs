//! Plans deeper than protobuf decoders allow by default: many scalar
//! subqueries in one select list, and a long chain of joins. Each is
//! planned by the driver, crosses into the plugin, is cut into stages,
//! encoded, vetted and decoded by real `dfx worker` processes; each answer
//! is checked against one worked out by hand and against a local run.

mod common;

use common::*;

/// Files and rows per file of the fixture: small, so the depth is the test.
const FILES: u64 = 2;
const ROWS_PER_FILE: u64 = 40;

/// `terms` scalar subqueries summed in one select list: the `i`-th counts
/// the rows with `v = i % 7` and `k >= i`.
fn scalar_subqueries(terms: u64) -> String {
    let terms: Vec<String> = (0..terms)
        .map(|i| format!("(SELECT count(*) FROM t WHERE v = {} AND k >= {i})", i % 7))
        .collect();
    format!("SELECT {} AS total", terms.join(" + "))
}

/// `scalar_subqueries(terms)`'s answer over `numbers_table(_, FILES,
/// ROWS_PER_FILE)`, counted row by row (`k` is 0.., `v = k % 7`).
fn scalar_subqueries_expected(terms: u64) -> i64 {
    let keys = 0..FILES * ROWS_PER_FILE;
    (0..terms)
        .map(|i| keys.clone().filter(|k| k % 7 == i % 7 && *k >= i).count() as i64)
        .sum()
}

/// `tables` filtered copies of `t` joined in a chain on their unique key
/// (each copy a filter and a projection deep, as a real query's are).
fn join_chain(tables: usize) -> String {
    let mut sql = "SELECT count(*) AS n, sum(t0.v) AS s, max(t".to_string();
    sql.push_str(&format!("{}.k) AS m FROM t t0", tables - 1));
    for j in 1..tables {
        sql.push_str(&format!(
            " JOIN (SELECT k, v + {j} AS v FROM t WHERE v >= 0) t{j} ON t{}.k = t{j}.k",
            j - 1
        ));
    }
    sql
}

async fn assert_distributed_equals_local(sql: &str, expected: Vec<Vec<Value>>) {
    let dir = tempfile::tempdir().unwrap();
    let table = numbers_table(dir.path(), FILES, ROWS_PER_FILE);
    let spec = dfx_host::SessionSpec {
        tables: [("t".to_string(), table.into())].into(),
        ..dfx_host::SessionSpec::default()
    };
    let host = host();
    let local = host.run_local(sql, &spec).await.unwrap();
    assert_eq!(rows(&local), expected, "local");
    let shuffle = dir.path().join("shuffle");
    let result = host
        .run_distributed(sql, &spec.clone().with_shuffle_dir(&shuffle))
        .await
        .unwrap_or_else(|err| panic!("distributed: {err}"));
    assert_eq!(rows(&result.batches), expected, "distributed");
    assert!(
        result.stages.len() > 1,
        "the plan was cut: {:?}",
        result.stages
    );
    host.shutdown().await;
}

#[tokio::test]
async fn thirty_scalar_subqueries_run_distributed_as_they_run_locally() {
    let sql = scalar_subqueries(30);
    // By hand for the first terms: 80 keys, 12 with v = 0 (0, 7, .., 77),
    // 12 with v = 1 and k >= 1 (1, 8, .., 78).
    assert_eq!(scalar_subqueries_expected(1), 12);
    assert_eq!(scalar_subqueries_expected(2), 12 + 12);
    assert_distributed_equals_local(&sql, vec![vec![i(scalar_subqueries_expected(30))]]).await;
}

#[tokio::test]
async fn join_chains_of_twenty_and_fifty_tables_run_distributed_as_they_run_locally() {
    // Every key meets itself once in each copy: every row, once.
    let total = (FILES * ROWS_PER_FILE) as i64;
    let sum: i64 = (0..total).map(|k| k % 7).sum();
    for tables in [20, 50] {
        assert_distributed_equals_local(
            &join_chain(tables),
            vec![vec![i(total), i(sum), i(total - 1)]],
        )
        .await;
    }
}
