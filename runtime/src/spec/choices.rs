//! The spec's choices among a few values: how map files are compressed,
//! where they live between stages, and where a plan is cut into stages.
//! Each is spelled in JSON and on the command line as the plugin's config
//! spells it.

use std::path::Path;

use dfx_abi::location::ShuffleLocation;
use serde::{Deserialize, Serialize};

/// How workers compress the map files they publish: the value of
/// `dfx_engine.shuffle_compression`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum ShuffleCompression {
    /// By location: none for a local directory, LZ4 for S3.
    #[default]
    Auto,
    /// LZ4 frames, per Arrow IPC buffer.
    Lz4,
    /// Uncompressed Arrow IPC: more bytes, no codec time.
    None,
}

impl ShuffleCompression {
    /// The config value (`auto`, `lz4`, `none`).
    pub fn as_str(self) -> &'static str {
        match self {
            ShuffleCompression::Auto => "auto",
            ShuffleCompression::Lz4 => "lz4",
            ShuffleCompression::None => "none",
        }
    }

    pub(crate) fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

impl std::fmt::Display for ShuffleCompression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where map files live between stages: the spec's `shuffle_durability`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum ShuffleDurability {
    /// In the location (a directory every worker shares, or S3): a map
    /// outlives its worker.
    #[default]
    #[cfg_attr(feature = "clap", value(name = "object_store"))]
    ObjectStore,
    /// On the disk of the worker that wrote each map, in the location's
    /// directory there, served over Arrow Flight: a lost worker's maps are
    /// lost, and run again.
    Local,
    /// Both: each map in the location, and a copy on the disk of the
    /// worker that wrote it, served over Arrow Flight. Readers stream from
    /// the worker, and read the location's file when it cannot be reached:
    /// a lost worker costs no rerun.
    Both,
}

impl ShuffleDurability {
    /// The spec's spelling (`object_store`, `local`).
    pub fn as_str(self) -> &'static str {
        match self {
            ShuffleDurability::ObjectStore => "object_store",
            ShuffleDurability::Local => "local",
            ShuffleDurability::Both => "both",
        }
    }

    pub(crate) fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// The durability of a spec naming none, for workers on machines of
    /// their own that serve their map files (a Ray cluster of dfx actors):
    /// `local` under a directory, which each machine has one of (a lost
    /// machine's maps run again); `both` under an object store (a lost
    /// machine's maps are read from there). Workers that share one
    /// machine's directory, or do not outlive their tasks, keep the
    /// default. A location no spec accepts gets `local`, and is refused by
    /// name where the spec is checked.
    pub fn for_serving_cluster(location: &str) -> Self {
        match ShuffleLocation::parse(Path::new(location)) {
            Ok(ShuffleLocation::S3(_)) => Self::Both,
            _ => Self::Local,
        }
    }
}

impl std::fmt::Display for ShuffleDurability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The map server's address when the spec names none: this host only.
pub const DEFAULT_MAP_SERVER_BIND: &str = "127.0.0.1:0";

/// Where the plugin's planner cuts a plan into stages: the value of
/// `dfx_engine.split`, spelled in JSON and on the command line as the
/// plugin spells it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// At every exchange: hash repartitions, merges, broadcast build sides,
    /// and single-task stages for operators that need all of an input.
    #[default]
    Exchange,
    /// The aggregate split: every topmost partial aggregate is a stage, and
    /// a plan without one is one stage.
    Aggregate,
}

impl Split {
    /// Both modes, for callers that check every one.
    pub const ALL: [Split; 2] = [Split::Exchange, Split::Aggregate];

    /// The config value (`exchange`, `aggregate`).
    pub fn as_str(self) -> &'static str {
        match self {
            Split::Exchange => "exchange",
            Split::Aggregate => "aggregate",
        }
    }
}

impl std::fmt::Display for Split {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_serving_cluster_keeps_maps_on_its_disks_and_copies_them_to_an_object_store() {
        for dir in ["/mnt/dfx/q1", "file:///mnt/dfx/q1", "relative/q1", ""] {
            assert_eq!(
                ShuffleDurability::for_serving_cluster(dir),
                ShuffleDurability::Local
            );
        }
        for url in ["s3://dfx/q1", "s3://dfx"] {
            assert_eq!(
                ShuffleDurability::for_serving_cluster(url),
                ShuffleDurability::Both
            );
        }
    }
}
