//! The root module shared by the test plugins that a host must refuse after
//! reading their declared versions (`wrong-abi`, `wrong-major`).
//!
//! Every constructor counts its calls in an exported static and then returns
//! an error: a test reads the count through `dlsym` (data, not code) and so
//! proves that a refusing host never called into the library.
//!
//! Every field of `dfx_abi::DfxPlugin` is set here (the exchange's fields
//! included: `bucket_path`, `reader_node_name`, and `encoded_stage_info`
//! returning `DfxStageInfo`), so the layout is exactly the real plugin's and
//! only the declared versions differ. A field added to the root module needs
//! one counting function below (the compiler says which).

use std::sync::atomic::{AtomicU64, Ordering};

use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::std_types::{RResult, RSlice, RStr, RString, RVec};
use datafusion_ffi::config::extension_options::FFI_ExtensionOptions;
use datafusion_ffi::execution::FFI_TaskContextProvider;
use datafusion_ffi::execution_plan::FFI_ExecutionPlan;
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use datafusion_ffi::proto::physical_extension_codec::FFI_PhysicalExtensionCodec;
use datafusion_ffi::query_planner::FFI_QueryPlanner;
use datafusion_ffi::udaf::FFI_AggregateUDF;
use datafusion_ffi::udf::FFI_ScalarUDF;
use dfx_abi::module::DfxCutStage;
use dfx_abi::{DfxCounters, DfxPlugin, DfxPluginRef, DfxStageInfo, FfiResult};

/// Calls of the root-module initializer (abi_stable runs it to read the
/// declared versions; that is data, not behaviour).
#[unsafe(no_mangle)]
pub static DFX_TEST_ROOT_CALLS: AtomicU64 = AtomicU64::new(0);

/// Calls of any exported constructor or function: must stay zero.
#[unsafe(no_mangle)]
pub static DFX_TEST_CONSTRUCTOR_CALLS: AtomicU64 = AtomicU64::new(0);

fn called<T>() -> FfiResult<T> {
    DFX_TEST_CONSTRUCTOR_CALLS.fetch_add(1, Ordering::SeqCst);
    RResult::RErr(RString::from(
        "test plugin: a refused plugin was called into",
    ))
}

extern "C" fn new_query_planner(
    _logical: FFI_LogicalExtensionCodec,
    _physical: FFI_PhysicalExtensionCodec,
) -> FfiResult<FFI_QueryPlanner> {
    called()
}

extern "C" fn new_physical_codec(
    _provider: FFI_TaskContextProvider,
) -> FfiResult<FFI_PhysicalExtensionCodec> {
    called()
}

extern "C" fn new_config_options() -> FfiResult<FFI_ExtensionOptions> {
    called()
}

extern "C" fn scalar_udfs() -> FfiResult<RVec<FFI_ScalarUDF>> {
    called()
}

extern "C" fn aggregate_udfs() -> FfiResult<RVec<FFI_AggregateUDF>> {
    called()
}

extern "C" fn stage_id(_index: u64) -> u64 {
    DFX_TEST_CONSTRUCTOR_CALLS.fetch_add(1, Ordering::SeqCst);
    0
}

extern "C" fn partition_path(_dir: RStr<'_>, _stage: u64, _map: u64) -> RString {
    DFX_TEST_CONSTRUCTOR_CALLS.fetch_add(1, Ordering::SeqCst);
    RString::new()
}

extern "C" fn bucket_path(_dir: RStr<'_>, _stage: u64, _map: u64, _bucket: u64) -> RString {
    DFX_TEST_CONSTRUCTOR_CALLS.fetch_add(1, Ordering::SeqCst);
    RString::new()
}

extern "C" fn partition_glob() -> RStr<'static> {
    DFX_TEST_CONSTRUCTOR_CALLS.fetch_add(1, Ordering::SeqCst);
    RStr::from_str("")
}

extern "C" fn counters() -> DfxCounters {
    DFX_TEST_CONSTRUCTOR_CALLS.fetch_add(1, Ordering::SeqCst);
    DfxCounters::default()
}

extern "C" fn panic_probe() -> FfiResult<u64> {
    called()
}

extern "C" fn stage_info(_plan: FFI_ExecutionPlan) -> FfiResult<DfxStageInfo> {
    called()
}

extern "C" fn encoded_stage_info(_plan_bytes: RSlice<'_, u8>) -> FfiResult<DfxStageInfo> {
    called()
}

extern "C" fn vet_stage(_plan_bytes: RSlice<'_, u8>, _allowed_json: RStr<'_>) -> FfiResult<()> {
    called()
}

extern "C" fn probe_location(_location: RStr<'_>, _options_json: RStr<'_>) -> FfiResult<()> {
    called()
}

extern "C" fn take_failures(_location: RStr<'_>) -> RString {
    DFX_TEST_CONSTRUCTOR_CALLS.fetch_add(1, Ordering::SeqCst);
    RString::from("[]")
}

extern "C" fn new_logical_codec(
    _provider: FFI_TaskContextProvider,
) -> FfiResult<FFI_LogicalExtensionCodec> {
    called()
}

extern "C" fn session_settings() -> RString {
    DFX_TEST_CONSTRUCTOR_CALLS.fetch_add(1, Ordering::SeqCst);
    RString::from("{}")
}

extern "C" fn cut_stage(_plan_bytes: RSlice<'_, u8>) -> FfiResult<DfxCutStage> {
    called()
}

extern "C" fn stage_for_map(
    _shared: RSlice<'_, u8>,
    _map_files: RSlice<'_, u8>,
    _map: u64,
) -> FfiResult<RVec<u8>> {
    called()
}

extern "C" fn seal_stage_input(_plan_bytes: RSlice<'_, u8>) -> FfiResult<RVec<u8>> {
    called()
}

extern "C" fn adapt_stage(
    _plan_bytes: RSlice<'_, u8>,
    _request_json: RStr<'_>,
) -> FfiResult<RString> {
    called()
}

extern "C" fn plan_stages(_plan_bytes: RSlice<'_, u8>) -> FfiResult<RVec<RVec<u8>>> {
    called()
}

extern "C" fn stage_runs_slices(_plan_bytes: RSlice<'_, u8>) -> FfiResult<bool> {
    called()
}

/// A dfx root module that declares `dfx_abi_version` and
/// `datafusion_ffi_major` as given, every function of which only counts.
pub fn refusing_module(dfx_abi_version: u32, datafusion_ffi_major: u64) -> DfxPluginRef {
    DFX_TEST_ROOT_CALLS.fetch_add(1, Ordering::SeqCst);
    DfxPlugin {
        dfx_abi_version,
        datafusion_ffi_major,
        plugin_name: RStr::from_str(env!("CARGO_PKG_NAME")),
        plugin_version: RStr::from_str(env!("CARGO_PKG_VERSION")),
        stage_node_name: RStr::from_str("ShuffleWriterExec"),
        codec_id: RStr::from_str("dfx_engine.physical.v5"),
        config_prefix: RStr::from_str("dfx_engine"),
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
        reader_node_name: RStr::from_str("ShuffleReaderExec"),
        vet_stage,
        probe_location,
        take_failures,
        session_settings,
        logical_codec_id: RStr::from_str("dfx_engine.logical.v1"),
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
