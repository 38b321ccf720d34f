//! The one session factory, used by the driver and by every worker.
//!
//! A [`SessionSpec`] is everything a session depends on, small enough to
//! travel as JSON inside a task envelope. [`build_session`] turns it into a
//! [`DfxSession`]: a `SessionContext` carrying the plugin's planner, codec,
//! config extension and functions. Driver and worker call the same function
//! with the same spec, so a plan one encodes the other can decode.

pub mod codec_chain;
mod late_context;
mod options;
pub mod query_planner;
mod tables;

pub use options::{default_partitions_per_task, effective_target_partitions, parse_engine_option};

use late_context::{LEAN_DECODE, LateTaskContext};

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use datafusion::execution::context::QueryPlanner;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::execution::{TaskContext, TaskContextProvider};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_ffi::execution::FFI_TaskContextProvider;
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use datafusion_ffi::proto::physical_extension_codec::FFI_PhysicalExtensionCodec;
use datafusion_ffi::query_planner::ForeignQueryPlanner;
use datafusion_proto::bytes::{
    physical_plan_from_bytes_with_extension_codec, physical_plan_to_bytes_with_extension_codec,
};
use datafusion_proto::logical_plan::DefaultLogicalExtensionCodec;
use datafusion_proto::physical_plan::PhysicalExtensionCodec;
use dfx_abi::Plugin;
use dfx_abi::stages::{attach_stages, find_stages};
use dfx_runtime::QueryRun;
use dfx_runtime::root::{DrivingQueryPlanner, QueryDriver};

use crate::error::{DataFusionContext, HostError, Result};
use crate::session::codec_chain::CodecChain;
use crate::session::query_planner::PluginQueryPlanner;
use crate::session::tables::register_table;

pub use dfx_runtime::spec::{
    DEFAULT_TARGET_PARTITIONS, SessionSpec, ShuffleCompression, Split, TableDefinition, TableFormat,
};

/// A query planned by [`DfxSession::plan`].
#[derive(Debug)]
pub struct Planned {
    /// The plan as one tree: each reader over its stage's writer.
    pub plan: Arc<dyn ExecutionPlan>,
    /// Its stages, encoded by the session, in pre-order: what a driver
    /// describes, cuts and ships.
    pub stages: Vec<Vec<u8>>,
}

/// A session built by [`build_session`], with the codec chain it encodes and
/// decodes stages with.
pub struct DfxSession {
    ctx: Arc<SessionContext>,
    chain: Arc<CodecChain>,
    spec: SessionSpec,
    plugin: Plugin,
    // The FFI codecs hold only a weak reference to this provider; it must
    // live as long as the session or every decode on the plugin side fails
    // with "task context provider dropped".
    _provider: Arc<dyn TaskContextProvider>,
    /// Encoded stages already vetted in this session (see [`Self::vet_once`]).
    vetted: Mutex<HashSet<Vec<u8>>>,
    /// The stage decoded last, kept for the next map of it (see
    /// [`Self::decode_stage_for_map`]).
    kept_stage: Mutex<Option<KeptStage>>,
    /// What runs the session's queries when their plans execute, for a
    /// session that drives them ([`build_driving_session`]).
    driver: Option<Arc<QueryDriver>>,
}

/// A decoded stage a serving worker keeps for its next map.
struct KeptStage {
    /// The encoded stage it was decoded from: the whole bytes are the key,
    /// with `written`.
    bytes: Vec<u8>,
    /// When the driver wrote the plan file: a later query reusing the same
    /// shuffle directory writes the same bytes to the same path, but its
    /// upstream stages published anew, and what the kept plan built from
    /// their output (a broadcast build side) belongs to the earlier query.
    written: SystemTime,
    plan: Arc<dyn ExecutionPlan>,
    /// The maps already run from `plan`.
    maps_run: BTreeSet<usize>,
}

/// Vetted stages a session remembers: enough for every stage of a query.
const VETTED_STAGES: usize = 256;

impl std::fmt::Debug for DfxSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DfxSession")
            .field("spec", &self.spec)
            .field("codec_ids", &self.codec_ids())
            .finish()
    }
}

impl DfxSession {
    /// The DataFusion session.
    pub fn ctx(&self) -> &SessionContext {
        &self.ctx
    }

