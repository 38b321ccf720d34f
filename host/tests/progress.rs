//! The live progress line of `dfx run`: drawn on a terminal (a tmux pane)
//! while a query's tasks run past about a second, erased when they end, and
//! nothing of it through a pipe.
//!
//! The query is kept running by the test-hooks plugin: the first map 0 of
//! any stage to get ready to publish sleeps a few seconds first
//! (`DFX_TEST_SLOW_PUBLISH`), so the line has time to show whatever the
//! machine's speed.

mod common;

use std::path::Path;
use std::process::Command;

use common::tmux::{Tmux, sh_quote};
use common::{dfx_bin, numbers_table, test_hooks_plugin_path};

/// Words only the live line holds (`tasks 2 running, 5/12 done`); `dfx
/// run`'s own summary never says "running".
const LINE_MARK: &str = " running, ";

/// Every row joined with the rows of its `v` (a seventh of the table), in
/// tasks across two stages and more.
const QUERY: &str = "SELECT count(*) AS n FROM t a JOIN t b ON a.v = b.v";

/// Rows of the table: files times rows per file.
const FILES: u64 = 4;
const ROWS_PER_FILE: u64 = 700;

/// The answer of [`QUERY`]: each of the 7 values of `v` is held by a
/// seventh of the rows, joined with each of them.
fn answer() -> String {
    let per_value = FILES * ROWS_PER_FILE / 7;
    format!("n\n{}\n", 7 * per_value * per_value)
}

/// `dfx run` of [`QUERY`] over `table`, as words.
fn run_args(table: &Path) -> Vec<String> {
    vec![
        "run".into(),
        "--plugin".into(),
        test_hooks_plugin_path().display().to_string(),
        "--table".into(),
        format!("t={}", table.display()),
        "--partitions".into(),
        "4".into(),
        "--format".into(),
        "csv".into(),
        QUERY.into(),
    ]
}

/// The hook's setting: the first map 0 to publish (the one creating `flag`)
/// sleeps three seconds first.
fn slow_publish(flag: &Path) -> String {
    format!("0-map-0.arrow:3000:{}", flag.display())
}

/// The numbers after each of `words` in `line`: `stages 1/3` gives 1 and 3.
fn counts_after(line: &str, word: &str) -> Vec<u64> {
    let rest = line
        .split_once(word)
        .unwrap_or_else(|| panic!("{word:?} in the line {line:?}"))
        .1;
    let text: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '/')
        .collect();
    text.split('/')
        .map(|n| {
            n.parse()
                .unwrap_or_else(|_| panic!("a count after {word:?} in {line:?}"))
        })
        .collect()
}

#[test]
fn a_long_query_shows_the_live_line_on_a_terminal_and_nothing_through_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let table = numbers_table(dir.path(), FILES, ROWS_PER_FILE);

    // On a terminal: the run waits for the pane's log to be in place.
    let out = dir.path().join("answer.csv");
    let log = dir.path().join("pane.log");
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
        "{} wait-for {gate}; DFX_TEST_SLOW_PUBLISH={} {dfx} > {}",
        tmux.client(),
        sh_quote(&slow_publish(&dir.path().join("slowed-tty"))),
        sh_quote(&out.display().to_string())
    );
    tmux.start(&script, 160, 20);
    tmux.log_to(&log);
    tmux.signal(&gate);

    // While the slow map sleeps the pane shows the line, and its counts.
    let pane = tmux.wait_for("the live line", |pane| pane.contains(LINE_MARK));
    let line = pane
        .lines()
        .find(|line| line.contains(LINE_MARK))
        .expect("the line the wait found");
    let [done, stages] = counts_after(line, "stages ")[..] else {
        panic!("stages done/total in {line:?}");
    };
    assert!(stages >= 2 && done < stages, "{line:?}");
    let [running] = counts_after(line, "tasks ")[..] else {
        panic!("tasks running in {line:?}");
    };
    let [tasks_done, tasks] = counts_after(line, LINE_MARK)[..] else {
        panic!("tasks done/total in {line:?}");
    };
    assert!(running >= 1 && tasks_done < tasks, "{line:?}");
    for part in [" published", " retries", "[00:00:0"] {
        assert!(line.contains(part), "{part:?} in the line {line:?}");
    }
    assert_eq!(tmux.exit_status(), None, "the query still runs: {pane}");

    assert_eq!(tmux.wait_for_exit(), 0, "{}", tmux.capture());
    assert_eq!(std::fs::read_to_string(&out).unwrap(), answer());
    // Drawn in place (no line of it scrolled away), and erased once the
    // tasks ended: the screen left holds none of it.
    let drawn = String::from_utf8_lossy(&std::fs::read(&log).unwrap()).into_owned();
    assert!(drawn.contains(LINE_MARK), "{drawn}");
    let screen = tmux.capture();
    assert!(!screen.contains(LINE_MARK), "{screen}");

    // Through a pipe: as slow a run, the same answer, no line.
    let flag = dir.path().join("slowed-pipe");
    let piped = Command::new(dfx_bin())
        .args(run_args(&table))
        .env("DFX_TEST_SLOW_PUBLISH", slow_publish(&flag))
        .output()
        .expect("dfx starts");
    assert!(piped.status.success(), "{piped:?}");
    assert!(flag.exists(), "the piped run was slowed too");
    assert_eq!(String::from_utf8_lossy(&piped.stdout), answer());
    let stderr = String::from_utf8_lossy(&piped.stderr);
    assert!(!stderr.contains(LINE_MARK), "{stderr}");
    assert!(!stderr.contains('\r'), "no redrawn line: {stderr}");
}
