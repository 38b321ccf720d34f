//! The split rule: where stages go, how they are numbered, and that running
//! every stage partition then the whole plan gives the in-process answer.

mod common;

use std::sync::Arc;

use common::*;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::Result;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, collect, displayable};
use datafusion_proto::bytes::{
    physical_plan_from_bytes_with_extension_codec, physical_plan_to_bytes_with_extension_codec,
};
use datafusion_proto::physical_plan::{
    ComposedPhysicalExtensionCodec, DefaultPhysicalExtensionCodec, PhysicalExtensionCodec,
};
use dfx_plugin::{DfxPhysicalCodec, ShuffleStageExec};
use futures::StreamExt;

async fn plan(sql: &str, shuffle: Option<&std::path::Path>) -> Result<Arc<dyn ExecutionPlan>> {
    session(shuffle)?
        .sql(sql)
        .await?
        .create_physical_plan()
        .await
}

fn text(plan: &Arc<dyn ExecutionPlan>) -> String {
    displayable(plan.as_ref()).indent(false).to_string()
}

#[tokio::test]
async fn one_aggregate_is_one_stage_over_the_partial_aggregate() -> Result<()> {
    let dir = temp_dir();
    let plan = plan("SELECT g, sum(v) FROM t GROUP BY g", Some(dir.path())).await?;
    assert_eq!(stage_ids(&plan), vec![1], "{}", text(&plan));
    let stage = &stages(&plan)[0];
    let child = stage.children()[0];
    assert!(
        text(child).starts_with("AggregateExec: mode=Partial"),
        "{}",
        text(&plan)
    );
    Ok(())
}

#[tokio::test]
async fn no_aggregate_wraps_the_whole_plan() -> Result<()> {
    let dir = temp_dir();
    let plan = plan("SELECT k, v FROM t WHERE v > 1", Some(dir.path())).await?;
    assert!(
        plan.downcast_ref::<ShuffleStageExec>().is_some(),
        "{}",
        text(&plan)
    );
    assert_eq!(stage_ids(&plan), vec![1]);
    Ok(())
}

#[tokio::test]
async fn union_of_two_aggregates_is_stages_one_and_two() -> Result<()> {
    let dir = temp_dir();
    let sql = "SELECT g, sum(v) FROM t GROUP BY g UNION ALL SELECT g, count(*) FROM u GROUP BY g";
    let plan = plan(sql, Some(dir.path())).await?;
    assert_eq!(stage_ids(&plan), vec![1, 2], "{}", text(&plan));
    Ok(())
}

#[tokio::test]
async fn join_of_two_aggregates_is_two_stages() -> Result<()> {
    let dir = temp_dir();
    let sql = "SELECT a.g, a.s, b.c FROM (SELECT g, sum(v) AS s FROM t GROUP BY g) a \
               JOIN (SELECT g, count(*) AS c FROM u GROUP BY g) b ON a.g = b.g";
    let plan = plan(sql, Some(dir.path())).await?;
    assert_eq!(stage_ids(&plan), vec![1, 2], "{}", text(&plan));
    Ok(())
}

#[tokio::test]
async fn no_shuffle_dir_no_stage() -> Result<()> {
    let plan = plan("SELECT g, sum(v) FROM t GROUP BY g", None).await?;
    assert!(stage_ids(&plan).is_empty(), "{}", text(&plan));
    Ok(())
}

#[tokio::test]
async fn numbering_starts_afresh_on_every_call() -> Result<()> {
    let dir = temp_dir();
    let ctx = session(Some(dir.path()))?;
    let sql = "SELECT g, sum(v) FROM t GROUP BY g UNION ALL SELECT g, sum(v) FROM u GROUP BY g";
    for _ in 0..3 {
        let plan = ctx.sql(sql).await?.create_physical_plan().await?;
        assert_eq!(stage_ids(&plan), vec![1, 2]);
    }
    Ok(())
}

/// Run every stage partition as a worker would (its own plan, encoded and
/// decoded through the codec chain, one partition executed), then the whole
/// plan as the driver does, and compare with the in-process answer.
async fn distributed_equals_local(sql: &str) -> Result<()> {
    distributed_equals_local_with(sql, &[]).await
}

