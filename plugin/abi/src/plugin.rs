//! [`Plugin`]: a plugin file that passed the handshake, and what a host
//! asks of it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use abi_stable::std_types::{RResult, RSlice, RStr, RVec};
use datafusion::common::{DataFusionError, Result};
use datafusion::logical_expr::{AggregateUDF, AggregateUDFImpl, ScalarUDF, ScalarUDFImpl};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_ffi::config::extension_options::FFI_ExtensionOptions;
use datafusion_ffi::execution::FFI_TaskContextProvider;
use datafusion_ffi::execution_plan::FFI_ExecutionPlan;
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use datafusion_ffi::proto::physical_extension_codec::FFI_PhysicalExtensionCodec;
use datafusion_ffi::query_planner::FFI_QueryPlanner;
use datafusion_ffi::udaf::FFI_AggregateUDF;
use datafusion_ffi::udf::FFI_ScalarUDF;

#[cfg(doc)]
use crate::compat::DFX_ABI_VERSION;
use crate::failure::FailureClass;
#[cfg(doc)]
use crate::module::DfxPlugin;
use crate::module::{DfxCounters, DfxPluginRef, DfxStageInfo, FfiResult};

/// A plugin file that passed the handshake.
///
/// Cheap to clone: the library stays loaded for the life of the process (an
/// unloaded library would leave dangling function pointers in every FFI
/// struct it handed out).
#[derive(Clone)]
pub struct Plugin {
    path: PathBuf,
    module: DfxPluginRef,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("path", &self.path)
            .field("name", &self.name())
            .field("version", &self.version())
            .finish()
    }
}

impl Plugin {
    /// A plugin whose handshake `load` has done.
    pub(crate) fn new(path: PathBuf, module: DfxPluginRef) -> Self {
        Self { path, module }
    }
}

impl Plugin {
    /// The file this plugin was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The root module, for hosts that need a field this wrapper does not cover.
    pub fn module(&self) -> DfxPluginRef {
        self.module
    }

