//! The split rule on plans: where each cut goes in both modes, how stages
//! are numbered, and that a map task runs alone.

mod common;

use std::sync::Arc;

use common::*;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::Result;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, displayable};
use dfx_plugin::{ShuffleReaderExec, ShuffleWriterExec};
use futures::StreamExt;

async fn plan_with(sql: &str, split: &str) -> Result<Arc<dyn ExecutionPlan>> {
    let dir = temp_dir();
    session_with(Some(dir.path()), split)?
        .sql(sql)
        .await?
        .create_physical_plan()
        .await
}

fn text(plan: &Arc<dyn ExecutionPlan>) -> String {
    displayable(plan.as_ref()).indent(false).to_string()
}

/// Each line of the plan, trimmed of its indent, for shape checks.
fn shape(plan: &Arc<dyn ExecutionPlan>) -> Vec<String> {
    text(plan)
        .lines()
        .map(|l| l.trim().split(':').next().unwrap_or_default().to_string())
        .collect()
}

fn readers(plan: &Arc<dyn ExecutionPlan>) -> Vec<String> {
    text(plan)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("ShuffleReaderExec: "))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn exchange_cuts_a_grouped_aggregate_at_its_repartition() -> Result<()> {
    let plan = plan_with("SELECT g, sum(v) FROM t GROUP BY g", "exchange").await?;
    // head: pass-through of the final aggregate's partitions; below it the
    // hash exchange between partial and final aggregate.
    assert_eq!(
        shape(&plan)[..5],
        [
            "ShuffleReaderExec",
            "ShuffleWriterExec",
            "AggregateExec",
            "ShuffleReaderExec",
            "ShuffleWriterExec",
        ],
        "{}",
        text(&plan)
    );
    assert_eq!(stage_ids(&plan), vec![1, 2]);
    let writers = stages(&plan);
    let top = writers[0].downcast_ref::<ShuffleWriterExec>().unwrap();
    let bottom = writers[1].downcast_ref::<ShuffleWriterExec>().unwrap();
    assert_eq!(top.deps(), &[2]);
    assert!(bottom.deps().is_empty());
    assert!(
        bottom.partitioning_display().starts_with("hash("),
        "{}",
        text(&plan)
    );
    assert_eq!(bottom.buckets(), 2);
    assert!(readers(&plan)[1].contains("mode=hash"), "{}", text(&plan));
    Ok(())
}

#[tokio::test]
async fn aggregate_mode_cuts_one_stage_per_topmost_partial_aggregate() -> Result<()> {
    let plan = plan_with("SELECT g, sum(v) FROM t GROUP BY g", "aggregate").await?;
    assert_eq!(stage_ids(&plan), vec![1], "{}", text(&plan));
    let writer = stages(&plan)[0].clone();
    assert!(
        text(writer.children()[0]).starts_with("AggregateExec: mode=Partial"),
        "{}",
        text(&plan)
    );
    let plan = plan_with("SELECT k, v FROM t WHERE v > 1", "aggregate").await?;
    assert!(plan.is::<ShuffleReaderExec>(), "{}", text(&plan));
    assert_eq!(stage_ids(&plan), vec![1]);
    let plan = plan_with(
        "SELECT g, sum(v) FROM t GROUP BY g UNION ALL SELECT g, count(*) FROM u GROUP BY g",
        "aggregate",
    )
    .await?;
    assert_eq!(stage_ids(&plan), vec![1, 2], "{}", text(&plan));
    Ok(())
}

#[tokio::test]
async fn a_merge_reads_its_input_pass_through_and_runs_in_the_head() -> Result<()> {
    let plan = plan_with("SELECT k, v FROM t ORDER BY v LIMIT 3", "exchange").await?;
    let lines = shape(&plan);
    assert_eq!(lines[0], "SortPreservingMergeExec", "{}", text(&plan));
    assert_eq!(lines[1], "ShuffleReaderExec", "{}", text(&plan));
    assert!(
        readers(&plan)[0].contains("mode=pass-through"),
        "{}",
        text(&plan)
    );
    Ok(())
}

#[tokio::test]
async fn a_plan_without_exchange_is_one_pass_through_stage() -> Result<()> {
    let plan = plan_with("SELECT k, v FROM t WHERE v > 1", "exchange").await?;
    assert!(plan.is::<ShuffleReaderExec>(), "{}", text(&plan));
    assert_eq!(stage_ids(&plan), vec![1]);
    Ok(())
}

