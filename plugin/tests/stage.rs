//! `ShuffleStageExec`: compute-and-publish, read-back, and what is left on
//! disk when things go wrong.

mod common;

use std::sync::Arc;

use common::*;
use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::Int64Type;
use datafusion::common::Result;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::SessionContext;
use futures::StreamExt;

fn task_ctx() -> Arc<datafusion::execution::TaskContext> {
    SessionContext::new().task_ctx()
}

fn keys(batches: &[datafusion::arrow::record_batch::RecordBatch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect()
}

#[tokio::test]
async fn computes_publishes_then_reads_back() -> Result<()> {
    let dir = temp_dir();
    let node = stage(3, dir.path(), generated_plan(2, 3, 4, None));
    let computed: Vec<_> = node
        .execute(1, task_ctx())?
        .map(|b| b.unwrap())
        .collect()
        .await;
    assert_eq!(keys(&computed), (0..12).collect::<Vec<_>>());
    assert_eq!(files_in(dir.path()), vec!["stage-3-part-1.arrow"]);

    // A stage over a child with no rows at all still answers with the
    // published rows: it read the file, it did not recompute.
    let reader = stage(3, dir.path(), generated_plan(2, 0, 0, None));
    let read: Vec<_> = reader
        .execute(1, task_ctx())?
        .map(|b| b.unwrap())
        .collect()
        .await;
    assert_eq!(keys(&read), keys(&computed));
    assert_eq!(read.len(), 3, "batch boundaries survive the file");
    Ok(())
}

#[tokio::test]
async fn the_file_is_an_arrow_ipc_stream_anyone_can_read() -> Result<()> {
    let dir = temp_dir();
    let node = stage(1, dir.path(), generated_plan(1, 2, 5, None));
    collect(node, task_ctx()).await?;
    let file = std::fs::File::open(dir.path().join("stage-1-part-0.arrow"))?;
    let reader = datafusion::arrow::ipc::reader::StreamReader::try_new(file, None)?;
    assert_eq!(reader.schema(), kv_schema());
    let rows: usize = reader.map(|b| b.unwrap().num_rows()).sum();
    assert_eq!(rows, 10);
    Ok(())
}

#[tokio::test]
async fn schema_mismatch_names_the_file_and_both_field_lists() -> Result<()> {
    let dir = temp_dir();
    collect(
        stage(1, dir.path(), generated_plan(1, 1, 2, None)),
        task_ctx(),
    )
    .await?;
    // Same stage id, different schema: (k) only.
    let ctx = SessionContext::new();
    let other = ctx
        .sql("SELECT 1 AS k")
        .await?
        .create_physical_plan()
        .await?;
    let err = stage(1, dir.path(), other)
        .execute(0, task_ctx())
        .err()
        .expect("mismatch")
        .to_string();
    assert!(err.contains("stage-1-part-0.arrow"), "{err}");
    assert!(err.contains("k: Int64 not null, v: Float64"), "{err}");
    assert!(err.contains("[k: Int64"), "{err}");
    assert!(err.contains("dfx stage 1 partition 0"), "{err}");
    Ok(())
}

#[tokio::test]
async fn a_half_written_partition_is_never_visible() -> Result<()> {
    let dir = temp_dir();
    let node = stage(2, dir.path(), generated_plan(1, 3, 2, None));
    let mut stream = node.execute(0, task_ctx())?;
    stream.next().await.unwrap()?;
    let during = files_in(dir.path());
    assert_eq!(during.len(), 1, "{during:?}");
    assert!(
        during[0].starts_with("stage-2-part-0.") && during[0].ends_with(".arrow.tmp"),
        "{during:?}"
    );
    while let Some(batch) = stream.next().await {
        batch?;
    }
    assert_eq!(files_in(dir.path()), vec!["stage-2-part-0.arrow"]);
    Ok(())
}

#[tokio::test]
async fn a_stream_dropped_half_way_leaves_nothing() -> Result<()> {
    let dir = temp_dir();
    let node = stage(1, dir.path(), generated_plan(1, 10, 2, None));
    let mut stream = node.execute(0, task_ctx())?;
    stream.next().await.unwrap()?;
    stream.next().await.unwrap()?;
    drop(stream);
    assert_eq!(files_in(dir.path()), Vec::<String>::new());
    Ok(())
}

#[tokio::test]
async fn a_failing_child_publishes_nothing() -> Result<()> {
    let dir = temp_dir();
    let node = stage(1, dir.path(), generated_plan(1, 5, 2, Some(3)));
    let results: Vec<_> = node.execute(0, task_ctx())?.collect().await;
    assert!(results[..3].iter().all(|r| r.is_ok()));
    let err = results[3].as_ref().unwrap_err().to_string();
    assert!(err.contains("generated failure at batch 3"), "{err}");
    assert_eq!(results.len(), 4, "the stream ends after the error");
    assert_eq!(files_in(dir.path()), Vec::<String>::new());
    Ok(())
}

#[tokio::test]
async fn two_writers_of_one_partition_do_not_interleave() -> Result<()> {
    let dir = temp_dir();
    let node = stage(1, dir.path(), generated_plan(1, 4, 3, None));
    let mut a = node.execute(0, task_ctx())?;
    let mut b = node.execute(0, task_ctx())?;
    let (mut done_a, mut done_b) = (false, false);
    while !(done_a && done_b) {
        if !done_a {
            done_a = a.next().await.transpose()?.is_none();
        }
        if !done_b {
            done_b = b.next().await.transpose()?.is_none();
        }
    }
    assert_eq!(files_in(dir.path()), vec!["stage-1-part-0.arrow"]);
    let read = collect(
        stage(1, dir.path(), generated_plan(1, 0, 0, None)),
        task_ctx(),
    )
    .await?;
    assert_eq!(
        keys(&read),
        (0..12).collect::<Vec<_>>(),
        "exactly one copy of the partition"
    );
    Ok(())
}

#[tokio::test]
async fn out_of_range_partition_is_an_error() -> Result<()> {
    let dir = temp_dir();
    let err = stage(4, dir.path(), generated_plan(2, 1, 1, None))
        .execute(2, task_ctx())
        .err()
        .expect("out of range")
        .to_string();
    assert!(err.contains("dfx stage 4 partition 2"), "{err}");
    assert!(err.contains("2 partitions"), "{err}");
    Ok(())
}

#[tokio::test]
async fn a_corrupt_file_is_named() -> Result<()> {
    let dir = temp_dir();
    std::fs::write(dir.path().join("stage-1-part-0.arrow"), b"not arrow at all")?;
    let err = stage(1, dir.path(), generated_plan(1, 1, 1, None))
        .execute(0, task_ctx())
        .err()
        .expect("corrupt")
        .to_string();
    assert!(err.contains("stage-1-part-0.arrow"), "{err}");
    assert!(err.contains("not a readable Arrow IPC stream"), "{err}");
    Ok(())
}
