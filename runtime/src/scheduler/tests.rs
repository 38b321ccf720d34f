//! The ready queue's order, its failure report and speculation, on
//! executors that run tasks in this process.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::graph::remaining_paths;
use super::*;
use crate::error::{Result, Retry, TaskFailure};
use crate::protocol::envelope::Envelope;
use crate::spec::SessionSpec;

fn info(stage_id: u64, deps: &[u64]) -> StageInfo {
    StageInfo {
        stage_id,
        shuffle_dir: "/s".into(),
        maps: 1,
        buckets: 1,
        partitions_per_map: 1,
        deps: deps.to_vec(),
        aligned_deps: Vec::new(),
        partitioning: "single".into(),
    }
}

/// Runs a task in process: it takes its stage's time and records when it
/// started and ended. The times differ by far more than a busy machine
/// delays a timer, so the order of events is the scheduler's.
#[derive(Debug, Default)]
struct Timed {
    millis: BTreeMap<u64, u64>,
    failing: BTreeSet<u64>,
    events: Mutex<Vec<String>>,
}

#[async_trait]
impl Executor for Timed {
    async fn run(
        &self,
        task: &Task,
        _slots: usize,
    ) -> std::result::Result<TaskReport, TaskFailure> {
        let log = |what: &str| {
            let event = format!("{what} {}", task.stage_id);
            self.events.lock().unwrap().push(event);
        };
        log("start");
        let millis = self.millis.get(&task.stage_id).copied().unwrap_or(1);
        tokio::time::sleep(Duration::from_millis(millis)).await;
        log("end");
        outcome(
            task,
            self.failing.contains(&task.stage_id),
            "failed on purpose",
        )
    }

    fn name(&self) -> String {
        "timed".into()
    }
}

/// A test executor's answer: one row published, or a final failure.
fn outcome(
    task: &Task,
    failing: bool,
    reason: &str,
) -> std::result::Result<TaskReport, TaskFailure> {
    if failing {
        return Err(TaskFailure {
            stage_id: task.stage_id,
            map: task.map,
            reason: reason.into(),
            stderr: String::new(),
            retry: Retry::No,
        });
    }
    Ok(TaskReport {
        rows: 1,
        bytes: None,
        elapsed_ms: None,
        wall_ms: 0.0,
        worker: None,
        attempt: 0,
        layout: None,
    })
}

fn tasks(infos: &[StageInfo]) -> Vec<Task> {
    infos
        .iter()
        .map(|info| Task {
            stage_id: info.stage_id,
            map: 0,
            envelope: format!("/t/{}", info.stage_id).into(),
            inline: None,
        })
        .collect()
}

async fn run(executor: Arc<Timed>, infos: &[StageInfo], slots: usize) -> Result<Vec<(u64, usize)>> {
    let scheduler = Scheduler::new(
        executor,
        SchedulerOptions {
            max_workers: Some(slots),
            max_attempts: 1,
            ..SchedulerOptions::default()
        },
    );
    let waves = waves(infos)?;
    let tasks = tasks(infos);
    let attempts = Attempts::new(&tasks, 1);
    match scheduler
        .run_ready(infos, &waves, &tasks, &attempts, None)
        .await
    {
        (done, None, _) => Ok(done.into_iter().map(|(task, _)| task).collect()),
        (_, Some(error), _) => Err(error),
    }
}

/// 1 reads 2 and 3; 2 reads 4. Waves: [3, 4], [2], [1].
fn graph() -> Vec<StageInfo> {
    vec![info(1, &[2, 3]), info(2, &[4]), info(3, &[]), info(4, &[])]
}

#[tokio::test]
async fn a_stage_starts_when_its_own_inputs_are_published_not_its_waves() {
    // 3 is slow; 2 needs only 4, so it starts while 3 still runs.
    let executor = Arc::new(Timed {
        millis: [(3, 600), (4, 10), (2, 10), (1, 10)].into(),
        ..Timed::default()
    });
    let order = run(Arc::clone(&executor), &graph(), 2).await.unwrap();
    assert_eq!(order, vec![(4, 0), (3, 0), (2, 0), (1, 0)]);
    let events = executor.events.lock().unwrap().clone();
    let at = |event: &str| events.iter().position(|e| e == event).unwrap();
    assert!(at("start 2") < at("end 3"), "{events:?}");
    assert!(
        at("end 2") < at("start 1") && at("end 3") < at("start 1"),
        "{events:?}"
    );
}

