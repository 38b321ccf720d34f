//! A test-only dfx plugin declaring the root module of dfx ABI version 1:
//! the fields up to and including `encoded_stage_info` with that version's types
//! (`encoded_stage_info` returned a `DfxStagePayload`, `stage_info` a
//! `DfxStageInfo` with a partition count), and neither `bucket_path` nor
//! `reader_node_name`.
//!
//! A current host must refuse it at the handshake, naming what differs,
//! without crashing and without calling any function of it (least of all one
//! of the fields the file does not have). Every function here counts its calls
//! in an exported static, which a test reads through `dlsym`.

use std::sync::atomic::{AtomicU64, Ordering};

use abi_stable::library::RootModule;
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::sabi_types::VersionStrings;
use abi_stable::std_types::{RResult, RSlice, RStr, RString, RVec};
use abi_stable::{
    StableAbi, declare_root_module_statics, export_root_module, package_version_strings,
};
use datafusion_ffi::config::extension_options::FFI_ExtensionOptions;
use datafusion_ffi::execution::FFI_TaskContextProvider;
use datafusion_ffi::execution_plan::FFI_ExecutionPlan;
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use datafusion_ffi::proto::physical_extension_codec::FFI_PhysicalExtensionCodec;
use datafusion_ffi::query_planner::FFI_QueryPlanner;
use datafusion_ffi::udaf::FFI_AggregateUDF;
use datafusion_ffi::udf::FFI_ScalarUDF;
// Unchanged since ABI version 1, so shared with the current root module.
use dfx_abi::{DfxCounters, FfiResult};

/// Runs of the root-module initializer.
#[unsafe(no_mangle)]
pub static DFX_TEST_ROOT_CALLS: AtomicU64 = AtomicU64::new(0);

/// Calls of any exported function: must stay zero.
#[unsafe(no_mangle)]
pub static DFX_TEST_CONSTRUCTOR_CALLS: AtomicU64 = AtomicU64::new(0);

/// The dfx ABI version this root module declares.
const ABI_VERSION_ONE: u32 = 1;

/// The root module of ABI version 1, field for field (doc comments shortened).
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = DfxPluginRef)))]
#[sabi(missing_field(option))]
pub struct DfxPlugin {
    /// 1.
    pub dfx_abi_version: u32,
    /// `datafusion_ffi::version()`.
    pub datafusion_ffi_major: u64,
    /// The package name.
    pub plugin_name: RStr<'static>,
    /// The package version.
    pub plugin_version: RStr<'static>,
    /// ABI version 1's one stage node, `ShuffleStageExec`.
    pub stage_node_name: RStr<'static>,
    /// ABI version 1's codec id, `dfx_engine.physical.v1`.
    pub codec_id: RStr<'static>,
    /// `dfx_engine`.
    pub config_prefix: RStr<'static>,
    /// The query planner.
    #[sabi(unsafe_opaque_field)]
    pub new_query_planner: extern "C" fn(
        logical_codec: FFI_LogicalExtensionCodec,
        physical_codec: FFI_PhysicalExtensionCodec,
    ) -> FfiResult<FFI_QueryPlanner>,
    /// The physical codec.
    #[sabi(unsafe_opaque_field)]
    pub new_physical_codec: extern "C" fn(
        task_ctx_provider: FFI_TaskContextProvider,
    ) -> FfiResult<FFI_PhysicalExtensionCodec>,
    /// The config extension.
    #[sabi(unsafe_opaque_field)]
    pub new_config_options: extern "C" fn() -> FfiResult<FFI_ExtensionOptions>,
    /// The scalar functions.
    #[sabi(unsafe_opaque_field)]
    pub scalar_udfs: extern "C" fn() -> FfiResult<RVec<FFI_ScalarUDF>>,
    /// The aggregate functions.
    #[sabi(unsafe_opaque_field)]
    pub aggregate_udfs: extern "C" fn() -> FfiResult<RVec<FFI_AggregateUDF>>,
    /// Id of the `index`-th stage.
    pub stage_id: extern "C" fn(index: u64) -> u64,
    /// ABI version 1's file of one partition of a stage.
    pub partition_path: extern "C" fn(dir: RStr<'_>, stage: u64, partition: u64) -> RString,
    /// Glob of the stage files.
    pub partition_glob: extern "C" fn() -> RStr<'static>,
    /// The counters: the end of the first prefix.
    #[sabi(last_prefix_field)]
    pub counters: extern "C" fn() -> DfxCounters,
    /// The panic probe.
    pub panic_probe: extern "C" fn() -> FfiResult<u64>,
    /// ABI version 1's description of a stage node.
    #[sabi(unsafe_opaque_field)]
    pub stage_info: extern "C" fn(plan: FFI_ExecutionPlan) -> FfiResult<DfxStageInfo>,
    /// ABI version 1's reading of an encoded stage: id and directory only.
    pub encoded_stage_info: extern "C" fn(plan_bytes: RSlice<'_, u8>) -> FfiResult<DfxStagePayload>,
}

/// ABI version 1's `encoded_stage_info` answer.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct DfxStagePayload {
    /// The stage id.
    pub stage_id: u64,
    /// The shuffle directory.
    pub shuffle_dir: RString,
}

/// ABI version 1's `stage_info` answer.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct DfxStageInfo {
    /// The stage id.
    pub stage_id: u64,
    /// The shuffle directory.
    pub shuffle_dir: RString,
    /// Partitions of the stage (one file each).
    pub partition_count: u64,
}

impl RootModule for DfxPluginRef {
    declare_root_module_statics! {DfxPluginRef}
    // The names dfx-abi used then and uses now.
    const BASE_NAME: &'static str = "dfx_plugin";
    const NAME: &'static str = "dfx_plugin";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}

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

extern "C" fn partition_path(_dir: RStr<'_>, _stage: u64, _partition: u64) -> RString {
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

extern "C" fn encoded_stage_info(_plan_bytes: RSlice<'_, u8>) -> FfiResult<DfxStagePayload> {
    called()
}

/// The root module as a plugin of ABI version 1 exported it.
#[export_root_module]
pub fn root_module() -> DfxPluginRef {
    DFX_TEST_ROOT_CALLS.fetch_add(1, Ordering::SeqCst);
    DfxPlugin {
        dfx_abi_version: ABI_VERSION_ONE,
        datafusion_ffi_major: datafusion_ffi::version(),
        // Not CARGO_PKG_NAME: build.rs gives this crate dfx-abi's.
        plugin_name: RStr::from_str("dfx-test-plugin-older-root"),
        plugin_version: RStr::from_str(env!("CARGO_PKG_VERSION")),
        stage_node_name: RStr::from_str("ShuffleStageExec"),
        codec_id: RStr::from_str("dfx_engine.physical.v1"),
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
    }
    .leak_into_prefix()
}
