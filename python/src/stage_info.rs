//! What an encoded stage says about itself, read without decoding it.
//!
//! A driver schedules stages by their ids, map counts and dependencies, and a
//! worker must refuse a stage aimed at another shuffle directory before
//! building anything from it; a decoded stage is a foreign node whose display
//! carries only its name. The plugin reads its own payload out of the plan
//! bytes (`encoded_stage_info`), so this module states no layout.

use dfx_abi::DfxStageInfo;
use dfx_runtime::protocol::stage_file;
use dfx_runtime::scheduler::StageInfo as RuntimeStageInfo;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::plugin::plugin;

/// What a stage root (`ShuffleWriterExec`) carries: everything a driver needs
/// to schedule it, as the plugin reports it.
///
/// ```text
/// stage 2 ── reads ──► stage 1        deps = [1]
///   maps    = tasks of stage 2 (slices of its input's partitions)
///   buckets = files each map publishes (its output's partitions)
/// ```
#[pyclass(frozen, get_all, eq, module = "dfx_engine._internal")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageInfo {
    /// The id the planner gave the writer (`stage_id(n)` for the n-th in pre-order).
    pub(crate) stage_id: u64,
    /// The shuffle directory the stage publishes into.
    pub(crate) shuffle_dir: String,
    /// Map tasks: one per partition of the writer's input.
    pub(crate) maps: u64,
    /// Buckets each map splits its rows into.
    pub(crate) buckets: u64,
    /// Input partitions each map runs (map `m` from `m * partitions_per_map`).
    pub(crate) partitions_per_map: u64,
    /// Ids of the stages this one reads, ascending; it runs once they are published.
    pub(crate) deps: Vec<u64>,
    /// Those of them read partition by partition: a map is handed only its
    /// slice's buckets of them.
    pub(crate) aligned_deps: Vec<u64>,
    /// How rows are split into buckets, for display (`hash([k@0], 4)`, `single`).
    pub(crate) partitioning: String,
}

impl From<DfxStageInfo> for StageInfo {
    fn from(info: DfxStageInfo) -> Self {
        Self {
            stage_id: info.stage_id,
            shuffle_dir: info.shuffle_dir.into_string(),
            maps: info.maps,
            buckets: info.buckets,
            partitions_per_map: info.partitions_per_map,
            deps: info.deps.into_vec(),
            aligned_deps: info.aligned_deps.into_vec(),
            partitioning: info.partitioning.into_string(),
        }
    }
}

impl From<&RuntimeStageInfo> for StageInfo {
    fn from(info: &RuntimeStageInfo) -> Self {
        Self {
            stage_id: info.stage_id,
            shuffle_dir: info.shuffle_dir.display().to_string(),
            maps: info.maps as u64,
            buckets: info.buckets as u64,
            partitions_per_map: info.partitions_per_map as u64,
            deps: info.deps.clone(),
            aligned_deps: info.aligned_deps.clone(),
            partitioning: info.partitioning.clone(),
        }
    }
}

#[pymethods]
impl StageInfo {
    fn __repr__(&self) -> String {
        format!(
            "StageInfo(stage_id={}, shuffle_dir={:?}, maps={}, buckets={}, \
             partitions_per_map={}, deps={:?}, aligned_deps={:?}, partitioning={:?})",
            self.stage_id,
            self.shuffle_dir,
            self.maps,
            self.buckets,
            self.partitions_per_map,
            self.deps,
            self.aligned_deps,
            self.partitioning
        )
    }
}

/// The [`StageInfo`] of the stage at the root of `plan` (bytes of an encoded
/// stage, as the driver writes them).
///
/// # Errors
///
/// `ValueError` with the plugin's reason: not a plan, a root that is not a
/// stage, a truncated or unknown payload (a stage file, as the driver
/// writes a stage cut for its maps, is described by its shared part).
#[pyfunction]
pub fn encoded_stage_info(py: Python<'_>, plan: &[u8]) -> PyResult<StageInfo> {
    // A plan file may be a stage cut for its maps: the runtime finds the
    // stage's writer in it.
    let info = stage_file::stage_info(plugin(py)?, plan).map_err(|err| {
        PyValueError::new_err(format!(
            "dfx_engine: encoded stage ({} bytes): {err}",
            plan.len()
        ))
    })?;
    Ok(info.into())
}
