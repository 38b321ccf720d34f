//! Failure classes are recorded where the error is made, keyed by the
//! shuffle location, and taken once: a reader that finds a map's file
//! missing records that map as lost, a writer whose storage fails records
//! an I/O failure, and the messages stay as detailed as before.

mod common;

use std::path::Path;
use std::sync::Arc;

use abi_stable::std_types::RStr;
use common::*;
use datafusion::common::Result;
use datafusion::physical_expr::Partitioning;
use datafusion::physical_expr::expressions::col;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::SessionContext;
use dfx_abi::FailureClass::{Io, Lost};
use dfx_plugin::error;
use dfx_plugin::{ReadMode, ShuffleReaderExec, ShuffleWriterExec};
use futures::StreamExt;

/// A hash writer of stage 3 over `maps` generated partitions, 4 buckets,
/// publishing into `dir`.
fn hash_writer(dir: &Path, maps: usize) -> Arc<ShuffleWriterExec> {
    let key = col("k", &kv_schema()).unwrap();
    Arc::new(
        ShuffleWriterExec::try_new(
            3,
            dir.to_path_buf(),
            generated_plan(maps, 5, 100, None),
            Partitioning::Hash(vec![key], 4),
            vec![],
            1,
        )
        .unwrap(),
    )
}

/// Run map `map` of `writer`; the rows it published.
async fn run_map(writer: &Arc<ShuffleWriterExec>, map: usize) -> Result<u64> {
    published_rows(writer, map, SessionContext::new().task_ctx()).await
}

fn hash_reader(writer: &Arc<ShuffleWriterExec>) -> Arc<ShuffleReaderExec> {
    Arc::new(
        ShuffleReaderExec::try_new(ReadMode::Hash, Arc::clone(writer) as Arc<dyn ExecutionPlan>)
            .unwrap(),
    )
}

/// Both maps of a stage 3 published into `dir`, then map 1's file removed.
async fn stage_with_map_1_lost(dir: &Path) -> Result<Arc<ShuffleWriterExec>> {
    let writer = hash_writer(dir, 2);
    run_map(&writer, 0).await?;
    run_map(&writer, 1).await?;
    std::fs::remove_file(dir.join("stage-3/1-map-1.arrow"))?;
    Ok(writer)
}

/// Read every partition of stage 3 from `writer`'s location, which must
/// fail; the error's message.
async fn failed_read(writer: &Arc<ShuffleWriterExec>) -> String {
    collect(hash_reader(writer), SessionContext::new().task_ctx())
        .await
        .expect_err("a read of a stage with a lost map fails")
        .to_string()
}

fn location(dir: &Path) -> String {
    dir.to_string_lossy().into_owned()
}

/// What the plugin's export `take_failures` answers for `location`: the
/// JSON text a host receives.
fn exported_take(location: &str) -> String {
    let module = dfx_plugin::export::root_module();
    let take = module
        .take_failures()
        .expect("the root module exports take_failures");
    take(RStr::from_str(location)).into_string()
}

#[tokio::test]
async fn a_reader_that_finds_a_map_file_missing_records_that_map_lost() -> Result<()> {
    let dir = temp_dir();
    let writer = stage_with_map_1_lost(dir.path()).await?;
    let err = failed_read(&writer).await;
    // The message is as detailed as ever: stage, map, bucket and file.
    for part in [
        "dfx stage 3 map 1 bucket",
        "lost output",
        "stage-3/1-map-1.arrow",
    ] {
        assert!(err.contains(part), "{part:?} not in {err}");
    }
    // Every partition of the reader missed map 1; it is recorded once.
    assert_eq!(error::take(&location(dir.path())), vec![Lost([3, 1])]);
    Ok(())
}

