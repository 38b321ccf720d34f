//! Filters that cross stages, through real `dfx worker` processes and the
//! real plugin file, with the default `dfx_engine.join_filters = auto`.
//!
//! The tables (Parquet; `p` and `q` two files each, `b` one):
//!
//! ```text
//! b(k Int64, w Int64):           (1, 10) (2, 20) (null, 30) (3, 40)
//! p(k Int64, x Int64, v Int64):  row i = (1, 0, 0) (1, 1, 1) (2, 2, 2) (3, 3, 3)
//!                                (null, 4, 4), then (1000 + i, i, i) up to
//!                                i = 199 999
//! q(x Int64, y Int64):           row i = (i, i % 3), i < 200 000
//! ```
//!
//! `b JOIN (p JOIN q ON p.x = q.x) ON b.k = p.k`: the rows i = 0..3 of `p`
//! match (the null key matches nothing), each meets one row of `q`, so
//! `count(*)` is 4 and `sum(p.v)` is 0 + 1 + 2 + 3 = 6. `p` and `q` are
//! large enough to be joined partitioned, each hashed by its own stage;
//! `b`, small, is broadcast to the join above, whose filter reaches `p`'s
//! stage through the partitioned join.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use datafusion::arrow::array::Int64Array;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::parquet::arrow::ArrowWriter;
use dfx_host::SessionSpec;
use dfx_host::session::Split;

const ROWS: i64 = 200_000;

fn write(dir: &Path, name: &str, columns: Vec<(&str, Vec<Option<i64>>)>) {
    let table = dir.join(name);
    std::fs::create_dir_all(&table).unwrap();
    let schema = Arc::new(Schema::new(
        columns
            .iter()
            .map(|(n, _)| Field::new(*n, DataType::Int64, true))
            .collect::<Vec<_>>(),
    ));
    let arrays = columns
        .into_iter()
        .map(|(_, values)| Arc::new(Int64Array::from(values)) as _)
        .collect();
    let batch = RecordBatch::try_new(Arc::clone(&schema), arrays).unwrap();
    // Two files of a large table, so it is read in two partitions.
    let files = if batch.num_rows() > 1000 { 2 } else { 1 };
    let per_file = batch.num_rows().div_ceil(files);
    for file in 0..files {
        let start = file * per_file;
        let part = batch.slice(start, per_file.min(batch.num_rows() - start));
        let out = std::fs::File::create(table.join(format!("part-{file}.parquet"))).unwrap();
        let mut writer = ArrowWriter::try_new(out, Arc::clone(&schema), None).unwrap();
        writer.write(&part).unwrap();
        writer.close().unwrap();
    }
}

fn tables(dir: &Path) -> SessionSpec {
    write(
        dir,
        "b",
        vec![
            ("k", vec![Some(1), Some(2), None, Some(3)]),
            ("w", vec![Some(10), Some(20), Some(30), Some(40)]),
        ],
    );
    let p_keys: Vec<Option<i64>> = (0..ROWS)
        .map(|i| match i {
            0 | 1 => Some(1),
            2 => Some(2),
            3 => Some(3),
            4 => None,
            i => Some(1000 + i),
        })
        .collect();
    let all: Vec<Option<i64>> = (0..ROWS).map(Some).collect();
    write(
        dir,
        "p",
        vec![("k", p_keys), ("x", all.clone()), ("v", all.clone())],
    );
    let thirds: Vec<Option<i64>> = (0..ROWS).map(|i| Some(i % 3)).collect();
    write(dir, "q", vec![("x", all), ("y", thirds)]);
    SessionSpec::new(["b", "p", "q"].map(|t| (t.to_string(), dir.join(t))))
}

/// The filter on `b` keeps every row, but a build side that reads a whole
/// table is not filtered by under `auto` (its keys are the table's).
const SQL: &str = "SELECT count(*) AS n, sum(pq.v) AS s FROM b \
                   JOIN (SELECT p.k, p.v FROM p JOIN q ON p.x = q.x) pq ON b.k = pq.k \
                   WHERE b.w < 100";

#[tokio::test]
async fn a_filtered_probe_stage_publishes_only_matching_rows_through_real_workers() {
    let data = tempfile::tempdir().unwrap();
    let spec = tables(data.path());
    let host = host();
    let local = host.run_local(SQL, &spec).await.unwrap();
    assert_eq!(rows(&local), vec![vec![i(4), i(6)]]);
    for split in [Split::Exchange, Split::Aggregate] {
        let shuffle = data.path().join(format!("shuffle-{split}"));
        let spec = spec.clone().with_shuffle_dir(&shuffle).with_split(split);
        let result = host.run_distributed(SQL, &spec).await.unwrap();
        assert_eq!(rows(&result.batches), vec![vec![i(4), i(6)]], "{split}");
        if split == Split::Exchange {
            // `q` hashed whole (200 000 rows); `p` filtered down to its four
            // matching rows (a Bloom filter could keep a few more), where
            // unfiltered it would publish 200 000 more.
            let published: usize = result.task_rows.values().sum();
            assert!(
                (ROWS as usize..ROWS as usize + 1000).contains(&published),
                "{published} rows published: {:?}",
                result.stages
            );
            // The summary below the build stage's writer, the filter below
            // the probe stage's.
            let explained = host.explain(SQL, &spec).await.unwrap();
            assert_eq!(
                explained.matches("JoinFilterExec").count(),
                1,
                "{explained}"
            );
            assert!(explained.contains("KeySummaryExec"), "{explained}");
        }
    }
}
