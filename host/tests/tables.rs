//! Tables as DataFusion defines them: every format, one file, a glob, Hive
//! partitions, a `CREATE EXTERNAL TABLE` script, and the errors of bad
//! input, each distributed through real workers and compared with the
//! hand-worked answer and the one-process run.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

use common::*;
use datafusion::arrow::array::{Array, Float64Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::parquet::arrow::ArrowWriter;
use dfx_host::session::{SessionSpec, TableDefinition, TableFormat};

/// The sales rows: two files of three, `(id, region, amount)`.
const ROWS: [[(i64, &str, f64); 3]; 2] = [
    [(1, "east", 10.0), (2, "west", 20.0), (3, "east", 30.0)],
    [(4, "north", 40.0), (5, "west", 50.0), (6, "east", 60.0)],
];

const BY_REGION: &str = "SELECT region, count(*) AS n, sum(amount) AS total FROM sales \
                         GROUP BY region ORDER BY region";

/// `BY_REGION` over both files, worked by hand.
fn by_region_expected() -> Vec<String> {
    vec![
        "east | 3 | 100.0".to_string(),
        "north | 1 | 40.0".to_string(),
        "west | 2 | 70.0".to_string(),
    ]
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("region", DataType::Utf8, false),
        Field::new("amount", DataType::Float64, false),
    ]))
}

fn batch(rows: &[(i64, &str, f64)]) -> RecordBatch {
    let columns: Vec<Arc<dyn Array>> = vec![
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
        Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.2))),
    ];
    RecordBatch::try_new(schema(), columns).unwrap()
}

/// Write `batch` as `path` in `format` (CSV with a header row).
fn write(path: &Path, format: TableFormat, batch: &RecordBatch) {
    let file = std::fs::File::create(path).unwrap();
    match format {
        TableFormat::Parquet => {
            let mut writer = ArrowWriter::try_new(file, batch.schema(), None).unwrap();
            writer.write(batch).unwrap();
            writer.close().unwrap();
        }
        TableFormat::Csv => {
            let mut writer = datafusion::arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(file);
            writer.write(batch).unwrap();
        }
        TableFormat::Json => {
            let mut writer = datafusion::arrow::json::LineDelimitedWriter::new(file);
            writer.write(batch).unwrap();
            writer.finish().unwrap();
        }
        TableFormat::Arrow => {
            let mut writer =
                datafusion::arrow::ipc::writer::FileWriter::try_new(file, &batch.schema()).unwrap();
            writer.write(batch).unwrap();
            writer.finish().unwrap();
        }
    }
}

/// The sales table as a directory of two files in `format`.
fn sales_dir(root: &Path, format: TableFormat) -> std::path::PathBuf {
    let dir = root.join(format!("sales-{format}"));
    std::fs::create_dir_all(&dir).unwrap();
    for (i, rows) in ROWS.iter().enumerate() {
        let name = format!("part-{i}{}", format.extension());
        write(&dir.join(name), format, &batch(rows));
    }
    dir
}

/// `sql` over `sales` run in one process and distributed in both split
/// modes; every answer.
async fn answers(root: &Path, sales: TableDefinition, sql: &str) -> Vec<Vec<String>> {
    let host = host();
    let spec = SessionSpec::new([("sales".to_string(), sales)]);
    let mut out = vec![sorted_rows(&host.run_local(sql, &spec).await.unwrap())];
    for split in SPLITS {
        // A location of its own for each run: a used one is refused.
        let dir = tempfile::tempdir_in(root).unwrap().keep();
        let spec = spec.clone().with_shuffle_dir(&dir).with_split(split);
        let result = host.run_distributed(sql, &spec).await.unwrap();
        out.push(sorted_rows(&result.batches));
    }
    out
}

