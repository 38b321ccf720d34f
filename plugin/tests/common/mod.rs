//! Shared fixtures for the plugin's in-process tests.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{Float64Array, Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::MemTable;
use datafusion::execution::{SendableRecordBatchStream, SessionStateBuilder, TaskContext};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::prelude::{SessionConfig, SessionContext};
use dfx_plugin::functions::{aggregate_udfs, scalar_udfs};
use dfx_plugin::{DfxConfig, DfxQueryPlanner, SHUFFLE_DIR_KEY, SPLIT_KEY, ShuffleWriterExec};

/// `(k Int64, v Float64)`.
pub fn kv_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Float64, true),
    ]))
}

/// A batch of `(k, v)` rows.
pub fn kv_batch(keys: &[i64], values: &[f64]) -> RecordBatch {
    RecordBatch::try_new(
        kv_schema(),
        vec![
            Arc::new(Int64Array::from(keys.to_vec())),
            Arc::new(Float64Array::from(values.to_vec())),
        ],
    )
    .unwrap()
}

/// One partition whose batches are made on demand, so a test can stream far
/// more data than it holds, or end the stream with an error.
#[derive(Debug)]
pub struct GeneratedPartition {
    pub schema: SchemaRef,
    pub batches: usize,
    pub rows_per_batch: usize,
    /// Yield an error instead of the batch with this index.
    pub fail_at: Option<usize>,
}

impl PartitionStream for GeneratedPartition {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let rows = self.rows_per_batch;
        let fail_at = self.fail_at;
        let batches = (0..self.batches).map(move |i| {
            if Some(i) == fail_at {
                return Err(DataFusionError::Execution(format!(
                    "generated failure at batch {i}"
                )));
            }
            let keys: Vec<i64> = (0..rows as i64).map(|r| r + (i * rows) as i64).collect();
            let values: Vec<f64> = keys.iter().map(|k| *k as f64 * 0.5).collect();
            Ok(kv_batch(&keys, &values))
        });
        Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            futures::stream::iter(batches),
        ))
    }
}

/// A plan of `partitions` generated partitions.
pub fn generated_plan(
    partitions: usize,
    batches: usize,
    rows_per_batch: usize,
    fail_at: Option<usize>,
) -> Arc<dyn ExecutionPlan> {
    let streams: Vec<Arc<dyn PartitionStream>> = (0..partitions)
        .map(|_| {
            Arc::new(GeneratedPartition {
                schema: kv_schema(),
                batches,
                rows_per_batch,
                fail_at,
            }) as Arc<dyn PartitionStream>
        })
        .collect();
    Arc::new(StreamingTableExec::try_new(kv_schema(), streams, None, vec![], false, None).unwrap())
}

/// A single-bucket writer of stage `id` over `input`, publishing into `dir`.
pub fn writer(id: u64, dir: &Path, input: Arc<dyn ExecutionPlan>) -> Arc<ShuffleWriterExec> {
    Arc::new(
        ShuffleWriterExec::try_new(
            id,
            dir.to_path_buf(),
            input,
            datafusion::physical_expr::Partitioning::UnknownPartitioning(1),
            vec![],
            1,
        )
        .unwrap(),
    )
}

/// Run map `map` of `writer` with `ctx` to its end; the rows it published
/// (the sum of its summary's `rows` column).
pub async fn published_rows(
    writer: &Arc<ShuffleWriterExec>,
    map: usize,
    ctx: Arc<TaskContext>,
) -> Result<u64> {
    use datafusion::arrow::array::UInt64Array;
    use futures::StreamExt;

    let mut stream = writer.execute(map, ctx)?;
    let mut rows = 0;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let column = batch.column_by_name("rows").unwrap();
        let column = column.as_any().downcast_ref::<UInt64Array>().unwrap();
        rows += column.iter().flatten().sum::<u64>();
    }
    Ok(rows)
}

