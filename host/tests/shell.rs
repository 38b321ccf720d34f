//! `dfx shell` in a real terminal (tmux): keys typed, the pane read back.
//!
//! # The fixture
//!
//! Table `sales`, two CSV files with a header row (two partitions):
//!
//! | file  | region | amount |
//! |-------|--------|-------:|
//! | a.csv | north  | 10     |
//! | a.csv | south  | 20     |
//! | a.csv | north  | 5      |
//! | b.csv | east   | 7      |
//! | b.csv | south  | 1      |
//! | b.csv | north  | 100    |
//!
//! - by region: east 7; north 10+5+100 = 115; south 20+1 = 21;
//! - `amount > 5`: 10, 20, 7, 100: four rows, the largest 100.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::tmux::{Tmux, alive, sh_quote};
use common::{dfx_bin, plugin_path};

/// The rows of every text table in `text` (lines `| a | b |`), cells
/// trimmed, header rows included, in order.
fn table_rows(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .map(str::trim)
        .filter(|line| line.starts_with('|') && line.ends_with('|'))
        .map(|line| {
            line.trim_matches('|')
                .split('|')
                .map(|cell| cell.trim().to_string())
                .collect()
        })
        .collect()
}

/// Whether `rows` holds `expected` as consecutive rows.
fn holds(rows: &[Vec<String>], expected: &[&[&str]]) -> bool {
    rows.windows(expected.len()).any(|window| {
        window
            .iter()
            .zip(expected)
            .all(|(row, want)| row.iter().map(String::as_str).eq(want.iter().copied()))
    })
}

/// The footers in `pane`, in order: (rows, stages, tasks), each checked
/// against the footer's whole wording.
fn footers(pane: &str) -> Vec<(usize, usize, usize)> {
    let mut found = Vec::new();
    for line in pane.lines() {
        let Some((rows, rest)) = line.split_once(" row(s) fetched. Elapsed ") else {
            continue;
        };
        let (seconds, rest) = rest.split_once(" seconds. ").expect("the elapsed time");
        let decimals = seconds.split_once('.').map(|(_, d)| d.len());
        assert_eq!(decimals, Some(3), "elapsed seconds as X.XXX: {line}");
        seconds.parse::<f64>().expect("elapsed seconds");
        let (stages, rest) = rest.split_once(" stage(s), ").expect("the stages");
        let tasks = rest.strip_suffix(" task(s).").expect("the tasks");
        found.push((
            rows.trim().parse().expect("rows"),
            stages.parse().expect("stages"),
            tasks.parse().expect("tasks"),
        ));
    }
    found
}

/// What `\stats` printed last: workers started, alive, and those that ran
/// the last query.
fn last_stats(pane: &str) -> (u64, BTreeSet<u32>, BTreeSet<u32>) {
    let value = |key: &str| {
        pane.lines()
            .rev()
            .find_map(|line| line.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key:?} in the pane:\n{pane}"))
            .trim()
            .to_string()
    };
    let pids = |text: String| -> BTreeSet<u32> {
        text.split_whitespace()
            .map(|pid| pid.parse().expect("a process id"))
            .collect()
    };
    (
        value("workers started by this session's pool:")
            .parse()
            .expect("a count"),
        pids(value("workers alive:")),
        pids(value("workers that ran the last query:")),
    )
}

/// The fixture's two CSV files under `dir/sales/`.
fn write_sales(dir: &Path) -> std::path::PathBuf {
    let table = dir.join("sales");
    std::fs::create_dir_all(&table).unwrap();
    std::fs::write(
        table.join("a.csv"),
        "region,amount\nnorth,10\nsouth,20\nnorth,5\n",
    )
    .unwrap();
    std::fs::write(
        table.join("b.csv"),
        "region,amount\neast,7\nsouth,1\nnorth,100\n",
    )
    .unwrap();
    table
}