#[tokio::test]
async fn every_format_gives_the_hand_worked_answer_distributed_and_in_one_process() {
    let root = tempfile::tempdir().unwrap();
    for format in TableFormat::ALL {
        let dir = sales_dir(root.path(), format);
        let mut table = TableDefinition::new(dir.display().to_string(), format);
        if format == TableFormat::Csv {
            table = table.with_option("format.has_header", "true");
        }
        for answer in answers(root.path(), table, BY_REGION).await {
            assert_eq!(answer, by_region_expected(), "{format}");
        }
    }
}

#[tokio::test]
async fn one_file_is_a_table_and_a_glob_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let dir = sales_dir(root.path(), TableFormat::Parquet);
    let one = TableDefinition::parquet(dir.join("part-1.parquet").display().to_string());
    let sql = "SELECT count(*) AS n, sum(amount) AS total FROM sales";
    for answer in answers(root.path(), one, sql).await {
        assert_eq!(answer, ["3 | 150.0"]);
    }
    // A glob is refused: the plan format would drop it, and a stage would
    // read the stray file beside the files it selects.
    std::fs::copy(dir.join("part-0.parquet"), dir.join("stray.parquet")).unwrap();
    let glob = TableDefinition::parquet(format!("{}/part-*.parquet", dir.display()));
    let err = refusal(glob).await;
    assert!(
        err.contains("table sales") && err.contains("is a glob"),
        "{err}"
    );
}

#[tokio::test]
async fn hive_partition_directories_are_columns() {
    let root = tempfile::tempdir().unwrap();
    let table = root.path().join("sales-hive");
    // region=<r>/part.parquet holding (id, amount) of that region's rows.
    let narrow = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("amount", DataType::Float64, false),
    ]));
    for region in ["east", "north", "west"] {
        let rows: Vec<(i64, f64)> = ROWS
            .iter()
            .flatten()
            .filter(|r| r.1 == region)
            .map(|r| (r.0, r.2))
            .collect();
        let dir = table.join(format!("region={region}"));
        std::fs::create_dir_all(&dir).unwrap();
        let columns: Vec<Arc<dyn Array>> = vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.1))),
        ];
        let batch = RecordBatch::try_new(Arc::clone(&narrow), columns).unwrap();
        write(&dir.join("part.parquet"), TableFormat::Parquet, &batch);
    }
    let hive =
        TableDefinition::parquet(table.display().to_string()).with_partition_column("region", None);
    for answer in answers(root.path(), hive.clone(), BY_REGION).await {
        assert_eq!(answer, by_region_expected());
    }
    // A filter on the partition column reads that directory only.
    let sql = "SELECT count(*) AS n FROM sales WHERE region = 'west'";
    for answer in answers(root.path(), hive, sql).await {
        assert_eq!(answer, ["2"]);
    }
}