    /// The plugin's package name.
    pub fn name(&self) -> &'static str {
        self.module.plugin_name().as_str()
    }

    /// The plugin's package version.
    pub fn version(&self) -> &'static str {
        self.module.plugin_version().as_str()
    }

    /// The dfx ABI version the plugin declares (equal to [`DFX_ABI_VERSION`]).
    pub fn abi_version(&self) -> u32 {
        self.module.dfx_abi_version()
    }

    /// The `datafusion-ffi` major the plugin was built with.
    pub fn datafusion_ffi_major(&self) -> u64 {
        self.module.datafusion_ffi_major()
    }

    /// The stage root's name (`ShuffleWriterExec`): hosts find stages by it.
    pub fn stage_node_name(&self) -> &'static str {
        self.module.stage_node_name().as_str()
    }

    /// The id of the plugin's physical codec (`dfx_engine.physical.v5`).
    pub fn codec_id(&self) -> &'static str {
        self.module.codec_id().as_str()
    }

    /// The prefix of the plugin's config extension (`dfx_engine`).
    pub fn config_prefix(&self) -> &'static str {
        self.module.config_prefix().as_str()
    }

    /// The id of the `index`-th stage in pre-order.
    pub fn stage_id(&self, index: usize) -> u64 {
        (self.module.stage_id())(index as u64)
    }

    /// The file of map task `map` of stage `stage_id` under `dir`
    /// (`stage-<S>/<K>-map-<M>.arrow`, `K` its key prefix): every bucket of the map, closed by its
    /// commit marker, so its presence says the map is published.
    pub fn map_path(&self, dir: &Path, stage_id: u64, map: usize) -> PathBuf {
        let dir = dir.to_string_lossy();
        let path = (self.module.partition_path())(RStr::from_str(&dir), stage_id, map as u64);
        PathBuf::from(path.into_string())
    }

    /// The map's file, as [`Plugin::map_path`]: the file whose presence says
    /// the map is published.
    pub fn marker_path(&self, dir: &Path, stage_id: u64, map: usize) -> PathBuf {
        self.map_path(dir, stage_id, map)
    }

    /// The file holding bucket `bucket` of map `map`: the map's file, as
    /// [`Plugin::map_path`] (every bucket of a map is in its one file).
    ///
    /// # Errors
    ///
    /// When the plugin predates the exchange's file layout.
    pub fn bucket_path(
        &self,
        dir: &Path,
        stage_id: u64,
        map: usize,
        bucket: usize,
    ) -> Result<PathBuf> {
        let Some(bucket_path) = self.module.bucket_path() else {
            return Err(DataFusionError::Execution(format!(
                "dfx plugin {} has no bucket_path (built before the exchange)",
                self.path.display()
            )));
        };
        let dir = dir.to_string_lossy();
        let path = bucket_path(RStr::from_str(&dir), stage_id, map as u64, bucket as u64);
        Ok(PathBuf::from(path.into_string()))
    }

    /// The consumer node's name (`ShuffleReaderExec`), when the plugin has one.
    pub fn reader_node_name(&self) -> Option<&'static str> {
        self.module.reader_node_name().map(|name| name.as_str())
    }

    /// Glob, relative to a shuffle directory, matching any stage output entry.
    pub fn partition_glob(&self) -> &'static str {
        (self.module.partition_glob())().as_str()
    }

    /// A snapshot of the plugin's counters.
    pub fn counters(&self) -> DfxCounters {
        (self.module.counters())()
    }

    /// The plugin's query planner on the host's codec chains.
    pub fn query_planner(
        &self,
        logical_codec: FFI_LogicalExtensionCodec,
        physical_codec: FFI_PhysicalExtensionCodec,
    ) -> Result<FFI_QueryPlanner> {
        self.result(
            "query planner",
            (self.module.new_query_planner())(logical_codec, physical_codec),
        )
    }

    /// The plugin's physical codec, bound to `task_ctx_provider`.
    pub fn physical_codec(
        &self,
        task_ctx_provider: FFI_TaskContextProvider,
    ) -> Result<FFI_PhysicalExtensionCodec> {
        self.result(
            "physical codec",
            (self.module.new_physical_codec())(task_ctx_provider),
        )
    }

    /// The plugin's config extension with its defaults.
    pub fn config_options(&self) -> Result<FFI_ExtensionOptions> {
        self.result("config options", (self.module.new_config_options())())
    }

    /// The plugin's scalar functions as FFI structs.
    pub fn ffi_scalar_udfs(&self) -> Result<Vec<FFI_ScalarUDF>> {
        self.result("scalar functions", (self.module.scalar_udfs())())
            .map(|v| v.into_vec())
    }

    /// The plugin's aggregate functions as FFI structs.
    pub fn ffi_aggregate_udfs(&self) -> Result<Vec<FFI_AggregateUDF>> {
        self.result("aggregate functions", (self.module.aggregate_udfs())())
            .map(|v| v.into_vec())
    }

    /// The plugin's scalar functions, ready to register on a session.
    pub fn scalar_udfs(&self) -> Result<Vec<ScalarUDF>> {
        Ok(self
            .ffi_scalar_udfs()?
            .iter()
            .map(|udf| ScalarUDF::new_from_shared_impl(Arc::<dyn ScalarUDFImpl>::from(udf)))
            .collect())
    }

    /// The plugin's aggregate functions, ready to register on a session.
    pub fn aggregate_udfs(&self) -> Result<Vec<AggregateUDF>> {
        Ok(self
            .ffi_aggregate_udfs()?
            .iter()
            .map(|udaf| AggregateUDF::new_from_shared_impl(Arc::<dyn AggregateUDFImpl>::from(udaf)))
            .collect())
    }

    /// Call the plugin's panic probe (see [`DfxPlugin::panic_probe`]).
    ///
    /// # Errors
    ///
    /// Always, when the plugin behaves: either the caught panic's message, or
    /// "built without test hooks". `Ok` means the plugin lacks the probe.
    pub fn panic_probe(&self) -> Result<u64> {
        match self.module.panic_probe() {
            Some(probe) => self.result("panic probe", probe()),
            None => Err(DataFusionError::Execution(format!(
                "dfx plugin {} has no panic probe",
                self.path.display()
            ))),
        }
    }

    /// What a stage root (`ShuffleWriterExec`) made by this plugin carries:
    /// id, shuffle directory, maps, buckets, the stages it reads; an error
    /// for any other node.
    pub fn stage_info(&self, plan: &Arc<dyn ExecutionPlan>) -> Result<DfxStageInfo> {
        let Some(stage_info) = self.module.stage_info() else {
            return Err(DataFusionError::Execution(format!(
                "dfx plugin {} cannot describe stage nodes (built before stage_info)",
                self.path.display()
            )));
        };
        let ffi_plan = FFI_ExecutionPlan::new(Arc::clone(plan), None);
        self.result("stage info", stage_info(ffi_plan))
    }

    /// The same description, read from an encoded stage (the bytes a driver
    /// ships) without decoding the plan.
    pub fn encoded_stage_info(&self, plan_bytes: &[u8]) -> Result<DfxStageInfo> {
        let Some(read) = self.module.encoded_stage_info() else {
            return Err(DataFusionError::Execution(format!(
                "dfx plugin {} cannot read encoded stages (built before encoded_stage_info)",
                self.path.display()
            )));
        };
        self.result("encoded stage info", read(RSlice::from_slice(plan_bytes)))
    }

    /// The stages of the encoded plan `plan_bytes` (a plan as the planner
    /// handed it back, encoded by the host's session), in pre-order, each
    /// rooted at its writer: what a driver describes, cuts and ships.
    pub fn plan_stages(&self, plan_bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        let Some(split) = self.module.plan_stages() else {
            return Err(DataFusionError::Execution(format!(
                "dfx plugin {} cannot cut an encoded plan into stages (built before \
                 plan_stages): its stages nest inside their readers; use the plugin built with \
                 this host",
                self.path.display()
            )));
        };
        let stages = self.result("plan split", split(RSlice::from_slice(plan_bytes)))?;
        Ok(stages.into_iter().map(RVec::into_vec).collect())
    }

    /// Refuse the encoded stage `plan_bytes` unless everything it reads is
    /// under `tables` or `shuffle_dir` and it writes only through dfx's
    /// writer into `shuffle_dir` (see the plugin's `vet` module).
    pub fn vet_stage(
        &self,
        plan_bytes: &[u8],
        tables: &[PathBuf],
        shuffle_dir: &str,
    ) -> Result<()> {
        let Some(vet) = self.module.vet_stage() else {
            return Err(DataFusionError::Execution(format!(
                "dfx plugin {} cannot vet a stage (built before vet_stage); a worker runs no \
                 stage it cannot vet",
                self.path.display()
            )));
        };
        let allowed = serde_json::json!({ "tables": tables, "shuffle_dir": shuffle_dir });
        let allowed = allowed.to_string();
        self.result(
            "stage check",
            vet(RSlice::from_slice(plan_bytes), RStr::from_str(&allowed)),
        )
    }

    /// Refuse the shuffle `location` if it holds stage output, cannot be
    /// reached (S3) or another driver holds it (S3); `store_options` are the
    /// spec's (`s3_endpoint`, `s3_region`, `s3_allow_http`).
    ///
    /// # Errors
    ///
    /// The plugin's message, which names the location and what is wrong.
    pub fn probe_location<'a>(
        &self,
        location: &str,
        store_options: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> std::result::Result<(), String> {
        let Some(probe) = self.module.probe_location() else {
            return Err(format!(
                "dfx plugin {} cannot probe a shuffle location (built before probe_location)",
                self.path.display()
            ));
        };
        let options: serde_json::Map<String, serde_json::Value> = store_options
            .into_iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect();
        let options = serde_json::Value::Object(options).to_string();
        match probe(RStr::from_str(location), RStr::from_str(&options)) {
            RResult::ROk(()) => Ok(()),
            // The plugin's message names the location; no path prefix needed.
            RResult::RErr(message) => Err(message.into_string()),
        }
    }

    /// The failure classes the plugin recorded for the shuffle `location`
    /// since they were last taken, oldest first; taking them forgets them.
    /// `location` is compared as the plugin compares locations: `/q`,
    /// `/q/` and `file:///q` are one location, `s3://b/p/` is `s3://b/p`.
    /// Pick a task's class from them with [`FailureClass::most_telling`].
    ///
    /// A plugin built before the export records nothing: an empty list.
    ///
    /// # Errors
    ///
    /// An answer that is not a JSON array of classes (a caught panic's
    /// message, or a plugin of another spelling), naming the plugin file.
    pub fn take_failures(&self, location: &str) -> std::result::Result<Vec<FailureClass>, String> {
        self.take_failures_answer(location)
            .map(|(_, classes)| classes)
    }

    /// The same, as the JSON array the plugin answered
    /// (`["io", {"lost": [2, 3]}]`), checked to be one: for a host that
    /// passes the classes on as text.
    ///
    /// # Errors
    ///
    /// Those of [`Plugin::take_failures`].
    pub fn take_failures_json(&self, location: &str) -> std::result::Result<String, String> {
        self.take_failures_answer(location).map(|(json, _)| json)
    }

    /// The DataFusion settings a session running the plugin's stages must
    /// carry, as `(key, value)` pairs in key order: set each on every
    /// session built for the plugin (`ConfigOptions::set`). They are the
    /// plugin's to state, so no host spells them.
    ///
    /// # Errors
    ///
    /// A plugin built before the export, or an answer that is not a JSON
    /// object of strings (a caught panic's message), naming the plugin file.
    pub fn session_settings(&self) -> std::result::Result<Vec<(String, String)>, String> {
        let Some(settings) = self.module.session_settings() else {
            return Err(format!(
                "dfx plugin {} was built before session_settings: it cannot tell a host the \
                 settings its stages need; rebuild the plugin",
                self.path.display()
            ));
        };
        let answer = settings().into_string();
        let parsed: std::collections::BTreeMap<String, String> = serde_json::from_str(&answer)
            .map_err(|err| {
                format!(
                    "dfx plugin {}: session_settings answered {answer:?}, not a JSON object of \
                     setting names to values: {err}",
                    self.path.display()
                )
            })?;
        Ok(parsed.into_iter().collect())
    }

    /// The encoded stage `plan_bytes` with its writer's input sealed, so the
    /// plugin runs every operator of it (see [`DfxPlugin::seal_stage_input`]).
    ///
    /// # Errors
    ///
    /// A plugin built before the export, or bytes whose root is not a
    /// writer, naming the plugin file.
    pub fn seal_stage_input(&self, plan_bytes: &[u8]) -> std::result::Result<Vec<u8>, String> {
        let Some(seal) = self.module.seal_stage_input() else {
            return Err(format!(
                "dfx plugin {} was built before seal_stage_input: it cannot run a stage under \
                 a memory limit in this host; rebuild the plugin",
                self.path.display()
            ));
        };
        match seal(RSlice::from_slice(plan_bytes)) {
            RResult::ROk(bytes) => Ok(bytes.into_vec()),
            RResult::RErr(message) => Err(format!(
                "dfx plugin {}: cannot seal the stage's input: {message}",
                self.path.display()
            )),
        }
    }

    /// Whether each map of the encoded stage `plan_bytes` runs a slice of
    /// several partitions (see [`DfxPlugin::stage_runs_slices`]); `None`
    /// for a plugin built before the export, whose stage must be decoded
    /// to tell.
    ///
    /// # Errors
    ///
    /// Bytes whose root is not a writer, naming the plugin file.
    pub fn stage_runs_slices(
        &self,
        plan_bytes: &[u8],
    ) -> Option<std::result::Result<bool, String>> {
        let runs_slices = self.module.stage_runs_slices()?;
        Some(match runs_slices(RSlice::from_slice(plan_bytes)) {
            RResult::ROk(slices) => Ok(slices),
            RResult::RErr(message) => Err(format!(
                "dfx plugin {}: cannot read the stage's writer: {message}",
                self.path.display()
            )),
        })
    }

    /// The id the plugin's logical codec is installed under
    /// (`dfx_engine.logical.v1`), or `None` for a plugin built before it.
    pub fn logical_codec_id(&self) -> Option<&'static str> {
        self.module.logical_codec_id().map(|id| id.as_str())
    }

    /// The plugin's logical codec, bound to `task_ctx_provider`: it carries
    /// in-memory tables (and table functions' rows) into the plugin's
    /// planner, up to the session's `dfx_engine.memory_table_limit`.
    ///
    /// # Errors
    ///
    /// A plugin built before the export, or the constructor's error, naming
    /// the plugin file.
    pub fn logical_codec(
        &self,
        task_ctx_provider: FFI_TaskContextProvider,
    ) -> Result<FFI_LogicalExtensionCodec> {
        let Some(new_codec) = self.module.new_logical_codec() else {
            return Err(DataFusionError::Execution(format!(
                "dfx plugin {} was built before its logical codec: it cannot carry an \
                 in-memory table into a plan; rebuild the plugin",
                self.path.display()
            )));
        };
        self.result("logical codec", new_codec(task_ctx_provider))
    }

    fn take_failures_answer(
        &self,
        location: &str,
    ) -> std::result::Result<(String, Vec<FailureClass>), String> {
        let Some(take) = self.module.take_failures() else {
            return Ok(("[]".to_string(), Vec::new()));
        };
        let answer = take(RStr::from_str(location)).into_string();
        let classes = parse_failures(&self.path, location, &answer)?;
        Ok((answer, classes))
    }

    fn result<T>(&self, what: &str, result: FfiResult<T>) -> Result<T> {
        match result {
            RResult::ROk(value) => Ok(value),
            RResult::RErr(message) => Err(DataFusionError::Execution(format!(
                "dfx plugin {}: {what} failed: {message}",
                self.path.display()
            ))),
        }
    }
}

