//! The runtime's one step between encoding a query's stages and running
//! them, for the Python driver: each stage described by the plugin from
//! its bytes, its id checked against its pre-order position, and cut for
//! its maps ([`dfx_runtime::prepare()`], the step the Rust host calls too).
//!
//! ```text
//! dfx_engine.driver                        this module           dfx_runtime
//! writers in pre-order ─► to_bytes(ctx) ─► prepare(encoded) ──► prepare: describe, cut
//!                                            │
//!                                            ▼
//!                           PreparedStages ─► Scheduler.run(spec, task_dir, stages)
//! ```

use dfx_runtime::scheduler::EncodedStage;
use pyo3::prelude::*;

use crate::error::from_runtime;
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
