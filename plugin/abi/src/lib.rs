//! The ABI of a dfx plugin file, and the one loader every host uses.
//!
//! A dfx plugin is a `cdylib` exporting one `abi_stable` root module,
//! [`DfxPlugin`]. A host calls [`load`] with the file's path, which performs
//! the whole handshake before anything in the library is called:
//!
//! 1. open the file as a shared library ([`LoadCheck::Open`]);
//! 2. find the exported root module ([`LoadCheck::NotADfxPlugin`]);
//! 3. let `abi_stable` check its version numbers and the root module's layout
//!    ([`LoadCheck::AbiStableVersion`], [`LoadCheck::RootModuleLayout`]);
//! 4. compare the dfx ABI version and the `datafusion-ffi` major the plugin
//!    declares with this host's ([`LoadCheck::DfxAbiVersion`],
//!    [`LoadCheck::DataFusionMajor`]).
//!
//! Only then does [`Plugin`] hand out the plugin's constructors.
//!
//! ```no_run
//! let plugin = dfx_abi::load(std::path::Path::new("target/debug/libdfx_plugin.so"))?;
//! println!("{} {}", plugin.name(), plugin.version());
//! # Ok::<(), dfx_abi::LoadError>(())
//! ```

pub mod compat;
pub mod failure;
pub mod location;
pub mod lock;
pub mod module;
pub mod stages;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use abi_stable::library::{LibraryError, RootModule, lib_header_from_path};
use abi_stable::std_types::{RResult, RSlice, RStr};
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

/// Words in every error of a failed write of shuffle storage (a full disk, a
/// dropped connection), for the person reading it. Hosts do not look for
/// them: the plugin records [`FailureClass::Io`] where it makes such an
/// error, and a host takes the class with [`Plugin::take_failures`].
pub const IO_FAILURE: &str = "I/O failure";

/// The config key, under the plugin's prefix (`dfx_engine.`), of the most
/// bytes (as Arrow IPC) an in-memory table may carry into a plan; hosts
/// name it to users and set it without spelling it.
pub const MEMORY_TABLE_LIMIT: &str = "memory_table_limit";

/// The stable start of the plugin's error refusing an in-memory table over
/// that limit. A host's planning wraps the error in words of its own (the
/// table's encoding failed), so a host finds the plugin's sentence by it,
/// to raise it alone; it never decides a retry.
pub const MEMORY_TABLE_TOO_LARGE: &str = "dfx in-memory table too large";

/// How many bytes from a Parquet file's end a host's tables read at once,
/// hoping the footer fits in them (a larger footer costs a second read);
/// both hosts register their tables with it.
///
/// DataFusion's default, 512 KiB, saves round trips to an object store; a
/// table here is a directory of local files, whose footers are a few KiB.
/// Every worker opens the files of its map afresh (its metadata cache has
/// never seen them), so at 512 KiB each open read and allocated half a
/// megabyte to parse a few KiB.
pub const PARQUET_FOOTER_HINT: usize = 64 * 1024;

/// The last 8 bytes of every published map file (`stage-<S>/map-<M>.arrow`).
///
/// A map file is the map's segments (each a whole Arrow IPC stream), then
/// its commit marker (JSON: stage, map, and per bucket its rows and the byte
/// ranges of its segments), then a footer of [`MAP_FOOTER_BYTES`]: the
/// marker's length as a little-endian u64, then this magic. The plugin
/// writes and reads it; it is here so that anything reading a shuffle
/// directory by hand (tests, tools) finds the layout in one place.
pub const MAP_FOOTER_MAGIC: &[u8; 8] = b"DFXMAP01";

/// Bytes of a map file's footer: the commit marker's length, then
/// [`MAP_FOOTER_MAGIC`].
pub const MAP_FOOTER_BYTES: u64 = 16;

