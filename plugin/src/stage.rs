//! `ShuffleStageExec`: one node that is both halves of an exchange.
//!
//! ```text
//!             execute(p)
//!                 │
//!   stage-S-part-p.arrow exists? ──yes──► stream the file, batch by batch
//!                 │ no
//!                 ▼
//!   child.execute(p) ──► each batch: append to a temp file, pass it on
//!                              end of stream: finish, rename into place
//!                              error or drop: remove the temp file
//! ```
//!
//! A worker executes a stage partition with no file present, so it computes
//! and publishes; the driver, once every worker is done, executes the same
//! plan and every stage node finds its file. Neither side holds a partition
//! whole in memory: batches stream through to the caller as they are written.
//!
//! File I/O happens inline in `poll_next` rather than on a blocking pool: the
//! plugin has its own copy of tokio, with no runtime of its own, so it cannot
//! spawn onto the host's. Writes are sequential appends of one batch at a time.

use std::fmt;
use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use datafusion::arrow::datatypes::{Fields, SchemaRef};
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
    ReplaceChildrenOptions,
};
use futures::{Stream, StreamExt};

use crate::counters::LiveObject;
use crate::paths::{partition_path, temp_path};

/// Name of the stage node, as hosts search for it.
pub const STAGE_NODE_NAME: &str = "ShuffleStageExec";

/// An exchange boundary: computes and publishes its child's partitions, or
/// streams them back from the shuffle directory once published.
#[derive(Debug)]
pub struct ShuffleStageExec {
    stage_id: u64,
    shuffle_dir: PathBuf,
    input: Arc<dyn ExecutionPlan>,
    _live: LiveObject,
}

impl ShuffleStageExec {
    /// A stage with id `stage_id` over `input`, publishing into `shuffle_dir`.
    pub fn new(stage_id: u64, shuffle_dir: PathBuf, input: Arc<dyn ExecutionPlan>) -> Self {
        Self {
            stage_id,
            shuffle_dir,
            input,
            _live: LiveObject::new(),
        }
    }

    /// The id the planner gave this stage.
    pub fn stage_id(&self) -> u64 {
        self.stage_id
    }

    /// The directory this stage publishes into and reads from.
    pub fn shuffle_dir(&self) -> &Path {
        &self.shuffle_dir
    }

    /// The subtree whose output this stage exchanges.
    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }

    /// Partitions of this stage: its child's.
    pub fn partition_count(&self) -> usize {
        self.input.output_partitioning().partition_count()
    }

    /// The published file of `partition`.
    pub fn partition_path(&self, partition: usize) -> PathBuf {
        partition_path(&self.shuffle_dir, self.stage_id, partition)
    }

    fn error(&self, partition: usize, message: impl fmt::Display) -> DataFusionError {
        DataFusionError::Execution(format!(
            "dfx stage {} partition {partition}: {message}",
            self.stage_id
        ))
    }

    fn read_published(&self, partition: usize, path: &Path) -> Result<SendableRecordBatchStream> {
        let file = File::open(path)
            .map_err(|e| self.error(partition, format!("cannot open {}: {e}", path.display())))?;
        let reader = StreamReader::try_new(BufReader::new(file), None).map_err(|e| {
            self.error(
                partition,
                format!("{} is not a readable Arrow IPC stream: {e}", path.display()),
            )
        })?;
        let expected = self.schema();
        if !same_fields(reader.schema().fields(), expected.fields()) {
            return Err(self.error(
                partition,
                format!(
                    "{} holds fields [{}] but the stage expects [{}]",
                    path.display(),
                    describe_fields(reader.schema().fields()),
                    describe_fields(expected.fields())
                ),
            ));
        }
        Ok(Box::pin(PublishedPartitionStream {
            reader,
            schema: expected,
            path: path.to_path_buf(),
            stage_id: self.stage_id,
            partition,
            _live: LiveObject::new(),
        }))
    }

    fn compute_and_publish(
        &self,
        partition: usize,
        path: PathBuf,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        std::fs::create_dir_all(&self.shuffle_dir).map_err(|e| {
            self.error(
                partition,
                format!(
                    "cannot create shuffle directory {}: {e}",
                    self.shuffle_dir.display()
                ),
            )
        })?;
        let input = self.input.execute(partition, isolated(&context))?;
        let temp = temp_path(&path);
        let file = File::create(&temp)
            .map_err(|e| self.error(partition, format!("cannot create {}: {e}", temp.display())))?;
        let schema = self.schema();
        // From here on the guard owns the temp file: any early return removes it.
        let temp = TempFile(Some(temp));
        let writer = StreamWriter::try_new(BufWriter::new(file), &schema).map_err(|e| {
            self.error(
                partition,
                format!("cannot start {}: {e}", temp.path().display()),
            )
        })?;
        Ok(Box::pin(PublishingStream {
            input,
            writer: Some(writer),
            temp,
            path,
            schema,
            stage_id: self.stage_id,
            partition,
            _live: LiveObject::new(),
        }))
    }
}