    /// The spec the session was built from.
    pub fn spec(&self) -> &SessionSpec {
        &self.spec
    }

    /// The context a worker executes a decoded stage with: the session's
    /// config and runtime, without its function registry.
    ///
    /// Every time a plan node crosses the FFI boundary to execute (the
    /// plugin's writer, each of its readers, the writer's input back in the
    /// host), datafusion-ffi rebuilds the context on the far side, every
    /// function of the session included: hundreds of built-in functions
    /// wrapped and unwrapped per crossing, a twelfth of a distributed q9's
    /// CPU at scale 1 (profiled). Executing a decoded stage never looks a
    /// function up: its expressions hold their functions since decode, and
    /// the nodes that list functions at run time (information_schema's
    /// tables) have no protobuf encoding, so they never reach a worker.
    pub fn stage_task_ctx(&self) -> Arc<TaskContext> {
        // Built from the session's parts: `task_ctx()` would copy every
        // function map only for this to drop them, once per task.
        Arc::new(TaskContext::new(
            None,
            self.ctx.session_id(),
            self.ctx.copied_config(),
            Default::default(),
            Default::default(),
            Default::default(),
            Default::default(),
            self.ctx.runtime_env(),
        ))
    }

    /// What the scheduler did for the session's last distributed query
    /// whose answer was read (a driving session's only).
    pub fn last_run(&self) -> Option<Arc<QueryRun>> {
        self.driver.as_ref().and_then(|driver| driver.last_run())
    }

    /// The plugin the session was built with.
    pub fn plugin(&self) -> &Plugin {
        &self.plugin
    }

    /// The session's physical codec chain.
    pub fn codec(&self) -> Arc<CodecChain> {
        Arc::clone(&self.chain)
    }

    /// The physical codec ids the session carries, in install order.
    pub fn codec_ids(&self) -> Vec<String> {
        self.chain.ids()
    }

