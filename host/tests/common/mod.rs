//! Shared by the host's integration tests: the real plugin file, the real
//! `dfx` binary, and a hand-checked fixture the tests write themselves.
//!
//! # The fixture
//!
//! Table `lineitem`, four Parquet files of two rows each (one partition, so
//! one task, per file). Prices and rates are binary fractions, so every
//! expected value below is exact in f64.
//!
//! | file | l_orderkey | l_returnflag | l_quantity | l_extendedprice | l_discount | l_tax | net revenue = price*(1-disc)*(1+tax) |
//! |------|-----------:|:------------:|-----------:|----------------:|-----------:|------:|------------------:|
//! | 0    | 1          | A            | 1          | 100             | 0.5        | 0     | 50                |
//! | 0    | 2          | N            | 2          | 200             | 0          | 0.5   | 300               |
//! | 1    | 3          | A            | 3          | 300             | 0.25       | 0     | 225               |
//! | 1    | 4          | R            | 4          | 400             | 0          | 0.25  | 500               |
//! | 2    | 5          | N            | 5          | 500             | 0.5        | 0.5   | 375               |
//! | 2    | 6          | R            | 6          | 600             | 0.25       | 0.25  | 562.5             |
//! | 3    | 7          | A            | 7          | 700             | 0          | 0     | 700               |
//! | 3    | 8          | N            | 8          | 800             | 0.125      | 0     | 700               |
//!
//! Grouped by flag (rows; count; sum qty; sum price; sum net;
//! weighted avg of qty by price = sum(qty*price)/sum(price)):
//!
//! - A: rows 1,3,7; 3; 1+3+7 = 11; 100+300+700 = 1100; 50+225+700 = 975;
//!   (100+900+4900)/1100 = 5900/1100 = 5.363636…
//! - N: rows 2,5,8; 3; 2+5+8 = 15; 200+500+800 = 1500; 300+375+700 = 1375;
//!   (400+2500+6400)/1500 = 9300/1500 = 6.2
//! - R: rows 4,6; 2; 4+6 = 10; 400+600 = 1000; 500+562.5 = 1062.5;
//!   (1600+3600)/1000 = 5200/1000 = 5.2
//!
//! Every file holds two different flags, so a partial aggregate by flag
//! emits 2 rows per file: 8 partial rows in all. By order key parity
//! (`l_orderkey % 2`), every file again holds one even and one odd key:
//! even keys 2,4,6,8 have prices 200+400+600+800 = 2000, odd keys 1,3,5,7
//! have 100+300+500+700 = 1600.

#![allow(dead_code)] // each test binary uses a different part of this module

pub mod tmux;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{Array, Float64Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::physical_plan::ExecutionPlan;
use dfx_host::driver::stages::{Stage, stages};
use dfx_host::session::{SessionSpec, Split, build_session};
use dfx_host::{Host, WorkerCommand, WorkerMode};

/// Group by flag: count, sum of quantity, sum of price.
pub const BY_FLAG: &str = "SELECT l_returnflag, count(*) AS n, sum(l_quantity) AS qty, \
     sum(l_extendedprice) AS price FROM lineitem GROUP BY l_returnflag ORDER BY l_returnflag";

/// The hand-checked answer of [`BY_FLAG`].
pub fn by_flag_expected() -> Vec<Vec<Value>> {
    vec![
        vec![s("A"), i(3), f(11.0), f(1100.0)],
        vec![s("N"), i(3), f(15.0), f(1500.0)],
        vec![s("R"), i(2), f(10.0), f(1000.0)],
    ]
}

/// The plugin's scalar function inside a sum, and its aggregate.
pub const FUNCTIONS: &str = "SELECT l_returnflag, \
     sum(dfx_net_revenue(l_extendedprice, l_discount, l_tax)) AS net, \
     dfx_weighted_avg(l_quantity, l_extendedprice) AS wavg \
     FROM lineitem GROUP BY l_returnflag ORDER BY l_returnflag";

/// The hand-checked answer of [`FUNCTIONS`].
pub fn functions_expected() -> Vec<Vec<Value>> {
    vec![
        vec![s("A"), f(975.0), f(5900.0 / 1100.0)],
        vec![s("N"), f(1375.0), f(6.2)],
        vec![s("R"), f(1062.5), f(5.2)],
    ]
}

/// Two aggregates under a UNION ALL: two independent stages.
pub const UNION: &str = "SELECT k, v FROM (\
     SELECT l_returnflag AS k, sum(l_quantity) AS v FROM lineitem GROUP BY l_returnflag \
     UNION ALL \
     SELECT CAST(l_orderkey % 2 AS VARCHAR) AS k, sum(l_extendedprice) AS v FROM lineitem \
     GROUP BY CAST(l_orderkey % 2 AS VARCHAR)) ORDER BY k";

/// The hand-checked answer of [`UNION`] (digits sort before letters).
pub fn union_expected() -> Vec<Vec<Value>> {
    vec![
        vec![s("0"), f(2000.0)],
        vec![s("1"), f(1600.0)],
        vec![s("A"), f(11.0)],
        vec![s("N"), f(15.0)],
        vec![s("R"), f(10.0)],
    ]
}

/// A cell of a result, compared with floats to 1e-9 relative.
#[derive(Debug, Clone)]
pub enum Value {
    Str(String),
    Int(i64),
    Float(f64),
}

pub fn s(v: &str) -> Value {
    Value::Str(v.to_string())
}
pub fn i(v: i64) -> Value {
    Value::Int(v)
}
pub fn f(v: f64) -> Value {
    Value::Float(v)
}

impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Value::Str(a), Value::Str(b)) => a == b,
            (Value::Int(a), Value::Int(b)) => a == b,
            (Value::Float(a), Value::Float(b)) => {
                (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
            }
            _ => false,
        }
    }
}

