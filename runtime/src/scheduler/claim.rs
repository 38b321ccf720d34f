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
//!
//! A spec naming a root rather than a location has a fresh location made
//! under it ([`crate::shuffle_root`]), claimed the same way; once the query
//! ends, [`ClaimedLocation::finish`] removes it or keeps it, by that
//! module's rule.

use std::path::{Path, PathBuf};

use dfx_abi::{DriverLock, Plugin};

use crate::error::{Result, RuntimeError};
use crate::protocol::TASK_DIR;
use crate::shuffle_root::{ShuffleRoot, holds_evidence, remove_location};
use crate::spec::{SessionSpec, ShuffleLocation};

/// A shuffle location held for one query, and where its scratch goes.
#[derive(Debug)]
pub struct ClaimedLocation {
    location: ShuffleLocation,
    dir: PathBuf,
    task_dir: PathBuf,
    /// The spec's store options and `keep_shuffle`, when the location was
    /// made under a root for this query: then [`Self::finish`] removes it.
    made: Option<(std::collections::BTreeMap<String, String>, bool)>,
    _lock: Option<DriverLock>,
    _scratch: Option<tempfile::TempDir>,
}

impl ClaimedLocation {
    /// Claim `spec`'s shuffle location for one query, or a fresh one made
    /// under its root (the root marked as dfx's first).
    ///
    /// # Errors
    ///
    /// A spec without a location or root, or with both, a location of
    /// another scheme, one another driver holds, one holding stage output,
    /// or an S3 location the plugin cannot reach; each message names the
    /// location.
    pub async fn claim(plugin: &Plugin, spec: &SessionSpec) -> Result<Self> {
        spec.validate()?;
        let (dir, made) = match (&spec.shuffle_dir, &spec.shuffle_root) {
            (Some(dir), _) => (dir.clone(), None),
            (None, Some(root)) => {
                let root = ShuffleRoot::new(root, &spec.store_options)?;
                root.mark().await?;
                let made = (spec.store_options.clone(), spec.keep_shuffle);
                (root.new_query_location(), Some(made))
            }
            (None, None) => {
                return Err(RuntimeError::Invalid(
                    "a distributed run needs a shuffle location or root; the spec has neither"
                        .into(),
                ));
            }
        };
        let mut claim = Self::claim_location(plugin, spec, &dir).await?;
        claim.made = made;
        Ok(claim)
    }

    async fn claim_location(plugin: &Plugin, spec: &SessionSpec, dir: &Path) -> Result<Self> {
        let location = ShuffleLocation::parse(dir)?;
        match &location {
            ShuffleLocation::Local(local) => {
                let lock = DriverLock::acquire(local).map_err(RuntimeError::Invalid)?;
                probe(plugin, &local.display().to_string(), spec).await?;
                Ok(Self {
                    task_dir: local.join(TASK_DIR),
                    dir: dir.to_path_buf(),
                    location,
                    made: None,
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
                    dir: dir.to_path_buf(),
                    location,
                    made: None,
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

    /// `spec` as this query runs it: its location the claimed one, and no
    /// root (what every session of the query is built from and ships).
    pub fn query_spec(&self, spec: &SessionSpec) -> SessionSpec {
        SessionSpec {
            shuffle_dir: Some(self.dir.clone()),
            shuffle_root: None,
            keep_shuffle: false,
            ..spec.clone()
        }
    }

    /// Whether the location was made under a root for this query.
    pub fn made_under_root(&self) -> bool {
        self.made.is_some()
    }

    /// End the query's claim. A location made under a root is removed once
    /// its answer was read (`answered`), unless the spec keeps it; after a
    /// failure it is kept when it holds anything but its driver's lock. The
    /// answer: the location when kept for a failure, for the error to name.
    /// A spec's own `shuffle_dir` stays as it is, and is not named.
    ///
    /// # Errors
    ///
    /// A location that cannot be listed or removed, naming it.
    pub async fn finish(self, answered: bool) -> Result<Option<String>> {
        let Some((options, keep)) = &self.made else {
            return Ok(None);
        };
        let location = self.canonical();
        if answered && *keep {
            return Ok(None);
        }
        if !answered && holds_evidence(&location, options).await? {
            return Ok(Some(location));
        }
        // Removed while still locked: no driver can take it meanwhile.
        remove_location(&location, options).await?;
        Ok(None)
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
