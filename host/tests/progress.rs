//! The live progress line of `dfx run`: drawn on a terminal (a tmux pane)
//! once a query has run about a second, and nothing of it through a pipe.

mod common;

use std::process::Command;

use common::tmux::{Tmux, sh_quote};
use common::{dfx_bin, numbers_table, plugin_path};

/// Words only the live line holds (`tasks 2 running, 5/12 done`); `dfx
/// run`'s own summary never says "running".
const LINE_MARK: &str = " running, ";

/// A query of a few seconds in a debug build over [`numbers_table`]'s
/// `t`: every row joined with the rows of its `v` (a seventh of the
/// table), in tasks across two stages and more.
const SLOW: &str = "SELECT count(*) AS n FROM t a JOIN t b ON a.v = b.v";

/// Rows of the table: files times rows per file.
const FILES: u64 = 4;
const ROWS_PER_FILE: u64 = 7000;

/// The answer of [`SLOW`]: each of the 7 values of `v` is held by a
/// seventh of the rows, joined with each of them.
fn slow_answer() -> u64 {
    let per_value = FILES * ROWS_PER_FILE / 7;
    7 * per_value * per_value
}

/// `dfx run` over the table, as words.
fn run_args(table: &std::path::Path) -> Vec<String> {
    vec![
        "run".into(),
        "--plugin".into(),
        plugin_path().display().to_string(),
        "--table".into(),
        format!("t={}", table.display()),
        "--partitions".into(),
        "4".into(),
        "--format".into(),
        "csv".into(),
        SLOW.into(),
    ]
}

#[test]
fn a_long_query_shows_the_live_line_on_a_terminal_and_nothing_through_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let table = numbers_table(dir.path(), FILES, ROWS_PER_FILE);
    let answer = format!("n\n{}\n", slow_answer());

    // On a terminal: the pane's every byte logged, lines the bar erased
    // included. The run waits for the log to be in place.
    let log = dir.path().join("pane.log");
    let out = dir.path().join("answer.csv");
    let mut words = vec![dfx_bin().display().to_string()];
    words.extend(run_args(&table));
    let dfx = words
        .iter()
        .map(|w| sh_quote(w))
        .collect::<Vec<_>>()
        .join(" ");
    let gate = format!("gate-{}", std::process::id());
    let tmux = Tmux::new();
    // `tmux` in the pane addresses the test's own server.
    let script = format!(
        "{} wait-for {gate}; {dfx} > {}",
        tmux.client(),
        sh_quote(&out.display().to_string())
    );
    tmux.start(&script, 160, 20);
    tmux.log_to(&log);
    tmux.signal(&gate);
    assert_eq!(tmux.wait_for_exit(), 0, "{}", tmux.capture());
    assert_eq!(std::fs::read_to_string(&out).unwrap(), answer);
    let drawn = String::from_utf8_lossy(&std::fs::read(&log).unwrap()).into_owned();
    let line = drawn
        .split(['\r', '\n'])
        .find(|line| line.contains(LINE_MARK))
        .unwrap_or_else(|| panic!("no live line on the terminal; it showed:\n{drawn}"));
    for part in ["stages ", " done", " published", " retries"] {
        assert!(line.contains(part), "{part:?} in the line {line:?}");
    }
    // Erased once the tasks end: the screen left holds no line of it.
    assert!(!tmux.capture().contains(LINE_MARK), "{}", tmux.capture());

    // Through a pipe: the same run, the same answer, no line.
    let piped = Command::new(dfx_bin())
        .args(run_args(&table))
        .output()
        .expect("dfx starts");
    assert!(piped.status.success(), "{piped:?}");
    assert_eq!(String::from_utf8_lossy(&piped.stdout), answer);
    let stderr = String::from_utf8_lossy(&piped.stderr);
    assert!(!stderr.contains(LINE_MARK), "{stderr}");
    assert!(!stderr.contains('\r'), "no redrawn line: {stderr}");
}
