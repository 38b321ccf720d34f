//! Bounded resources: a table of a thousand files runs on a bounded pool of
//! worker processes, whatever its task count. Real `dfx worker` processes.

mod common;

use std::collections::BTreeSet;

use common::*;
use dfx_host::SessionSpec;

#[tokio::test]
async fn a_table_of_a_thousand_files_runs_on_at_most_max_workers_processes() {
    const FILES: u64 = 1000;
    const ROWS: u64 = 10;
    let dir = tempfile::tempdir().unwrap();
    let table = numbers_table(dir.path(), FILES, ROWS);
    assert_eq!(std::fs::read_dir(&table).unwrap().count(), FILES as usize);
    let spec = SessionSpec {
        tables: [("t".to_string(), table.into())].into(),
        target_partitions: 4,
        ..SessionSpec::default()
    }
    .with_shuffle_dir(dir.path().join("shuffle"));
    let host = host().max_workers(Some(2));
    // (Each task's plan lists every file of the scan, so the cost grows with
    // files squared; a per-task plan would fix that. Kept to one scan here.)
    let result = host
        .run_distributed(
            "SELECT count(*) AS n, sum(v) AS s, count(DISTINCT k % 1000) AS d FROM t",
            &spec,
        )
        .await
        .unwrap();
    // By hand: keys 0..10000 once each; v = k % 7 sums to 1428 full weeks
    // of 21 plus 0+1+2+3 for the last four keys; k % 1000 takes every value.
    let total = FILES * ROWS;
    let sum: u64 = (0..total).map(|k| k % 7).sum();
    assert_eq!(sum, 1428 * 21 + 6);
    assert_eq!(
        rows(&result.batches),
        vec![vec![i(total as i64), i(sum as i64), i(1000)]]
    );
    // One map per file (a table's contract: a task per file) at least.
    let tasks = result.task_reports.len();
    assert!(tasks >= FILES as usize, "{tasks} tasks");
    let workers: BTreeSet<u32> = result
        .task_reports
        .values()
        .map(|r| r.worker.expect("a pooled task names its worker"))
        .collect();
    assert!(
        workers.len() <= 2,
        "{tasks} tasks ran on {} processes: {workers:?}",
        workers.len()
    );
    let ended = host.shutdown().await;
    assert_eq!(ended.killed, 0, "{ended:?}");
    assert!(ended.exited <= 2, "{ended:?}");
}

/// A spec over `numbers_table(dir, 4, 40_000)` with a memory limit.
fn limited_spec(dir: &std::path::Path, limit: Option<u64>, name: &str) -> SessionSpec {
    let mut spec = SessionSpec {
        tables: [("t".to_string(), dir.join("t").into())].into(),
        ..SessionSpec::default()
    }
    .with_shuffle_dir(dir.join(name));
    spec.memory_limit = limit;
    spec
}

#[tokio::test]
async fn a_memory_limit_reaches_the_stage_operators_in_each_worker() {
    let dir = tempfile::tempdir().unwrap();
    numbers_table(dir.path(), 4, 40_000);
    let host = host();
    const JOIN: &str = "SELECT count(*) AS n FROM t a JOIN t b ON a.k = b.k";

    // Without a limit the join answers...
    let result = host
        .run_distributed(JOIN, &limited_spec(dir.path(), None, "unlimited"))
        .await
        .unwrap();
    assert_eq!(rows(&result.batches), vec![vec![i(160_000)]]);

    // ...with 64 KiB per task its build side (80 000 keys, which a hash join
    // cannot spill) does not fit: the pool is there, below the plugin's
    // writer, although every context crossing the FFI boundary loses it.
    let err = host
        .run_distributed(JOIN, &limited_spec(dir.path(), Some(64 << 10), "join"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("Resources exhausted"), "{err}");
    assert!(err.contains("stage "), "{err}");

    // A sort spills instead. The window's stage sorts each of its two hash
    // partitions (about 200 000 rows of two Int64 columns, over 3 MiB) under
    // a 1 MiB limit, so it must spill; the answer is an unlimited local run's.
    let big = tempfile::tempdir().unwrap();
    numbers_table(big.path(), 4, 100_000);
    let window = "SELECT sum(rn * k) AS s, count(*) AS n FROM \
                  (SELECT k, row_number() OVER (PARTITION BY v ORDER BY k) AS rn FROM t)";
    let local = host
        .run_local(window, &limited_spec(big.path(), None, "local"))
        .await
        .unwrap();
    let spilled = host
        .run_distributed(window, &limited_spec(big.path(), Some(1 << 20), "window"))
        .await
        .unwrap();
    assert_eq!(rows(&spilled.batches), rows(&local));
    assert_eq!(rows(&local)[0][1], i(400_000));
    host.shutdown().await;
}
