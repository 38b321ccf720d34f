//! Finding stages and readers in a host-side plan, and running them the way a
//! driver does.
//!
//! A stage is a subtree rooted at a `ShuffleWriterExec`; its consumer reads it
//! through a `ShuffleReaderExec`. In the plan a test session puts back
//! together ([`crate::session::TestSession::planned`]) the reader's only
//! child is that writer, so stages nest and the plan stays one tree. Executing map `m` of a writer publishes
//! `stage-S/k-map-m.arrow` (every non-empty bucket's segments, closed by the
//! map's commit marker), and yields one summary batch
//! `(bucket, rows, bytes)`. A reader never executes its writer: every stage a
//! plan reads must have run before the plan's root is executed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{Array, RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::{ExecutionPlan, collect, displayable};
use dfx_abi::{DfxStageInfo, Plugin};
use futures::StreamExt;

pub use dfx_abi::stages::{find_stages, node_display};

/// The indented display of the whole plan.
pub fn plan_display(plan: &Arc<dyn ExecutionPlan>) -> String {
    displayable(plan.as_ref()).indent(true).to_string()
}

/// The indented display of one stage's own operators: from its writer down
/// to the readers it holds, without the stages below them.
pub fn stage_display(writer: &Arc<dyn ExecutionPlan>, reader_node_name: &str) -> String {
    fn walk(node: &Arc<dyn ExecutionPlan>, depth: usize, reader: &str, out: &mut String) {
        out.push_str(&"  ".repeat(depth));
        out.push_str(&node_display(node.as_ref()));
        out.push('\n');
        if depth > 0 && node_display(node.as_ref()).contains(reader) {
            return;
        }
        for child in node.children() {
            walk(child, depth + 1, reader, out);
        }
    }
    let mut out = String::new();
    walk(writer, 0, reader_node_name, &mut out);
    out
}

/// Every node of `plan` whose display contains `reader_node_name`, in
/// pre-order (readers of nested stages included).
pub fn find_readers(
    plan: &Arc<dyn ExecutionPlan>,
    reader_node_name: &str,
) -> Vec<Arc<dyn ExecutionPlan>> {
    // The same containment rule as for writers; a reader's display never
    // contains the writer's name, so the two searches do not overlap.
    find_stages(plan, reader_node_name)
}

/// One stage of a plan: its writer and what the plugin says about it.
#[derive(Debug, Clone)]
pub struct Stage {
    /// The stage's root, a (foreign) `ShuffleWriterExec`.
    pub writer: Arc<dyn ExecutionPlan>,
    /// The plugin's description of the writer.
    pub info: DfxStageInfo,
}

/// The stages of `plan` in pre-order, each checked to carry the id its
/// position gives it (`plugin.stage_id(n)` for the n-th), as a driver checks.
///
/// # Errors
///
/// The plugin's refusal to describe a writer, or an id out of place.
pub fn stages(plugin: &Plugin, plan: &Arc<dyn ExecutionPlan>) -> Result<Vec<Stage>> {
    find_stages(plan, plugin.stage_node_name())
        .into_iter()
        .enumerate()
        .map(|(index, writer)| {
            let info = plugin.stage_info(&writer)?;
            let expected = plugin.stage_id(index);
            if info.stage_id != expected {
                return Err(DataFusionError::Execution(format!(
                    "the writer at pre-order position {index} carries stage id {}, \
                     the plugin numbers it {expected}",
                    info.stage_id
                )));
            }
            Ok(Stage { writer, info })
        })
        .collect()
}

/// The ids of the stages `node`'s subtree reads directly: the first writer on
/// each path down (not `node` itself), ascending and without duplicates. The
/// host-side recomputation of [`DfxStageInfo::deps`].
///
/// # Errors
///
/// The plugin's refusal to describe one of those writers.
pub fn direct_deps(plugin: &Plugin, node: &Arc<dyn ExecutionPlan>) -> Result<Vec<u64>> {
    fn walk(
        plugin: &Plugin,
        node: &Arc<dyn ExecutionPlan>,
        found: &mut BTreeSet<u64>,
    ) -> Result<()> {
        for child in node.children() {
            if node_display(child.as_ref()).contains(plugin.stage_node_name()) {
                found.insert(plugin.stage_info(child)?.stage_id);
            } else {
                walk(plugin, child, found)?;
            }
        }
        Ok(())
    }
    let mut found = BTreeSet::new();
    walk(plugin, node, &mut found)?;
    Ok(found.into_iter().collect())
}

