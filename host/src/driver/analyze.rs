//! What a distributed run spent, stage by stage: the figures behind
//! `dfx run --analyze`.
//!
//! ```text
//! stage 3 (tasks: max 40 ms) ─┐
//!                             ├─► stage 1 (max 15 ms) ─► final read (5 ms)
//! stage 2 (tasks: max 12 ms) ─┘
//! critical path: 3 → 1, 55 ms of tasks + 5 ms of final read
//! ```
//!
//! A stage's time is that of its slowest task (a wave ends with its last
//! task), so the **critical path** is the chain of stages through their
//! deps whose slowest tasks sum largest: what no amount of workers would
//! make shorter. Task times are the driver's (dispatch to report), known for
//! every worker, old or new.

use crate::driver::DistributedResult;
use dfx_runtime::scheduler::TaskReport;

/// One stage's tasks, summed up.
#[derive(Debug, Clone, PartialEq)]
pub struct StageSummary {
    /// The stage.
    pub stage_id: u64,
    /// Tasks that reported.
    pub tasks: usize,
    /// Rows its tasks published.
    pub rows: usize,
    /// Bytes its tasks published; `None` if a worker did not say.
    pub bytes: Option<u64>,
    /// The fastest task, in milliseconds.
    pub min_ms: f64,
    /// The median task, in milliseconds.
    pub median_ms: f64,
    /// The slowest task, in milliseconds: the stage's time.
    pub max_ms: f64,
    /// Distinct workers (process ids) that ran its tasks.
    pub workers: usize,
}

/// The chain of stages whose slowest tasks sum largest.
#[derive(Debug, Clone, PartialEq)]
pub struct CriticalPath {
    /// Stage ids in the order they ran (the one reading no other first).
    pub stages: Vec<u64>,
    /// The sum of each stage's slowest task, in milliseconds.
    pub tasks_ms: f64,
    /// The driver's final read, in milliseconds.
    pub final_read_ms: f64,
}

impl CriticalPath {
    /// Tasks and final read together.
    pub fn total_ms(&self) -> f64 {
        self.tasks_ms + self.final_read_ms
    }
}

/// Each stage of `result`, in pre-order (the order of their ids).
pub fn stage_summaries(result: &DistributedResult) -> Vec<StageSummary> {
    result
        .stages
        .iter()
        .map(|stage| {
            let reports: Vec<&TaskReport> = result
                .task_reports
                .range((stage.stage_id, 0)..=(stage.stage_id, usize::MAX))
                .map(|(_, report)| report)
                .collect();
            let mut times: Vec<f64> = reports.iter().map(|r| r.wall_ms).collect();
            times.sort_by(f64::total_cmp);
            let mut workers: Vec<u32> = reports.iter().filter_map(|r| r.worker).collect();
            workers.sort_unstable();
            workers.dedup();
            StageSummary {
                stage_id: stage.stage_id,
                tasks: reports.len(),
                rows: reports.iter().map(|r| r.rows).sum(),
                bytes: reports.iter().map(|r| r.bytes).sum(),
                min_ms: times.first().copied().unwrap_or(0.0),
                median_ms: median(&times),
                max_ms: times.last().copied().unwrap_or(0.0),
                workers: workers.len(),
            }
        })
        .collect()
}

/// The median of sorted `values` (0 when empty).
fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The critical path of `result`: through the deps, the chain whose stages'
/// slowest tasks sum largest, then the final read.
pub fn critical_path(result: &DistributedResult) -> CriticalPath {
    let summaries = stage_summaries(result);
    let max_ms = |id: u64| {
        summaries
            .iter()
            .find(|s| s.stage_id == id)
            .map_or(0.0, |s| s.max_ms)
    };
    // Longest chain ending at each stage, memoized over the deps (no
    // ordering of ids assumed: a stage reused by two readers sits where
    // pre-order first met it).
    let mut best = std::collections::BTreeMap::new();
    for stage in &result.stages {
        longest_chain(result, stage.stage_id, &max_ms, &mut best, &mut Vec::new());
    }
    let (tasks_ms, stages) = best
        .into_values()
        .max_by(|a: &(f64, Vec<u64>), b| a.0.total_cmp(&b.0))
        .unwrap_or((0.0, Vec::new()));
    CriticalPath {
        stages,
        tasks_ms,
        final_read_ms: result.final_read_ms,
    }
}