/// The rows of `batches` as comparable values.
pub fn rows(batches: &[RecordBatch]) -> Vec<Vec<Value>> {
    let mut out = Vec::new();
    for batch in batches {
        for row in 0..batch.num_rows() {
            let mut cells = Vec::new();
            for column in batch.columns() {
                let any = column.as_any();
                let cell = if let Some(a) = any.downcast_ref::<Int64Array>() {
                    Value::Int(a.value(row))
                } else if let Some(a) = any.downcast_ref::<Float64Array>() {
                    Value::Float(a.value(row))
                } else {
                    let formatter =
                        ArrayFormatter::try_new(column.as_ref(), &FormatOptions::default())
                            .expect("a displayable column");
                    Value::Str(formatter.value(row).to_string())
                };
                cells.push(cell);
            }
            out.push(cells);
        }
    }
    out
}

/// The plugin file: `DFX_PLUGIN`, else `target/<profile>/libdfx_plugin.so`
/// beside the directory holding this test binary.
pub fn plugin_path() -> PathBuf {
    if let Some(path) = std::env::var_os("DFX_PLUGIN").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("a test binary inside target/<profile>/deps");
    let path = profile_dir.join(dfx_abi::plugin_file_name());
    assert!(
        path.is_file(),
        "the plugin file {} is missing: run `cargo build -p dfx-plugin` first, or set DFX_PLUGIN",
        path.display()
    );
    path
}

/// The plugin built with its `test-hooks` feature (fault injection compiled
/// in): `DFX_PLUGIN_TEST_HOOKS`, else `target/<profile>/test-hooks/`, where
/// `ffi-tests/build-plugins.sh` puts it.
pub fn test_hooks_plugin_path() -> PathBuf {
    if let Some(path) = std::env::var_os("DFX_PLUGIN_TEST_HOOKS").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let shipped = plugin_path();
    let path = shipped
        .parent()
        .expect("the plugin file's directory")
        .join("test-hooks")
        .join(dfx_abi::plugin_file_name());
    assert!(
        path.is_file(),
        "the test-hooks plugin {} is missing: run `ffi-tests/build-plugins.sh` first, or set \
         DFX_PLUGIN_TEST_HOOKS",
        path.display()
    );
    path
}

/// A host whose driver and `dfx worker`s load the test-hooks plugin, the
/// workers with `env` set (the hooks read it).
pub fn hooks_host(env: &[(&str, &str)]) -> Host {
    let plugin = dfx_abi::load(&test_hooks_plugin_path()).expect("the test-hooks plugin loads");
    let mut command = WorkerCommand::dfx(dfx_bin());
    for (key, value) in env {
        command = command.env(key, value);
    }
    Host::with_worker(plugin, command)
}