#[tokio::test]
async fn a_free_slot_takes_the_task_on_the_longest_remaining_path() {
    // One slot: 4 (three stages to the root) before 3 (two).
    let executor = Arc::new(Timed::default());
    let order = run(executor, &graph(), 1).await.unwrap();
    assert_eq!(order, vec![(4, 0), (2, 0), (3, 0), (1, 0)]);
    let paths = remaining_paths(&graph());
    assert_eq!(paths, [(1, 1), (2, 2), (3, 2), (4, 3)].into());
}

#[tokio::test]
async fn a_failure_stops_later_waves_and_reports_its_wave_whole() {
    // 4 fails; 3, of the same wave, still runs and its reader does not.
    let executor = Arc::new(Timed {
        millis: [(3, 50)].into(),
        failing: [4].into(),
        ..Timed::default()
    });
    let err = run(Arc::clone(&executor), &graph(), 2).await.unwrap_err();
    let events = executor.events.lock().unwrap().clone();
    assert!(events.contains(&"end 3".to_string()), "{events:?}");
    assert!(
        !events.iter().any(|e| e == "start 2" || e == "start 1"),
        "{events:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("1 of 2 worker task(s) failed in wave 1 (stages [3, 4])"),
        "{text}"
    );
}

#[tokio::test]
async fn a_stage_of_no_map_is_published_at_once() {
    let mut infos = graph();
    infos[3].maps = 0;
    let executor = Arc::new(Timed::default());
    let scheduler = Scheduler::new(executor, SchedulerOptions::default());
    let waves = waves(&infos).unwrap();
    let tasks: Vec<Task> = tasks(&infos)
        .into_iter()
        .filter(|t| t.stage_id != 4)
        .collect();
    let attempts = Attempts::new(&tasks, 1);
    let (done, error, _) = scheduler
        .run_ready(&infos, &waves, &tasks, &attempts, None)
        .await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(done.len(), 3);
}

/// Runs a task in process: each attempt `(stage, map, attempt)` in
/// `millis` sleeps that long, every other one 100 ms; attempts in
/// `failing` fail for good.
#[derive(Debug, Default)]
struct Straggling {
    millis: BTreeMap<(u64, usize, u32), u64>,
    failing: BTreeSet<(u64, usize, u32)>,
    events: Mutex<Vec<String>>,
}

#[async_trait]
impl Executor for Straggling {
    async fn run(
        &self,
        task: &Task,
        _slots: usize,
    ) -> std::result::Result<TaskReport, TaskFailure> {
        let attempt = task.inline.as_ref().map_or(0, |e| e.attempt);
        let name = format!("{}/{} attempt {attempt}", task.stage_id, task.map);
        self.events.lock().unwrap().push(format!("start {name}"));
        let key = (task.stage_id, task.map, attempt);
        let millis = self.millis.get(&key).copied().unwrap_or(100);
        tokio::time::sleep(Duration::from_millis(millis)).await;
        self.events.lock().unwrap().push(format!("end {name}"));
        let failing = self.failing.contains(&(task.stage_id, task.map, attempt));
        outcome(task, failing, &format!("{name} failed on purpose"))
    }

    fn name(&self) -> String {
        "straggling".into()
    }
}

