//! A minimal host session wired to the plugin file, as any host would build
//! it from the plugin's FFI structs:
//!
//! ```text
//! SessionContext
//!   query planner  = ForeignQueryPlanner(plugin.query_planner(logical, physical))
//!   physical chain = [DefaultPhysicalExtensionCodec, foreign plugin codec]
//!   config         = plugin.config_options() (+ dfx_engine.shuffle_dir, dfx_engine.split)
//!   functions      = plugin.scalar_udfs() + plugin.aggregate_udfs()
//! ```

use std::path::Path;
use std::sync::{Arc, OnceLock, Weak};

use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{SessionStateBuilder, TaskContext, TaskContextProvider};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_ffi::execution::FFI_TaskContextProvider;
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use datafusion_ffi::proto::physical_extension_codec::FFI_PhysicalExtensionCodec;
use datafusion_proto::bytes::{
    physical_plan_from_bytes_with_extension_codec, physical_plan_to_bytes_with_extension_codec,
};
use datafusion_proto::logical_plan::DefaultLogicalExtensionCodec;
use datafusion_proto::physical_plan::{
    ComposedPhysicalExtensionCodec, DefaultPhysicalExtensionCodec, PhysicalExtensionCodec,
};
use dfx_abi::Plugin;

/// Partitions of every test session: pinned, never the core count, so plans
/// and file counts are the same on every machine.
pub const TARGET_PARTITIONS: usize = 2;

/// A task-context provider bound to its session after the session exists.
///
/// A query planned as a host plans it ([`TestSession::planned`]).
#[derive(Debug)]
pub struct Planned {
    /// The plan as one tree: each reader over its stage's writer.
    pub plan: Arc<dyn ExecutionPlan>,
    /// The plan as the planner handed it back: each reader carrying its
    /// stage, none with a child.
    pub handed: Arc<dyn ExecutionPlan>,
    /// Its stages as this session encodes them, in pre-order.
    pub stages: Vec<Vec<u8>>,
}

/// The planner and codecs must be built before the `SessionContext` they
/// serve, yet call back into it; `FFI_TaskContextProvider` keeps only a weak
/// reference, so this object must live as long as the session (it does: the
/// [`TestSession`] owns it).
#[derive(Debug, Default)]
struct LateTaskContext {
    session: OnceLock<Weak<SessionContext>>,
}

impl TaskContextProvider for LateTaskContext {
    fn task_ctx(&self) -> Arc<TaskContext> {
        match self.session.get().and_then(Weak::upgrade) {
            Some(ctx) => ctx.task_ctx(),
            // Only reached if a plugin object outlives its session.
            None => Arc::new(TaskContext::default()),
        }
    }
}

/// The split modes of `dfx_engine.split`.
pub const SPLIT_EXCHANGE: &str = "exchange";
/// The aggregate split: every topmost partial aggregate is a stage.
pub const SPLIT_AGGREGATE: &str = "aggregate";

/// What a test session is built from.
#[derive(Debug, Clone, Default)]
pub struct SessionOptions {
    /// `dfx_engine.shuffle_dir`; `None` leaves the plugin's default.
    pub shuffle_dir: Option<String>,
    /// `dfx_engine.split` ([`SPLIT_EXCHANGE`], [`SPLIT_AGGREGATE`]); `None`
    /// leaves the plugin's default.
    pub split: Option<String>,
    /// Parquet tables: (name, directory).
    pub tables: Vec<(String, String)>,
}

impl SessionOptions {
    /// Options with this shuffle directory and no tables.
    pub fn distributed(shuffle_dir: &Path) -> Self {
        Self {
            shuffle_dir: Some(shuffle_dir.to_string_lossy().into_owned()),
            ..Self::default()
        }
    }

    /// Set `dfx_engine.split`.
    pub fn with_split(mut self, split: &str) -> Self {
        self.split = Some(split.to_string());
        self
    }

    /// Add a Parquet table.
    pub fn with_table(mut self, name: &str, dir: &Path) -> Self {
        self.tables
            .push((name.to_string(), dir.to_string_lossy().into_owned()));
        self
    }
}

/// A host session on the plugin, with the codec chain it encodes stages with.
pub struct TestSession {
    /// The plugin the session was built on.
    pub plugin: Plugin,
    /// The session.
    pub ctx: Arc<SessionContext>,
    /// Host default codec followed by the plugin's foreign codec.
    pub chain: Arc<dyn PhysicalExtensionCodec>,
    /// The plugin's codec alone (foreign), for feeding it payloads directly.
    pub plugin_codec: Arc<dyn PhysicalExtensionCodec>,
    // Kept alive for the FFI structs' weak references; dropped last.
    _provider: Arc<dyn TaskContextProvider>,
}

impl std::fmt::Debug for TestSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestSession").finish_non_exhaustive()
    }
}