/// The plan of `sql` in [`session`] planned for `partitions`, each map
/// running `per_task` of them, with `collapse_stages` as given.
async fn plan_in_tasks_of(
    sql: &str,
    partitions: usize,
    per_task: usize,
    collapse: &str,
) -> Result<Arc<dyn ExecutionPlan>> {
    let dir = temp_dir();
    let ctx = session(Some(dir.path()))?;
    {
        let state = ctx.state_ref();
        let mut state = state.write();
        let options = state.config_mut().options_mut();
        options.execution.target_partitions = partitions;
        options.set("dfx_engine.partitions_per_task", &per_task.to_string())?;
        options.set("dfx_engine.collapse_stages", collapse)?;
    }
    ctx.sql(sql).await?.create_physical_plan().await
}

/// The cores of this process, which plans as a driver does.
fn planning_cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

#[tokio::test]
async fn a_plan_no_wider_than_a_task_runs_whole() -> Result<()> {
    let sql = "SELECT t.g, sum(u.v) FROM t JOIN u ON t.k = u.k GROUP BY t.g ORDER BY t.g";
    // Two partitions everywhere, two a task: every stage would be one task.
    // `task`: one stage, the whole plan inside its writer.
    let plan = plan_in_tasks_of(sql, 2, 2, "task").await?;
    assert_eq!(stage_ids(&plan), vec![1], "{}", text(&plan));
    let writer = stages(&plan)[0].clone();
    let inside = text(writer.children()[0]);
    assert!(
        inside.contains("RepartitionExec: partitioning=Hash"),
        "{inside}"
    );
    assert!(!inside.contains("ShuffleReaderExec"), "{inside}");
    // `auto`, no wider than this process's cores either (the tables' two
    // partitions): not cut at all, so the driver runs it, with no stage.
    let plan = plan_in_tasks_of(sql, 2, 2, "auto").await?;
    if planning_cores() >= 2 {
        assert!(stages(&plan).is_empty(), "{}", text(&plan));
        assert!(
            text(&plan).contains("RepartitionExec: partitioning=Hash"),
            "the whole plan: {}",
            text(&plan)
        );
    } else {
        assert_eq!(stage_ids(&plan), vec![1], "{}", text(&plan));
    }
    // `auto`, wider than this process's cores but no wider than a task: one
    // stage, for a worker with the cores.
    let wide = planning_cores() + 1;
    let plan = plan_in_tasks_of(sql, wide, wide, "auto").await?;
    assert_eq!(stage_ids(&plan), vec![1], "{}", text(&plan));
    // One a task, or collapsing turned off: cut at every exchange.
    for (per_task, collapse) in [(1, "auto"), (2, "off"), (1, "task")] {
        let plan = plan_in_tasks_of(sql, 2, per_task, collapse).await?;
        assert!(
            stage_ids(&plan).len() > 2,
            "{per_task} {collapse}: {}",
            text(&plan)
        );
    }
    // A union of two tables runs four partitions: wider than a task of two.
    let union = "SELECT g, count(*) FROM (SELECT g FROM t UNION ALL SELECT g FROM u) GROUP BY g";
    let plan = plan_in_tasks_of(union, 2, 2, "task").await?;
    assert!(stage_ids(&plan).len() > 1, "{}", text(&plan));
    let plan = plan_in_tasks_of(union, 2, 4, "task").await?;
    assert_eq!(stage_ids(&plan), vec![1], "{}", text(&plan));
    Ok(())
}

#[tokio::test]
async fn a_collected_inner_join_broadcasts_its_build_side() -> Result<()> {
    let dir = temp_dir();
    let ctx = session(Some(dir.path()))?;
    // A non-equi inner join: the nested-loop join collects its left side.
    let sql = "SELECT t.k, u.v FROM t JOIN u ON t.k > u.k";
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    assert!(
        readers(&plan).iter().any(|r| r.contains("mode=broadcast")),
        "{}",
        text(&plan)
    );
    Ok(())
}

#[tokio::test]
async fn joins_that_emit_unmatched_build_rows_run_in_one_task() -> Result<()> {
    for sql in [
        "SELECT count(*) FROM t WHERE v NOT IN (SELECT v FROM u WHERE k > 1)",
        "SELECT count(*) FROM t FULL JOIN u ON t.k > u.k + 1",
        "SELECT t.v, u.v FROM t LEFT JOIN u ON t.k > u.k",
    ] {
        let plan = plan_with(sql, "exchange").await?;
        let join_stage = stages(&plan)
            .into_iter()
            .find(|w| {
                let input = text(w.children()[0]);
                input.contains("NestedLoopJoinExec") || input.contains("null_aware")
            })
            .unwrap_or_else(|| panic!("no stage holds the join of {sql}:\n{}", text(&plan)));
        let writer = join_stage.downcast_ref::<ShuffleWriterExec>().unwrap();
        // The join's own stage: one map, reading every probe partition.
        let join_line = text(writer.input())
            .lines()
            .position(|l| l.contains("JoinExec"))
            .unwrap();
        assert!(
            join_line <= 2,
            "{sql}: the join is not the stage's root\n{}",
            text(&plan)
        );
        assert_eq!(writer.maps(), 1, "{sql}:\n{}", text(&plan));
    }
    Ok(())
}