impl DisplayAs for ShuffleStageExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::Default | DisplayFormatType::TreeRender => {
                write!(f, "{STAGE_NODE_NAME}: stage={}", self.stage_id)
            }
            DisplayFormatType::Verbose => write!(
                f,
                "{STAGE_NODE_NAME}: stage={}, shuffle_dir={}",
                self.stage_id,
                self.shuffle_dir.display()
            ),
        }
    }
}

impl ExecutionPlan for ShuffleStageExec {
    fn name(&self) -> &str {
        STAGE_NODE_NAME
    }

    /// The child's: a stage partition is the child's partition, streamed
    /// through or read back in the same order.
    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal(format!(
                "dfx stage {} takes one child, got {}",
                self.stage_id,
                children.len()
            )));
        }
        Ok(Arc::new(ShuffleStageExec::new(
            self.stage_id,
            self.shuffle_dir.clone(),
            children.swap_remove(0),
        )))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(
                datafusion::physical_plan::execution_plan::ChildrenPropertiesMode::Recompute,
            ),
        )
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let count = self.partition_count();
        if partition >= count {
            return Err(self.error(
                partition,
                format!("out of range: the stage has {count} partitions"),
            ));
        }
        let path = self.partition_path(partition);
        if path.exists() {
            self.read_published(partition, &path)
        } else {
            self.compute_and_publish(partition, path, context)
        }
    }
}

/// `context` with file-stream work stealing off.
///
/// A task runs one partition of the stage's child and nothing polls the
/// siblings, so a scan that rebalances files between sibling partitions at
/// run time would let this one partition read every file of the scan, and
/// each task would publish the whole input: the answer would count each row
/// once per task. Forced here rather than left to each host's session config,
/// because the node is what makes "execute one partition alone" a contract.
fn isolated(context: &Arc<TaskContext>) -> Arc<TaskContext> {
    if !context
        .session_config()
        .options()
        .execution
        .enable_file_stream_work_stealing
    {
        return Arc::clone(context);
    }
    let mut config = context.session_config().clone();
    config
        .options_mut()
        .execution
        .enable_file_stream_work_stealing = false;
    Arc::new(TaskContext::new(
        context.task_id(),
        context.session_id(),
        config,
        context.scalar_functions().clone(),
        context.higher_order_functions().clone(),
        context.aggregate_functions().clone(),
        context.window_functions().clone(),
        context.runtime_env(),
    ))
}

/// Field lists agree on names, types and nullability, in order. Metadata is
/// not compared: it does not change how a batch reads.
fn same_fields(found: &Fields, expected: &Fields) -> bool {
    found.len() == expected.len()
        && found.iter().zip(expected.iter()).all(|(a, b)| {
            a.name() == b.name()
                && a.data_type() == b.data_type()
                && a.is_nullable() == b.is_nullable()
        })
}