/// The chain of deps ending at `id` whose stages' times sum largest, with
/// that sum; memoized in `best`. `visiting` guards against a cycle (the
/// driver refuses those before running; here one would only stop the walk).
fn longest_chain(
    result: &DistributedResult,
    id: u64,
    max_ms: &impl Fn(u64) -> f64,
    best: &mut std::collections::BTreeMap<u64, (f64, Vec<u64>)>,
    visiting: &mut Vec<u64>,
) -> (f64, Vec<u64>) {
    if let Some(found) = best.get(&id) {
        return found.clone();
    }
    if visiting.contains(&id) {
        return (0.0, Vec::new());
    }
    visiting.push(id);
    let deps = result.stage(id).map(|s| s.deps.clone()).unwrap_or_default();
    let (below_ms, mut chain) = deps
        .iter()
        .map(|dep| longest_chain(result, *dep, max_ms, best, visiting))
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .unwrap_or((0.0, Vec::new()));
    visiting.pop();
    chain.push(id);
    let found = (below_ms + max_ms(id), chain);
    best.insert(id, found.clone());
    found
}

/// `dfx run --analyze-json`'s document: every stage as the plugin described
/// it (maps, buckets, deps, partitioning) with each of its tasks' report,
/// the waves, the critical path, the final read and `wall_ms`, the whole
/// run's time as the caller measured it. Every task is kept, not a summary,
/// so a model of the run (`scripts/scaling-model.py`) can redo the schedule.
pub fn to_json(result: &DistributedResult, wall_ms: f64) -> serde_json::Value {
    let stages: Vec<serde_json::Value> = result
        .stages
        .iter()
        .map(|stage| {
            let tasks: Vec<serde_json::Value> = result
                .task_reports
                .range((stage.stage_id, 0)..=(stage.stage_id, usize::MAX))
                .map(|((_, map), r)| {
                    serde_json::json!({
                        "map": map,
                        "rows": r.rows,
                        "bytes": r.bytes,
                        "wall_ms": r.wall_ms,
                        "elapsed_ms": r.elapsed_ms,
                        "worker": r.worker,
                        "attempt": r.attempt,
                    })
                })
                .collect();
            serde_json::json!({
                "stage_id": stage.stage_id,
                "maps": stage.maps,
                "buckets": stage.buckets,
                "deps": stage.deps,
                "partitioning": stage.partitioning,
                "tasks": tasks,
            })
        })
        .collect();
    let path = critical_path(result);
    serde_json::json!({
        "wall_ms": wall_ms,
        "worker_mode": result.worker_mode.as_str(),
        "final_read_ms": result.final_read_ms,
        "waves": result.waves,
        "critical_path": {"stages": path.stages, "tasks_ms": path.tasks_ms},
        "stages": stages,
        "decisions": result.decisions,
    })
}

