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
        tables: [("t".to_string(), table)].into(),
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
