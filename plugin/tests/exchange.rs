//! Every stage's map tasks run apart (one partition each, in this process),
//! then the root of the same plan: the answer must equal the in-process one,
//! for every join type, windows, set operations, limits and subqueries, in
//! both split modes, with and without a codec round trip of each stage.

mod common;

use std::sync::Arc;

use common::*;
use datafusion::arrow::array::{Int32Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::Result;
use datafusion::datasource::MemTable;
use datafusion::physical_plan::{ExecutionPlan, collect, displayable};
use datafusion::prelude::SessionContext;

/// Tables `a(k, v)` and `b(k, w)`, four partitions each, NULLs in `k`.
fn register_ab(ctx: &SessionContext) -> Result<()> {
    let schema = |value: &str| {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int32, true),
            Field::new(value, DataType::Int32, false),
        ]))
    };
    for (name, value, seed) in [("a", "v", 0), ("b", "w", 7)] {
        let schema = schema(value);
        let partitions: Vec<Vec<RecordBatch>> = (0..4)
            .map(|p| {
                let keys: Vec<Option<i32>> = (0..25)
                    .map(|i| {
                        let n = p * 25 + i;
                        if (n + seed) % 9 == 0 {
                            None
                        } else {
                            Some((n * 7 + seed * 3) % 60)
                        }
                    })
                    .collect();
                let values: Vec<i32> = (0..25).map(|i| p * 25 + i).collect();
                vec![
                    RecordBatch::try_new(
                        Arc::clone(&schema),
                        vec![
                            Arc::new(Int32Array::from(keys)),
                            Arc::new(Int32Array::from(values)),
                        ],
                    )
                    .unwrap(),
                ]
            })
            .collect();
        ctx.register_table(name, Arc::new(MemTable::try_new(schema, partitions)?))?;
    }
    Ok(())
}

const QUERIES: &[&str] = &[
    "select a.k, a.v, b.w from a join b on a.k = b.k",
    "select a.k, a.v, b.w from a join b on a.k > b.k + 50",
    "select a.v, b.w from a left join b on a.k = b.k",
    "select a.v, b.w from a left join b on a.k > b.k + 50",
    "select a.v, b.w from a right join b on a.k = b.k",
    "select a.v, b.w from a right join b on a.k > b.k + 50",
    "select a.v, b.w from a full join b on a.k = b.k",
    "select x.v, b.w from (select * from a where v < 10) x left join b on x.k = b.k",
    "select x.v, b.w from (select * from a where v < 10) x full join b on x.k = b.k",
    "select x.v from (select * from a where v < 10) x where exists (select 1 from b where b.k = x.k)",
    "select x.v from (select * from a where v < 10) x where not exists (select 1 from b where b.k = x.k)",
    "select x.v, b.w from (select * from a where v < 10) x left join b on x.k = b.k and b.w > x.v",
    "select x.v % 3, count(y.w) from (select * from a order by v limit 30) x left join (select * from b order by w limit 60) y on x.k = y.k group by x.v % 3",
    "select count(*) from a full join b on a.k > b.k + 40",
    "select a.v from a where exists (select 1 from b where b.k = a.k)",
    "select a.v from a where exists (select 1 from b where b.k > a.k + 50)",
    "select a.v from a where not exists (select 1 from b where b.k = a.k)",
    "select a.v from a where not exists (select 1 from b where b.k > a.k + 50)",
    "select a.v from a where a.k in (select k from b)",
    "select count(*) from a where a.k not in (select k from b where k is not null)",
    "select count(*) from a where a.k not in (select k from b)",
    "select a.v from a where a.k in (select k from b) or a.v > 90",
    "select a.v from a where exists (select 1 from b where b.k = a.k) or a.v < 5",
    "select b.w from b where b.k not in (select k from a where k is not null and v < 50)",
    "select a.v, b.w from a cross join b where a.v < 5 and b.w < 5",
    "select k, v, row_number() over (partition by k order by v) from a",
    "select k, v, sum(v) over (order by v rows between 2 preceding and current row) from a",
    "select k from a union select k from b",
    "select k from a union all select k from b",
    "select k, sum(v) as s from a group by k union all select k, sum(w) as s from b group by k",
    "select s, count(*) from (select k, sum(v) as s from a group by k union all select k, sum(w) from b group by k) group by s",
    "select k from a intersect select k from b",
    "select k from a except select k from b",
    "select v from a order by v desc limit 7",
    "select k, count(*) from a group by k order by count(*) desc, k limit 5",
    "select v from a where v > (select avg(w) from b)",
    "select a.v, (select max(w) from b where b.k = a.k) from a",
    "select k, count(distinct v), sum(v) from a group by k",
    "select count(*), sum(v) from a",
    "select * from a where v > 80",
    "select k, v % 3, sum(v) from a group by grouping sets ((k), (v % 3), ())",
    "select count(*) from (select * from a limit 13)",
    "select * from a where v > 1000",
    "select k, count(*) from a where v > 1000 group by k",
    "select * from (values (1, 'x'), (2, 'y')) t(i, s)",
    "select distinct k from a",
    "select k, array_agg(v order by v) from a group by k",
    "select a.k, b.k from a join b on a.k = b.k and a.v < b.w order by a.k, b.k limit 10",
];