/// Every file in `dir`, sorted by name.
pub fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A session with dfx's planner, config and functions, and table `t(k, g, v)`
/// in two partitions and table `u` with the same shape.
pub fn session(shuffle_dir: Option<&Path>) -> Result<SessionContext> {
    session_with(shuffle_dir, "exchange")
}

/// [`session`] under the split rule `split` (`exchange` or `aggregate`).
pub fn session_with(shuffle_dir: Option<&Path>, split: &str) -> Result<SessionContext> {
    let mut config = SessionConfig::new().with_target_partitions(2);
    config.options_mut().extensions.insert(DfxConfig::default());
    config.options_mut().set(SPLIT_KEY, split)?;
    if let Some(dir) = shuffle_dir {
        config
            .options_mut()
            .set(SHUFFLE_DIR_KEY, &dir.to_string_lossy())?;
    }
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .with_query_planner(Arc::new(DfxQueryPlanner::default()))
        .build();
    let ctx = SessionContext::new_with_state(state);
    for udf in scalar_udfs() {
        ctx.register_udf(udf.as_ref().clone());
    }
    for udaf in aggregate_udfs() {
        ctx.register_udaf(udaf.as_ref().clone());
    }
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("g", DataType::Utf8, false),
        Field::new("v", DataType::Float64, true),
    ]));
    let batch = |k: Vec<i64>, g: Vec<&str>, v: Vec<Option<f64>>| {
        RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from(k)),
                Arc::new(StringArray::from(g)),
                Arc::new(Float64Array::from(v)),
            ],
        )
        .unwrap()
    };
    let partitions = vec![
        vec![batch(
            vec![1, 2],
            vec!["a", "b"],
            vec![Some(1.0), Some(2.0)],
        )],
        vec![batch(vec![3, 4], vec!["a", "b"], vec![Some(3.0), None])],
    ];
    for name in ["t", "u"] {
        let table = MemTable::try_new(Arc::clone(&schema), partitions.clone())?;
        ctx.register_table(name, Arc::new(table))?;
    }
    Ok(ctx)
}

/// Writers of `plan` in pre-order, descending into each.
pub fn stages(plan: &Arc<dyn ExecutionPlan>) -> Vec<Arc<dyn ExecutionPlan>> {
    let mut found = Vec::new();
    if plan.downcast_ref::<ShuffleWriterExec>().is_some() {
        found.push(Arc::clone(plan));
    }
    for child in plan.children() {
        found.extend(stages(child));
    }
    found
}

/// Ids of the stages of `plan`, in pre-order.
pub fn stage_ids(plan: &Arc<dyn ExecutionPlan>) -> Vec<u64> {
    stages(plan)
        .iter()
        .map(|s| s.downcast_ref::<ShuffleWriterExec>().unwrap().stage_id())
        .collect()
}