/// `dfx run --analyze`'s text: one line per stage, then the critical path.
pub fn render(result: &DistributedResult) -> String {
    let mut out =
        String::from("stage | tasks | workers | rows | bytes | task ms min / median / max\n");
    for s in stage_summaries(result) {
        out.push_str(&format!(
            "{:>5} | {:>5} | {:>7} | {:>4} | {:>5} | {:.2} / {:.2} / {:.2}\n",
            s.stage_id,
            s.tasks,
            s.workers,
            s.rows,
            s.bytes.map_or("?".to_string(), |b| b.to_string()),
            s.min_ms,
            s.median_ms,
            s.max_ms
        ));
    }
    let path = critical_path(result);
    let chain: Vec<String> = path.stages.iter().map(|s| format!("stage {s}")).collect();
    out.push_str(&format!(
        "critical path: {} -> final read: {:.2} ms of tasks + {:.2} ms of final read = {:.2} ms\n",
        chain.join(" -> "),
        path.tasks_ms,
        path.final_read_ms,
        path.total_ms()
    ));
    for decision in &result.decisions {
        out.push_str(&format!(
            "adaptive: stage {}: {} -> {} task(s): {}\n",
            decision.stage_id, decision.planned_tasks, decision.tasks, decision.reason
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::stages::StageInfo;
    use dfx_runtime::scheduler::{TaskReports, WorkerMode};

    fn stage(stage_id: u64, maps: usize, deps: Vec<u64>) -> StageInfo {
        StageInfo {
            stage_id,
            shuffle_dir: "/s".into(),
            maps,
            buckets: 1,
            partitions_per_map: 1,
            deps,
            aligned_deps: Vec::new(),
            partitioning: "single".into(),
        }
    }

    fn report(rows: usize, bytes: Option<u64>, wall_ms: f64, worker: u32) -> TaskReport {
        TaskReport {
            rows,
            bytes,
            elapsed_ms: None,
            wall_ms,
            worker: Some(worker),
            attempt: 0,
            layout: None,
        }
    }

    /// Stage 1 reads 2 and 4; 2 reads 3. Chains: 3 → 2 → 1 (5 + 10 + 1 =
    /// 16 ms) and 4 → 1 (14 + 1 = 15 ms).
    fn result() -> DistributedResult {
        let mut task_reports = TaskReports::new();
        task_reports.insert((1, 0), report(3, Some(30), 1.0, 7));
        task_reports.insert((2, 0), report(4, Some(40), 10.0, 7));
        task_reports.insert((2, 1), report(5, Some(50), 2.0, 8));
        task_reports.insert((2, 2), report(6, None, 4.0, 8));
        task_reports.insert((3, 0), report(1, Some(10), 5.0, 7));
        task_reports.insert((4, 0), report(2, Some(20), 14.0, 8));
        DistributedResult {
            batches: Vec::new(),
            stages: vec![
                stage(1, 1, vec![2, 4]),
                stage(2, 3, vec![3]),
                stage(3, 1, vec![]),
                stage(4, 1, vec![]),
            ],
            waves: vec![vec![3, 4], vec![2], vec![1]],
            tasks: task_reports.keys().copied().collect(),
            task_rows: task_reports.iter().map(|(k, r)| (*k, r.rows)).collect(),
            task_reports,
            worker_mode: WorkerMode::Pool,
            final_read_ms: 2.5,
            decisions: Vec::new(),
            attempts: Default::default(),
            retries: Vec::new(),
            shuffle_location: "/s".into(),
        }
    }

    #[test]
    fn a_stage_sums_its_tasks_and_spans_their_times() {
        let summaries = stage_summaries(&result());
        let two = &summaries[1];
        assert_eq!(two.stage_id, 2);
        assert_eq!((two.tasks, two.rows, two.workers), (3, 15, 2));
        // One task did not say its bytes: the stage's are unknown.
        assert_eq!(two.bytes, None);
        assert_eq!((two.min_ms, two.median_ms, two.max_ms), (2.0, 4.0, 10.0));
        assert_eq!(summaries[3].bytes, Some(20));
    }

    #[test]
    fn the_json_document_keeps_every_task_under_its_stage() {
        let doc = to_json(&result(), 40.0);
        assert_eq!(doc["wall_ms"], 40.0);
        assert_eq!(doc["final_read_ms"], 2.5);
        assert_eq!(doc["critical_path"]["stages"], serde_json::json!([3, 2, 1]));
        let two = &doc["stages"][1];
        assert_eq!(two["stage_id"], 2);
        assert_eq!(two["deps"], serde_json::json!([3]));
        let maps: Vec<u64> = two["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["map"].as_u64().unwrap())
            .collect();
        assert_eq!(maps, vec![0, 1, 2]);
        assert_eq!(two["tasks"][0]["wall_ms"], 10.0);
        // A worker that did not say its bytes: null, not zero.
        assert!(two["tasks"][2]["bytes"].is_null());
    }

    #[test]
    fn the_critical_path_is_the_chain_whose_slowest_tasks_sum_largest() {
        let path = critical_path(&result());
        assert_eq!(path.stages, vec![3, 2, 1]);
        assert_eq!(path.tasks_ms, 16.0);
        assert_eq!(path.total_ms(), 18.5);
        let text = render(&result());
        assert!(
            text.contains("critical path: stage 3 -> stage 2 -> stage 1 -> final read: 16.00 ms"),
            "{text}"
        );
    }
}