#[tokio::test]
async fn stages_are_numbered_in_pre_order_and_afresh_on_every_call() -> Result<()> {
    let sql = "SELECT t.g, sum(t.v) FROM t JOIN u ON t.k = u.k GROUP BY t.g";
    for _ in 0..2 {
        let plan = plan_with(sql, "exchange").await?;
        let ids = stage_ids(&plan);
        let expected: Vec<u64> = (1..=ids.len() as u64).collect();
        assert_eq!(ids, expected, "{}", text(&plan));
        assert!(ids.len() >= 3, "{}", text(&plan));
        // Every dep is a later stage in pre-order: writers below come after.
        for writer in stages(&plan) {
            let writer = writer.downcast_ref::<ShuffleWriterExec>().unwrap();
            assert!(writer.deps().iter().all(|d| *d > writer.stage_id()));
        }
    }
    Ok(())
}

#[tokio::test]
async fn no_shuffle_dir_no_stage() -> Result<()> {
    let ctx = session(None)?;
    let plan = ctx
        .sql("SELECT g, sum(v) FROM t GROUP BY g")
        .await?
        .create_physical_plan()
        .await?;
    assert!(stages(&plan).is_empty(), "{}", text(&plan));
    Ok(())
}

#[tokio::test]
async fn an_unknown_split_mode_is_refused_by_name() -> Result<()> {
    let dir = temp_dir();
    let ctx = session_with(Some(dir.path()), "everywhere")?;
    // Whichever step reads the config first (planning, at the latest) refuses.
    let err = match ctx.sql("SELECT g FROM t").await {
        Err(err) => err.to_string(),
        Ok(df) => df.create_physical_plan().await.unwrap_err().to_string(),
    };
    assert!(err.contains("dfx_engine.split"), "{err}");
    assert!(err.contains("everywhere"), "{err}");
    Ok(())
}

#[tokio::test]
async fn the_functions_answer_by_hand() -> Result<()> {
    // t: (1,a,1.0) (2,b,2.0) (3,a,3.0) (4,b,null)
    // a: weighted avg (1*1 + 3*3) / (1 + 3) = 2.5; b: only (2, 2.0) counts = 2.0
    let ctx = session(None)?;
    let batches = ctx
        .sql("SELECT g, dfx_weighted_avg(v, k) AS w FROM t GROUP BY g ORDER BY g")
        .await?
        .collect()
        .await?;
    let expected = "+---+-----+\n| g | w   |\n+---+-----+\n| a | 2.5 |\n| b | 2.0 |\n+---+-----+";
    assert_eq!(pretty_format_batches(&batches)?.to_string(), expected);
    Ok(())
}

/// A worker runs one partition of a stage and never polls its siblings. With
/// a scan over several files, run-time file rebalancing between sibling
/// partitions would let that one partition read every file: each task would
/// publish the whole table. Each task must publish only its own files' rows.
#[tokio::test]
async fn a_task_reads_only_its_own_files() -> Result<()> {
    let shuffle = temp_dir();
    let ctx = session(Some(shuffle.path()))?;
    // Four files of two rows: with two partitions each task owns two files.
    let _data = parquet_table(&ctx, "files", 4, 2).await?;
    let plan = ctx
        .sql("SELECT k, v FROM files")
        .await?
        .create_physical_plan()
        .await?;
    let stage = &stages(&plan)[0];
    assert_eq!(
        stage.output_partitioning().partition_count(),
        2,
        "{}",
        text(&plan)
    );
    // Map 1 alone, first, as a worker process would run it.
    let mut rows = 0;
    let mut stream = stage.execute(1, ctx.task_ctx())?;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let column = batch.column_by_name("rows").unwrap();
        let column = column
            .as_any()
            .downcast_ref::<datafusion::arrow::array::UInt64Array>()
            .unwrap();
        rows += column.iter().flatten().sum::<u64>();
    }
    assert_eq!(rows, 4, "map 1 owns two files of two rows");
    Ok(())
}

/// Register `name` as a Parquet table of `files` files, each holding keys
/// `0..rows` and a value column.
async fn parquet_table(
    ctx: &datafusion::prelude::SessionContext,
    name: &str,
    files: usize,
    rows: usize,
) -> Result<tempfile::TempDir> {
    let data = temp_dir();
    let writer = datafusion::prelude::SessionContext::new();
    for file in 0..files {
        let df = writer
            .sql(&format!(
                "SELECT value AS k, value * {file} AS v FROM generate_series(0, {}) AS s(value)",
                rows - 1
            ))
            .await?;
        df.write_parquet(
            &data
                .path()
                .join(format!("part-{file}.parquet"))
                .to_string_lossy(),
            datafusion::dataframe::DataFrameWriteOptions::new(),
            None,
        )
        .await?;
    }
    ctx.register_parquet(
        name,
        &data.path().to_string_lossy(),
        datafusion::prelude::ParquetReadOptions::default(),
    )
    .await?;
    Ok(data)
}

