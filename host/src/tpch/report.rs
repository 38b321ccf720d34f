//! The figures of a `dfx tpch` run: one row per query, printed as a table
//! and optionally written as JSON.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::TpchError;
use crate::session::{ShuffleCompression, Split};

/// Outcome of one query.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "detail")]
pub enum Outcome {
    /// Both ran and the answers agree.
    Agree,
    /// Both ran and the answers differ (the first difference).
    Mismatch(String),
    /// A single-process run (stock or dfx-local) failed (first line of the error).
    LocalFailed(String),
    /// The distributed run failed (first line of the error).
    DistributedFailed(String),
}

impl Outcome {
    /// Short label for the table.
    pub fn label(&self) -> String {
        match self {
            Outcome::Agree => "agree".to_string(),
            Outcome::Mismatch(d) => format!("MISMATCH: {d}"),
            Outcome::LocalFailed(d) => format!("single-process failed: {d}"),
            Outcome::DistributedFailed(d) => format!("cannot run distributed: {d}"),
        }
    }
}

/// The figures of one query.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueryReport {
    /// TPC-H query number.
    pub query: u8,
    /// Rows in the (stock) answer.
    pub rows: Option<usize>,
    /// Median wall time of stock DataFusion (default config, same files and
    /// partitions, no plugin) over the runs, milliseconds: the baseline.
    pub stock_ms: Option<f64>,
    /// Median wall time of dfx's own session run in one process, milliseconds.
    pub local_ms: Option<f64>,
    /// Median distributed wall time over the runs, milliseconds.
    pub distributed_ms: Option<f64>,
    /// `distributed_ms / stock_ms`.
    pub ratio: Option<f64>,
    /// Stages the distributed plan was cut into.
    pub stages: Option<usize>,
    /// Worker tasks (one per map of each stage) of one distributed run.
    pub tasks: Option<usize>,
    /// Why each adapted stage of that run ran as it did, as `--analyze`
    /// prints it (`stage 5: switched to broadcast: ...`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<String>,
    /// Whether the answers agree, or why there is no comparison.
    pub outcome: Outcome,
}

/// Everything `dfx tpch` measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunReport {
    /// TPC-H scale factor.
    pub scale: f64,
    /// Files per table (and target partitions of every session).
    pub partitions: usize,
    /// Where the distributed plans were cut into stages.
    pub split: Split,
    /// How workers compressed their map files.
    pub shuffle_compression: ShuffleCompression,
    /// Timed runs per query and mode.
    pub runs: usize,
    /// One entry per selected query, in the order run.
    pub queries: Vec<QueryReport>,
    /// Geometric mean of the distributed/stock ratios of the queries that
    /// ran every way.
    pub geomean_ratio: Option<f64>,
    /// Geometric mean of the dfx-local/stock ratios of the same queries.
    pub geomean_local_ratio: Option<f64>,
    /// Queries whose answers differ.
    pub mismatches: usize,
    /// Queries that could not run in one of the modes.
    pub failures: usize,
}

impl RunReport {
    /// Assemble a report, computing the geometric mean and the counts.
    pub fn new(
        scale: f64,
        partitions: usize,
        split: Split,
        shuffle_compression: ShuffleCompression,
        runs: usize,
        queries: Vec<QueryReport>,
    ) -> Self {
        let ratios: Vec<f64> = queries.iter().filter_map(|q| q.ratio).collect();
        let local_ratios: Vec<f64> = queries
            .iter()
            .filter(|q| q.ratio.is_some())
            .filter_map(|q| Some(q.local_ms? / q.stock_ms?))
            .collect();
        let mismatches = queries
            .iter()
            .filter(|q| matches!(q.outcome, Outcome::Mismatch(_)))
            .count();
        let failures = queries
            .iter()
            .filter(|q| {
                matches!(
                    q.outcome,
                    Outcome::LocalFailed(_) | Outcome::DistributedFailed(_)
                )
            })
            .count();
        RunReport {
            scale,
            partitions,
            split,
            shuffle_compression,
            runs,
            geomean_ratio: geometric_mean(&ratios),
            geomean_local_ratio: geometric_mean(&local_ratios),
            queries,
            mismatches,
            failures,
        }
    }

