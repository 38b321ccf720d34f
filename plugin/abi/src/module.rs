//! The root module: the one symbol a dfx plugin file exports.
//!
//! Declared as an `abi_stable` prefix type so that a later plugin can append
//! fields without breaking hosts built against this one: a host reads the
//! fields it knows and `abi_stable` checks their layout before any of them is
//! touched. Every field is `Copy` (integers, `RStr<'static>`, `extern "C"`
//! function pointers), because prefix fields are read by value.
//!
//! The `datafusion-ffi` structs returned by the constructors are opaque to
//! `abi_stable` (`#[sabi(unsafe_opaque_field)]`); their compatibility is
//! guarded by [`DfxPlugin::datafusion_ffi_major`], which every host checks
//! before calling anything (see [`crate::compat`]).

use abi_stable::library::RootModule;
use abi_stable::sabi_types::VersionStrings;
use abi_stable::std_types::{RResult, RSlice, RStr, RString, RVec};
use abi_stable::{StableAbi, declare_root_module_statics, package_version_strings};
use datafusion_ffi::config::extension_options::FFI_ExtensionOptions;
use datafusion_ffi::execution::FFI_TaskContextProvider;
use datafusion_ffi::execution_plan::FFI_ExecutionPlan;
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use datafusion_ffi::proto::physical_extension_codec::FFI_PhysicalExtensionCodec;
use datafusion_ffi::query_planner::FFI_QueryPlanner;
use datafusion_ffi::udaf::FFI_AggregateUDF;
use datafusion_ffi::udf::FFI_ScalarUDF;

/// What an exported constructor returns: the value, or an error message.
///
/// A constructor never unwinds across the boundary; a panic inside it is
/// caught by the plugin and arrives here as `RErr`.
pub type FfiResult<T> = RResult<T, RString>;

/// Counters the plugin keeps so that tests and benchmarks can see what
/// happened on its side of the boundary.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DfxCounters {
    /// Calls of the plugin's query planner.
    pub planner_calls: u64,
    /// Stages (`ShuffleWriterExec` nodes) inserted by the planner, summed over calls.
    pub stages_inserted: u64,
    /// Stage nodes encoded by the plugin's codec.
    pub stages_encoded: u64,
    /// Stage nodes decoded by the plugin's codec.
    pub stages_decoded: u64,
    /// Plugin-side objects alive right now (writer and reader nodes, their streams,
    /// planners, codecs). Returns to zero when a host has released everything.
    pub live_objects: u64,
}

/// The dfx plugin's root module.
///
/// Fields up to [`DfxPlugin::counters`] form the first version's prefix;
/// later versions may only append after it.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = DfxPluginRef)))]
#[sabi(missing_field(option))]
pub struct DfxPlugin {
    /// The dfx ABI version the plugin was built with ([`crate::DFX_ABI_VERSION`]).
    pub dfx_abi_version: u32,
    /// `datafusion_ffi::version()` of the plugin's build: the DataFusion major
    /// its FFI structs belong to.
    pub datafusion_ffi_major: u64,
    /// The plugin's package name.
    pub plugin_name: RStr<'static>,
    /// The plugin's package version.
    pub plugin_version: RStr<'static>,
    /// Name of the stage root node (`ShuffleWriterExec`); hosts find stages
    /// by containment of this name in a node's display, in pre-order,
    /// descending into stages (they nest).
    pub stage_node_name: RStr<'static>,
    /// Id of the plugin's physical extension codec (`dfx_engine.physical.v5`).
    pub codec_id: RStr<'static>,
    /// Prefix of the plugin's config extension (`dfx_engine`).
    pub config_prefix: RStr<'static>,

    /// The query planner, built on the host's codec chains.
    #[sabi(unsafe_opaque_field)]
    pub new_query_planner: extern "C" fn(
        logical_codec: FFI_LogicalExtensionCodec,
        physical_codec: FFI_PhysicalExtensionCodec,
    ) -> FfiResult<FFI_QueryPlanner>,