/// A stage holding a partitioned hash join runs one partition alone, as a
/// task does. With the join's dynamic filter (which waits for every partition
/// of the join) it would never finish; the planner turns the filter off when
/// it distributes. The timeout only turns a hang into a failure.
#[tokio::test]
async fn a_task_with_a_partitioned_join_finishes_alone() -> Result<()> {
    let dir = temp_dir();
    let ctx = session(Some(dir.path()))?;
    let _left = parquet_table(&ctx, "l", 2, 100).await?;
    let _right = parquet_table(&ctx, "r", 2, 100).await?;
    // Force a partitioned join, not a broadcast of the small side.
    ctx.sql("SET datafusion.optimizer.hash_join_single_partition_threshold = 0")
        .await?;
    ctx.sql("SET datafusion.optimizer.hash_join_single_partition_threshold_rows = 0")
        .await?;
    let sql = "SELECT count(*) FROM l JOIN r ON l.k = r.k AND l.v = r.v";
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    assert!(text(&plan).contains("mode=Partitioned"), "{}", text(&plan));
    // The stage holding the join: the one that reads two others.
    let stage = stages(&plan)
        .into_iter()
        .find(|w| w.downcast_ref::<ShuffleWriterExec>().unwrap().deps().len() == 2)
        .expect("a stage reading both sides of the join");
    run_stages_below(&ctx, &stage).await?;
    let run_one_partition = async {
        let mut stream = stage.execute(0, ctx.task_ctx())?;
        while let Some(batch) = stream.next().await {
            batch?;
        }
        Ok::<_, datafusion::common::DataFusionError>(())
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), run_one_partition)
        .await
        .expect("partition 0 of the join stage never finished")?;
    Ok(())
}

/// Publish every stage below `stage` (not `stage` itself).
async fn run_stages_below(
    ctx: &datafusion::prelude::SessionContext,
    stage: &Arc<dyn ExecutionPlan>,
) -> Result<()> {
    let input = Arc::clone(stage.children()[0]);
    run_stages(ctx, &input).await?;
    Ok(())
}

/// Each writer's stage id, deps and the deps it reads partition by
/// partition, in pre-order.
fn alignment(plan: &Arc<dyn ExecutionPlan>) -> Vec<(u64, Vec<u64>, Vec<u64>)> {
    stages(plan)
        .iter()
        .map(|s| {
            let w = s.downcast_ref::<ShuffleWriterExec>().unwrap();
            (w.stage_id(), w.deps().to_vec(), w.aligned_deps().to_vec())
        })
        .collect()
}

#[tokio::test]
async fn a_stage_reads_partition_by_partition_only_along_operators_that_keep_partitions()
-> Result<()> {
    // The final aggregate reads its hash exchange bucket by partition; the
    // collected build side is read whole by every partition.
    let joined = "SELECT t.g, sum(u.v) FROM t JOIN u ON t.k = u.k GROUP BY t.g";
    let plan = plan_with(joined, "exchange").await?;
    assert_eq!(
        alignment(&plan),
        [
            (1, vec![2], vec![2]),
            (2, vec![3], vec![]),
            (3, vec![], vec![])
        ],
        "{}",
        text(&plan)
    );
    // A partitioned join reads both sides bucket by partition.
    let dir = temp_dir();
    let ctx = session_with(Some(dir.path()), "exchange")?;
    for key in [
        "hash_join_single_partition_threshold",
        "hash_join_single_partition_threshold_rows",
    ] {
        ctx.sql(&format!("SET datafusion.optimizer.{key} = 0"))
            .await?;
    }
    let plan = ctx.sql(joined).await?.create_physical_plan().await?;
    let join_stage = alignment(&plan)
        .into_iter()
        .find(|(_, deps, _)| deps.len() == 2)
        .unwrap_or_else(|| panic!("no stage reads two: {}", text(&plan)));
    assert_eq!(join_stage.2, join_stage.1, "{}", text(&plan));
    // Under a union, partition p + 2 of the stage reads bucket p of the
    // second side: neither side is read partition by partition.
    let union = "SELECT g, sum(v) FROM t GROUP BY g UNION ALL SELECT g, sum(v) FROM u GROUP BY g";
    let plan = plan_with(union, "exchange").await?;
    assert_eq!(
        alignment(&plan)[0],
        (1, vec![2, 3], vec![]),
        "{}",
        text(&plan)
    );
    Ok(())
}