fn describe_fields(fields: &Fields) -> String {
    fields
        .iter()
        .map(|f| {
            let null = if f.is_nullable() { "" } else { " not null" };
            format!("{}: {}{null}", f.name(), f.data_type())
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Streams a published partition file.
struct PublishedPartitionStream {
    reader: StreamReader<BufReader<File>>,
    schema: SchemaRef,
    path: PathBuf,
    stage_id: u64,
    partition: usize,
    _live: LiveObject,
}

impl Stream for PublishedPartitionStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let next = self.reader.next();
        Poll::Ready(next.map(|batch| {
            // The reader's own schema: same fields as the node's (checked at
            // open), so relabel with the node's to keep metadata consistent.
            let batch = batch.map_err(|e| {
                DataFusionError::Execution(format!(
                    "dfx stage {} partition {}: cannot read {}: {e}",
                    self.stage_id,
                    self.partition,
                    self.path.display()
                ))
            })?;
            RecordBatch::try_new(Arc::clone(&self.schema), batch.columns().to_vec()).map_err(|e| {
                DataFusionError::Execution(format!(
                    "dfx stage {} partition {}: {} does not match the stage's schema: {e}",
                    self.stage_id,
                    self.partition,
                    self.path.display()
                ))
            })
        }))
    }
}

impl RecordBatchStream for PublishedPartitionStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}

/// A temp file removed on drop unless it was published.
struct TempFile(Option<PathBuf>);

impl TempFile {
    fn path(&self) -> &Path {
        self.0.as_deref().unwrap_or(Path::new(""))
    }

    /// Rename into place; from now on the file is not ours to remove.
    fn publish(&mut self, to: &Path) -> std::io::Result<()> {
        if let Some(temp) = &self.0 {
            std::fs::rename(temp, to)?;
            self.0 = None;
        }
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(temp) = self.0.take() {
            // Best effort: the file may never have been created.
            let _ = std::fs::remove_file(temp);
        }
    }
}

/// Passes the child's batches through while appending them to a temp file;
/// publishes the file at the end of the stream.
struct PublishingStream {
    input: SendableRecordBatchStream,
    writer: Option<StreamWriter<BufWriter<File>>>,
    temp: TempFile,
    path: PathBuf,
    schema: SchemaRef,
    stage_id: u64,
    partition: usize,
    _live: LiveObject,
}

impl PublishingStream {
    fn error(&self, message: impl fmt::Display) -> DataFusionError {
        DataFusionError::Execution(format!(
            "dfx stage {} partition {}: {message}",
            self.stage_id, self.partition
        ))
    }

    /// Abandon the partition: nothing is published and the temp file goes.
    fn abandon(&mut self) {
        self.writer = None;
        let _ = self.temp.0.take().map(std::fs::remove_file);
    }

    fn finish(&mut self) -> Result<()> {
        let Some(mut writer) = self.writer.take() else {
            return Ok(());
        };
        let temp = self.temp.path().display().to_string();
        writer
            .finish()
            .map_err(|e| self.error(format!("cannot finish {temp}: {e}")))?;
        writer
            .into_inner()
            .map_err(|e| self.error(format!("cannot flush {temp}: {e}")))?;
        let path = self.path.clone();
        self.temp
            .publish(&path)
            .map_err(|e| self.error(format!("cannot publish {temp} as {}: {e}", path.display())))
    }
}

impl Stream for PublishingStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.writer.is_none() {
            return Poll::Ready(None);
        }
        match self.input.poll_next_unpin(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(batch))) => {
                let written = self.writer.as_mut().map(|w| w.write(&batch));
                if let Some(Err(e)) = written {
                    let message = format!("cannot write {}: {e}", self.temp.path().display());
                    self.abandon();
                    return Poll::Ready(Some(Err(self.error(message))));
                }
                Poll::Ready(Some(Ok(batch)))
            }
            Poll::Ready(Some(Err(e))) => {
                self.abandon();
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => match self.finish() {
                Ok(()) => Poll::Ready(None),
                Err(e) => {
                    self.abandon();
                    Poll::Ready(Some(Err(e)))
                }
            },
        }
    }
}

impl RecordBatchStream for PublishingStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}