#[test]
fn the_shell_creates_a_table_answers_on_one_pool_survives_a_bad_query_and_quits() {
    let dir = tempfile::tempdir().unwrap();
    let table = write_sales(dir.path());
    let command = [
        "env".to_string(),
        format!("DFX_HISTORY={}", dir.path().join("history").display()),
        dfx_bin().display().to_string(),
        "shell".into(),
        "--plugin".into(),
        plugin_path().display().to_string(),
        "--partitions".into(),
        "2".into(),
        "--partitions-per-task".into(),
        "2".into(),
        // On a worker of the shell's pool, not kept whole in the shell.
        "--set".into(),
        "collapse_stages=task".into(),
    ]
    .iter()
    .map(|word| sh_quote(word))
    .collect::<Vec<_>>()
    .join(" ");
    let tmux = Tmux::new();
    tmux.start(&command, 200, 50);
    let shell_pid = tmux.pane_pid();
    tmux.wait_for("the prompt", |pane| pane.contains("dfx> "));

    tmux.send_line(&format!(
        "CREATE EXTERNAL TABLE sales STORED AS CSV LOCATION '{}/' OPTIONS ('format.has_header' \
         'true');",
        table.display()
    ));
    tmux.wait_for("the table", |pane| pane.contains("Table sales created."));

    // A statement spanning two lines: it runs at its `;`. The second is
    // typed at the continuation prompt: keys typed while the line editor
    // sets the terminal up again may be discarded.
    tmux.send_line("SELECT region, sum(amount) AS total FROM sales");
    tmux.wait_for("the continuation prompt", |pane| {
        pane.lines().any(|line| line.trim() == "->")
    });
    tmux.send_line("GROUP BY region ORDER BY region;");
    let pane = tmux.wait_for("the first answer", |pane| footers(pane).len() == 1);
    let rows = table_rows(&pane);
    assert!(
        holds(
            &rows,
            &[
                &["region", "total"],
                &["east", "7"],
                &["north", "115"],
                &["south", "21"]
            ]
        ),
        "{pane}"
    );
    let (answered, stages, tasks) = footers(&pane)[0];
    assert_eq!(answered, 3, "{pane}");
    // No operator runs more than a task's two partitions, and `task` keeps
    // such a plan off the driver: one stage of one task, on a worker of the
    // shell's pool.
    assert_eq!((stages, tasks), (1, 1), "{pane}");

    tmux.send_line("\\stats");
    let pane = tmux.wait_for("the stats", |pane| {
        pane.contains("workers that ran the last query:")
    });
    let (started, alive_after_first, ran_first) = last_stats(&pane);
    assert!(started >= 1, "{pane}");
    assert!(!ran_first.is_empty(), "{pane}");
    assert!(ran_first.is_subset(&alive_after_first), "{pane}");

    tmux.send_line("\\d");
    let pane = tmux.wait_for("the table list", |pane| {
        table_rows(pane)
            .iter()
            .any(|row| row.first().is_some_and(|name| name == "sales"))
    });
    assert!(
        table_rows(&pane)
            .iter()
            .any(|row| row[0] == "sales" && row[1].starts_with("CSV ")),
        "{pane}"
    );
    tmux.send_line("\\d sales");
    let pane = tmux.wait_for("the columns", |pane| {
        holds(
            &table_rows(pane),
            &[&["column", "type"], &["region", "Utf8"]],
        )
    });
    assert!(
        holds(
            &table_rows(&pane),
            &[
                &["column", "type"],
                &["region", "Utf8"],
                &["amount", "Int64"]
            ]
        ),
        "{pane}"
    );

    tmux.send_line("SELECT no_such_column FROM sales;");
    let pane = tmux.wait_for("the error", |pane| pane.contains("dfx: error:"));
    let error = pane
        .lines()
        .find(|line| line.contains("dfx: error:"))
        .unwrap();
    assert!(error.contains("no_such_column"), "{pane}");

    // Still answering, with a setting every session of the query gets.
    tmux.send_line("SET datafusion.execution.batch_size = 2;");
    // The shell's answer, a line of its own: the typed line holds the same
    // words, and keys typed while the shell is busy race its terminal.
    tmux.wait_for("the setting", |pane| {
        pane.lines()
            .any(|line| line.trim() == "datafusion.execution.batch_size = 2")
    });
    tmux.send_line("SHOW datafusion.execution.batch_size;");
    tmux.wait_for("the shown setting", |pane| {
        holds(
            &table_rows(pane),
            &[
                &["name", "value"],
                &["datafusion.execution.batch_size", "2"],
            ],
        )
    });
    tmux.send_line("SELECT count(*) AS n, max(amount) AS top FROM sales WHERE amount > 5;");
    let pane = tmux.wait_for("the second answer", |pane| footers(pane).len() == 2);
    assert!(
        holds(&table_rows(&pane), &[&["n", "top"], &["4", "100"]]),
        "{pane}"
    );
    assert_eq!(footers(&pane)[1].0, 1, "{pane}");

    // One pool served both queries: no worker started for the second, and
    // the workers that ran it are those alive after the first.
    tmux.send_line("\\stats");
    let pane = tmux.wait_for("the second stats", |pane| {
        pane.matches("workers that ran the last query:").count() == 2
    });
    let (started_after, alive_after_second, ran_second) = last_stats(&pane);
    assert_eq!(started_after, started, "{pane}");
    assert_eq!(alive_after_second, alive_after_first, "{pane}");
    assert!(!ran_second.is_empty(), "{pane}");
    assert!(ran_second.is_subset(&alive_after_first), "{pane}");
    for pid in &alive_after_second {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(
            cmdline.contains("worker --serve"),
            "{pid} is a pooled worker: {cmdline}"
        );
    }

    tmux.send_line("\\q");
    assert_eq!(tmux.wait_for_exit(), 0, "{}", tmux.capture());
    assert!(!alive(shell_pid), "the shell's process is gone");
    assert!(
        common::eventually(|| alive_after_second.iter().all(|pid| !alive(*pid))),
        "the pool's workers end with the shell: {alive_after_second:?}"
    );
    let history = std::fs::read_to_string(dir.path().join("history")).unwrap_or_default();
    assert!(
        history.contains("GROUP BY region ORDER BY region;"),
        "the history file keeps the lines typed: {history}"
    );
}