/// [`distributed_equals_local`] with `settings` (SQL `SET` statements) run on
/// every session: driver, workers and the local one.
async fn distributed_equals_local_with(sql: &str, settings: &[&str]) -> Result<()> {
    let configured = |shuffle: Option<&std::path::Path>| {
        let shuffle = shuffle.map(|p| p.to_path_buf());
        async move {
            let ctx = session(shuffle.as_deref())?;
            for setting in settings {
                ctx.sql(setting).await?;
            }
            Ok::<_, datafusion::common::DataFusionError>(ctx)
        }
    };
    let dir = temp_dir();
    let ctx = configured(Some(dir.path())).await?;
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    let chain = ComposedPhysicalExtensionCodec::new(vec![
        Arc::new(DefaultPhysicalExtensionCodec {}) as Arc<dyn PhysicalExtensionCodec>,
        Arc::new(DfxPhysicalCodec::default()),
    ]);
    let mut tasks = 0;
    for (index, stage) in stages(&plan).into_iter().enumerate() {
        for p in 0..stage.output_partitioning().partition_count() {
            // A fresh decode per task: nothing is shared between tasks but files.
            let bytes = physical_plan_to_bytes_with_extension_codec(Arc::clone(&stage), &chain)?;
            let worker_ctx = configured(Some(dir.path())).await?;
            let decoded = physical_plan_from_bytes_with_extension_codec(
                &bytes,
                &worker_ctx.task_ctx(),
                &chain,
            )?;
            assert_eq!(stage_ids(&decoded), vec![index as u64 + 1]);
            let mut stream = decoded.execute(p, worker_ctx.task_ctx())?;
            while let Some(batch) = stream.next().await {
                batch?;
            }
            tasks += 1;
        }
    }
    let published = files_in(dir.path());
    assert_eq!(published.len(), tasks, "one file per task: {published:?}");
    let replanned = ctx.sql(sql).await?.create_physical_plan().await?;
    let distributed = collect(replanned, ctx.task_ctx()).await?;
    let local = configured(None).await?.sql(sql).await?.collect().await?;
    assert_eq!(
        pretty_format_batches(&distributed)?.to_string(),
        pretty_format_batches(&local)?.to_string(),
        "{sql}"
    );
    Ok(())
}

#[tokio::test]
async fn stages_run_separately_give_the_local_answer() -> Result<()> {
    distributed_equals_local("SELECT g, sum(v), count(*) FROM t GROUP BY g ORDER BY g").await?;
    distributed_equals_local("SELECT k, v FROM t WHERE k > 1 ORDER BY k").await?;
    distributed_equals_local(
        "SELECT g, dfx_weighted_avg(v, k) AS w, sum(dfx_net_revenue(v, 0.1, 0.05)) AS r \
         FROM t GROUP BY g ORDER BY g",
    )
    .await?;
    distributed_equals_local(
        "SELECT * FROM (SELECT g, sum(v) FROM t GROUP BY g UNION ALL \
         SELECT g, count(*) FROM u GROUP BY g) ORDER BY 1, 2",
    )
    .await
}

/// Joins whose build side owes rows at the end (anti, semi, outer), and an
/// uncorrelated scalar subquery: each must survive being cut into tasks.
#[tokio::test]
async fn joins_and_subqueries_survive_the_split() -> Result<()> {
    distributed_equals_local(
        "SELECT g, count(*) AS n FROM t WHERE k NOT IN (SELECT k FROM u WHERE v > 2) \
         GROUP BY g ORDER BY g",
    )
    .await?;
    distributed_equals_local(
        "SELECT t.g, count(u.k) AS n FROM t LEFT JOIN u ON t.k = u.k + 1 GROUP BY t.g ORDER BY t.g",
    )
    .await?;
    distributed_equals_local(
        "SELECT g, sum(v) AS s FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.k = t.k AND u.v > 1) \
         GROUP BY g ORDER BY g",
    )
    .await?;
    // Without reordering the preserved side of these joins is the collected
    // build side, which owes its unmatched rows at the very end.
    let no_reordering = ["SET datafusion.optimizer.join_reordering = false"];
    distributed_equals_local_with(
        "SELECT s.g, count(t.k) AS n FROM (SELECT * FROM u WHERE k < 3) s \
         LEFT JOIN t ON s.k = t.k + 5 GROUP BY s.g ORDER BY s.g",
        &no_reordering,
    )
    .await?;
    distributed_equals_local_with(
        "SELECT g, count(*) AS n FROM t WHERE k NOT IN (SELECT k FROM u WHERE v > 2) \
         GROUP BY g ORDER BY g",
        &no_reordering,
    )
    .await?;
    distributed_equals_local(
        "SELECT g, sum(v) AS s FROM t WHERE v > (SELECT avg(v) FROM u) GROUP BY g ORDER BY g",
    )
    .await
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
    // Partition 1 alone, first, as a worker process would run it.
    let mut rows = 0;
    let mut stream = stage.execute(1, ctx.task_ctx())?;
    while let Some(batch) = stream.next().await {
        rows += batch?.num_rows();
    }
    assert_eq!(rows, 4, "partition 1 owns two files of two rows");
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
    let stage = Arc::clone(&stages(&plan)[0]);
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
