//! A datafusion-python session that drives its queries: `collect()`,
//! `to_pandas()`, `count()`, `execute_stream()` each run the stages on the
//! session's executor and read the head, as `run_distributed` does.
//!
//! ```text
//! datafusion-python plans  ──► this module's query planner (FFI): the
//!                               runtime's DrivingQueryPlanner over the
//!                               plugin's: claim, plan, encode the stages
//!                               (the session's codecs), DistributedRootExec
//!                          ◄── the plan's bytes, written by the session's
//!                               codecs: the root as a handle (RootCodec,
//!                               installed on the session beside the
//!                               plugin's codec)
//! datafusion-python decodes the handle through RootCodec (FFI): the root
//!                               itself, over datafusion-python's head
//! datafusion-python executes the root (FFI): the runtime drives the query
//! ```
//!
//! A query planner hands datafusion-python bytes, never a plan, and the
//! root holds what bytes cannot (the claim, the executor, the stages): it
//! crosses as a handle into a table of this process, taken when
//! datafusion-python decodes the plan, which it does as soon as the planner
//! answers. A worker's session has no root codec, and no stage holds a
//! root, so the codec ids a worker checks stay the plugin's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use datafusion::common::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::execution::context::QueryPlanner;
use datafusion::logical_expr::{AggregateUDF, HigherOrderUDF, ScalarUDF, WindowUDF};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion_ffi::execution::FFI_TaskContextProvider;
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use datafusion_ffi::proto::physical_extension_codec::FFI_PhysicalExtensionCodec;
use datafusion_ffi::query_planner::{FFI_QueryPlanner, ForeignQueryPlanner};
use datafusion_proto::bytes::physical_plan_to_bytes_with_extension_codec;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use dfx_abi::Plugin;
use dfx_runtime::SessionSpec;
use dfx_runtime::root::{DistributedRootExec, DrivingQueryPlanner, EncodeStage, QueryDriver};
use pyo3::prelude::*;
use tokio::runtime::Handle;

use crate::blocking::runtime;
use crate::error::from_runtime;
use crate::scheduler::{QueryRun, Scheduler};

/// How a session drives its queries: its spec and the scheduler over its
/// executor. Given to `DfxEngineExtension(driver)`; installed on one session.
#[pyclass(frozen, module = "dfx_engine._internal")]
pub struct SessionDriver {
    spec: SessionSpec,
    scheduler: Py<Scheduler>,
    envelope_files: bool,
    driver: OnceLock<Arc<QueryDriver>>,
}

#[pymethods]
impl SessionDriver {
    /// Drive the queries of a session of `spec_json` (a location or a root)
    /// with `scheduler`; `envelope_files` when its executor starts a
    /// process per task.
    ///
    /// Raises:
    ///     ValueError: A spec the runtime refuses, or one naming neither a
    ///         location nor a root.
    #[new]
    #[pyo3(signature = (spec_json, scheduler, envelope_files = false))]
    fn new(spec_json: &str, scheduler: Py<Scheduler>, envelope_files: bool) -> PyResult<Self> {
        let spec = SessionSpec::from_json(spec_json).map_err(from_runtime)?;
        if spec.shuffle_dir.is_none() && spec.shuffle_root.is_none() {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "a driving session needs a shuffle location or root; the spec has neither",
            ));
        }
        Ok(Self {
            spec,
            scheduler,
            envelope_files,
            driver: OnceLock::new(),
        })
    }

    /// What the scheduler did for the session's last query whose answer was
    /// read, or `None`.
    #[getter]
    fn last_run(&self) -> Option<QueryRun> {
        let run = self.driver.get()?.last_run()?;
        Some(QueryRun::from(run))
    }
}

impl SessionDriver {
    /// The session's query planner: the plugin's `planner`, driving; its
    /// plans cross with the session's codecs (`physical`, [`RootCodec`]
    /// among them).
    pub fn query_planner(
        &self,
        plugin: &Plugin,
        planner: FFI_QueryPlanner,
        logical: FFI_LogicalExtensionCodec,
        physical: FFI_PhysicalExtensionCodec,
    ) -> PyResult<FFI_QueryPlanner> {
        let handle = runtime()?.handle().clone();
        let encoder: Arc<dyn PhysicalExtensionCodec> = (&physical).into();
        let encode: EncodeStage = Arc::new(move |plan| {
            physical_plan_to_bytes_with_extension_codec(plan, encoder.as_ref())
                .map(|bytes| bytes.to_vec())
        });
        let scheduler = self.scheduler.get().runtime_scheduler();
        let driver = QueryDriver::new(
            plugin.clone(),
            self.spec.clone(),
            scheduler,
            // What a worker's session carries: the plugin's codec alone.
            vec![plugin.codec_id().to_string()],
            encode,
        )
        .with_envelope_files(self.envelope_files)
        .with_runtime(handle.clone());
        let driver = Arc::clone(self.driver.get_or_init(|| Arc::new(driver)));
        let inner: Arc<dyn QueryPlanner + Send + Sync> = Arc::new(ForeignQueryPlanner(planner));
        let planner = Arc::new(DrivingQueryPlanner::new(inner, driver));
        // The session's codecs, the root codec among them: datafusion-python
        // gives the planner its own anyway.
        Ok(FFI_QueryPlanner::new_with_ffi_codecs(
            planner, logical, physical,
        ))
    }
}

