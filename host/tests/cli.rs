//! The `dfx` binary and the embedding example, end to end.

mod common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::*;
use dfx_host::session::default_partitions_per_task;

fn dfx(args: &[&str]) -> Output {
    Command::new(dfx_bin())
        .args(args)
        .env("DFX_PLUGIN", plugin_path())
        .output()
        .expect("dfx starts")
}

/// `dfx args`, with `stdin` written to its standard input.
fn dfx_with_stdin(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(dfx_bin())
        .args(args)
        .env("DFX_PLUGIN", plugin_path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dfx starts");
    // Dropped after the write: dfx reads to the end of its input.
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().expect("dfx ends")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn dfx_run_prints_the_answer_and_a_summary_and_removes_its_temp_directory() {
    let fixture = Fixture::new();
    let table = format!("lineitem={}", fixture.table_dir().display());
    let answer = "l_returnflag,n,qty,price\nA,3,11.0,1100.0\nN,3,15.0,1500.0\nR,2,10.0,1000.0\n";
    let aggregate = ["--format", "csv", "--split", "aggregate"];
    let out = dfx(&[
        &["run", "--table", &table, "--partitions-per-task", "1"][..],
        &aggregate,
        &[BY_FLAG],
    ]
    .concat());
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(text(&out.stdout), answer);
    assert!(
        stderr.contains("stages: 1; waves: 1; tasks: 4; split: aggregate;"),
        "{stderr}"
    );
    assert!(stderr.contains("stage 1 (maps 4, buckets 1, "), "{stderr}");
    assert!(stderr.contains("1/0=2 1/1=2 1/2=2 1/3=2"), "{stderr}");
    assert!(stderr.contains("wall time"), "{stderr}");

    // By default a task runs as many partitions as this machine has cores:
    // the four files' partitions in fewer tasks, each publishing one file.
    let maps = 4usize.div_ceil(default_partitions_per_task().min(4));
    let out = dfx(&[&["run", "--table", &table][..], &aggregate, &[BY_FLAG]].concat());
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(text(&out.stdout), answer);
    assert!(
        stderr.contains(&format!("tasks: {maps}; split: aggregate;")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("stage 1 (maps {maps}, ")),
        "{stderr}"
    );

    // The default cuts at every exchange: the same answer, more stages.
    let out = dfx(&["run", "--table", &table, "--format", "csv", BY_FLAG]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(text(&out.stdout), answer);
    assert!(stderr.contains("split: exchange;"), "{stderr}");
    assert!(
        stderr.contains(&format!("stage 2 (maps {maps}, ")),
        "{stderr}"
    );
    let dir = stderr
        .lines()
        .find_map(|l| {
            l.split_once("shuffle directory: ")
                .and_then(|(_, rest)| rest.strip_suffix(" (temporary, removed)"))
                .map(PathBuf::from)
        })
        .expect("the summary names the shuffle directory");
    assert!(
        !dir.exists(),
        "temp shuffle directory {} left behind",
        dir.display()
    );
}

/// `--analyze`: each stage's tasks, workers, rows, bytes and task times,
/// then the critical path; rows and bytes per stage are printed without it.
#[test]
fn dfx_run_analyze_sums_each_stage_and_names_the_critical_path() {
    let fixture = Fixture::new();
    let table = format!("lineitem={}", fixture.table_dir().display());
    // A task per partition, so a task per file.
    let split = [
        "--split",
        "aggregate",
        "--format",
        "csv",
        "--partitions-per-task",
        "1",
    ];
    let out = dfx(&[&["run", "--table", &table][..], &split, &[BY_FLAG]].concat());
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Four maps of two rows each, grouped by flag: two groups per map.
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("stage 1 (maps 4, ") && l.contains("): 8 row(s), ")),
        "{stderr}"
    );
    assert!(!stderr.contains("critical path"), "{stderr}");

    let args = [
        &["run", "--analyze", "--table", &table][..],
        &split,
        &[BY_FLAG],
    ]
    .concat();
    let out = dfx(&args);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("worker mode: pool"), "{stderr}");
    assert!(
        stderr.contains("stage | tasks | workers | rows | bytes | task ms min / median / max"),
        "{stderr}"
    );
    let line = stderr
        .lines()
        .find(|l| l.trim_start().starts_with("1 |"))
        .unwrap_or_else(|| panic!("no line for stage 1 in\n{stderr}"));
    let cells: Vec<&str> = line.split('|').map(str::trim).collect();
    assert_eq!(cells[1], "4", "{line}");
    assert_eq!(cells[3], "8", "{line}");
    assert!(cells[4].parse::<u64>().unwrap() > 0, "{line}");
    assert!(
        stderr.contains("critical path: stage 1 -> final read: "),
        "{stderr}"
    );
}

