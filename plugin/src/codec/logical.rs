//! [`DfxLogicalCodec`]: the logical extension codec that carries a table the
//! plan format cannot into the plugin's planner, by value.

use std::io::Write;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::catalog::TableProvider;
use datafusion::common::{DataFusionError, Result, TableReference, not_impl_err};
use datafusion::execution::{SessionStateBuilder, TaskContext};
use datafusion::logical_expr::{Extension, LogicalPlan};
use datafusion::physical_plan::ExecutionPlanProperties;
use datafusion_ffi::execution::FFI_TaskContextProvider;
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use futures::StreamExt;

use dfx_abi::MEMORY_TABLE_TOO_LARGE;

use crate::config::{DfxConfig, MEMORY_TABLE_LIMIT_KEY};
use crate::counters::LiveObject;
use crate::guard;
use crate::memory_table::MemorySourceTable;
use crate::memory_table::TablePayload;

/// The codec's id, as hosts list it among their session's logical codecs.
pub const LOGICAL_CODEC_ID: &str = "dfx_engine.logical.v1";

/// How far past the limit a refused table is still measured, so the error
/// can give its size: a table function without end is not scanned forever.
const MEASURE_PAST_LIMIT: u64 = 16;

/// Encodes a table provider the plan format does not carry (anything but a
/// listing table, a view or an empty table, which DataFusion's format
/// encodes itself) by scanning it here, in the host, and carrying its rows
/// as Arrow IPC; decodes them as a [`MemorySourceTable`] in the planner.
///
/// Bound to the host session's task-context provider, whose config holds
/// the size limit (`dfx_engine.memory_table_limit`).
#[derive(Debug)]
pub struct DfxLogicalCodec {
    task_ctx_provider: FFI_TaskContextProvider,
    _live: LiveObject,
}

impl DfxLogicalCodec {
    /// A codec reading its session's settings through `task_ctx_provider`.
    pub fn new(task_ctx_provider: FFI_TaskContextProvider) -> Self {
        Self {
            task_ctx_provider,
            _live: LiveObject::new(),
        }
    }

    fn task_ctx(&self) -> Result<Arc<TaskContext>> {
        Arc::<TaskContext>::try_from(&self.task_ctx_provider)
    }

    fn encode_table(
        &self,
        table_ref: &TableReference,
        table: Arc<dyn TableProvider>,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        let task_ctx = self.task_ctx()?;
        let limit = DfxConfig::from_config(task_ctx.session_config().options())?.memory_table_limit;
        // A session of the host's settings to scan with: the table (often
        // the host's own, behind FFI) needs one, and nothing else of it.
        let state = SessionStateBuilder::new()
            .with_config(task_ctx.session_config().clone())
            .with_runtime_env(task_ctx.runtime_env())
            .with_default_features()
            .build();
        // Called while the host encodes its plan, not from an async context
        // of the plugin's: the plugin's copy of tokio has no runtime on this
        // thread, and a scan of rows already in memory needs none.
        let partitions = futures::executor::block_on(async {
            let plan = table.scan(&state, None, &[], None).await?;
            let mut budget = Budget::new(limit);
            let mut partitions = Vec::new();
            for partition in 0..plan.output_partitioning().partition_count() {
                let mut writer = StreamWriter::try_new(Sink::new(&mut budget), &table.schema())?;
                let mut stream = plan.execute(partition, state.task_ctx())?;
                while let Some(batch) = stream.next().await {
                    writer.write(&batch?)?;
                    if writer.get_ref().budget.gave_up() {
                        break;
                    }
                }
                writer.finish()?;
                let mut sink = writer.into_inner()?;
                partitions.push(std::mem::take(&mut sink.bytes));
                if budget.gave_up() {
                    break;
                }
            }
            if budget.over() {
                return Err(too_large(table_ref, &budget));
            }
            Ok(partitions)
        })?;
        TablePayload { partitions }.encode(buf)
    }
}

/// The error for a table over the limit: its size, the limit and the
/// setting that raises it.
fn too_large(table_ref: &TableReference, budget: &Budget) -> DataFusionError {
    let size = if budget.gave_up() {
        format!("more than {}", bytes(budget.used))
    } else {
        bytes(budget.used)
    };
    DataFusionError::Execution(format!(
        "{MEMORY_TABLE_TOO_LARGE}: the table `{table_ref}` holds {size} as Arrow IPC, over the limit \
         of {} an in-memory table may carry into a dfx plan; raise `{MEMORY_TABLE_LIMIT_KEY}` \
         (in bytes), or write the data to files and register them as a table",
        bytes(budget.limit)
    ))
}

fn bytes(n: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    if n >= 1024 * 1024 {
        format!("{:.1} MiB ({n} bytes)", n as f64 / MIB)
    } else {
        format!("{n} bytes")
    }
}

/// The bytes a table has taken so far against its limit. Past the limit,
/// bytes are counted but no longer kept.
struct Budget {
    limit: u64,
    used: u64,
}

impl Budget {
    fn new(limit: u64) -> Self {
        Self { limit, used: 0 }
    }

    fn over(&self) -> bool {
        self.used > self.limit
    }

    fn gave_up(&self) -> bool {
        self.used > self.limit.saturating_mul(MEASURE_PAST_LIMIT)
    }
}

/// One partition's IPC stream, kept while the table is within its budget.
struct Sink<'a> {
    budget: &'a mut Budget,
    bytes: Vec<u8>,
}

impl<'a> Sink<'a> {
    fn new(budget: &'a mut Budget) -> Self {
        Self {
            budget,
            bytes: Vec::new(),
        }
    }
}

impl Write for Sink<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.budget.used += buf.len() as u64;
        if self.budget.over() {
            // Only measured from here on: the table is refused anyway.
            self.bytes = Vec::new();
        } else {
            self.bytes.extend_from_slice(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogicalExtensionCodec for DfxLogicalCodec {
    fn try_decode(
        &self,
        _buf: &[u8],
        _inputs: &[LogicalPlan],
        _ctx: &TaskContext,
    ) -> Result<Extension> {
        not_impl_err!("dfx's logical codec carries tables, not extension nodes")
    }

    fn try_encode(&self, _node: &Extension, _buf: &mut Vec<u8>) -> Result<()> {
        not_impl_err!("dfx's logical codec carries tables, not extension nodes")
    }

    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        table_ref: &TableReference,
        schema: SchemaRef,
        _ctx: &TaskContext,
    ) -> Result<Arc<dyn TableProvider>> {
        guard::catch("the logical codec's try_decode_table_provider", || {
            let payload = TablePayload::decode(buf)?;
            Ok(Arc::new(MemorySourceTable::try_new(table_ref, schema, payload)?) as _)
        })
    }

    fn try_encode_table_provider(
        &self,
        table_ref: &TableReference,
        node: Arc<dyn TableProvider>,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        guard::catch("the logical codec's try_encode_table_provider", || {
            self.encode_table(table_ref, node, buf)
        })
    }
}