/// Group stages (indices into `stages`) into waves: a stage is in the first
/// wave after every stage of its `deps`, as a driver schedules them.
///
/// # Errors
///
/// A dep that names no stage of the plan, or a cycle.
pub fn waves(stages: &[Stage]) -> Result<Vec<Vec<usize>>> {
    let ids: BTreeSet<u64> = stages.iter().map(|s| s.info.stage_id).collect();
    for stage in stages {
        if let Some(unknown) = stage.info.deps.iter().find(|dep| !ids.contains(dep)) {
            return Err(DataFusionError::Execution(format!(
                "stage {} reads stage {unknown}, which is not in the plan (stages {ids:?})",
                stage.info.stage_id
            )));
        }
    }
    let mut done = BTreeSet::new();
    let mut waves = Vec::new();
    while done.len() < stages.len() {
        let wave: Vec<usize> = (0..stages.len())
            .filter(|&i| !done.contains(&stages[i].info.stage_id))
            .filter(|&i| stages[i].info.deps.iter().all(|dep| done.contains(dep)))
            .collect();
        if wave.is_empty() {
            return Err(DataFusionError::Execution(format!(
                "the stages' deps form a cycle: {:?}",
                stages
                    .iter()
                    .map(|s| (s.info.stage_id, s.info.deps.to_vec()))
                    .collect::<Vec<_>>()
            )));
        }
        done.extend(wave.iter().map(|&i| stages[i].info.stage_id));
        waves.push(wave);
    }
    Ok(waves)
}

/// One row of a writer's summary: what map `m` published for one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketSummary {
    /// The bucket.
    pub bucket: u64,
    /// Rows in the bucket.
    pub rows: u64,
    /// Bytes of the bucket's segments in its map's file (0 when empty).
    pub bytes: u64,
}

/// Read a writer's summary batches (`bucket`, `rows`, `bytes`, all UInt64).
///
/// # Errors
///
/// A missing column or one of another type, named.
pub fn read_summary(batches: &[RecordBatch]) -> Result<Vec<BucketSummary>> {
    fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a UInt64Array> {
        let column = batch.column_by_name(name).ok_or_else(|| {
            DataFusionError::Execution(format!(
                "the writer's summary has no column `{name}`: {:?}",
                batch.schema()
            ))
        })?;
        column
            .as_any()
            .downcast_ref::<UInt64Array>()
            .ok_or_else(|| {
                DataFusionError::Execution(format!(
                    "the writer's summary column `{name}` is {}, not {}",
                    column.data_type(),
                    DataType::UInt64
                ))
            })
    }
    let mut rows = Vec::new();
    for batch in batches {
        let (bucket, count, bytes) = (
            column(batch, "bucket")?,
            column(batch, "rows")?,
            column(batch, "bytes")?,
        );
        for row in 0..batch.num_rows() {
            rows.push(BucketSummary {
                bucket: bucket.value(row),
                rows: count.value(row),
                bytes: bytes.value(row),
            });
        }
    }
    Ok(rows)
}

/// What executing one map of a writer returned.
#[derive(Debug, Clone)]
pub struct MapRun {
    /// Summary batches, as the stream yielded them.
    pub batches: Vec<RecordBatch>,
    /// The same, one entry per bucket.
    pub summary: Vec<BucketSummary>,
}

impl MapRun {
    /// Rows the map published (what a worker reports).
    pub fn rows(&self) -> u64 {
        self.summary.iter().map(|b| b.rows).sum()
    }
}

