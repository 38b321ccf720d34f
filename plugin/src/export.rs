//! The root module and its `extern "C"` constructors.
//!
//! Every constructor runs its body behind [`crate::guard`]: a panic must not
//! unwind into a host compiled separately (it would abort the process, or
//! worse), so it becomes an error message instead. The objects they return
//! guard their own methods (see the table in [`crate::guard`]).

use std::path::Path;
use std::sync::Arc;

use abi_stable::export_root_module;
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::std_types::{RErr, ROk, RSlice, RStr, RString, RVec};
use datafusion::common::{DataFusionError, Result};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_ffi::config::extension_options::FFI_ExtensionOptions;
use datafusion_ffi::execution::FFI_TaskContextProvider;
use datafusion_ffi::execution_plan::FFI_ExecutionPlan;
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use datafusion_ffi::proto::physical_extension_codec::FFI_PhysicalExtensionCodec;
use datafusion_ffi::query_planner::FFI_QueryPlanner;
use datafusion_ffi::udaf::FFI_AggregateUDF;
use datafusion_ffi::udf::FFI_ScalarUDF;
use dfx_abi::module::DfxCutStage;
use dfx_abi::{DFX_ABI_VERSION, DfxCounters, DfxPlugin, DfxPluginRef, DfxStageInfo, FfiResult};

use crate::codec::logical::{DfxLogicalCodec, LOGICAL_CODEC_ID};
use crate::codec::physical::DfxPhysicalCodec;
use crate::config::{CONFIG_PREFIX, DfxConfig};
use crate::exchange::probe;
use crate::exchange::store::S3Options;
use crate::exec::shuffle_writer::ShuffleWriterExec;
use crate::guard::GuardedQueryPlanner;
use crate::planner::DfxQueryPlanner;
use crate::vet::{Allowed, vet_encoded_stage};
use crate::wire::{CODEC_ID, READER_NODE_NAME, WRITER_NODE_NAME};
use crate::{adapt, counters, encoded, error, functions, guard, isolation, paths};

/// The plugin's root module, as `abi_stable` exports it.
#[export_root_module]
pub fn root_module() -> DfxPluginRef {
    DfxPlugin {
        dfx_abi_version: DFX_ABI_VERSION,
        datafusion_ffi_major: datafusion_ffi::version(),
        plugin_name: RStr::from_str(env!("CARGO_PKG_NAME")),
        plugin_version: RStr::from_str(env!("CARGO_PKG_VERSION")),
        stage_node_name: RStr::from_str(WRITER_NODE_NAME),
        codec_id: RStr::from_str(CODEC_ID),
        config_prefix: RStr::from_str(CONFIG_PREFIX),
        new_query_planner,
        new_physical_codec,
        new_config_options,
        scalar_udfs,
        aggregate_udfs,
        stage_id,
        partition_path,
        partition_glob,
        counters,
        panic_probe,
        stage_info,
        encoded_stage_info,
        bucket_path,
        reader_node_name: RStr::from_str(READER_NODE_NAME),
        vet_stage,
        probe_location,
        take_failures,
        session_settings,
        logical_codec_id: RStr::from_str(LOGICAL_CODEC_ID),
        new_logical_codec,
        cut_stage,
        stage_for_map,
        adapt_stage,
        seal_stage_input,
        plan_stages,
        stage_runs_slices,
    }
    .leak_into_prefix()
}

/// Run `body`, turning an error or a panic (see [`crate::guard`]) into an
/// error message for the host.
fn guarded<T>(what: &str, body: impl FnOnce() -> Result<T>) -> FfiResult<T> {
    match guard::catch(what, body) {
        Ok(value) => ROk(value),
        Err(err) if err.to_string().contains(guard::PANIC_PREFIX) => {
            RErr(RString::from(err.strip_backtrace()))
        }
        Err(err) => RErr(RString::from(format!("dfx {what}: {err}"))),
    }
}

extern "C" fn new_query_planner(
    logical_codec: FFI_LogicalExtensionCodec,
    physical_codec: FFI_PhysicalExtensionCodec,
) -> FfiResult<FFI_QueryPlanner> {
    guarded("query planner", || {
        Ok(FFI_QueryPlanner::new_with_ffi_codecs(
            Arc::new(GuardedQueryPlanner::new(DfxQueryPlanner::default())),
            logical_codec,
            physical_codec,
        ))
    })
}

extern "C" fn new_physical_codec(
    task_ctx_provider: FFI_TaskContextProvider,
) -> FfiResult<FFI_PhysicalExtensionCodec> {
    guarded("physical codec", || {
        Ok(FFI_PhysicalExtensionCodec::new(
            Arc::new(DfxPhysicalCodec::default()),
            None,
            task_ctx_provider,
        ))
    })
}

