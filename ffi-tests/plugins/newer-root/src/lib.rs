//! A test-only dfx plugin declaring a *newer* root module: every field of the
//! current one, same versions, plus one field appended after the last
//! (`stage_runs_slices`), as a later version may append an export.
//!
//! A current host must load it and use every field it knows. The functions
//! here do no query work (the constructors of DataFusion objects return an
//! error); the file-layout functions and the counters answer as the real
//! plugin's do, so a test can check that the host's calls reach them. Each
//! call is counted in an exported static, read by a test through `dlsym`.

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
use dfx_abi::module::DfxCutStage;
use dfx_abi::{DFX_ABI_VERSION, DfxCounters, DfxStageInfo, FfiResult};

/// Runs of the root-module initializer.
#[unsafe(no_mangle)]
pub static DFX_TEST_ROOT_CALLS: AtomicU64 = AtomicU64::new(0);

/// Calls of any exported function of the current root module's fields.
#[unsafe(no_mangle)]
pub static DFX_TEST_CONSTRUCTOR_CALLS: AtomicU64 = AtomicU64::new(0);

/// What [`counters`] reports: values no real plugin reports at load time, so a
/// host that shows them has called this library.
pub const NEWER_COUNTERS: DfxCounters = DfxCounters {
    planner_calls: 11,
    stages_inserted: 12,
    stages_encoded: 13,
    stages_decoded: 14,
    live_objects: 15,
};