/// What a root's handle starts with, so a payload of the root codec's id
/// that is not a handle is named as such rather than misread.
const ROOT_HANDLE: &[u8] = b"dfx-root-handle:";

/// Roots planned and not yet decoded by datafusion-python, by handle.
fn roots() -> &'static Mutex<HashMap<u64, Arc<dyn ExecutionPlan>>> {
    static ROOTS: OnceLock<Mutex<HashMap<u64, Arc<dyn ExecutionPlan>>>> = OnceLock::new();
    ROOTS.get_or_init(Mutex::default)
}

/// The id a driving session installs [`RootCodec`] under, beside the
/// plugin's codec. A worker's session lacks it: no stage holds a root.
pub const ROOT_CODEC_ID: &str = "dfx_engine.root.v1";

/// The codec a driving session's plans cross with: a [`DistributedRootExec`]
/// as a handle; nothing else (the session's other codecs write the rest).
#[derive(Debug)]
pub struct RootCodec;

impl RootCodec {
    /// The codec as datafusion-ffi hands it across, its roots decoded on
    /// `runtime`.
    pub fn ffi(runtime: Handle, provider: FFI_TaskContextProvider) -> FFI_PhysicalExtensionCodec {
        FFI_PhysicalExtensionCodec::new(Arc::new(RootCodec), Some(runtime), provider)
    }
}

/// What the root codec answers for anything but a root: not its own.
fn not_a_root(what: &str) -> DataFusionError {
    DataFusionError::NotImplemented(format!(
        "{ROOT_CODEC_ID} encodes only {}, not {what}",
        dfx_runtime::root::distributed_root_exec::DISTRIBUTED_ROOT_NODE_NAME
    ))
}

impl PhysicalExtensionCodec for RootCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        _ctx: &TaskContext,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let Some(handle) = buf.strip_prefix(ROOT_HANDLE) else {
            return Err(not_a_root(&format!("a node of {} bytes", buf.len())));
        };
        let handle = <[u8; 8]>::try_from(handle)
            .map(u64::from_le_bytes)
            .map_err(|_| {
                DataFusionError::Internal(format!(
                    "a distributed root's handle is 8 bytes, found {}",
                    handle.len()
                ))
            })?;
        let root = roots()
            .lock()
            .map_err(|_| DataFusionError::Internal("the table of roots is poisoned".into()))?
            .remove(&handle)
            .ok_or_else(|| {
                DataFusionError::Internal(format!(
                    "no distributed root {handle} in this process: a plan of a driving \
                     session is decoded once, where it was planned"
                ))
            })?;
        // Over the head as datafusion-python decoded it: the root reads
        // the head through datafusion-python's own nodes.
        root.replace_children(
            inputs.to_vec(),
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        if node.downcast_ref::<DistributedRootExec>().is_none() {
            return Err(not_a_root(node.name()));
        }
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let handle = NEXT.fetch_add(1, Ordering::Relaxed);
        roots()
            .lock()
            .map_err(|_| DataFusionError::Internal("the table of roots is poisoned".into()))?
            .insert(handle, node);
        buf.extend_from_slice(ROOT_HANDLE);
        buf.extend_from_slice(&handle.to_le_bytes());
        Ok(())
    }

    fn try_encode_udf(&self, node: &ScalarUDF, _buf: &mut Vec<u8>) -> Result<()> {
        Err(not_a_root(node.name()))
    }

    fn try_encode_udaf(&self, node: &AggregateUDF, _buf: &mut Vec<u8>) -> Result<()> {
        Err(not_a_root(node.name()))
    }

    fn try_encode_udwf(&self, node: &WindowUDF, _buf: &mut Vec<u8>) -> Result<()> {
        Err(not_a_root(node.name()))
    }

    fn try_encode_higher_order_function(
        &self,
        node: &HigherOrderUDF,
        _buf: &mut Vec<u8>,
    ) -> Result<()> {
        Err(not_a_root(node.name()))
    }
}