/// Where the commit marker is in the whole map file `file` (the segments
/// are the bytes before it), or `None` when the file does not end with a
/// footer or the footer's length overruns it. For readers of a shuffle by
/// hand; the plugin reads only a file's tail, and says what is wrong.
pub fn map_marker_range(file: &[u8]) -> Option<std::ops::Range<usize>> {
    let footer = file.len().checked_sub(MAP_FOOTER_BYTES as usize)?;
    let (len, magic) = file[footer..].split_at(8);
    if magic != MAP_FOOTER_MAGIC {
        return None;
    }
    let len = usize::try_from(u64::from_le_bytes(len.try_into().ok()?)).ok()?;
    Some(footer.checked_sub(len)?..footer)
}

pub use compat::{DFX_ABI_VERSION, LoadCheck, LoadError, host_datafusion_ffi_major};
pub use failure::FailureClass;
pub use location::{LocationError, S3Location, ShuffleLocation};
pub use lock::DriverLock;
pub use module::{DfxCounters, DfxPlugin, DfxPluginRef, DfxStageInfo, FfiResult};

/// The file name a plugin build produces on this platform (`libdfx_plugin.so`
/// on Linux).
pub fn plugin_file_name() -> String {
    format!(
        "{}{}{}",
        std::env::consts::DLL_PREFIX,
        DfxPluginRef::BASE_NAME,
        std::env::consts::DLL_SUFFIX
    )
}

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

/// Load the dfx plugin at `path`, performing the whole handshake.
///
/// # Errors
///
/// A [`LoadError`] naming the check that failed, with what this host expected
/// and what the file had. A refused library is never called into.
pub fn load(path: &Path) -> Result<Plugin, LoadError> {
    let refuse = |check: LoadCheck, expected: &str, found: String| LoadError {
        path: path.to_path_buf(),
        check,
        expected: expected.to_string(),
        found,
    };
    let header = lib_header_from_path(path).map_err(|err| match err {
        LibraryError::OpenError { err, .. } => refuse(
            LoadCheck::Open,
            "a loadable shared library",
            err.to_string(),
        ),
        LibraryError::GetSymbolError { err, .. } => refuse(
            LoadCheck::NotADfxPlugin,
            "a dfx plugin (an exported abi_stable root module)",
            format!("not a dfx plugin: {err}"),
        ),
        other => refuse(
            LoadCheck::AbiStableVersion,
            "a compatible abi_stable library header",
            other.to_string(),
        ),
    })?;
    let module = header
        .init_root_module::<DfxPluginRef>()
        .map_err(|err| match err {
            LibraryError::AbiInstability(err) => refuse(
                LoadCheck::RootModuleLayout,
                "the dfx root module layout of this host's dfx-abi",
                format!("an incompatible layout: {err}"),
            ),
            LibraryError::IncompatibleVersionNumber {
                expected_version,
                actual_version,
                ..
            } => refuse(
                LoadCheck::AbiStableVersion,
                &format!("dfx-abi {expected_version}"),
                format!("dfx-abi {actual_version}"),
            ),
            LibraryError::RootModule { err, .. } => refuse(
                LoadCheck::RootModuleInit,
                "a root module that initializes",
                err.to_string(),
            ),
            other => refuse(
                LoadCheck::AbiStableVersion,
                "a compatible abi_stable library",
                other.to_string(),
            ),
        })?;
    compat::check_versions(
        path,
        module.dfx_abi_version(),
        module.datafusion_ffi_major(),
    )?;
    Ok(Plugin {
        path: path.to_path_buf(),
        module,
    })
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

    /// The id of the plugin's physical codec (`dfx_engine.physical.v2`).
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
    /// (`stage-<S>/map-<M>.arrow`): every bucket of the map, closed by its
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

    #[test]
    fn a_map_file_splits_at_its_footer() {
        let mut file = b"segmentsmarker".to_vec();
        file.extend_from_slice(&6u64.to_le_bytes());
        file.extend_from_slice(MAP_FOOTER_MAGIC);
        assert_eq!(map_marker_range(&file), Some(8..14));
        // No magic, too short, or a length past the file's start.
        assert_eq!(map_marker_range(&file[..file.len() - 1]), None);
        assert_eq!(map_marker_range(b"short"), None);
        let mut overrun = b"x".to_vec();
        overrun.extend_from_slice(&2u64.to_le_bytes());
        overrun.extend_from_slice(MAP_FOOTER_MAGIC);
        assert_eq!(map_marker_range(&overrun), None);
    }
}