    /// The physical extension codec for the exchange's nodes
    /// (`ShuffleWriterExec`, `ShuffleReaderExec`), bound to a task-context
    /// provider of the host's session.
    #[sabi(unsafe_opaque_field)]
    pub new_physical_codec: extern "C" fn(
        task_ctx_provider: FFI_TaskContextProvider,
    ) -> FfiResult<FFI_PhysicalExtensionCodec>,

    /// The config extension declaring `dfx_engine.shuffle_dir`, with defaults.
    #[sabi(unsafe_opaque_field)]
    pub new_config_options: extern "C" fn() -> FfiResult<FFI_ExtensionOptions>,

    /// The plugin's scalar functions.
    #[sabi(unsafe_opaque_field)]
    pub scalar_udfs: extern "C" fn() -> FfiResult<RVec<FFI_ScalarUDF>>,

    /// The plugin's aggregate functions.
    #[sabi(unsafe_opaque_field)]
    pub aggregate_udfs: extern "C" fn() -> FfiResult<RVec<FFI_AggregateUDF>>,

    /// Id of the `index`-th stage in pre-order (`FIRST_STAGE_ID + index`).
    pub stage_id: extern "C" fn(index: u64) -> u64,

    /// The file of map task `map` of `stage` under `dir`
    /// (`stage-<S>/<K>-map-<M>.arrow`): every bucket of the map, closed by its
    /// commit marker, so the map is published once it exists. The same file
    /// as [`DfxPlugin::bucket_path`]'s.
    pub partition_path: extern "C" fn(dir: RStr<'_>, stage: u64, map: u64) -> RString,

    /// Glob (relative to a shuffle directory) matching any stage output entry
    /// (`stage-*`).
    pub partition_glob: extern "C" fn() -> RStr<'static>,

    /// A snapshot of the plugin's counters.
    #[sabi(last_prefix_field)]
    pub counters: extern "C" fn() -> DfxCounters,

    /// Test hook: panics inside an exported constructor when the plugin was
    /// built with its `test-hooks` feature, and reports an error otherwise.
    /// Lets a host prove that a panic does not unwind across the boundary.
    pub panic_probe: extern "C" fn() -> FfiResult<u64>,

    /// What a stage root (`ShuffleWriterExec`) made by this plugin carries:
    /// its id, shuffle directory, maps, buckets and the stages it reads.
    /// Errors for any other node. Lets a driver schedule stages and a worker
    /// check a decoded stage against its envelope, which the FFI wrapper's
    /// display cannot tell them.
    #[sabi(unsafe_opaque_field)]
    pub stage_info: extern "C" fn(plan: FFI_ExecutionPlan) -> FfiResult<DfxStageInfo>,

    /// The same description as [`DfxPlugin::stage_info`], read from an
    /// *encoded* stage (the bytes a driver ships) without decoding the plan.
    /// Lets hosts that cannot hand a foreign node back across FFI (Python)
    /// schedule stages, and lets a worker refuse a stage aimed at another
    /// directory before building anything from it.
    pub encoded_stage_info: extern "C" fn(plan_bytes: RSlice<'_, u8>) -> FfiResult<DfxStageInfo>,

    /// The file holding bucket `bucket` of map `map` of `stage` under `dir`:
    /// the map's file, as [`DfxPlugin::partition_path`] (`bucket` changes
    /// nothing: the map's commit marker indexes the file by bucket).
    pub bucket_path: extern "C" fn(dir: RStr<'_>, stage: u64, map: u64, bucket: u64) -> RString,

    /// Name of the consumer node (`ShuffleReaderExec`), for hosts that mark
    /// reads in a plan's display.
    pub reader_node_name: RStr<'static>,

    /// Refuse an *encoded* stage a worker must not run: one holding a sink,
    /// a file scan outside the tables of `allowed_json`
    /// (`{"tables": [...], "shuffle_dir": "..."}`), a writer aimed at another
    /// shuffle location, or an extension node that is not dfx's. Called by
    /// a worker before it decodes anything; every finding is in the error.
    pub vet_stage:
        extern "C" fn(plan_bytes: RSlice<'_, u8>, allowed_json: RStr<'_>) -> FfiResult<()>,

    /// A driver's check of its shuffle location, before anything runs:
    /// refuses one that holds stage output (`stage-*`); probes an S3 location
    /// (unreachable endpoint, missing bucket, refused credentials) and
    /// creates its lock object. `options_json` holds the spec's store
    /// options (`{"s3_endpoint": ..., "s3_region": ..., "s3_allow_http": ...}`).
    pub probe_location: extern "C" fn(location: RStr<'_>, options_json: RStr<'_>) -> FfiResult<()>,

    /// The failure classes ([`crate::FailureClass`]) the plugin recorded for
    /// the shuffle `location` since they were last taken, as a JSON array
    /// (`["io", {"lost": [2, 3]}]`), oldest first; they are forgotten once
    /// taken. The plugin records a class where it makes the error, keyed by
    /// the location the failing node writes to or reads from, compared as
    /// the plugin compares locations (a trailing `/` and `file://` do not
    /// count). A caught panic answers its message instead, which is not
    /// JSON: a host reports it as an error (see
    /// [`crate::Plugin::take_failures`]).
    pub take_failures: extern "C" fn(location: RStr<'_>) -> RString,

    /// The DataFusion settings every session running this plugin's stages
    /// must carry, as a JSON object of DataFusion keys to values
    /// (`{"datafusion.execution.enable_file_stream_work_stealing": "false"}`).
    /// They act when a stage executes, in a session the host builds (the
    /// planner shapes plans under settings of its own), so a host sets each
    /// on every session it builds, the driver's and each worker's. A caught
    /// panic answers its message instead, which is not JSON (see
    /// [`crate::Plugin::session_settings`]).
    pub session_settings: extern "C" fn() -> RString,

    /// Id of the plugin's logical extension codec (`dfx_engine.logical.v1`),
    /// under which a host installs [`DfxPlugin::new_logical_codec`]'s codec.
    pub logical_codec_id: RStr<'static>,

    /// The logical extension codec that carries a table the plan format
    /// cannot (an in-memory table, a table function's rows) into the
    /// plugin's planner by value, bound to a task-context provider of the
    /// host's session (whose `dfx_engine.memory_table_limit` bounds it). A
    /// host installs it on its session's logical codec chain.
    #[sabi(unsafe_opaque_field)]
    pub new_logical_codec: extern "C" fn(
        task_ctx_provider: FFI_TaskContextProvider,
    ) -> FfiResult<FFI_LogicalExtensionCodec>,

    /// Cut an *encoded* stage for its maps, so each task carries only the
    /// file groups its map reads: the stage's shared part (each scan a map
    /// reads holds no file) and, per map, that map's files. A driver calls
    /// it once per stage, in time linear in the stage's files. No map's
    /// files (an empty `maps`) means the shared part is the whole plan
    /// every map runs.
    pub cut_stage: extern "C" fn(plan_bytes: RSlice<'_, u8>) -> FfiResult<DfxCutStage>,

    /// The encoded stage map `map` runs: the shared part of
    /// [`DfxPlugin::cut_stage`] with map `map`'s files put back in. Errors
    /// for files of another map or of another stage's cut.
    pub stage_for_map: extern "C" fn(
        shared: RSlice<'_, u8>,
        map_files: RSlice<'_, u8>,
        map: u64,
    ) -> FfiResult<RVec<u8>>,

    /// How a ready stage runs, decided from what the stages it reads
    /// published (a driver calls it once every one of them is published,
    /// before any of its tasks starts). `plan_bytes` is the encoded stage
    /// (a stage file's shared part); `request_json` is
    /// `{"settings": {<dfx_engine key>: <value>, ...}, "slots": <tasks at once>}`.
    /// Answers JSON: `{"groups": [[first, last], ...] | null, "settings":
    /// {...}, "reason": "..." | null}`: the partitions each task runs (one
    /// task per group, as its first partition; `null`: as planned), the
    /// `dfx_engine` settings every task of the stage must carry, and what
    /// was decided and why.
    pub adapt_stage:
        extern "C" fn(plan_bytes: RSlice<'_, u8>, request_json: RStr<'_>) -> FfiResult<RString>,

    /// The encoded stage `plan_bytes` (as a worker runs it) with its
    /// writer's input sealed: one node that the plugin's codec decodes into
    /// the whole input, so every operator of the stage is the plugin's and
    /// runs under the session's `dfx_engine.memory_limit`. For a worker
    /// that cannot give the stage's operators a memory pool itself (a host
    /// whose nodes lose it crossing into the plugin and back). Call it after
    /// the checks: the plan it answers is checked as a whole stage is.
    pub seal_stage_input: extern "C" fn(plan_bytes: RSlice<'_, u8>) -> FfiResult<RVec<u8>>,
    /// The stages of an *encoded* plan (the plan the planner handed back,
    /// encoded by the host's session), in pre-order: each reader carries
    /// the stage it reads as a blob, so stages do not nest as messages and
    /// are cut out here, each rooted at its writer with its own readers'
    /// stages taken out. What a driver ships and describes.
    pub plan_stages: extern "C" fn(plan_bytes: RSlice<'_, u8>) -> FfiResult<RVec<RVec<u8>>>,
    /// Whether each map of the encoded stage `plan_bytes` runs a slice of
    /// several of its input's partitions, read from its writer without
    /// decoding the plan. Such a map runs its partitions at once on the
    /// plugin's runtime, where only the plugin's own operators may run, so
    /// a worker decodes the stage with its input sealed
    /// ([`DfxPlugin::seal_stage_input`]).
    pub stage_runs_slices: extern "C" fn(plan_bytes: RSlice<'_, u8>) -> FfiResult<bool>,
}

/// What [`DfxPlugin::cut_stage`] answers: an encoded stage cut for its maps.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct DfxCutStage {
    /// The stage with the file groups of the scans its maps read taken out.
    pub shared: RVec<u8>,
    /// Each map's files, map 0 first; empty when the shared part is whole.
    pub maps: RVec<RVec<u8>>,
}

/// What [`DfxPlugin::stage_info`] and [`DfxPlugin::encoded_stage_info`]
/// report about a stage: everything a driver needs to schedule it.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct DfxStageInfo {
    /// The stage id the planner gave the writer (`FIRST_STAGE_ID + n` for the
    /// n-th writer in pre-order).
    pub stage_id: u64,
    /// The shuffle directory the stage publishes into.
    pub shuffle_dir: RString,
    /// Map tasks: one per slice of the writer's input partitions.
    pub maps: u64,
    /// Buckets each map splits its rows into (1 for pass-through and
    /// broadcast exchanges).
    pub buckets: u64,
    /// Input partitions each map runs: map `m` runs partitions
    /// `m * partitions_per_map ..` (the last map may run fewer).
    pub partitions_per_map: u64,
    /// Ids of the stages this one reads (the writers met first below it on
    /// each path), ascending. A stage runs once all of them are published.
    pub deps: RVec<u64>,
    /// The deps this stage reads partition by partition: its input's
    /// partition `p` reads bucket `p` of every map of them and nothing else,
    /// so map `m` reads only the buckets of its own slice. Ascending; a dep
    /// read any other way (whole, merged, through a union) is not listed.
    pub aligned_deps: RVec<u64>,
    /// How rows are split into buckets, for display (`hash([k@0], 4)`,
    /// `single`).
    pub partitioning: RString,
}

impl RootModule for DfxPluginRef {
    declare_root_module_statics! {DfxPluginRef}
    const BASE_NAME: &'static str = "dfx_plugin";
    const NAME: &'static str = "dfx_plugin";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}