    /// Plan `sql` into a physical plan.
    ///
    /// # Errors
    ///
    /// Whatever parsing, logical or physical planning reports.
    pub async fn physical_plan(&self, sql: &str) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self.plan(sql).await?.plan)
    }

    /// `sql` planned: the plan as one tree (each reader over the writer of
    /// the stage it reads) and its stages as this session encodes them, in
    /// pre-order.
    ///
    /// The planner hands its plan back with each reader carrying its stage
    /// as a blob; the plan is encoded, cut into its stages by the plugin,
    /// and each stage decoded and given back to its reader.
    ///
    /// # Errors
    ///
    /// Whatever parsing, planning, encoding, the cut or decoding reports.
    pub async fn plan(&self, sql: &str) -> Result<Planned> {
        let frame = self
            .ctx
            .sql(sql)
            .await
            .context(|| format!("cannot plan {sql:?}"))?;
        let plan = frame
            .create_physical_plan()
            .await
            .context(|| format!("cannot create the physical plan of {sql:?}"))?;
        let Some(reader) = self.plugin.reader_node_name() else {
            return Ok(Planned {
                plan,
                stages: Vec::new(),
            });
        };
        if find_stages(&plan, reader).is_empty() {
            return Ok(Planned {
                plan,
                stages: Vec::new(),
            });
        }
        let bytes = self.encode(Arc::clone(&plan))?;
        let stages = self
            .plugin
            .plan_stages(&bytes)
            .context(|| format!("cannot cut the plan of {sql:?} into its stages"))?;
        let writers = stages
            .iter()
            .enumerate()
            .map(|(index, stage)| {
                self.decode(stage).map_err(|err| {
                    HostError::Invalid(format!("stage {}: {err}", self.plugin.stage_id(index)))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let plan = attach_stages(&plan, reader, &writers)
            .context(|| format!("cannot put the plan of {sql:?} together"))?;
        Ok(Planned { plan, stages })
    }

    /// Encode `plan` with this session's codecs: a driver encodes each
    /// stage with them, since without them only DataFusion's own nodes
    /// survive.
    ///
    /// # Errors
    ///
    /// A node no codec of the session claims.
    pub fn encode(&self, plan: Arc<dyn ExecutionPlan>) -> Result<Vec<u8>> {
        let name = plan.name().to_string();
        physical_plan_to_bytes_with_extension_codec(plan, self.chain.as_ref())
            .map(|bytes| bytes.to_vec())
            .context(|| format!("cannot encode the plan rooted at {name}"))
    }

    /// Whether this session vetted the encoded stage `bytes` already. The
    /// bytes themselves are the key, compared whole: no hash collision can
    /// pass a stage that was never vetted.
    pub fn is_vetted(&self, bytes: &[u8]) -> bool {
        self.vetted.lock().is_ok_and(|v| v.contains(bytes))
    }

    /// Remember that the encoded stage `bytes` passed the vet in this
    /// session (its verdict depends only on the bytes and the spec).
    pub fn mark_vetted(&self, bytes: &[u8]) {
        if let Ok(mut vetted) = self.vetted.lock() {
            if vetted.len() >= VETTED_STAGES {
                vetted.clear();
            }
            vetted.insert(bytes.to_vec());
        }
    }

    /// The stage encoded as `bytes`, read from a plan file the driver wrote
    /// at `written`, to run its map `map`: the plan decoded for the previous
    /// task when that was the same stage from the same plan file and this
    /// map has not run from it yet, otherwise a new decode, kept in its
    /// place (never kept without `written`).
    ///
    /// A serving worker runs map after map of a stage from the same bytes,
    /// and a DataFusion plan is made to run each of its partitions from one
    /// instance. Running them from one instance, as one process would, saves
    /// the decode and builds once
    /// what the plan shares between partitions: the collected build side of
    /// a broadcast join is read and hashed once per worker, not once per map.
    /// A map already run from the plan gets a fresh decode, so no operator is
    /// ever asked to run one partition twice. Only one stage is kept: at most
    /// one stage's shared state outlives its task. After a failed task the
    /// worker calls [`Self::forget_stage`], so nothing a failure left behind
    /// serves a retry.
    ///
    /// # Errors
    ///
    /// What [`Self::decode`] reports.
    pub fn decode_stage_for_map(
        &self,
        bytes: &[u8],
        written: Option<SystemTime>,
        map: usize,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let Some(written) = written else {
            // No way to tell this query's plan file from an earlier one's.
            self.forget_stage();
            return self.decode(bytes);
        };
        if let Ok(mut kept) = self.kept_stage.lock()
            && let Some(stage) = kept
                .as_mut()
                .filter(|stage| stage.written == written && stage.bytes == bytes)
            && stage.maps_run.insert(map)
        {
            return Ok(Arc::clone(&stage.plan));
        }
        let plan = self.decode(bytes)?;
        if let Ok(mut kept) = self.kept_stage.lock() {
            *kept = Some(KeptStage {
                bytes: bytes.to_vec(),
                written,
                plan: Arc::clone(&plan),
                maps_run: BTreeSet::from([map]),
            });
        }
        Ok(plan)
    }

    /// Let go of the stage [`Self::decode_stage_for_map`] kept.
    pub fn forget_stage(&self) {
        if let Ok(mut kept) = self.kept_stage.lock() {
            kept.take();
        }
    }

    /// Decode a plan encoded by a session with the same codec ids.
    ///
    /// # Errors
    ///
    /// Bytes that are not a plan, or a node no codec of the session claims.
    pub fn decode(&self, bytes: &[u8]) -> Result<Arc<dyn ExecutionPlan>> {
        let decode = || {
            physical_plan_from_bytes_with_extension_codec(
                bytes,
                &self.ctx.task_ctx(),
                self.chain.as_ref(),
            )
        };
        // First with the plugin handed a lean context (see `LateTaskContext`);
        // a plan whose dfx nodes need the session's functions (a writer
        // hashing on a UDF) fails that way, and is decoded again with all.
        let lean = LEAN_DECODE.with(|flag| {
            flag.set(true);
            let decoded = decode();
            flag.set(false);
            decoded
        });
        lean.or_else(|_| decode())
            .context(|| format!("cannot decode a plan of {} bytes", bytes.len()))
    }
}

/// Build the session `spec` describes, with `plugin`'s planner, codec, config
/// extension and functions, and every table registered.
///
/// Used by the driver and by every worker (a worker's without its tables,
/// [`build_worker_session`]), so both decode and encode with the same chain.
/// When `spec.codec_ids` is not empty, the session's codec ids must equal it.
///
/// # Errors
///
/// A plugin constructor that fails, a table directory that cannot be listed
/// or registered, or codec ids that differ from the spec's.
pub async fn build_session(plugin: &Plugin, spec: &SessionSpec) -> Result<DfxSession> {
    build(plugin, spec, Tables::Register, None).await
}

/// How a driving session's driver is made from its codec chain (the
/// encoder of its stages).
pub type MakeDriver<'a> = Box<dyn FnOnce(Arc<CodecChain>) -> QueryDriver + Send + 'a>;

/// [`build_session`] for a session whose queries run distributed when
/// their plans execute (`ctx().sql(q).await?.collect().await`): its
/// planner claims each query's location, plans in it and puts a
/// [`DistributedRootExec`](dfx_runtime::root::DistributedRootExec) on the
/// plan, run by the driver `make_driver` builds.
///
/// # Errors
///
/// As [`build_session`].
pub async fn build_driving_session(
    plugin: &Plugin,
    spec: &SessionSpec,
    make_driver: MakeDriver<'_>,
) -> Result<DfxSession> {
    build(plugin, spec, Tables::Register, Some(make_driver)).await
}

/// [`build_session`] for a worker: the same session, config and codecs, but
/// the spec's tables are not registered.
///
/// An encoded stage carries its scans whole (files, schema, statistics), so
/// decoding and running it never looks a table up, while registering one
/// lists its directory and reads every file's footer: for TPC-H's eight
/// tables on eight files, about as much CPU as the rest of a small task.
/// The tables still bound what a stage may read (the vet reads them from the
/// spec), and still set the session's partitions.
///
/// # Errors
///
/// As [`build_session`], but for registering a table.
pub async fn build_worker_session(plugin: &Plugin, spec: &SessionSpec) -> Result<DfxSession> {
    build(plugin, spec, Tables::Skip, None).await
}

/// Whether a session registers its spec's tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tables {
    /// In its catalog, for SQL (a driver, a local run).
    Register,
    /// Not at all: it only decodes and runs stages (a worker).
    Skip,
}

async fn build(
    plugin: &Plugin,
    spec: &SessionSpec,
    tables: Tables,
    make_driver: Option<MakeDriver<'_>>,
) -> Result<DfxSession> {
    // A spec made in code was never read from JSON: checked here as one read
    // would be (its tables' definitions among the rest).
    spec.validate()?;
    let plugin_what = |what: &str| format!("dfx plugin {}: {what}", plugin.path().display());
    let late = Arc::new(LateTaskContext::default());
    let provider: Arc<dyn TaskContextProvider> = late.clone();
    let runtime = tokio::runtime::Handle::try_current().ok();

    let plugin_codec = plugin
        .physical_codec(FFI_TaskContextProvider::from(&provider))
        .context(|| plugin_what("cannot build its physical codec"))?;
    let plugin_codec: Arc<dyn PhysicalExtensionCodec> = (&plugin_codec).into();
    let chain = CodecChain::default()
        .with_codec(plugin.codec_id(), plugin_codec)
        .context(|| plugin_what("cannot install its physical codec"))?;
    let chain = Arc::new(chain);
    if !spec.codec_ids.is_empty() && chain.ids() != spec.codec_ids {
        return Err(HostError::Invalid(format!(
            "codec ids differ: the spec expects {:?} but a session built with the plugin {} carries {:?}; \
             the plan was written by a differently built host and would be misread",
            spec.codec_ids,
            plugin.path().display(),
            chain.ids()
        )));
    }

    // The plugin's logical codec carries what the plan format cannot (an
    // in-memory table, a table function's rows) into its planner by value;
    // a plugin built before it gets DataFusion's, and such scans are refused
    // by name (see `query_planner`).
    let carries_tables = plugin.logical_codec_id().is_some();
    let logical = if carries_tables {
        plugin
            .logical_codec(FFI_TaskContextProvider::from(&provider))
            .context(|| plugin_what("cannot build its logical codec"))?
    } else {
        FFI_LogicalExtensionCodec::new(
            Arc::new(DefaultLogicalExtensionCodec {}),
            runtime.clone(),
            FFI_TaskContextProvider::from(&provider),
        )
    };
    let physical = FFI_PhysicalExtensionCodec::new(
        Arc::clone(&chain) as Arc<dyn PhysicalExtensionCodec>,
        runtime,
        FFI_TaskContextProvider::from(&provider),
    );
    let planner = plugin
        .query_planner(logical, physical)
        .context(|| plugin_what("cannot build its query planner"))?;

    // A worker runs stages whose partitions are already fixed: only a
    // session that plans lists its tables for the partition floor.
    let partitions = match tables {
        Tables::Register => effective_target_partitions(spec).await?,
        Tables::Skip => spec.target_partitions,
    };
    let mut config = SessionConfig::new().with_target_partitions(partitions);
    // The settings that act when a stage executes (no file-stream work
    // stealing, one partition per file, the footer read) are the plugin's:
    // set as it states them, on the driver's session and each worker's,
    // then the spec's own DataFusion settings.
    let stated = plugin.session_settings().map_err(HostError::Invalid)?;
    let settings = spec.datafusion_settings(stated)?;
    for (key, value) in &settings {
        let set = config.options_mut().set(key, value);
        if spec.datafusion_options.contains_key(key) {
            set.map_err(|e| {
                HostError::Invalid(format!(
                    "session spec datafusion_options sets {key} to {value:?}: {e}"
                ))
            })?;
        } else {
            set.context(|| plugin_what(&format!("states the setting {key}={value}, which")))?;
        }
    }
    // The optimizer settings a stage needs so that each of its partitions can
    // run alone (no join dynamic filter, no physical scalar subquery, which
    // joins may collect their build side) are the plugin planner's too: it
    // plans with a copy of this config and sets them itself.
    let options = plugin
        .config_options()
        .context(|| plugin_what("cannot build its config extension"))?;
    config.options_mut().extensions.insert(options);
    let key = format!("{}.shuffle_dir", plugin.config_prefix());
    let dir = spec
        .shuffle_dir
        .as_deref()
        .map(|d| d.to_string_lossy().into_owned())
        .unwrap_or_default();
    config
        .options_mut()
        .set(&key, &dir)
        .context(|| plugin_what(&format!("cannot set {key}")))?;
    // Only a distributing session is cut into stages, so only it says where.
    if spec.shuffle_dir.is_some() {
        let key = format!("{}.split", plugin.config_prefix());
        config
            .options_mut()
            .set(&key, spec.split.as_str())
            .context(|| plugin_what(&format!("cannot set {key}")))?;
    }
    // The rest the runtime says every session sets (compression, store and
    // engine options), exactly as the Python host sets them.
    for (name, value) in spec.plugin_settings() {
        let key = format!("{}.{name}", plugin.config_prefix());
        config
            .options_mut()
            .set(&key, &value)
            .context(|| plugin_what(&format!("cannot set {key} to {value:?}")))?;
    }

    let planner: Arc<dyn QueryPlanner + Send + Sync> = Arc::new(PluginQueryPlanner {
        planner: ForeignQueryPlanner(planner),
        carries_tables,
    });
    let driver = make_driver.map(|make| Arc::new(make(Arc::clone(&chain))));
    let planner = match &driver {
        Some(driver) => Arc::new(DrivingQueryPlanner::new(planner, Arc::clone(driver))),
        None => planner,
    };
    let state = SessionStateBuilder::new()
        .with_default_features()
        .with_config(config)
        .with_query_planner(planner)
        .build();
    let ctx = Arc::new(SessionContext::new_with_state(state));
    // Cannot fail: `late` was created above and bound nowhere else.
    let _ = late.session.set(Arc::downgrade(&ctx));

    for udf in plugin
        .scalar_udfs()
        .context(|| plugin_what("cannot load its scalar functions"))?
    {
        ctx.register_udf(udf);
    }
    for udaf in plugin
        .aggregate_udfs()
        .context(|| plugin_what("cannot load its aggregate functions"))?
    {
        ctx.register_udaf(udaf);
    }
    if tables == Tables::Register {
        for (name, table) in &spec.tables {
            register_table(&ctx, name, table, spec).await?;
        }
    }

    Ok(DfxSession {
        ctx,
        chain,
        spec: spec.clone(),
        plugin: plugin.clone(),
        _provider: provider,
        vetted: Mutex::default(),
        kept_stage: Mutex::default(),
        driver,
    })
}
