//! The runtime's one step between encoding a query's stages and running
//! them, for the Python driver: each stage described by the plugin from
//! its bytes, its id checked against its pre-order position, and cut for
//! its maps ([`dfx_runtime::prepare()`], the step the Rust host calls too).
//!
//! ```text
//! dfx_engine.driver                        this module           dfx_runtime
//! plan ─► to_bytes(ctx) ─► plan_stages(bytes): the plugin cuts the plan into
//!                          its stages (pre-order; each reader carried its stage)
//! stages ──────────────► prepare(encoded) ──► prepare: describe, cut
//!                                            │
//!                                            ▼
//!                           PreparedStages ─► Scheduler.run(spec, task_dir, stages)
//! ```

use dfx_runtime::scheduler::EncodedStage;
use pyo3::prelude::*;

use pyo3::types::PyBytes;

use crate::error::{from_runtime, runtime_error};
use crate::plugin::plugin;
use crate::stage_info::StageInfo;

/// A query's stages as the runtime prepared them: described by the plugin
/// and cut for their maps, ready for `Scheduler.run`.
#[pyclass(frozen, module = "dfx_engine._internal")]
pub struct PreparedStages {
    stages: Vec<EncodedStage>,
}

impl PreparedStages {
    /// The stages themselves, for the scheduler.
    pub(crate) fn encoded(&self) -> &[EncodedStage] {
        &self.stages
    }
}

#[pymethods]
impl PreparedStages {
    /// Every stage, in pre-order, as the plugin described it.
    #[getter]
    fn stages(&self) -> Vec<StageInfo> {
        self.stages
            .iter()
            .map(|stage| StageInfo::from(&stage.info))
            .collect()
    }

    fn __len__(&self) -> usize {
        self.stages.len()
    }

    fn __repr__(&self) -> String {
        let ids: Vec<u64> = self.stages.iter().map(|s| s.info.stage_id).collect();
        format!("PreparedStages(stages={ids:?})")
    }
}

/// The stages of `encoded_stages` (a query's writers, encoded in pre-order
/// with the driver's session), described by the plugin from their bytes
/// and cut for their maps.
///
/// Raises:
///     ValueError: Stages the plugin cannot describe or cut, or numbered
///         out of pre-order; each naming the stage.
#[pyfunction]
pub fn prepare(py: Python<'_>, encoded_stages: Vec<Vec<u8>>) -> PyResult<PreparedStages> {
    let plugin = plugin(py)?;
    let stages = py
        .detach(|| dfx_runtime::prepare(plugin, encoded_stages))
        .map_err(from_runtime)?;
    Ok(PreparedStages { stages })
}

/// The stages of `plan` (a plan as the planner handed it back, encoded
/// with the driver's session), cut out by the plugin in pre-order, each
/// rooted at its writer and holding its own nodes only: the planner's
/// readers carry the stages they read, so no stage nests in another and
/// each decodes within datafusion-python's depth on its own.
///
/// Raises:
///     RuntimeError: Bytes that are not an encoded plan, or a stage in it
///         that is not one.
#[pyfunction]
pub fn plan_stages<'py>(py: Python<'py>, plan: Vec<u8>) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    let plugin = plugin(py)?;
    let stages = py
        .detach(|| plugin.plan_stages(&plan))
        .map_err(runtime_error)?;
    Ok(stages.iter().map(|stage| PyBytes::new(py, stage)).collect())
}