/// The shell's command line for the fixture, with `extra` options.
fn shell_command(dir: &Path, extra: &[String]) -> String {
    let mut words = vec![
        "env".to_string(),
        format!("DFX_HISTORY={}", dir.join("history").display()),
        dfx_bin().display().to_string(),
        "shell".into(),
        "--plugin".into(),
        plugin_path().display().to_string(),
        "--partitions".into(),
        "2".into(),
    ];
    words.extend_from_slice(extra);
    words
        .iter()
        .map(|word| sh_quote(word))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn under_a_shuffle_root_each_query_is_removed_once_read_and_a_failed_one_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let table = write_sales(dir.path());
    let root = dir.path().join("root");
    let tmux = Tmux::new();
    tmux.start(
        &shell_command(
            dir.path(),
            &["--shuffle-root".into(), root.display().to_string()],
        ),
        200,
        50,
    );
    tmux.wait_for("the prompt", |pane| pane.contains("dfx> "));
    tmux.send_line(&format!(
        "CREATE EXTERNAL TABLE sales STORED AS CSV LOCATION '{}/' OPTIONS ('format.has_header' \
         'true');",
        table.display()
    ));
    tmux.wait_for("the table", |pane| pane.contains("Table sales created."));
    tmux.send_line(
        "SELECT region, sum(amount) AS total FROM sales GROUP BY region ORDER BY region;",
    );
    let pane = tmux.wait_for("the first answer", |pane| footers(pane).len() == 1);
    assert!(
        holds(
            &table_rows(&pane),
            &[&["east", "7"], &["north", "115"], &["south", "21"]]
        ),
        "{pane}"
    );
    tmux.send_line("SELECT count(*) AS n FROM sales WHERE amount > 5;");
    let pane = tmux.wait_for("the second answer", |pane| footers(pane).len() == 2);
    assert!(holds(&table_rows(&pane), &[&["n"], &["4"]]), "{pane}");
    // Both answers read: the root holds its marker and nothing else.
    let names = |root: &Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(root)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    assert_eq!(
        names(&root),
        [dfx_runtime::shuffle_root::ROOT_MARKER],
        "{pane}"
    );

    // A query whose task fails keeps its location, and the error names it.
    tmux.send_line(
        "SELECT CAST(region AS INT) AS r, total FROM \
         (SELECT region, sum(amount) AS total FROM sales GROUP BY region) t;",
    );
    let pane = tmux.wait_for("the error", |pane| pane.contains("dfx: error:"));
    let kept: Vec<String> = names(&root)
        .into_iter()
        .filter(|name| name.as_str() != dfx_runtime::shuffle_root::ROOT_MARKER)
        .collect();
    assert_eq!(kept.len(), 1, "one location kept: {kept:?}\n{pane}");
    assert!(
        pane.replace('\n', "").contains(&kept[0]),
        "the error names the kept location {}:\n{pane}",
        kept[0]
    );
    tmux.send_line("\\q");
    assert_eq!(tmux.wait_for_exit(), 0, "{}", tmux.capture());
}