impl TestSession {
    /// Build a session on `plugin`. Must run inside a multi-threaded tokio
    /// runtime: the FFI wrappers get its handle to drive plugin-side streams.
    ///
    /// # Errors
    ///
    /// Any refusal of the plugin's constructors, of the config key, or of a
    /// table registration.
    pub async fn new(plugin: &Plugin, options: &SessionOptions) -> Result<Self> {
        let late = Arc::new(LateTaskContext::default());
        let provider: Arc<dyn TaskContextProvider> = late.clone();
        let ffi_provider = FFI_TaskContextProvider::from(&provider);
        let runtime = tokio::runtime::Handle::try_current().ok();

        let plugin_codec_ffi = plugin.physical_codec(ffi_provider.clone())?;
        let plugin_codec: Arc<dyn PhysicalExtensionCodec> = (&plugin_codec_ffi).into();
        let chain: Arc<dyn PhysicalExtensionCodec> =
            Arc::new(ComposedPhysicalExtensionCodec::new(vec![
                Arc::new(DefaultPhysicalExtensionCodec {}),
                Arc::clone(&plugin_codec),
            ]));
        let logical = FFI_LogicalExtensionCodec::new(
            Arc::new(DefaultLogicalExtensionCodec {}),
            runtime.clone(),
            ffi_provider.clone(),
        );
        let physical = FFI_PhysicalExtensionCodec::new(Arc::clone(&chain), runtime, ffi_provider);
        let planner_ffi = plugin.query_planner(logical, physical)?;
        let planner: Arc<dyn datafusion::execution::context::QueryPlanner + Send + Sync> =
            (&planner_ffi).into();

        let mut config = SessionConfig::new().with_target_partitions(TARGET_PARTITIONS);
        config
            .options_mut()
            .extensions
            .insert(plugin.config_options()?);
        if let Some(dir) = &options.shuffle_dir {
            config
                .options_mut()
                .set(&format!("{}.shuffle_dir", plugin.config_prefix()), dir)?;
        }
        if let Some(split) = &options.split {
            config
                .options_mut()
                .set(&format!("{}.split", plugin.config_prefix()), split)?;
        }
        let state = SessionStateBuilder::new()
            .with_config(config)
            .with_default_features()
            .with_query_planner(planner)
            .build();
        let ctx = Arc::new(SessionContext::new_with_state(state));
        late.session
            .set(Arc::downgrade(&ctx))
            .map_err(|_| DataFusionError::Internal("session bound twice".into()))?;
        for udf in plugin.scalar_udfs()? {
            ctx.register_udf(udf);
        }
        for udaf in plugin.aggregate_udfs()? {
            ctx.register_udaf(udaf);
        }
        for (name, dir) in &options.tables {
            ctx.register_parquet(name.as_str(), dir.as_str(), Default::default())
                .await?;
        }
        Ok(Self {
            plugin: plugin.clone(),
            ctx,
            chain,
            plugin_codec,
            _provider: provider,
        })
    }

    /// Plan `sql` into a physical plan (through the plugin's planner), as
    /// one tree: each reader over the writer of the stage it reads (see
    /// [`Self::planned`]).
    ///
    /// # Errors
    ///
    /// SQL, planning or plugin errors.
    pub async fn plan(&self, sql: &str) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self.planned(sql).await?.plan)
    }

    /// `sql` planned as a host plans it: the planner hands each reader
    /// back carrying its stage; the plan is encoded, cut into its stages by
    /// the plugin, and each stage decoded and given back to its reader.
    ///
    /// # Errors
    ///
    /// SQL, planning, plugin, encoding or decoding errors.
    pub async fn planned(&self, sql: &str) -> Result<Planned> {
        let handed = self.ctx.sql(sql).await?.create_physical_plan().await?;
        let Some(reader) = self.plugin.reader_node_name() else {
            return Ok(Planned {
                plan: Arc::clone(&handed),
                handed,
                stages: Vec::new(),
            });
        };
        if dfx_abi::stages::find_stages(&handed, reader).is_empty() {
            return Ok(Planned {
                plan: Arc::clone(&handed),
                handed,
                stages: Vec::new(),
            });
        }
        let stages = self
            .plugin
            .plan_stages(&self.encode(Arc::clone(&handed))?)?;
        let writers = stages
            .iter()
            .map(|stage| self.decode(stage))
            .collect::<Result<Vec<_>>>()?;
        let plan = dfx_abi::stages::attach_stages(&handed, reader, &writers)?;
        Ok(Planned {
            plan,
            handed,
            stages,
        })
    }

    /// Run `sql` to completion the way a driver does, in this process: plan
    /// once, run every map of every stage wave by wave, then execute the root
    /// of the same plan (its readers only read). Format the result as a table.
    ///
    /// # Errors
    ///
    /// SQL, planning, plugin or execution errors, message intact.
    pub async fn run_sql(&self, sql: &str) -> Result<String> {
        let plan = self.plan(sql).await?;
        crate::plans::run_query(&self.plugin, &plan, self.ctx.task_ctx()).await
    }

    /// Encode `plan` through this session's chain.
    ///
    /// # Errors
    ///
    /// When a node has no codec in the chain.
    pub fn encode(&self, plan: Arc<dyn ExecutionPlan>) -> Result<Vec<u8>> {
        Ok(physical_plan_to_bytes_with_extension_codec(plan, self.chain.as_ref())?.to_vec())
    }

    /// Decode `bytes` through this session's chain.
    ///
    /// # Errors
    ///
    /// Malformed bytes, unknown nodes, or the plugin codec's refusal.
    pub fn decode(&self, bytes: &[u8]) -> Result<Arc<dyn ExecutionPlan>> {
        physical_plan_from_bytes_with_extension_codec(
            bytes,
            &self.ctx.task_ctx(),
            self.chain.as_ref(),
        )
    }
}
