//! Plan shapes: `dfx explain` of the 22 TPC-H queries, in both split modes,
//! kept whole as snapshot files under `host/tests/snapshots/`, so that a
//! change of plan shape (a stage more or less, a join planned otherwise, a
//! reader in another place) is seen in review as a diff of those files.
//!
//! Explain only: the real `dfx` binary and plugin plan each query over tiny
//! TPC-H tables (scale 0.01, two files a table) and nothing runs. The text
//! is the binary's, with the one machine-specific part, where the tables
//! are, written as `$TPCH`.
//!
//! A differing or missing snapshot fails (`scripts/test.sh` sets
//! `INSTA_UPDATE=no`; CI's `CI=true` does the same). After a change meant to
//! alter plans, rewrite them and review the diff:
//!
//! ```text
//! INSTA_UPDATE=always cargo test -p dfx-host --test plan_shapes
//! git diff host/tests/snapshots/
//! ```

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use dfx_host::session::Split;
use dfx_host::tpch::datagen::{TABLES, ensure_dataset};
use dfx_host::tpch::queries::query;

const SCALE: f64 = 0.01;
const PARTITIONS: usize = 2;

/// The TPC-H tables, generated once per test process. They live in the
/// build's scratch directory, so a later run reuses them (a dataset is
/// marked complete only once whole, and concurrent runs stage apart).
fn dataset() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("plan-shapes");
        let (dataset, _) = ensure_dataset(&dir, SCALE, PARTITIONS, false)
            .unwrap_or_else(|e| panic!("TPC-H tables in {}: {e}", dir.display()));
        dataset.root
    })
}

/// `dfx explain` of TPC-H query `number` under `split`, with where the
/// tables are written as `$TPCH`.
fn explain(split: Split, number: u8) -> String {
    let root = dataset();
    let sql = query(number)
        .unwrap_or_else(|| panic!("no TPC-H query {number}"))
        .sql;
    let mut command = std::process::Command::new(common::dfx_bin());
    command
        .arg("explain")
        .arg("--plugin")
        .arg(common::plugin_path())
        .args(["--partitions", &PARTITIONS.to_string()])
        // The cuts, a map per partition (slices only regroup the maps).
        .args(["--partitions-per-task", "1"])
        .args(["--split", split.as_str()]);
    for table in TABLES {
        command
            .arg("--table")
            .arg(format!("{table}={}", root.join(table).display()));
    }
    let output = command.arg(sql).output().expect("dfx explain starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "q{number}, split {split}: dfx explain failed\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        !stdout.trim().is_empty(),
        "q{number}, split {split}: no plan"
    );
    // A scan names its files as object store paths: without the leading `/`.
    let root = root.to_string_lossy();
    stdout
        .replace(root.as_ref(), "$TPCH")
        .replace(root.trim_start_matches('/'), "$TPCH")
}

/// Compare the plan of query `number` under `split` with its snapshot.
fn check(split: Split, number: u8) {
    let plan = explain(split, number);
    insta::with_settings!({
        description => format!("dfx explain --split {split} of TPC-H q{number}"),
        omit_expression => true,
    }, {
        insta::assert_snapshot!(format!("{split}_q{number:02}"), plan);
    });
}

/// One test per query and split, so that each differing plan is reported
/// (and its new snapshot written for review) on its own.
macro_rules! plan_shapes {
    ($($number:literal: $exchange:ident, $aggregate:ident;)*) => {
        $(
            #[test]
            fn $exchange() {
                check(Split::Exchange, $number);
            }

            #[test]
            fn $aggregate() {
                check(Split::Aggregate, $number);
            }
        )*
    };
}

plan_shapes! {
    1: q01_split_at_every_exchange, q01_split_at_aggregates;
    2: q02_split_at_every_exchange, q02_split_at_aggregates;
    3: q03_split_at_every_exchange, q03_split_at_aggregates;
    4: q04_split_at_every_exchange, q04_split_at_aggregates;
    5: q05_split_at_every_exchange, q05_split_at_aggregates;
    6: q06_split_at_every_exchange, q06_split_at_aggregates;
    7: q07_split_at_every_exchange, q07_split_at_aggregates;
    8: q08_split_at_every_exchange, q08_split_at_aggregates;
    9: q09_split_at_every_exchange, q09_split_at_aggregates;
    10: q10_split_at_every_exchange, q10_split_at_aggregates;
    11: q11_split_at_every_exchange, q11_split_at_aggregates;
    12: q12_split_at_every_exchange, q12_split_at_aggregates;
    13: q13_split_at_every_exchange, q13_split_at_aggregates;
    14: q14_split_at_every_exchange, q14_split_at_aggregates;
    15: q15_split_at_every_exchange, q15_split_at_aggregates;
    16: q16_split_at_every_exchange, q16_split_at_aggregates;
    17: q17_split_at_every_exchange, q17_split_at_aggregates;
    18: q18_split_at_every_exchange, q18_split_at_aggregates;
    19: q19_split_at_every_exchange, q19_split_at_aggregates;
    20: q20_split_at_every_exchange, q20_split_at_aggregates;
    21: q21_split_at_every_exchange, q21_split_at_aggregates;
    22: q22_split_at_every_exchange, q22_split_at_aggregates;
}

/// Every query has a snapshot, and no snapshot is left from a test that is
/// gone: a snapshot nobody checks would still look like a guarantee.
#[test]
fn every_query_and_split_has_one_snapshot_and_no_other_is_kept() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots");
    let mut found: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("plan_shapes__") && name.ends_with(".snap"))
        .collect();
    found.sort();
    let mut wanted: Vec<String> = Split::ALL
        .iter()
        .flat_map(|split| (1..=22).map(move |n| format!("plan_shapes__{split}_q{n:02}.snap")))
        .collect();
    wanted.sort();
    assert_eq!(found, wanted);
}