/// `--analyze-json FILE`: the stages as the plugin described them, with
/// every task's report, as JSON a model of the run can read.
#[test]
fn dfx_run_analyze_json_writes_every_stage_and_task() {
    let fixture = Fixture::new();
    let table = format!("lineitem={}", fixture.table_dir().display());
    let file = fixture.root.path().join("analyze.json");
    let file_arg = file.to_str().unwrap();
    let args = [
        "run",
        "--analyze-json",
        file_arg,
        "--partitions-per-task",
        "1",
        "--table",
        &table,
        BY_FLAG,
    ];
    let out = dfx(&args);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let stages = doc["stages"].as_array().unwrap();
    // The default split: the grouping's hash exchange above the scan.
    assert!(stages.len() >= 2, "{doc:#}");
    let scan = stages
        .iter()
        .find(|s| s["deps"] == serde_json::json!([]))
        .unwrap();
    assert_eq!(scan["maps"], 4, "{doc:#}");
    let tasks = scan["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 4, "{doc:#}");
    let rows: u64 = tasks.iter().map(|t| t["rows"].as_u64().unwrap()).sum();
    assert!(rows > 0, "{doc:#}");
    assert!(
        tasks.iter().all(|t| t["bytes"].as_u64().unwrap() > 0),
        "{doc:#}"
    );
    let wall = doc["wall_ms"].as_f64().unwrap();
    let slowest = tasks.iter().map(|t| t["wall_ms"].as_f64().unwrap());
    assert!(slowest.fold(0.0, f64::max) <= wall, "{doc:#}");
    assert!(!doc["waves"].as_array().unwrap().is_empty(), "{doc:#}");
}

#[test]
fn dfx_run_formats_and_local_mode() {
    let fixture = Fixture::new();
    let table = format!("lineitem={}", fixture.table_dir().display());
    let shuffle = fixture.shuffle_dir("mine");
    let shuffle_arg = shuffle.to_str().unwrap();
    let out = dfx(&[
        "run",
        "--table",
        &table,
        "--shuffle-dir",
        shuffle_arg,
        "--format",
        "json",
        FUNCTIONS,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json[2]["l_returnflag"], "R");
    assert_eq!(json[2]["net"], 1062.5);
    assert_eq!(json[1]["wavg"], 6.2);
    // A directory the user names is kept, with its output.
    assert!(shuffle.join("stage-1").join("0-map-0.arrow").is_file());

    let out = dfx(&["run", "--local", "--table", &table, BY_FLAG]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("| A            | 3 | 11.0 | 1100.0 |"),
        "{stdout}"
    );
    assert!(
        text(&out.stderr).contains("local run: no stages"),
        "{}",
        text(&out.stderr)
    );

    // SQL that starts with a comment, as `"$(cat q9.sql)"` passes it, is the
    // query and not an unknown flag.
    let commented = format!("-- by flag, commented\n{BY_FLAG}");
    let out = dfx(&["run", "--local", "--table", &table, &commented]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("| A            | 3 | 11.0 | 1100.0 |"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn dfx_run_and_explain_read_the_query_from_a_file_or_stdin() {
    let fixture = Fixture::new();
    let table = format!("lineitem={}", fixture.table_dir().display());
    let row = "| A            | 3 | 11.0 | 1100.0 |";
    let file = fixture.shuffle_dir("q.sql");
    std::fs::write(&file, format!("-- by flag, from a file\n{BY_FLAG}\n")).unwrap();
    let file = file.to_str().unwrap();

    // -f FILE, distributed and local, and for explain.
    let out = dfx(&["run", "--table", &table, "-f", file]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(row), "{}", text(&out.stdout));
    assert!(text(&out.stderr).contains("split: exchange;"));
    let out = dfx(&["run", "--local", "--table", &table, "--file", file]);
    assert!(text(&out.stdout).contains(row), "{}", text(&out.stderr));
    let out = dfx(&["explain", "--table", &table, "-f", file]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("<== stage 1 ("),
        "{}",
        text(&out.stdout)
    );

    // Neither SQL nor -f: stdin, as datafusion-cli reads it; `-f -` too.
    let out = dfx_with_stdin(&["run", "--table", &table], BY_FLAG);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(row), "{}", text(&out.stdout));
    let out = dfx_with_stdin(&["run", "--local", "--table", &table, "-f", "-"], BY_FLAG);
    assert!(text(&out.stdout).contains(row), "{}", text(&out.stderr));
    let out = dfx_with_stdin(&["explain", "--local", "--table", &table], BY_FLAG);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("AggregateExec"),
        "{}",
        text(&out.stdout)
    );

    // Mistakes are named: both a file and SQL, an empty stdin, a missing file.
    let out = dfx(&["run", "--local", "--table", &table, "-f", file, BY_FLAG]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("cannot be used with"),
        "{}",
        text(&out.stderr)
    );
    let out = dfx_with_stdin(&["run", "--local", "--table", &table], "  \n");
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no query: stdin is empty"),
        "{}",
        text(&out.stderr)
    );
    let missing = fixture.shuffle_dir("missing.sql");
    let out = dfx(&["run", "--local", "-f", missing.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains(&format!("{}: No such file", missing.display())),
        "{}",
        text(&out.stderr)
    );
}

#[cfg(feature = "cli-extras")]
#[test]
fn dfx_tpch_queries_take_lists_and_ranges_and_name_bad_ones() {
    // Bad selections are refused before any data is generated.
    for (bad, culprit) in [
        ("1-", "\"1-\" in --queries \"1-\" is not a range"),
        ("5-2", "runs backwards (write 2-5)"),
        (
            "0,3",
            "\"0\" in --queries \"0,3\" is not a TPC-H query number",
        ),
        ("1-30", "is not a range of TPC-H query numbers"),
        ("six", "\"six\""),
    ] {
        let data = tempfile::tempdir().unwrap();
        let data_dir = data.path().to_str().unwrap();
        let out = dfx(&["tpch", "--queries", bad, "--data-dir", data_dir]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{bad}: {stderr}");
        assert!(stderr.contains(culprit), "{bad}: {stderr}");
        assert_eq!(
            std::fs::read_dir(data.path()).unwrap().count(),
            0,
            "{bad}: data generated for a refused selection"
        );
    }

    // A range and a list, in the order given, without repeats.
    let data = tempfile::tempdir().unwrap();
    let out = dfx(&[
        "tpch",
        "--scale",
        "0.01",
        "--partitions",
        "2",
        "--runs",
        "1",
        "--queries",
        "13-14,6,q14",
        "--data-dir",
        data.path().to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let queries: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("| q"))
        .filter_map(|l| l.split(' ').next())
        .filter(|n| n.parse::<u8>().is_ok())
        .collect();
    assert_eq!(queries, ["13", "14", "6"], "{stdout}");
}

#[test]
fn dfx_explain_marks_each_stage_with_its_id_maps_buckets_and_deps() {
    let fixture = Fixture::new();
    let table = format!("lineitem={}", fixture.table_dir().display());
    let out = dfx(&[
        "explain",
        "--split",
        "aggregate",
        "--partitions-per-task",
        "1",
        "--table",
        &table,
        UNION,
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.contains(
            "ShuffleWriterExec, number_of_children=1    <== stage 1 (maps 4, buckets 1, "
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("<== stage 2 (maps 4, buckets 1, "),
        "{stdout}"
    );
    assert!(stdout.contains(", deps [])"), "{stdout}");
    assert!(
        stdout.contains(
            "ShuffleReaderExec, number_of_children=1    <-- reads stage 1 as 4 partition(s)"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("AggregateExec"), "{stdout}");

    // Exchange mode: the partial aggregates' stages are read by later ones.
    let out = dfx(&["explain", "--table", &table, BY_FLAG]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.contains("<== stage 1 ("), "{stdout}");
    assert!(stdout.contains(", deps [2])"), "{stdout}");
    assert!(stdout.contains("hash("), "{stdout}");

    let out = dfx(&["explain", "--local", "--table", &table, UNION]);
    assert!(out.status.success());
    assert!(!text(&out.stdout).contains("ShuffleWriterExec"));
    assert!(!text(&out.stdout).contains("<== stage"));

    // One partition, no wider than a task: kept whole for the driver, and
    // said so; under `task`, one stage.
    let literals = "SELECT v, count(*) AS n FROM (VALUES (1), (2), (2)) AS t(v) GROUP BY v";
    let out = dfx(&["explain", "--partitions", "1", literals]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        !text(&out.stdout).contains("<== stage"),
        "{}",
        text(&out.stdout)
    );
    assert!(
        text(&out.stderr).contains("no stage: the driver runs this plan whole"),
        "{}",
        text(&out.stderr)
    );
    let task = ["--partitions", "1", "--set", "collapse_stages=task"];
    let out = dfx(&[&["explain"][..], &task, &[literals]].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("<== stage 1 ("),
        "{}",
        text(&out.stdout)
    );
    assert!(text(&out.stderr).is_empty(), "{}", text(&out.stderr));
}

#[test]
fn dfx_fails_with_a_clear_message_and_a_non_zero_status() {
    let fixture = Fixture::new();
    let table = format!("lineitem={}", fixture.table_dir().display());

    let out = Command::new(dfx_bin())
        .args([
            "run",
            "--plugin",
            "/nonexistent/libdfx_plugin.so",
            "--table",
            &table,
            BY_FLAG,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("cannot find the dfx plugin file"),
        "{stderr}"
    );
    assert!(
        stderr.contains("/nonexistent/libdfx_plugin.so (--plugin)"),
        "{stderr}"
    );

    let shuffle = fixture.shuffle_dir("used");
    std::fs::create_dir_all(shuffle.join("stage-1")).unwrap();
    let out = dfx(&[
        "run",
        "--table",
        &table,
        "--shuffle-dir",
        shuffle.to_str().unwrap(),
        BY_FLAG,
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("already holds stage output"),
        "{}",
        text(&out.stderr)
    );

    let out = dfx(&[
        "run",
        "--table",
        &table,
        "SELECT no_such_column FROM lineitem",
    ]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("dfx: error: cannot plan"), "{stderr}");
    assert!(stderr.contains("no_such_column"), "{stderr}");
    assert!(
        !stderr.contains("kept for inspection"),
        "nothing was dispatched: {stderr}"
    );

    let out = dfx(&["run", "--table", "no-equals-sign", BY_FLAG]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("expected NAME=LOCATION"),
        "{}",
        text(&out.stderr)
    );

    let out = dfx(&["run", "--table", "orders=/nonexistent/orders", BY_FLAG]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("table orders (/nonexistent/orders): /nonexistent/orders does not exist"),
        "{stderr}"
    );

    // Zero partitions or zero workers is refused, not rounded up.
    for (flag, value) in [("--partitions", "0"), ("--max-workers", "0")] {
        let out = dfx(&["run", flag, value, "--table", &table, BY_FLAG]);
        assert!(!out.status.success(), "{flag} {value} was accepted");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(flag), "{stderr}");
        assert!(stderr.contains("expected at least 1, got 0"), "{stderr}");
    }
}

/// A table function's rows cross into the plugin's planner by value: it
/// runs distributed and in one process alike, with the hand-worked answer.
#[test]
fn a_table_function_runs_distributed_and_locally() {
    for local in [false, true] {
        let sql = "SELECT count(*) AS n, sum(value) AS total FROM generate_series(1, 10)";
        let mut args = vec!["run", "--format", "csv"];
        if local {
            args.push("--local");
        }
        args.push(sql);
        let out = dfx(&args);
        assert!(out.status.success(), "local {local}: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout), "n,total\n10,55\n", "local {local}");
    }
}

#[test]
fn every_subcommand_has_help() {
    for args in [
        &["--help"][..],
        &["run", "--help"],
        &["explain", "--help"],
        &["worker", "--help"],
        &["shell", "--help"],
        #[cfg(feature = "cli-extras")]
        &["tpch", "--help"],
        #[cfg(feature = "cli-extras")]
        &["bench", "--help"],
    ] {
        let out = dfx(args);
        assert!(out.status.success(), "dfx {args:?}");
        assert!(
            text(&out.stdout).contains("Usage: dfx"),
            "dfx {args:?}: {}",
            text(&out.stdout)
        );
    }
}

#[test]
fn the_embedding_example_runs_a_distributed_query() {
    let exe = std::env::current_exe().unwrap();
    let example = exe
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .join("examples")
        .join("embed");
    assert!(
        example.is_file(),
        "{} is missing: `cargo test -p dfx-host` builds it (or `cargo build -p dfx-host --examples`)",
        example.display()
    );
    let fixture = Fixture::new();
    let out = Command::new(&example)
        .arg(fixture.table_dir())
        .arg(BY_FLAG)
        .env("DFX_PLUGIN", plugin_path())
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.contains("| N            | 3 | 15.0 | 1500.0 |"),
        "{stdout}"
    );
    assert!(
        text(&out.stderr).contains(" stages, ") && text(&out.stderr).contains(" tasks"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn the_plugin_is_found_beside_the_executable_and_a_refused_file_is_named() {
    let fixture = Fixture::new();
    let table = format!("lineitem={}", fixture.table_dir().display());
    // No --plugin, no DFX_PLUGIN: target/<profile>/dfx finds its neighbour.
    let out = Command::new(dfx_bin())
        .args(["run", "--max-workers", "1", "--split", "aggregate"])
        .args(["--partitions-per-task", "1", "--table", &table, BY_FLAG])
        .env_remove("DFX_PLUGIN")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("| R            | 2 | 10.0 | 1000.0 |"));
    assert!(
        text(&out.stderr).contains("tasks: 4"),
        "{}",
        text(&out.stderr)
    );

    // A file that is not a plugin: refused by the handshake, and named.
    let not_a_plugin = fixture.root.path().join("libdfx_plugin.so");
    std::fs::write(&not_a_plugin, b"not a shared library").unwrap();
    let out = Command::new(dfx_bin())
        .args(["explain", "--table", &table, BY_FLAG])
        .env("DFX_PLUGIN", &not_a_plugin)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("refused"), "{stderr}");
    assert!(stderr.contains("$DFX_PLUGIN"), "{stderr}");
    assert!(stderr.contains(not_a_plugin.to_str().unwrap()), "{stderr}");
}

/// Whether this process ignores SIGINT (a background job of a non-interactive
/// shell does, and its children inherit that, so Ctrl-C cannot be simulated).
fn sigint_ignored() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (2 - 1)) != 0)
}

#[test]
fn an_interrupted_driver_leaves_no_worker_running() {
    let fixture = Fixture::new();
    let shuffle = fixture.shuffle_dir("interrupted");
    // Workers that never finish, each naming its envelope on its command
    // line; the first wave is the four maps of the stage over the table.
    let marker = shuffle.join("tasks").to_str().unwrap().to_string();
    interrupt_while_workers_hang(
        &fixture,
        &shuffle,
        ("process", "sh"),
        r#"exec tail -f /dev/null "$1" >/dev/null"#,
        &marker,
    );
}

#[test]
fn an_interrupted_driver_leaves_no_pooled_worker_running() {
    let fixture = Fixture::new();
    let shuffle = fixture.shuffle_dir("interrupted");
    // Serving workers that never answer (nor read their requests, so the
    // end of their input would not end them either), each naming a file of
    // this test on its command line: $0 is this test's directory (`--serve`
    // is $1), and the file's path is on no other process's command line.
    let name = fixture.root.path().join("pooled-worker");
    std::fs::write(&name, b"").unwrap();
    let marker = name.to_str().unwrap().to_string();
    interrupt_while_workers_hang(
        &fixture,
        &shuffle,
        ("pool", fixture.root.path().to_str().unwrap()),
        r#"exec tail -f /dev/null "$0/pooled-worker" >/dev/null"#,
        &marker,
    );
}

/// Start `dfx run` in `mode` with four workers `/bin/sh -c SCRIPT ZEROTH
/// <envelope or --serve>` that never finish and whose command lines name
/// `marker`, interrupt it once all four run, and check that none of them
/// outlives it. Their output is not the driver's pipe: tail exits by itself
/// once the reader of a pipe it writes to has gone, which would pass for a
/// kill.
fn interrupt_while_workers_hang(
    fixture: &Fixture,
    shuffle: &Path,
    (mode, zeroth): (&str, &str),
    script: &str,
    marker: &str,
) {
    let table = format!("lineitem={}", fixture.table_dir().display());
    let mut driver = Command::new(dfx_bin())
        .args([
            "run",
            "--max-workers",
            "4",
            // Four tasks at once, one per file.
            "--partitions-per-task",
            "1",
            "--table",
            &table,
            "--shuffle-dir",
            shuffle.to_str().unwrap(),
            "--worker-mode",
            mode,
        ])
        .args(["--worker", "/bin/sh", "--worker-arg", "-c"])
        .args(["--worker-arg", script, "--worker-arg", zeroth])
        .arg(BY_FLAG)
        .env("DFX_PLUGIN", plugin_path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        eventually(|| live_processes_mentioning(marker).len() == 4),
        "four workers never started"
    );
    let (signal, code) = if sigint_ignored() {
        ("-TERM", 143)
    } else {
        ("-INT", 130)
    };
    let killed = Command::new("kill")
        .args([signal, &driver.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = driver.wait().unwrap();
    assert_eq!(status.code(), Some(code));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut driver.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(stderr.contains("workers stopped"), "{stderr}");
    assert!(
        eventually(|| live_processes_mentioning(marker).is_empty()),
        "workers outlived their driver: {:?}",
        live_processes_mentioning(marker)
    );
}

#[test]
fn dfx_run_set_gives_every_session_a_plugin_setting() {
    let fixture = Fixture::new();
    let table = format!("lineitem={}", fixture.table_dir().display());
    let run = |setting: &str| dfx(&["run", "--set", setting, "--table", &table, BY_FLAG]);
    for setting in ["join_filters=off", "dfx_engine.join_filters=on"] {
        let out = run(setting);
        assert!(out.status.success(), "{setting}: {}", text(&out.stderr));
        assert!(
            text(&out.stdout).contains("| A            | 3 | 11.0 | 1100.0 |"),
            "{setting}: {}",
            text(&out.stdout)
        );
    }
    // The plugin reads it: a value it does not take is refused, naming it.
    let out = run("join_filters=sometimes");
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("dfx_engine.join_filters") && stderr.contains("sometimes"),
        "{stderr}"
    );
    // So is a decision's value, when the query is planned: whether or not
    // the adaptive step would ever ask about it, no task runs.
    for (setting, key) in [
        ("coalesce=sometimes", "dfx_engine.coalesce"),
        ("skew_split=sometimes", "dfx_engine.skew_split"),
        ("broadcast_switch=sometimes", "dfx_engine.broadcast_switch"),
    ] {
        let out = run(setting);
        assert_eq!(out.status.code(), Some(1), "{setting}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(key)
                && stderr.contains(r#""auto", "on" or "off""#)
                && stderr.contains("cannot create the physical plan"),
            "{setting}: {stderr}"
        );
        assert!(
            text(&out.stdout).is_empty(),
            "{setting}: {}",
            text(&out.stdout)
        );
    }
    // A key the spec holds as a flag of its own is refused before anything
    // runs.
    let out = run("split=aggregate");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("fields of their own"),
        "{}",
        text(&out.stderr)
    );
    let out = run("join_filters");
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("expected KEY=VALUE"));
    // A DataFusion key reaches DataFusion: one it takes runs, one it does
    // not know is refused, naming it; one dfx sets itself is refused too.
    let out = run("datafusion.optimizer.hash_join_single_partition_threshold=0");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = run("datafusion.optimizer.no_such_setting=1");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("datafusion_options sets datafusion.optimizer.no_such_setting"),
        "{}",
        text(&out.stderr)
    );
    let out = run("datafusion.optimizer.repartition_file_scans=true");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("but dfx sets it"),
        "{}",
        text(&out.stderr)
    );
}

/// A task running a slice of two of four partitions is handed, of the hash
/// exchange its final aggregate reads bucket by partition, only the two
/// buckets of its slice of each upstream map; the answer is the
/// hand-checked one. Process workers leave each envelope in the location,
/// read back here.
#[test]
fn a_task_is_handed_only_its_slices_buckets_of_the_exchange_it_reads() {
    let fixture = Fixture::new();
    let table = format!("lineitem={}", fixture.table_dir().display());
    let shuffle = fixture.shuffle_dir("windows");
    let out = dfx(&[
        "run",
        "--table",
        &table,
        "--partitions",
        "4",
        "--partitions-per-task",
        "2",
        "--worker-mode",
        "process",
        "--set",
        "coalesce=off",
        "--shuffle-dir",
        shuffle.to_str().unwrap(),
        BY_FLAG,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for row in [
        "| A            | 3 | 11.0 | 1100.0 |",
        "| N            | 3 | 15.0 | 1500.0 |",
        "| R            | 2 | 10.0 | 1000.0 |",
    ] {
        assert!(stdout.contains(row), "{row} in {stdout}");
    }
    // Stage 1 (the final aggregate) reads stage 2 (the partial aggregates
    // of two maps, four buckets each): 2 rows a file, 8 in all.
    let mut rows = 0;
    for map in 0..2usize {
        let envelope = shuffle.join("tasks").join(format!("task-1-{map}.json"));
        let envelope: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&envelope).unwrap()).unwrap();
        let ranges = envelope["spec"]["stage_options"][dfx_abi::SHUFFLE_RANGES]
            .as_str()
            .unwrap_or_else(|| panic!("map {map} handed no layouts: {envelope}"));
        let layouts = dfx_abi::StageLayouts::parse(ranges).unwrap().unwrap();
        let upstream = &layouts.stages[&2];
        assert_eq!(upstream.len(), 2, "{ranges}");
        for layout in upstream {
            assert_eq!(
                layout.described(),
                map * 2..map * 2 + 2,
                "map {map}: {ranges}"
            );
            rows += layout.rows.iter().sum::<u64>();
        }
    }
    assert_eq!(
        rows, 8,
        "the two slices' windows hold every partial row once"
    );
    // The scan stage reads no stage: handed nothing.
    let scan: serde_json::Value =
        serde_json::from_slice(&std::fs::read(shuffle.join("tasks/task-2-0.json")).unwrap())
            .unwrap();
    assert!(
        scan["spec"]["stage_options"][dfx_abi::SHUFFLE_RANGES].is_null(),
        "{scan}"
    );
}