/// Stage 1 reads stage 2, whose three maps run at once on three slots
/// (a fourth is free for a twin); map 2's first attempt straggles.
async fn run_straggling(
    executor: Arc<Straggling>,
) -> (Result<Vec<((u64, usize), TaskReport)>>, Vec<String>) {
    let mut infos = vec![info(1, &[2]), info(2, &[])];
    infos[1].maps = 3;
    let spec = SessionSpec::new(std::iter::empty::<(String, String)>());
    let tasks: Vec<Task> = [(1, 0), (2, 0), (2, 1), (2, 2)]
        .into_iter()
        .map(|(stage_id, map)| Task {
            stage_id,
            map,
            envelope: format!("/t/{stage_id}-{map}").into(),
            inline: Some(Arc::new(Envelope {
                spec: spec.clone(),
                plan: "/t/plan".into(),
                stage_id,
                partition: map,
                attempt: 0,
                added_from: None,
            })),
        })
        .collect();
    let scheduler = Scheduler::new(
        executor,
        SchedulerOptions {
            max_workers: Some(4),
            max_attempts: 1,
            speculation: Some(Speculation {
                factor: 2.0,
                min_elapsed: Duration::from_millis(200),
            }),
            ..SchedulerOptions::default()
        },
    );
    let waves = waves(&infos).unwrap();
    let attempts = Attempts::new(&tasks, 1);
    let outcome = match scheduler
        .run_ready(&infos, &waves, &tasks, &attempts, None)
        .await
    {
        (done, None, _) => Ok(done),
        (_, Some(error), _) => Err(error),
    };
    (outcome, attempts.retries())
}

#[tokio::test]
async fn a_straggler_gets_a_twin_and_the_first_to_finish_wins() {
    let executor = Arc::new(Straggling {
        millis: [((2, 2, 0), 60_000)].into(),
        ..Straggling::default()
    });
    let (done, retries) = run_straggling(Arc::clone(&executor)).await;
    let done: BTreeMap<_, _> = done.unwrap().into_iter().collect();
    assert_eq!(done.len(), 4);
    assert_eq!(done[&(2, 2)].attempt, 1, "{retries:?}");
    assert_eq!(done[&(2, 0)].attempt, 0);
    let events = executor.events.lock().unwrap().clone();
    // The straggler was stopped, never finished; its reader ran.
    assert!(
        !events.iter().any(|e| e == "end 2/2 attempt 0"),
        "{events:?}"
    );
    assert!(
        events.iter().any(|e| e == "end 1/0 attempt 0"),
        "{events:?}"
    );
    assert!(
        retries[0].starts_with("stage 2 map 2 attempt 1: speculative, its first attempt ran"),
        "{retries:?}"
    );
    assert!(
        retries[1].contains("published first; the first attempt was stopped"),
        "{retries:?}"
    );
}

#[tokio::test]
async fn a_failed_twin_leaves_the_first_attempt_to_finish() {
    let executor = Arc::new(Straggling {
        millis: [((2, 2, 0), 1_500)].into(),
        failing: [(2, 2, 1)].into(),
        ..Straggling::default()
    });
    let (done, retries) = run_straggling(Arc::clone(&executor)).await;
    let done: BTreeMap<_, _> = done.unwrap().into_iter().collect();
    assert_eq!(done[&(2, 2)].attempt, 0, "{retries:?}");
    let events = executor.events.lock().unwrap().clone();
    assert!(
        events.iter().any(|e| e == "end 2/2 attempt 1"),
        "{events:?}"
    );
    assert!(
        events.iter().any(|e| e == "end 2/2 attempt 0"),
        "{events:?}"
    );
}

#[tokio::test]
async fn a_failed_first_attempt_waits_for_its_twin() {
    // The first attempt fails for good while its twin runs; the twin
    // publishes, so the task succeeds.
    let millis: BTreeMap<_, _> = [((2, 2, 0), 1_000), ((2, 2, 1), 2_000)].into();
    let executor = Arc::new(Straggling {
        millis: millis.clone(),
        failing: [(2, 2, 0)].into(),
        ..Straggling::default()
    });
    let (done, retries) = run_straggling(Arc::clone(&executor)).await;
    let done: BTreeMap<_, _> = done.unwrap().into_iter().collect();
    assert_eq!(done[&(2, 2)].attempt, 1, "{retries:?}");
    let events = executor.events.lock().unwrap().clone();
    let at = |event: &str| events.iter().position(|e| e == event).unwrap();
    assert!(
        at("end 2/2 attempt 0") < at("end 2/2 attempt 1"),
        "{events:?}"
    );

    // Both fail: the first attempt's failure is the one reported.
    let executor = Arc::new(Straggling {
        millis,
        failing: [(2, 2, 0), (2, 2, 1)].into(),
        ..Straggling::default()
    });
    let (done, _) = run_straggling(executor).await;
    let text = done.unwrap_err().to_string();
    assert!(text.contains("2/2 attempt 0 failed on purpose"), "{text}");
}
