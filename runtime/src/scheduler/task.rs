//! A task as the scheduler holds it, and its report.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use dfx_abi::MapLayout;

use crate::protocol::{Envelope, WorkerReport};

/// One task to dispatch: one map of one stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    /// The stage.
    pub stage_id: u64,
    /// The map (the stage's input partition the worker runs).
    pub map: usize,
    /// The envelope file the worker is given. With `inline` set, the name
    /// the file would have (messages name the task by it) and nothing on
    /// disk.
    pub envelope: PathBuf,
    /// The envelope itself, sent in the request to a pooled worker instead
    /// of a file; `None` for a task whose envelope is a file (process mode
    /// always: a process is given a path).
    pub inline: Option<Arc<Envelope>>,
}

/// Rows each task reported, keyed by `(stage_id, map)`.
pub type TaskRows = BTreeMap<(u64, usize), usize>;

/// What each task reported, keyed by `(stage_id, map)`.
pub type TaskReports = BTreeMap<(u64, usize), TaskReport>;

/// One completed task, as its worker reported it and the driver saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskReport {
    /// Rows it published, over all of its buckets.
    pub rows: usize,
    /// Bytes it published, over all of its buckets (`None` from a worker
    /// that does not report them).
    pub bytes: Option<u64>,
    /// The worker's own time for the task, in milliseconds (`None` from a
    /// worker that does not report it).
    pub elapsed_ms: Option<f64>,
    /// The driver's time for the task, from dispatch (process start or
    /// request) to its report, in milliseconds.
    pub wall_ms: f64,
    /// Process id of the worker that ran it.
    pub worker: Option<u32>,
    /// The attempt that succeeded (0: the first).
    pub attempt: u32,
    /// Where each bucket lies in the map's file, as its worker reported it
    /// (`None` from a worker that does not report it).
    pub layout: Option<Arc<MapLayout>>,
}

impl TaskReport {
    /// The report of a task its worker reported as `report`, seen by the
    /// driver to take `wall_ms` on worker `worker`; the attempt is set by the
    /// scheduler.
    pub fn from_worker(report: &WorkerReport, wall_ms: f64, worker: Option<u32>) -> Self {
        Self {
            rows: report.rows,
            bytes: report.bytes,
            elapsed_ms: report.elapsed_ms,
            wall_ms,
            worker,
            attempt: 0,
            layout: report.layout.as_deref().cloned().map(Arc::new),
        }
    }
}

impl Task {
    /// The envelope of this attempt: the one carried inline, or the file's.
    ///
    /// # Errors
    ///
    /// An envelope file that cannot be read or does not parse.
    pub fn read_envelope(&self) -> crate::error::Result<Envelope> {
        match &self.inline {
            Some(envelope) => Ok(Envelope::clone(envelope)),
            None => Envelope::read(&self.envelope),
        }
    }
}
