//! A driver's claim on its shuffle location, before anything is built: the
//! one definition for both hosts.
//!
//! Nothing is planned or written into a location whose files the readers
//! would take for this query's (stage ids restart for every plan, and a
//! reader trusts any published map), or that another driver is using:
//!
//! - a local directory is locked for the run (`flock`, [`DriverLock`]), then
//!   the plugin checks it holds no stage output; the driver's scratch goes
//!   into its `tasks/` directory;
//! - an S3 location is probed by the plugin (endpoint, bucket, credentials,
//!   no stage output) and claimed with a create-only lock object; the
//!   scratch goes into a local temporary directory, removed with the claim.

use std::path::{Path, PathBuf};

use dfx_abi::{DriverLock, Plugin};

use crate::error::{Result, RuntimeError};
use crate::protocol::TASK_DIR;
use crate::spec::{SessionSpec, ShuffleLocation};

/// A shuffle location held for one query, and where its scratch goes.
#[derive(Debug)]
pub struct ClaimedLocation {
    location: ShuffleLocation,
    task_dir: PathBuf,
    _lock: Option<DriverLock>,
    _scratch: Option<tempfile::TempDir>,
}

impl ClaimedLocation {
    /// Claim `spec`'s shuffle location for one query.
    ///
    /// # Errors
    ///
    /// A spec without a location, a location of another scheme, one another
    /// driver holds, one holding stage output, or an S3 location the plugin
    /// cannot reach; each message names the location.
    pub async fn claim(plugin: &Plugin, spec: &SessionSpec) -> Result<Self> {
        let dir = spec.shuffle_dir.as_deref().ok_or_else(|| {
            RuntimeError::Invalid(
                "a distributed run needs a shuffle location; the spec has none".into(),
            )
        })?;
        let location = ShuffleLocation::parse(dir)?;
        match &location {
            ShuffleLocation::Local(local) => {
                let lock = DriverLock::acquire(local).map_err(RuntimeError::Invalid)?;
                probe(plugin, &local.display().to_string(), spec).await?;
                Ok(Self {
                    task_dir: local.join(TASK_DIR),
                    location,
                    _lock: Some(lock),
                    _scratch: None,
                })
            }
            ShuffleLocation::S3 { .. } => {
                probe(plugin, &location.canonical(), spec).await?;
                // Envelopes and plans stay on the driver's disk; executors
                // that run elsewhere carry them by value.
                let scratch = tempfile::Builder::new()
                    .prefix("dfx-tasks-")
                    .tempdir()
                    .map_err(|e| RuntimeError::io("cannot create", std::env::temp_dir(), e))?;
                Ok(Self {
                    task_dir: scratch.path().join(TASK_DIR),
                    location,
                    _lock: None,
                    _scratch: Some(scratch),
                })
            }
        }
    }

    /// Where the query's encoded stages and envelope files go.
    pub fn task_dir(&self) -> &Path {
        &self.task_dir
    }

    /// The location, in its one spelling (see [`ShuffleLocation::canonical`]).
    pub fn canonical(&self) -> String {
        self.location.canonical()
    }
}

/// The plugin's check of `location`, on a blocking thread: an S3 probe waits
/// on the network for up to its timeout.
async fn probe(plugin: &Plugin, location: &str, spec: &SessionSpec) -> Result<()> {
    let plugin = plugin.clone();
    let location = location.to_string();
    let options = spec.store_options.clone();
    tokio::task::spawn_blocking(move || plugin.probe_location(&location, &options))
        .await
        .map_err(|e| {
            RuntimeError::Invalid(format!("the shuffle location probe did not finish: {e}"))
        })?
        .map_err(RuntimeError::Invalid)
}