/// The classes in the answer of `plugin`'s `take_failures` for `location`.
fn parse_failures(
    plugin: &Path,
    location: &str,
    answer: &str,
) -> std::result::Result<Vec<FailureClass>, String> {
    serde_json::from_str(answer).map_err(|err| {
        format!(
            "dfx plugin {}: take_failures for {location} answered {answer:?}, not a JSON array \
             of failure classes: {err}",
            plugin.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_that_is_not_failure_classes_is_an_error_naming_the_plugin() {
        let plugin = Path::new("/p/libdfx_plugin.so");
        assert_eq!(
            parse_failures(plugin, "/q", r#"["io", {"lost": [2, 3]}]"#),
            Ok(vec![FailureClass::Io, FailureClass::Lost([2, 3])])
        );
        assert_eq!(parse_failures(plugin, "/q", "[]"), Ok(vec![]));
        for answer in [
            "dfx plugin panicked in take_failures: boom",
            "",
            r#"["retry"]"#,
        ] {
            let err = parse_failures(plugin, "/q", answer).unwrap_err();
            let quoted = format!("{answer:?}");
            for part in ["/p/libdfx_plugin.so", "take_failures for /q", &quoted] {
                assert!(err.contains(part), "{part:?} not in {err}");
            }
        }
    }
}