/// Execute map `map` of `writer` and read its summary.
///
/// # Errors
///
/// Execution errors, message intact, or a malformed summary.
pub async fn run_map(
    writer: &Arc<dyn ExecutionPlan>,
    map: usize,
    task_ctx: Arc<TaskContext>,
) -> Result<MapRun> {
    let stream = writer.execute(map, task_ctx)?;
    let batches: Vec<RecordBatch> = datafusion::physical_plan::common::collect(stream).await?;
    let summary = read_summary(&batches)?;
    Ok(MapRun { batches, summary })
}

/// Every map of one stage, run in order.
///
/// # Errors
///
/// The first map's error, with the stage and map named.
pub async fn run_stage(stage: &Stage, task_ctx: Arc<TaskContext>) -> Result<Vec<MapRun>> {
    let mut runs = Vec::new();
    for map in 0..stage.info.maps as usize {
        let run = run_map(&stage.writer, map, Arc::clone(&task_ctx))
            .await
            .map_err(|err| err.context(format!("stage {} map {map}", stage.info.stage_id)))?;
        runs.push(run);
    }
    Ok(runs)
}

/// Every stage of `plan`, run wave by wave in this process as a driver's
/// workers would; returns the map runs of each stage, in pre-order.
///
/// # Errors
///
/// The first failing map, or a plan whose stages cannot be scheduled.
pub async fn run_stages(
    plugin: &Plugin,
    plan: &Arc<dyn ExecutionPlan>,
    task_ctx: Arc<TaskContext>,
) -> Result<Vec<(Stage, Vec<MapRun>)>> {
    let stages = stages(plugin, plan)?;
    let mut runs: Vec<Option<Vec<MapRun>>> = vec![None; stages.len()];
    for wave in waves(&stages)? {
        for index in wave {
            runs[index] = Some(run_stage(&stages[index], Arc::clone(&task_ctx)).await?);
        }
    }
    Ok(stages
        .into_iter()
        .zip(runs)
        .map(|(stage, runs)| (stage, runs.unwrap_or_default()))
        .collect())
}

/// Run every stage of `plan`, then execute its root and format the answer.
///
/// # Errors
///
/// Any stage's or the root's error, message intact.
pub async fn run_query(
    plugin: &Plugin,
    plan: &Arc<dyn ExecutionPlan>,
    task_ctx: Arc<TaskContext>,
) -> Result<String> {
    run_stages(plugin, plan, Arc::clone(&task_ctx)).await?;
    run_to_table(plan, task_ctx).await
}

/// The files a stage run must have published: the one holding the marker of
/// every map and the one holding each non-empty bucket (both the map's file),
/// as the plugin's path functions name them.
///
/// # Errors
///
/// A plugin without `bucket_path`.
pub fn expected_files(
    plugin: &Plugin,
    shuffle_dir: &Path,
    stage_id: u64,
    runs: &[MapRun],
) -> Result<BTreeSet<PathBuf>> {
    let mut files = BTreeSet::new();
    for (map, run) in runs.iter().enumerate() {
        files.insert(plugin.marker_path(shuffle_dir, stage_id, map));
        for bucket in run.summary.iter().filter(|b| b.rows > 0) {
            files.insert(plugin.bucket_path(shuffle_dir, stage_id, map, bucket.bucket as usize)?);
        }
    }
    Ok(files)
}

/// Every file under `shuffle_dir`, recursively, except the driver's scratch
/// (`tasks/`).
///
/// # Errors
///
/// A directory that cannot be listed, named.
pub fn published_files(shuffle_dir: &Path) -> Result<BTreeSet<PathBuf>> {
    fn walk(dir: &Path, out: &mut BTreeSet<PathBuf>) -> Result<()> {
        let entries = std::fs::read_dir(dir).map_err(|err| {
            DataFusionError::Execution(format!("listing {}: {err}", dir.display()))
        })?;
        for entry in entries {
            let path = entry
                .map_err(|err| {
                    DataFusionError::Execution(format!("listing {}: {err}", dir.display()))
                })?
                .path();
            if path.is_dir() {
                walk(&path, out)?;
            } else {
                out.insert(path);
            }
        }
        Ok(())
    }
    let mut out = BTreeSet::new();
    walk(shuffle_dir, &mut out)?;
    let tasks = shuffle_dir.join("tasks");
    Ok(out.into_iter().filter(|p| !p.starts_with(&tasks)).collect())
}