#[tokio::test]
async fn a_map_file_gone_after_its_marker_was_read_is_lost_output_too() -> Result<()> {
    let dir = temp_dir();
    let writer = hash_writer(dir.path(), 2);
    run_map(&writer, 0).await?;
    run_map(&writer, 1).await?;
    // `execute` reads every marker; the file goes before the first poll.
    let mut stream = hash_reader(&writer).execute(0, SessionContext::new().task_ctx())?;
    std::fs::remove_file(dir.path().join("stage-3/0-map-0.arrow"))?;
    let err = loop {
        match stream.next().await {
            Some(Ok(_)) => continue,
            Some(Err(err)) => break err.to_string(),
            None => panic!("the stream ended without the lost file's error"),
        }
    };
    for part in [
        "dfx stage 3 map 0 bucket 0",
        "lost output: the marker promised",
        "the file is gone",
        "stage-3/0-map-0.arrow",
    ] {
        assert!(err.contains(part), "{part:?} not in {err}");
    }
    assert_eq!(error::take(&location(dir.path())), vec![Lost([3, 0])]);
    Ok(())
}

#[tokio::test]
async fn a_writer_whose_publish_fails_records_an_io_failure() -> Result<()> {
    let dir = temp_dir();
    // A directory where the map's file is to be published: the rename
    // fails (EISDIR), for root too.
    std::fs::create_dir_all(dir.path().join("stage-3/0-map-0.arrow/taken"))?;
    let writer = hash_writer(dir.path(), 1);
    let err = run_map(&writer, 0).await.unwrap_err().to_string();
    for part in [
        "dfx stage 3 map 0",
        dfx_abi::IO_FAILURE,
        "cannot publish",
        "stage-3/0-map-0.arrow",
    ] {
        assert!(err.contains(part), "{part:?} not in {err}");
    }
    assert_eq!(error::take(&location(dir.path())), vec![Io]);
    Ok(())
}

#[tokio::test]
async fn failures_are_taken_once() -> Result<()> {
    let dir = temp_dir();
    let writer = stage_with_map_1_lost(dir.path()).await?;
    failed_read(&writer).await;
    let at = location(dir.path());
    assert_eq!(exported_take(&at), r#"[{"lost":[3,1]}]"#);
    assert_eq!(exported_take(&at), "[]");
    // A second failed read records it again, for the next take.
    failed_read(&writer).await;
    assert_eq!(error::take(&at), vec![Lost([3, 1])]);
    assert!(error::take(&at).is_empty());
    Ok(())
}

#[tokio::test]
async fn another_locations_failures_are_not_taken() -> Result<()> {
    let lost = temp_dir();
    let writer = stage_with_map_1_lost(lost.path()).await?;
    failed_read(&writer).await;
    let full = temp_dir();
    std::fs::create_dir_all(full.path().join("stage-3/0-map-0.arrow/taken"))?;
    run_map(&hash_writer(full.path(), 1), 0).await.unwrap_err();
    let untouched = temp_dir();
    assert!(error::take(&location(untouched.path())).is_empty());
    assert_eq!(error::take(&location(full.path())), vec![Io]);
    assert_eq!(error::take(&location(lost.path())), vec![Lost([3, 1])]);
    Ok(())
}

#[tokio::test]
async fn a_location_is_one_location_however_it_is_spelled() -> Result<()> {
    let dir = temp_dir();
    let writer = stage_with_map_1_lost(dir.path()).await?;
    failed_read(&writer).await;
    let slash = format!("{}/", location(dir.path()));
    assert_eq!(error::take(&slash), vec![Lost([3, 1])]);
    failed_read(&writer).await;
    let url = format!("file://{}", location(dir.path()));
    assert_eq!(error::take(&url), vec![Lost([3, 1])]);
    assert!(error::take(&location(dir.path())).is_empty());
    Ok(())
}

#[test]
fn the_built_plugin_file_exports_take_failures() {
    // The cdylib cargo built beside this test, loaded as a host loads it:
    // its own copy of the ledger, in which nothing was recorded.
    let exe = std::env::current_exe().unwrap();
    let file = exe.with_file_name(dfx_abi::plugin_file_name());
    let plugin = dfx_abi::load(&file).unwrap_or_else(|err| panic!("{err}"));
    let dir = temp_dir();
    assert_eq!(plugin.take_failures(&location(dir.path())), Ok(vec![]));
    assert_eq!(
        plugin.take_failures_json(&location(dir.path())),
        Ok("[]".to_string())
    );
}