/// A table `t` of `files` Parquet files, `rows_per_file` rows each: `k`
/// runs 0, 1, 2, ... over all files (unique), `v = k % 7`. Returns its
/// directory.
pub fn numbers_table(dir: &Path, files: u64, rows_per_file: u64) -> PathBuf {
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::parquet::arrow::ArrowWriter;

    let table = dir.join("t");
    std::fs::create_dir_all(&table).unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
    ]));
    for file in 0..files {
        let start = (file * rows_per_file) as i64;
        let keys: Vec<i64> = (start..start + rows_per_file as i64).collect();
        let values: Vec<i64> = keys.iter().map(|k| k % 7).collect();
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from(keys)),
                Arc::new(Int64Array::from(values)),
            ],
        )
        .unwrap();
        let out = std::fs::File::create(table.join(format!("part-{file}.parquet"))).unwrap();
        let mut writer = ArrowWriter::try_new(out, Arc::clone(&schema), None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
    }
    table
}

/// The real plugin, loaded from disk.
pub fn plugin() -> dfx_host::Plugin {
    dfx_abi::load(&plugin_path()).expect("the plugin file passes the handshake")
}

/// The file of map `map` of stage `stage` under `dir`, as the plugin names it
/// (the plugin loaded once for every name a test asks).
pub fn map_file(dir: &Path, stage: u64, map: usize) -> PathBuf {
    static NAMER: std::sync::OnceLock<dfx_host::Plugin> = std::sync::OnceLock::new();
    NAMER.get_or_init(plugin).map_path(dir, stage, map)
}

/// The real `dfx` binary of this build.
pub fn dfx_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_dfx"))
}

/// A host whose workers are the real `dfx worker`.
pub fn host() -> Host {
    Host::with_worker(plugin(), WorkerCommand::dfx(dfx_bin()))
}

/// A host whose workers are `/bin/sh -c SCRIPT sh ENVELOPE`, one process per
/// task, with `$DFX` the real `dfx` binary: for tests that interfere with a
/// worker.
pub fn host_with_script(script: &str) -> Host {
    let command = WorkerCommand::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .env("DFX", dfx_bin());
    Host::with_worker(plugin(), command).worker_mode(WorkerMode::Process)
}

/// The fixture: a temp directory holding `lineitem/part-{0..3}.parquet`.
pub struct Fixture {
    pub root: tempfile::TempDir,
}

impl Fixture {
    pub fn new() -> Self {
        let root = tempfile::Builder::new()
            .prefix("dfx-host-test-")
            .tempdir()
            .expect("a temp dir");
        let dir = root.path().join("lineitem");
        std::fs::create_dir_all(&dir).unwrap();
        #[rustfmt::skip]
        let data: [(i64, &str, f64, f64, f64, f64); 8] = [
            (1, "A", 1.0, 100.0, 0.5, 0.0),
            (2, "N", 2.0, 200.0, 0.0, 0.5),
            (3, "A", 3.0, 300.0, 0.25, 0.0),
            (4, "R", 4.0, 400.0, 0.0, 0.25),
            (5, "N", 5.0, 500.0, 0.5, 0.5),
            (6, "R", 6.0, 600.0, 0.25, 0.25),
            (7, "A", 7.0, 700.0, 0.0, 0.0),
            (8, "N", 8.0, 800.0, 0.125, 0.0),
        ];
        let schema = Arc::new(Schema::new(vec![
            Field::new("l_orderkey", DataType::Int64, false),
            Field::new("l_returnflag", DataType::Utf8, false),
            Field::new("l_quantity", DataType::Float64, false),
            Field::new("l_extendedprice", DataType::Float64, false),
            Field::new("l_discount", DataType::Float64, false),
            Field::new("l_tax", DataType::Float64, false),
        ]));
        for (file, rows) in data.chunks(2).enumerate() {
            let columns: Vec<Arc<dyn Array>> = vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.2))),
                Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.3))),
                Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.4))),
                Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.5))),
            ];
            let batch = RecordBatch::try_new(Arc::clone(&schema), columns).unwrap();
            let out = std::fs::File::create(dir.join(format!("part-{file}.parquet"))).unwrap();
            let mut writer = ArrowWriter::try_new(out, Arc::clone(&schema), None).unwrap();
            writer.write(&batch).unwrap();
            writer.close().unwrap();
        }
        Self { root }
    }

    pub fn table_dir(&self) -> PathBuf {
        self.root.path().join("lineitem")
    }

    /// A shuffle directory inside the fixture that does not exist yet.
    pub fn shuffle_dir(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }

    /// A spec over the fixture with no shuffle directory.
    pub fn spec(&self) -> SessionSpec {
        SessionSpec::new([("lineitem".to_string(), self.table_dir())])
    }

    /// A spec over the fixture with shuffle directory `name`.
    pub fn distributed_spec(&self, name: &str) -> SessionSpec {
        self.spec().with_shuffle_dir(self.shuffle_dir(name))
    }
}