fn sorted_rows(batches: &[RecordBatch]) -> Vec<String> {
    let text = pretty_format_batches(batches).unwrap().to_string();
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with('|'))
        .skip(1)
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

async fn local(sql: &str) -> Result<Vec<String>> {
    let ctx = session(None)?;
    register_ab(&ctx)?;
    Ok(sorted_rows(&ctx.sql(sql).await?.collect().await?))
}

/// Small build sides are collected (DataFusion's choice) or, with
/// `partitioned_joins`, every hash join is partitioned.
async fn distributed(
    sql: &str,
    split: &str,
    partitioned_joins: bool,
    target_partitions: usize,
) -> Result<(Vec<String>, Arc<dyn ExecutionPlan>)> {
    let dir = temp_dir();
    let ctx = session_with(Some(dir.path()), split)?;
    register_ab(&ctx)?;
    ctx.sql(&format!(
        "SET datafusion.execution.target_partitions = {target_partitions}"
    ))
    .await?;
    if partitioned_joins {
        for key in [
            "hash_join_single_partition_threshold",
            "hash_join_single_partition_threshold_rows",
        ] {
            // Applied by `sql` itself; its (empty) frame is not run, since
            // in a distributing session only a driver runs plans.
            ctx.sql(&format!("SET datafusion.optimizer.{key} = 0"))
                .await?;
        }
    }
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    run_stages(&ctx, &plan).await?;
    let batches = collect(Arc::clone(&plan), ctx.task_ctx()).await?;
    Ok((sorted_rows(&batches), plan))
}

#[tokio::test]
async fn partitions_run_apart_give_the_local_answer_in_both_modes() -> Result<()> {
    let mut failures = Vec::new();
    for (split, partitioned) in [
        ("exchange", false),
        ("exchange", true),
        ("aggregate", false),
        ("aggregate", true),
    ] {
        for sql in QUERIES {
            let expected = local(sql).await?;
            match distributed(sql, split, partitioned, 2).await {
                Ok((found, plan)) if found != expected => failures.push(format!(
                    "{split} (partitioned joins: {partitioned}): {sql}: {} rows instead of {}\n{}",
                    found.len(),
                    expected.len(),
                    displayable(plan.as_ref()).indent(false)
                )),
                Ok(_) => {}
                Err(err) => failures.push(format!(
                    "{split} (partitioned joins: {partitioned}): {sql}: {err}"
                )),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    Ok(())
}

/// With one target partition DataFusion plans single-partition operators
/// (`Single` aggregates, collected joins of every type) that the split rule
/// must leave with the one partition they were planned for.
#[tokio::test]
async fn one_target_partition_gives_the_local_answer() -> Result<()> {
    let mut failures = Vec::new();
    for sql in QUERIES {
        let ctx = session(None)?;
        register_ab(&ctx)?;
        ctx.sql("SET datafusion.execution.target_partitions = 1")
            .await?;
        let expected = sorted_rows(&ctx.sql(sql).await?.collect().await?);
        match distributed(sql, "exchange", false, 1).await {
            Ok((found, plan)) if found != expected => failures.push(format!(
                "{sql}: {} rows instead of {}\n{}",
                found.len(),
                expected.len(),
                displayable(plan.as_ref()).indent(false)
            )),
            Ok(_) => {}
            Err(err) => failures.push(format!("{sql}: {err}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    Ok(())
}

#[tokio::test]
#[ignore = "prints plans for a reader; run with --ignored --nocapture"]
async fn show_plans() -> Result<()> {
    for sql in QUERIES {
        let dir = temp_dir();
        let ctx = session(Some(dir.path()))?;
        register_ab(&ctx)?;
        let plan = ctx.sql(sql).await?.create_physical_plan().await?;
        println!("-- {sql}\n{}", displayable(plan.as_ref()).indent(false));
    }
    Ok(())
}
