//! Small Parquet tables whose answers are worked out by hand in the tests.
//!
//! `lineitem` (two files, so a two-partition scan really has two sources):
//!
//! | file | flag | quantity | price | discount | tax |
//! | ---- | ---- | -------- | ----- | -------- | --- |
//! | 1    | A    | 1        | 100   | 0.10     | 0.0 |
//! | 1    | A    | 2        | 200   | 0.00     | 0.1 |
//! | 1    | R    | 3        | 300   | 0.50     | 0.0 |
//! | 1    | N    | 4        | 400   | 0.25     | 0.5 |
//! | 2    | R    | 5        | 50    | 0.00     | 0.0 |
//! | 2    | N    | 6        | 60    | 0.50     | 0.5 |
//! | 2    | A    | 7        | 70    | 0.00     | 1.0 |
//! | 2    | N    | 8        | 80    | 0.25     | 0.0 |

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{Float64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::parquet::arrow::ArrowWriter;

use crate::session::SessionOptions;

/// One row of the `lineitem` fixture.
type Row = (&'static str, f64, f64, f64, f64);

/// The `lineitem` fixture, file by file (see the module docs).
pub const LINEITEM: [&[Row]; 2] = [
    &[
        ("A", 1.0, 100.0, 0.10, 0.0),
        ("A", 2.0, 200.0, 0.00, 0.1),
        ("R", 3.0, 300.0, 0.50, 0.0),
        ("N", 4.0, 400.0, 0.25, 0.5),
    ],
    &[
        ("R", 5.0, 50.0, 0.00, 0.0),
        ("N", 6.0, 60.0, 0.50, 0.5),
        ("A", 7.0, 70.0, 0.00, 1.0),
        ("N", 8.0, 80.0, 0.25, 0.0),
    ],
];

/// Write the `lineitem` fixture as Parquet files into `root/lineitem/` and
/// return that directory.
///
/// # Panics
///
/// On I/O errors: a fixture that cannot be written is a broken test machine.
pub fn write_lineitem(root: &Path) -> PathBuf {
    write_lineitem_with_price_factor(root, 1.0)
}

/// [`write_lineitem`] with every price multiplied by `factor`: the same files,
/// schema and partitioning, other answers. Overwriting the fixture with it
/// after a stage ran proves a later read used the stage files, not the table.
pub fn write_lineitem_with_price_factor(root: &Path, factor: f64) -> PathBuf {
    let dir = root.join("lineitem");
    std::fs::create_dir_all(&dir).expect("create the fixture directory");
    let schema = Arc::new(Schema::new(vec![
        Field::new("l_returnflag", DataType::Utf8, false),
        Field::new("l_quantity", DataType::Float64, false),
        Field::new("l_extendedprice", DataType::Float64, false),
        Field::new("l_discount", DataType::Float64, false),
        Field::new("l_tax", DataType::Float64, false),
    ]));
    for (index, rows) in LINEITEM.iter().enumerate() {
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(Float64Array::from_iter_values(
                    rows.iter().map(|r| r.2 * factor),
                )),
                Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.3))),
                Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.4))),
            ],
        )
        .expect("the fixture batch matches its schema");
        let file =
            File::create(dir.join(format!("part-{index}.parquet"))).expect("create a fixture file");
        let mut writer =
            ArrowWriter::try_new(file, Arc::clone(&schema), None).expect("a Parquet writer");
        writer.write(&batch).expect("write the fixture batch");
        writer.close().expect("finish the fixture file");
    }
    dir
}

/// Options for a distributing session over the `lineitem` fixture, written
/// into `root`, with the shuffle directory `root/shuffle`.
pub fn distributed_lineitem(root: &Path) -> SessionOptions {
    SessionOptions::distributed(&root.join("shuffle")).with_table("lineitem", &write_lineitem(root))
}

/// One aggregate per flag: quantities A 1+2+7, N 4+6+8, R 3+5.
///
/// Exchange split: a hash stage (scan + partial aggregate, buckets by flag)
/// read by a pass-through stage (final aggregate + sort) below the root's
/// merge. Aggregate split: one stage, the partial aggregate.
pub const AGGREGATE_SQL: &str = "SELECT l_returnflag, sum(l_quantity) AS qty, count(*) AS n \
     FROM lineitem GROUP BY l_returnflag ORDER BY l_returnflag";

/// [`AGGREGATE_SQL`]'s answer, worked out by hand from the fixture.
pub const AGGREGATE_ANSWER: &str = "\
+--------------+------+---+
| l_returnflag | qty  | n |
+--------------+------+---+
| A            | 10.0 | 3 |
| N            | 18.0 | 3 |
| R            | 8.0  | 2 |
+--------------+------+---+";

/// Two independent aggregates under a UNION ALL: two hash stages, siblings
/// (read by one pass-through stage in the exchange split).
pub const UNION_SQL: &str = "SELECT l_returnflag, sum(l_quantity) AS v FROM lineitem GROUP BY l_returnflag \
     UNION ALL \
     SELECT l_returnflag, max(l_extendedprice) AS v FROM lineitem GROUP BY l_returnflag \
     ORDER BY l_returnflag, v";

/// [`UNION_SQL`]'s answer: sums as above, maximum prices A 200, N 400, R 300.
pub const UNION_ANSWER: &str = "\
+--------------+-------+
| l_returnflag | v     |
+--------------+-------+
| A            | 10.0  |
| A            | 200.0 |
| N            | 18.0  |
| N            | 400.0 |
| R            | 8.0   |
| R            | 300.0 |
+--------------+-------+";

/// No aggregate and no repartition: one pass-through stage below the root's
/// merge in the exchange split; wrapped whole in the aggregate split.
pub const SCAN_SQL: &str =
    "SELECT l_returnflag, l_quantity FROM lineitem WHERE l_quantity > 5 ORDER BY l_quantity";

/// [`SCAN_SQL`]'s answer: quantities 6, 7, 8.
pub const SCAN_ANSWER: &str = "\
+--------------+------------+
| l_returnflag | l_quantity |
+--------------+------------+
| N            | 6.0        |
| A            | 7.0        |
| N            | 8.0        |
+--------------+------------+";

/// A self-join on the flag, then an aggregate: a join's build side is read
/// whole by every probe task (broadcast) or both sides are hashed on the key.
pub const JOIN_SQL: &str = "SELECT a.l_returnflag, count(*) AS n \
     FROM lineitem a JOIN lineitem b ON a.l_returnflag = b.l_returnflag \
     GROUP BY a.l_returnflag ORDER BY a.l_returnflag";

/// [`JOIN_SQL`]'s answer: pairs per flag, A 3·3, N 3·3, R 2·2.
pub const JOIN_ANSWER: &str = "\
+--------------+---+
| l_returnflag | n |
+--------------+---+
| A            | 9 |
| N            | 9 |
| R            | 4 |
+--------------+---+";