/// The current root module's fields, in order, then one more.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = DfxPluginRef)))]
#[sabi(missing_field(option))]
pub struct DfxPlugin {
    /// This build's dfx ABI version: appending a field does not change it.
    pub dfx_abi_version: u32,
    /// `datafusion_ffi::version()`.
    pub datafusion_ffi_major: u64,
    /// The package name.
    pub plugin_name: RStr<'static>,
    /// The package version.
    pub plugin_version: RStr<'static>,
    /// `ShuffleWriterExec`.
    pub stage_node_name: RStr<'static>,
    /// `dfx_engine.physical.v5`.
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
    /// The commit marker of a map task.
    pub partition_path: extern "C" fn(dir: RStr<'_>, stage: u64, map: u64) -> RString,
    /// Glob of the stage entries.
    pub partition_glob: extern "C" fn() -> RStr<'static>,
    /// The counters: the end of the first prefix.
    #[sabi(last_prefix_field)]
    pub counters: extern "C" fn() -> DfxCounters,
    /// The panic probe.
    pub panic_probe: extern "C" fn() -> FfiResult<u64>,
    /// The description of a stage root.
    #[sabi(unsafe_opaque_field)]
    pub stage_info: extern "C" fn(plan: FFI_ExecutionPlan) -> FfiResult<DfxStageInfo>,
    /// The description of an encoded stage.
    pub encoded_stage_info: extern "C" fn(plan_bytes: RSlice<'_, u8>) -> FfiResult<DfxStageInfo>,
    /// The file of one bucket of a map task.
    pub bucket_path: extern "C" fn(dir: RStr<'_>, stage: u64, map: u64, bucket: u64) -> RString,
    /// `ShuffleReaderExec`.
    pub reader_node_name: RStr<'static>,
    /// The stage check.
    pub vet_stage:
        extern "C" fn(plan_bytes: RSlice<'_, u8>, allowed_json: RStr<'_>) -> FfiResult<()>,
    /// The shuffle location probe.
    pub probe_location: extern "C" fn(location: RStr<'_>, options_json: RStr<'_>) -> FfiResult<()>,
    /// The failure classes recorded for a shuffle location, as JSON.
    pub take_failures: extern "C" fn(location: RStr<'_>) -> RString,
    /// The session settings the plugin's stages need, as JSON.
    pub session_settings: extern "C" fn() -> RString,
    /// The logical codec's id.
    pub logical_codec_id: RStr<'static>,
    /// The logical codec.
    #[sabi(unsafe_opaque_field)]
    pub new_logical_codec: extern "C" fn(
        task_ctx_provider: FFI_TaskContextProvider,
    ) -> FfiResult<FFI_LogicalExtensionCodec>,
    /// Cuts nothing: this plugin does no query work.
    pub cut_stage: extern "C" fn(plan_bytes: RSlice<'_, u8>) -> FfiResult<DfxCutStage>,
    /// Puts nothing together: this plugin does no query work.
    pub stage_for_map: extern "C" fn(
        shared: RSlice<'_, u8>,
        map_files: RSlice<'_, u8>,
        map: u64,
    ) -> FfiResult<RVec<u8>>,
    /// Decides nothing: this plugin does no query work.
    pub adapt_stage:
        extern "C" fn(plan_bytes: RSlice<'_, u8>, request_json: RStr<'_>) -> FfiResult<RString>,
    /// Seals nothing: this plugin does no query work.
    pub seal_stage_input: extern "C" fn(plan_bytes: RSlice<'_, u8>) -> FfiResult<RVec<u8>>,
    /// Splits nothing: this plugin does no query work.
    pub plan_stages: extern "C" fn(plan_bytes: RSlice<'_, u8>) -> FfiResult<RVec<RVec<u8>>>,
    /// Reads nothing: this plugin does no query work.
    pub stage_runs_slices: extern "C" fn(plan_bytes: RSlice<'_, u8>) -> FfiResult<bool>,
    /// The appended field: an export a later version might add.
    pub newer_field: extern "C" fn() -> u64,
}

impl RootModule for DfxPluginRef {
    declare_root_module_statics! {DfxPluginRef}
    // The names of dfx-abi's root module.
    const BASE_NAME: &'static str = "dfx_plugin";
    const NAME: &'static str = "dfx_plugin";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}

fn count() {
    DFX_TEST_CONSTRUCTOR_CALLS.fetch_add(1, Ordering::SeqCst);
}

fn no_query_work<T>() -> FfiResult<T> {
    count();
    RResult::RErr(RString::from(
        "test plugin: the newer-root plugin does no query work",
    ))
}

extern "C" fn new_query_planner(
    _logical: FFI_LogicalExtensionCodec,
    _physical: FFI_PhysicalExtensionCodec,
) -> FfiResult<FFI_QueryPlanner> {
    no_query_work()
}

extern "C" fn new_logical_codec(
    _provider: FFI_TaskContextProvider,
) -> FfiResult<FFI_LogicalExtensionCodec> {
    no_query_work()
}

extern "C" fn new_physical_codec(
    _provider: FFI_TaskContextProvider,
) -> FfiResult<FFI_PhysicalExtensionCodec> {
    no_query_work()
}

extern "C" fn new_config_options() -> FfiResult<FFI_ExtensionOptions> {
    no_query_work()
}

extern "C" fn scalar_udfs() -> FfiResult<RVec<FFI_ScalarUDF>> {
    no_query_work()
}

extern "C" fn aggregate_udfs() -> FfiResult<RVec<FFI_AggregateUDF>> {
    no_query_work()
}

extern "C" fn stage_id(index: u64) -> u64 {
    count();
    1 + index
}

extern "C" fn partition_path(dir: RStr<'_>, stage: u64, map: u64) -> RString {
    count();
    RString::from(format!("{dir}/stage-{stage}/map-{map}.json"))
}

extern "C" fn bucket_path(dir: RStr<'_>, stage: u64, map: u64, _bucket: u64) -> RString {
    count();
    RString::from(format!("{dir}/stage-{stage}/map-{map}.arrow"))
}

extern "C" fn partition_glob() -> RStr<'static> {
    count();
    RStr::from_str("stage-*")
}

extern "C" fn counters() -> DfxCounters {
    count();
    NEWER_COUNTERS
}

extern "C" fn panic_probe() -> FfiResult<u64> {
    no_query_work()
}

extern "C" fn stage_info(_plan: FFI_ExecutionPlan) -> FfiResult<DfxStageInfo> {
    no_query_work()
}

/// Describes any bytes as stage 1 publishing into the directory the bytes
/// spell, so a test sees its own input come back across the boundary.
extern "C" fn encoded_stage_info(plan_bytes: RSlice<'_, u8>) -> FfiResult<DfxStageInfo> {
    count();
    RResult::ROk(DfxStageInfo {
        stage_id: 1,
        shuffle_dir: RString::from(String::from_utf8_lossy(plan_bytes.as_slice()).into_owned()),
        maps: 2,
        buckets: 3,
        partitions_per_map: 1,
        deps: RVec::from(vec![4, 5]),
        aligned_deps: RVec::from(vec![5]),
        partitioning: RString::from("single"),
    })
}

extern "C" fn vet_stage(_plan_bytes: RSlice<'_, u8>, _allowed_json: RStr<'_>) -> FfiResult<()> {
    no_query_work()
}

extern "C" fn probe_location(_location: RStr<'_>, _options_json: RStr<'_>) -> FfiResult<()> {
    no_query_work()
}

/// Nothing was recorded: an empty JSON array, as the real plugin answers.
extern "C" fn take_failures(_location: RStr<'_>) -> RString {
    count();
    RString::from("[]")
}

/// One setting, as the real plugin answers its settings.
extern "C" fn session_settings() -> RString {
    count();
    RString::from(r#"{"datafusion.optimizer.repartition_file_scans":"false"}"#)
}

extern "C" fn cut_stage(_plan_bytes: RSlice<'_, u8>) -> FfiResult<DfxCutStage> {
    no_query_work()
}

extern "C" fn stage_for_map(
    _shared: RSlice<'_, u8>,
    _map_files: RSlice<'_, u8>,
    _map: u64,
) -> FfiResult<RVec<u8>> {
    no_query_work()
}

extern "C" fn seal_stage_input(_plan_bytes: RSlice<'_, u8>) -> FfiResult<RVec<u8>> {
    no_query_work()
}

extern "C" fn adapt_stage(
    _plan_bytes: RSlice<'_, u8>,
    _request_json: RStr<'_>,
) -> FfiResult<RString> {
    no_query_work()
}

extern "C" fn plan_stages(_plan_bytes: RSlice<'_, u8>) -> FfiResult<RVec<RVec<u8>>> {
    no_query_work()
}

extern "C" fn stage_runs_slices(_plan_bytes: RSlice<'_, u8>) -> FfiResult<bool> {
    no_query_work()
}

/// A current host cannot name this field, so never calls it.
extern "C" fn newer_field() -> u64 {
    count();
    42
}

/// The newer root module.
#[export_root_module]
pub fn root_module() -> DfxPluginRef {
    DFX_TEST_ROOT_CALLS.fetch_add(1, Ordering::SeqCst);
    DfxPlugin {
        dfx_abi_version: DFX_ABI_VERSION,
        datafusion_ffi_major: datafusion_ffi::version(),
        // Not CARGO_PKG_NAME: build.rs gives this crate dfx-abi's.
        plugin_name: RStr::from_str("dfx-test-plugin-newer-root"),
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
        newer_field,
    }
    .leak_into_prefix()
}