extern "C" fn new_logical_codec(
    task_ctx_provider: FFI_TaskContextProvider,
) -> FfiResult<FFI_LogicalExtensionCodec> {
    guarded("logical codec", || {
        Ok(FFI_LogicalExtensionCodec::new(
            Arc::new(DfxLogicalCodec::new(task_ctx_provider.clone())),
            None,
            task_ctx_provider,
        ))
    })
}

extern "C" fn new_config_options() -> FfiResult<FFI_ExtensionOptions> {
    guarded("config options", || DfxConfig::default().to_ffi())
}

extern "C" fn scalar_udfs() -> FfiResult<RVec<FFI_ScalarUDF>> {
    guarded("scalar functions", || {
        Ok(functions::scalar_udfs()
            .into_iter()
            .map(FFI_ScalarUDF::from)
            .collect())
    })
}

extern "C" fn aggregate_udfs() -> FfiResult<RVec<FFI_AggregateUDF>> {
    guarded("aggregate functions", || {
        Ok(functions::aggregate_udfs()
            .into_iter()
            .map(FFI_AggregateUDF::from)
            .collect())
    })
}

extern "C" fn stage_id(index: u64) -> u64 {
    paths::stage_id(index)
}

/// The map's file ([`paths::map_path`]), whose presence says it is published.
extern "C" fn partition_path(dir: RStr<'_>, stage: u64, map: u64) -> RString {
    map_path(dir, stage, map)
}

/// The map's file again: every bucket of a map is in it.
extern "C" fn bucket_path(dir: RStr<'_>, stage: u64, map: u64, _bucket: u64) -> RString {
    map_path(dir, stage, map)
}

fn map_path(dir: RStr<'_>, stage: u64, map: u64) -> RString {
    let path = paths::map_path(Path::new(dir.as_str()), stage, map as usize);
    RString::from(path.to_string_lossy().into_owned())
}

extern "C" fn partition_glob() -> RStr<'static> {
    RStr::from_str(paths::PARTITION_GLOB)
}

extern "C" fn counters() -> DfxCounters {
    counters::snapshot()
}

extern "C" fn panic_probe() -> FfiResult<u64> {
    guarded("panic probe", || {
        if cfg!(feature = "test-hooks") {
            panic!("the panic probe fired inside the plugin, as a test asked");
        }
        Err(DataFusionError::Execution(
            "the plugin was built without its test-hooks feature".to_string(),
        ))
    })
}

extern "C" fn stage_info(plan: FFI_ExecutionPlan) -> FfiResult<DfxStageInfo> {
    guarded("stage info", || {
        let plan = Arc::<dyn ExecutionPlan>::try_from(&plan)?;
        let Some(writer) = plan.downcast_ref::<ShuffleWriterExec>() else {
            return Err(DataFusionError::Execution(format!(
                "{} is not a stage writer of this plugin",
                plan.name()
            )));
        };
        Ok(DfxStageInfo {
            stage_id: writer.stage_id(),
            shuffle_dir: RString::from(writer.shuffle_dir().to_string_lossy().into_owned()),
            maps: writer.maps() as u64,
            buckets: writer.buckets() as u64,
            partitions_per_map: writer.partitions_per_map() as u64,
            deps: writer.deps().iter().copied().collect(),
            aligned_deps: writer.aligned_deps().iter().copied().collect(),
            partitioning: RString::from(writer.partitioning_display()),
        })
    })
}

extern "C" fn encoded_stage_info(plan_bytes: RSlice<'_, u8>) -> FfiResult<DfxStageInfo> {
    guarded("encoded stage info", || {
        let payload = crate::wire::read_encoded_stage(plan_bytes.as_slice())?;
        Ok(DfxStageInfo {
            stage_id: payload.stage_id,
            shuffle_dir: RString::from(payload.shuffle_dir),
            maps: payload.maps,
            buckets: payload.buckets,
            partitions_per_map: payload.partitions_per_map,
            deps: payload.deps.into_iter().collect(),
            aligned_deps: payload.aligned_deps.into_iter().collect(),
            partitioning: RString::from(payload.partitioning_display),
        })
    })
}

extern "C" fn vet_stage(plan_bytes: RSlice<'_, u8>, allowed_json: RStr<'_>) -> FfiResult<()> {
    guarded("stage check", || {
        let allowed =
            Allowed::from_json(allowed_json.as_str()).map_err(DataFusionError::Execution)?;
        vet_encoded_stage(plan_bytes.as_slice(), &allowed).map_err(DataFusionError::Execution)
    })
}