/// Run every map task of every stage of `plan` in this process, each stage
/// once every stage it depends on has run, as the scheduler orders them (a
/// stage whose join filter reads a build stage depends on it, which may
/// come before it in pre-order); returns the rows each stage published, in
/// the order the stages ran.
///
/// Each map runs on its own copy of the stage, decoded from the bytes a
/// driver would ship, as in a worker: operators share state between the
/// partitions of one instance (a join's collected build side and its count of
/// probe partitions still running), which would hide what running apart
/// breaks.
pub async fn run_stages(
    ctx: &SessionContext,
    plan: &Arc<dyn ExecutionPlan>,
) -> Result<Vec<(u64, u64)>> {
    use datafusion::arrow::array::UInt64Array;
    use datafusion::physical_plan::ExecutionPlanProperties;
    use futures::StreamExt;
    let mut waiting = stages(plan);
    // Deepest first among the ready ones, as before deps could point
    // forward in pre-order.
    waiting.reverse();
    // A dep outside `plan` (a subtree's stage reading a build stage beside
    // it) is the caller's to have run.
    let ours: Vec<u64> = waiting
        .iter()
        .map(|s| s.downcast_ref::<ShuffleWriterExec>().unwrap().stage_id())
        .collect();
    let mut published: Vec<(u64, u64)> = Vec::new();
    while !waiting.is_empty() {
        let ready = waiting
            .iter()
            .position(|stage| {
                let writer = stage.downcast_ref::<ShuffleWriterExec>().unwrap();
                writer
                    .deps()
                    .iter()
                    .all(|dep| !ours.contains(dep) || published.iter().any(|(id, _)| id == dep))
            })
            .ok_or_else(|| {
                DataFusionError::Internal("no stage has all its deps published".to_string())
            })?;
        let stage = waiting.remove(ready);
        let writer = stage.downcast_ref::<ShuffleWriterExec>().unwrap();
        let mut rows = 0;
        let bytes = datafusion_proto::bytes::physical_plan_to_bytes_with_extension_codec(
            Arc::clone(&stage),
            &codec_chain(),
        )?;
        for map in 0..stage.output_partitioning().partition_count() {
            let copy = datafusion_proto::bytes::physical_plan_from_bytes_with_extension_codec(
                &bytes,
                &ctx.task_ctx(),
                &codec_chain(),
            )?;
            let mut stream = copy.execute(map, ctx.task_ctx())?;
            while let Some(batch) = stream.next().await {
                let batch = batch?;
                let column = batch
                    .column_by_name("rows")
                    .and_then(|c| c.as_any().downcast_ref::<UInt64Array>())
                    .expect("a summary batch with a rows column");
                rows += column.iter().flatten().sum::<u64>();
            }
        }
        published.push((writer.stage_id(), rows));
    }
    Ok(published)
}

/// A fresh temp dir path (created).
pub fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// `dir/name`.
pub fn path(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

/// A session distributing into `shuffle_dir`, and its physical plan of `sql`.
pub async fn planned(
    shuffle_dir: &Path,
    sql: &str,
) -> Result<(SessionContext, Arc<dyn ExecutionPlan>)> {
    let ctx = session(Some(shuffle_dir))?;
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    Ok((ctx, plan))
}

/// The default codec, then dfx's: what a host's chain does.
pub fn codec_chain() -> datafusion_proto::physical_plan::ComposedPhysicalExtensionCodec {
    use datafusion_proto::physical_plan::{
        ComposedPhysicalExtensionCodec, DefaultPhysicalExtensionCodec, PhysicalExtensionCodec,
    };
    ComposedPhysicalExtensionCodec::new(vec![
        Arc::new(DefaultPhysicalExtensionCodec {}) as Arc<dyn PhysicalExtensionCodec>,
        Arc::new(dfx_plugin::DfxPhysicalCodec::default()),
    ])
}

/// A published map file split into its segments and its commit marker
/// (parsed), read by the footer's account.
pub fn split_map_file(path: &Path) -> (Vec<u8>, serde_json::Value) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let range = dfx_abi::map_marker_range(&bytes)
        .unwrap_or_else(|| panic!("{} does not end with a marker", path.display()));
    let marker = serde_json::from_slice(&bytes[range.clone()])
        .unwrap_or_else(|e| panic!("marker of {}: {e}", path.display()));
    (bytes[..range.start].to_vec(), marker)
}

/// The commit marker closing a published map file, parsed.
pub fn read_marker(path: &Path) -> serde_json::Value {
    split_map_file(path).1
}

/// Write a map file of `segments` closed by `marker`, as a writer would.
pub fn write_map_file(path: &Path, segments: &[u8], marker: &serde_json::Value) {
    use dfx_plugin::exchange::marker::FOOTER_MAGIC;
    let index = serde_json::to_vec(marker).unwrap();
    let mut bytes = segments.to_vec();
    bytes.extend_from_slice(&index);
    bytes.extend_from_slice(&(index.len() as u64).to_le_bytes());
    bytes.extend_from_slice(FOOTER_MAGIC);
    std::fs::write(path, bytes).unwrap();
}