/// A map task's commit marker (closing `stage-S/k-map-m.arrow`), as the plugin
/// writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    /// The stage.
    pub stage_id: u64,
    /// The map task.
    pub map: u64,
    /// The attempt that published it.
    pub attempt: u64,
    /// Bytes of the segments before it.
    pub bytes: u64,
    /// Rows and bytes per bucket.
    pub buckets: Vec<BucketSummary>,
}

/// Read and parse the commit marker closing the map file at `path`.
///
/// # Errors
///
/// An unreadable file or a field missing, each naming the file.
pub fn read_marker(path: &Path) -> Result<Marker> {
    let fail = |what: String| DataFusionError::Execution(format!("{}: {what}", path.display()));
    let bytes = std::fs::read(path).map_err(|err| fail(err.to_string()))?;
    let range = dfx_abi::map_marker_range(&bytes)
        .ok_or_else(|| fail("does not end with a commit marker's footer".to_string()))?;
    let json: serde_json::Value =
        serde_json::from_slice(&bytes[range]).map_err(|err| fail(format!("not JSON: {err}")))?;
    let number = |value: &serde_json::Value, key: &str| {
        value[key]
            .as_u64()
            .ok_or_else(|| fail(format!("no number `{key}` in {value}")))
    };
    let buckets = json["buckets"]
        .as_array()
        .ok_or_else(|| fail(format!("no array `buckets` in {json}")))?
        .iter()
        .map(|b| {
            Ok(BucketSummary {
                bucket: number(b, "bucket")?,
                rows: number(b, "rows")?,
                bytes: number(b, "bytes")?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Marker {
        stage_id: number(&json, "stage_id")?,
        map: number(&json, "map")?,
        attempt: number(&json, "attempt")?,
        bytes: number(&json, "bytes")?,
        buckets,
    })
}

/// Execute every partition of `plan`, draining each stream; returns the rows
/// per partition.
///
/// # Errors
///
/// The first error of any partition, message intact.
pub async fn run_partitions(
    plan: &Arc<dyn ExecutionPlan>,
    task_ctx: Arc<TaskContext>,
) -> Result<Vec<usize>> {
    let count = plan.properties().output_partitioning().partition_count();
    let mut rows = Vec::with_capacity(count);
    for partition in 0..count {
        let stream = plan.execute(partition, Arc::clone(&task_ctx))?;
        rows.push(drain(stream).await?);
    }
    Ok(rows)
}

/// Execute `plan` fully and format its batches as a table.
///
/// # Errors
///
/// Execution errors.
pub async fn run_to_table(
    plan: &Arc<dyn ExecutionPlan>,
    task_ctx: Arc<TaskContext>,
) -> Result<String> {
    let batches = collect(Arc::clone(plan), task_ctx).await?;
    format_batches(&batches)
}

/// Format batches as a table (the comparison form of the tests).
///
/// # Errors
///
/// Unprintable column types.
pub fn format_batches(batches: &[RecordBatch]) -> Result<String> {
    Ok(pretty_format_batches(batches)?.to_string())
}

/// Drain a stream, counting rows.
async fn drain(mut stream: SendableRecordBatchStream) -> Result<usize> {
    let mut rows = 0;
    while let Some(batch) = stream.next().await {
        rows += batch?.num_rows();
    }
    Ok(rows)
}

/// A stage description as JSON (how the child process reports it).
pub fn stage_info_to_json(info: &DfxStageInfo) -> serde_json::Value {
    serde_json::json!({
        "stage_id": info.stage_id,
        "shuffle_dir": info.shuffle_dir.as_str(),
        "maps": info.maps,
        "buckets": info.buckets,
        "partitions_per_map": info.partitions_per_map,
        "deps": info.deps.to_vec(),
        "aligned_deps": info.aligned_deps.to_vec(),
        "partitioning": info.partitioning.as_str(),
    })
}

/// The inverse of [`stage_info_to_json`].
///
/// # Errors
///
/// A missing or mistyped field, named.
pub fn stage_info_from_json(json: &serde_json::Value) -> std::result::Result<DfxStageInfo, String> {
    let number = |key: &str| {
        json[key]
            .as_u64()
            .ok_or_else(|| format!("no number `{key}` in {json}"))
    };
    let text = |key: &str| {
        json[key]
            .as_str()
            .map(|s| s.into())
            .ok_or_else(|| format!("no string `{key}` in {json}"))
    };
    let ids = |key: &str| {
        json[key]
            .as_array()
            .ok_or_else(|| format!("no array `{key}` in {json}"))?
            .iter()
            .map(|d| {
                d.as_u64()
                    .ok_or_else(|| format!("an id of `{key}` is not a number: {d}"))
            })
            .collect::<std::result::Result<Vec<_>, _>>()
    };
    Ok(DfxStageInfo {
        stage_id: number("stage_id")?,
        shuffle_dir: text("shuffle_dir")?,
        maps: number("maps")?,
        buckets: number("buckets")?,
        partitions_per_map: number("partitions_per_map")?,
        deps: ids("deps")?.into(),
        aligned_deps: ids("aligned_deps")?.into(),
        partitioning: text("partitioning")?,
    })
}

/// What the child process reports after running a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildReport {
    /// The decoded plan's indented display, as the child sees it.
    pub display: String,
    /// For a stage: the rows each map published (the sum of its summary's
    /// `rows`, what a worker reports); for any other plan: the rows each
    /// partition produced.
    pub rows: Vec<usize>,
    /// For a stage: the plugin's description of the decoded writer, in the
    /// child.
    pub stage_info: Option<DfxStageInfo>,
    /// For a stage: the plugin's description read from the encoded bytes,
    /// in the child.
    pub encoded_stage_info: Option<DfxStageInfo>,
}

/// Run the encoded `plan` in a separate process (`child`, the
/// `dfx-ffi-child` binary): it decodes with its own session and executes every
/// partition (every map, for a stage).
///
/// # Errors
///
/// The child's stderr when it exits unsuccessfully, or a malformed report.
pub fn run_in_child(
    child: &Path,
    plan: &[u8],
    scratch: &Path,
) -> std::result::Result<ChildReport, String> {
    let file = scratch.join(format!("plan-{}.bin", std::process::id()));
    std::fs::write(&file, plan).map_err(|err| format!("writing {}: {err}", file.display()))?;
    let output = std::process::Command::new(child)
        .arg("run")
        .arg(&file)
        .output()
        .map_err(|err| format!("spawning {}: {err}", child.display()))?;
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    if !output.status.success() {
        return Err(stderr);
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    // The last non-empty line: anything a library prints before it is noise.
    let line = stdout
        .lines()
        .rev()
        .find(|line| !line.trim().is_empty())
        .ok_or_else(|| format!("the child printed no report; stderr: {stderr}"))?;
    let report: serde_json::Value =
        serde_json::from_str(line).map_err(|err| format!("unreadable report {line:?}: {err}"))?;
    let display = report["display"]
        .as_str()
        .ok_or("report without display")?
        .to_string();
    let rows = report["rows"]
        .as_array()
        .ok_or("report without rows")?
        .iter()
        .map(|n| {
            n.as_u64()
                .map(|n| n as usize)
                .ok_or("a row count is not a number")
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let optional_info = |key: &str| match &report[key] {
        serde_json::Value::Null => Ok(None),
        value => stage_info_from_json(value).map(Some),
    };
    Ok(ChildReport {
        display,
        rows,
        stage_info: optional_info("stage_info")?,
        encoded_stage_info: optional_info("encoded_stage_info")?,
    })
}