extern "C" fn probe_location(location: RStr<'_>, options_json: RStr<'_>) -> FfiResult<()> {
    let probed = guard::catch("shuffle location probe", || {
        let options =
            S3Options::from_json(options_json.as_str()).map_err(DataFusionError::Execution)?;
        probe::probe_location(location.as_str(), &options).map_err(DataFusionError::Execution)
    });
    // The probe's own messages name the location already: passed on bare.
    match probed {
        Ok(()) => ROk(()),
        Err(DataFusionError::Execution(message)) => RErr(RString::from(message)),
        Err(other) => RErr(RString::from(other.strip_backtrace())),
    }
}

/// The failure classes recorded for `location`, taken, as a JSON array. A
/// caught panic answers its message, which a host cannot parse as one and
/// reports as an error: it must not read as "nothing failed".
extern "C" fn take_failures(location: RStr<'_>) -> RString {
    let taken = guard::catch("take_failures", || {
        serde_json::to_string(&error::take(location.as_str()))
            .map_err(|e| DataFusionError::Execution(format!("cannot encode failure classes: {e}")))
    });
    match taken {
        Ok(json) => RString::from(json),
        Err(err) => RString::from(err.strip_backtrace()),
    }
}

/// The settings every session running the plugin's stages must carry
/// ([`isolation::session_settings`]), as a JSON object. A caught panic
/// answers its message, which a host cannot parse as one.
extern "C" fn session_settings() -> RString {
    let answered = guard::catch("session_settings", || {
        let settings: serde_json::Map<String, serde_json::Value> = isolation::session_settings()
            .into_iter()
            .map(|(key, value)| (key.to_string(), serde_json::Value::String(value)))
            .collect();
        Ok(serde_json::Value::Object(settings).to_string())
    });
    match answered {
        Ok(json) => RString::from(json),
        Err(err) => RString::from(err.strip_backtrace()),
    }
}

/// The encoded stage cut for its maps ([`encoded::cut_stage`]).
extern "C" fn cut_stage(plan_bytes: RSlice<'_, u8>) -> FfiResult<DfxCutStage> {
    guarded("stage cut", || {
        let cut = encoded::cut_stage(plan_bytes.as_slice())?;
        Ok(DfxCutStage {
            shared: RVec::from(cut.shared),
            maps: cut.maps.into_iter().map(RVec::from).collect(),
        })
    })
}

/// The stages of an encoded plan ([`encoded::split_plan`]).
extern "C" fn plan_stages(plan_bytes: RSlice<'_, u8>) -> FfiResult<RVec<RVec<u8>>> {
    guarded("plan split", || {
        let stages = encoded::split_plan(plan_bytes.as_slice())?;
        Ok(stages.into_iter().map(RVec::from).collect())
    })
}

/// Whether the encoded stage's maps run slices, read from its writer.
extern "C" fn stage_runs_slices(plan_bytes: RSlice<'_, u8>) -> FfiResult<bool> {
    guarded("stage slices", || {
        Ok(crate::wire::read_encoded_stage(plan_bytes.as_slice())?.runs_slices())
    })
}

/// How a ready stage runs ([`adapt::adapt_stage`]), as JSON.
extern "C" fn adapt_stage(
    plan_bytes: RSlice<'_, u8>,
    request_json: RStr<'_>,
) -> FfiResult<RString> {
    guarded("adaptive stage", || {
        let adaptation = adapt::adapt_stage(plan_bytes.as_slice(), request_json.as_str())?;
        serde_json::to_string(&adaptation)
            .map(RString::from)
            .map_err(|e| DataFusionError::Execution(format!("cannot encode the decision: {e}")))
    })
}

/// The stage one map runs ([`encoded::stage_for_map`]).
extern "C" fn stage_for_map(
    shared: RSlice<'_, u8>,
    map_files: RSlice<'_, u8>,
    map: u64,
) -> FfiResult<RVec<u8>> {
    guarded("stage for a map", || {
        encoded::stage_for_map(shared.as_slice(), map_files.as_slice(), map).map(RVec::from)
    })
}

/// The stage with its writer's input sealed ([`encoded::seal_stage_input`]).
extern "C" fn seal_stage_input(plan_bytes: RSlice<'_, u8>) -> FfiResult<RVec<u8>> {
    guarded("sealed stage input", || {
        encoded::seal_stage_input(plan_bytes.as_slice()).map(RVec::from)
    })
}