/// The stage of `BY_FLAG`'s plan over the table (it reads no other stage),
/// and one stage that reads it.
pub async fn leaf_and_reader(spec: &SessionSpec) -> (u64, u64) {
    let (_, stages) = planned(spec, BY_FLAG).await;
    let leaf = stages.iter().find(|s| s.info.deps.is_empty()).unwrap();
    let reader = stages
        .iter()
        .find(|s| s.info.deps.contains(&leaf.stage_id()))
        .unwrap();
    (leaf.stage_id(), reader.stage_id())
}

/// `spec` with adaptive coalescing off: every map of every stage runs as a
/// task of its own, for tests about the tasks themselves.
pub fn one_task_per_partition(mut spec: SessionSpec) -> SessionSpec {
    spec.engine_options
        .insert("coalesce".to_string(), "off".to_string());
    spec
}

/// The plan `spec`'s session makes of `sql` (planned once, as the driver
/// does) and its stages in pre-order.
pub async fn planned(spec: &SessionSpec, sql: &str) -> (Arc<dyn ExecutionPlan>, Vec<Stage>) {
    let plugin = plugin();
    let session = build_session(&plugin, spec).await.unwrap();
    let plan = session.physical_plan(sql).await.unwrap();
    let stages = stages(&plugin, &plan).unwrap();
    (plan, stages)
}

/// Every row of `batches` as one display string, sorted: for comparing
/// answers whose row order is not part of the query.
pub fn sorted_rows(batches: &[RecordBatch]) -> Vec<String> {
    let mut out = Vec::new();
    for batch in batches {
        let formatters: Vec<ArrayFormatter> = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &FormatOptions::default()).unwrap())
            .collect();
        for row in 0..batch.num_rows() {
            let cells: Vec<String> = formatters
                .iter()
                .map(|f| f.value(row).to_string())
                .collect();
            out.push(cells.join(" | "));
        }
    }
    out.sort();
    out
}

/// Both split modes, exchange (the default) first.
pub const SPLITS: [Split; 2] = Split::ALL;

/// A published map file split into its segments and its commit marker
/// (parsed), by its footer's account.
pub fn split_map_file(path: &Path) -> (Vec<u8>, serde_json::Value) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("map file {}: {e}", path.display()));
    let range = dfx_abi::map_marker_range(&bytes)
        .unwrap_or_else(|| panic!("{} does not end with a marker", path.display()));
    let marker = serde_json::from_slice(&bytes[range.clone()])
        .unwrap_or_else(|e| panic!("marker of {}: {e}", path.display()));
    (bytes[..range.start].to_vec(), marker)
}

/// The commit marker closing a published map file, parsed.
pub fn read_marker(path: &Path) -> serde_json::Value {
    split_map_file(path).1
}

/// Every file below `dir`, relative to it, sorted.
pub fn files_below(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                out.push(
                    path.strip_prefix(root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// File names directly in `dir`, sorted.
pub fn file_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Pids of live (not zombie) processes whose command line mentions `marker`,
/// other than this test process.
pub fn live_processes_mentioning(marker: &str) -> Vec<u32> {
    let me = std::process::id();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if !String::from_utf8_lossy(&cmdline).contains(marker) {
            continue;
        }
        // A zombie has ended; only its exit status is left to collect.
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
        if state != Some(Some('Z')) {
            found.push(pid);
        }
    }
    found
}

/// Wait (bounded) until `done` holds; false if it never did. Not a timing
/// assertion: the bound only keeps a broken build from hanging the suite.
pub fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    done()
}