    /// The results table as printed by `dfx tpch` (Markdown, so it pastes
    /// into a README unchanged).
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "| query | rows | stock ms | dfx-local ms | distributed ms | distributed/stock | stages | tasks | answer |"
        );
        let _ = writeln!(out, "|---|--:|--:|--:|--:|--:|--:|--:|---|");
        for q in &self.queries {
            let _ = writeln!(
                out,
                "| q{} | {} | {} | {} | {} | {} | {} | {} | {} |",
                q.query,
                opt(q.rows),
                ms(q.stock_ms),
                ms(q.local_ms),
                ms(q.distributed_ms),
                q.ratio.map_or("-".to_string(), |r| format!("{r:.2}")),
                opt(q.stages),
                opt(q.tasks),
                q.outcome.label().replace('|', "\\|"),
            );
        }
        let _ = writeln!(
            out,
            "\ngeometric mean of distributed/stock: {}, of dfx-local/stock: {} (over {} of {} \
             queries)",
            self.geomean_ratio
                .map_or("-".to_string(), |g| format!("{g:.2}")),
            self.geomean_local_ratio
                .map_or("-".to_string(), |g| format!("{g:.2}")),
            self.queries.iter().filter(|q| q.ratio.is_some()).count(),
            self.queries.len()
        );
        out
    }

    /// Write the report as pretty JSON to `path`.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn write_json(&self, path: &Path) -> Result<(), TpchError> {
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| TpchError::Invalid(format!("cannot serialise the report: {e}")))?;
        std::fs::write(path, text + "\n").map_err(|e| TpchError::io(path, e))
    }
}

fn opt(v: Option<usize>) -> String {
    v.map_or("-".to_string(), |v| v.to_string())
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".to_string(), |v| format!("{v:.1}"))
}

/// Median of `values` (mean of the middle two for an even count); `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

/// Geometric mean of positive `values`; `None` when there are none.
pub fn geometric_mean(values: &[f64]) -> Option<f64> {
    let logs: Vec<f64> = values
        .iter()
        .filter(|v| v.is_finite() && **v > 0.0)
        .map(|v| v.ln())
        .collect();
    if logs.is_empty() {
        return None;
    }
    Some((logs.iter().sum::<f64>() / logs.len() as f64).exp())
}

/// First line of an error message, for a table cell.
pub fn first_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("(no message)")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(query: u8, ratio: Option<f64>, outcome: Outcome) -> QueryReport {
        QueryReport {
            query,
            rows: Some(4),
            stock_ms: Some(10.0),
            local_ms: Some(12.0),
            distributed_ms: ratio.map(|r| r * 10.0),
            ratio,
            stages: Some(1),
            tasks: Some(2),
            decisions: Vec::new(),
            outcome,
        }
    }

    #[test]
    fn medians_and_geometric_means() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        let g = geometric_mean(&[2.0, 8.0]).unwrap();
        assert!((g - 4.0).abs() < 1e-12);
        assert_eq!(geometric_mean(&[]), None);
    }

    #[test]
    fn table_reports_failures_and_mismatches_loudly() {
        let report = RunReport::new(
            0.1,
            2,
            Split::Exchange,
            ShuffleCompression::Lz4,
            3,
            vec![
                q(1, Some(2.0), Outcome::Agree),
                q(2, None, Outcome::DistributedFailed("not supported".into())),
                q(
                    3,
                    Some(8.0),
                    Outcome::Mismatch("expected 1 rows, found 2".into()),
                ),
            ],
        );
        assert_eq!(report.mismatches, 1);
        assert_eq!(report.failures, 1);
        assert!((report.geomean_ratio.unwrap() - 4.0).abs() < 1e-12);
        let table = report.table();
        assert!(
            table.contains("| q1 | 4 | 10.0 | 12.0 | 20.0 | 2.00 | 1 | 2 | agree |"),
            "{table}"
        );
        assert!(
            table.contains("cannot run distributed: not supported"),
            "{table}"
        );
        assert!(
            table.contains("MISMATCH: expected 1 rows, found 2"),
            "{table}"
        );
        assert!(
            table.contains("distributed/stock: 4.00, of dfx-local/stock: 1.20 (over 2 of 3"),
            "{table}"
        );
    }

    #[test]
    fn first_line_skips_blank_lines() {
        assert_eq!(first_line("\n  boom  \nmore"), "boom");
        assert_eq!(first_line(""), "(no message)");
    }
}