fn dfx(args: &[&str]) -> Output {
    Command::new(dfx_bin())
        .args(args)
        .env("DFX_PLUGIN", plugin_path())
        .output()
        .expect("dfx starts")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_script_creates_its_tables_then_runs_and_prints_each_query() {
    let root = tempfile::tempdir().unwrap();
    let csv = sales_dir(root.path(), TableFormat::Csv);
    let json = sales_dir(root.path(), TableFormat::Json);
    let script = root.path().join("report.sql");
    std::fs::write(
        &script,
        format!(
            "CREATE EXTERNAL TABLE sales STORED AS CSV LOCATION '{}' \
             OPTIONS ('format.has_header' 'true');\n\
             CREATE EXTERNAL TABLE events STORED AS JSON LOCATION '{}';\n\
             {BY_REGION};\n\
             SELECT count(*) AS n FROM sales JOIN events ON sales.id = events.id \
             WHERE events.amount > 25;\n",
            csv.display(),
            json.display()
        ),
    )
    .unwrap();
    let out = dfx(&["run", "--format", "csv", "-f", script.to_str().unwrap()]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        stdout, "region,n,total\neast,3,100.0\nnorth,1,40.0\nwest,2,70.0\nn\n4\n",
        "{stderr}"
    );
    assert!(stderr.contains("query 2 of 2"), "{stderr}");

    // A table after a query: refused before anything runs.
    std::fs::write(
        &script,
        format!(
            "SELECT 1;\nCREATE EXTERNAL TABLE late STORED AS CSV LOCATION '{}';",
            csv.display()
        ),
    )
    .unwrap();
    let out = dfx(&["run", "-f", script.to_str().unwrap()]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(!out.status.success());
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("statement 2 creates table late after a query"),
        "{stderr}"
    );
}

#[test]
fn a_table_flag_takes_its_format_from_the_flag_or_the_extension() {
    let root = tempfile::tempdir().unwrap();
    let csv = sales_dir(root.path(), TableFormat::Csv);
    let json = sales_dir(root.path(), TableFormat::Json);
    let sql = "SELECT count(*) AS n FROM sales";
    // A file's extension says JSON.
    let file = format!("sales={}/part-1.json", json.display());
    let out = dfx(&["run", "--format", "csv", "--table", &file, sql]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "n\n3\n");
    // A directory's name says nothing: the flag does.
    let dir = format!("sales={}", csv.display());
    let out = dfx(&[
        "run",
        "--format",
        "csv",
        "--table-format",
        "csv",
        "--table",
        &dir,
        sql,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "n\n6\n");
}

/// The error building a driver's session over `sales`, as text.
async fn refusal(sales: TableDefinition) -> String {
    let spec = SessionSpec::new([("sales".to_string(), sales)]);
    match dfx_host::build_session(&plugin(), &spec).await {
        Ok(_) => panic!("the table was accepted"),
        Err(err) => err.to_string(),
    }
}

#[tokio::test]
async fn bad_tables_are_refused_naming_the_table_and_the_fault() {
    let root = tempfile::tempdir().unwrap();
    let dir = sales_dir(root.path(), TableFormat::Parquet);

    let empty = root.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let err = refusal(TableDefinition::parquet(empty.display().to_string())).await;
    assert!(
        err.contains("table sales") && err.contains("no .parquet file"),
        "{err}"
    );

    let missing = root.path().join("missing");
    let err = refusal(TableDefinition::parquet(missing.display().to_string())).await;
    assert!(
        err.contains("table sales") && err.contains("does not exist"),
        "{err}"
    );

    let corrupt = root.path().join("corrupt");
    std::fs::create_dir_all(&corrupt).unwrap();
    std::fs::copy(dir.join("part-0.parquet"), corrupt.join("part-0.parquet")).unwrap();
    std::fs::write(corrupt.join("part-1.parquet"), b"not parquet at all").unwrap();
    let err = refusal(TableDefinition::parquet(corrupt.display().to_string())).await;
    assert!(
        err.contains("table sales") && err.contains("part-1.parquet cannot be read as parquet"),
        "{err}"
    );

    let mixed = root.path().join("mixed");
    std::fs::create_dir_all(&mixed).unwrap();
    std::fs::copy(dir.join("part-0.parquet"), mixed.join("part-0.parquet")).unwrap();
    let as_text = Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, false)]));
    let text_ids = RecordBatch::try_new(
        as_text,
        vec![Arc::new(StringArray::from_iter_values(["seven"])) as Arc<dyn Array>],
    )
    .unwrap();
    write(
        &mixed.join("part-1.parquet"),
        TableFormat::Parquet,
        &text_ids,
    );
    let err = refusal(TableDefinition::parquet(mixed.display().to_string())).await;
    assert!(
        err.contains("table sales: column id is") && err.contains("part-0.parquet"),
        "{err}"
    );

    let clash =
        TableDefinition::parquet(dir.display().to_string()).with_partition_column("region", None);
    let err = refusal(clash).await;
    assert!(
        err.contains("partition column region is also a column of its files"),
        "{err}"
    );
}
