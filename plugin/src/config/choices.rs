//! The config's choices among a few values, as the accessors of
//! [`super::DfxConfig`] answer them: each decision's setting, where map
//! files live, how they are compressed, where a plan is cut; and
//! [`choose`], the one parser of them all.

use datafusion::common::{DataFusionError, Result};

/// The choice a setting's `value` names among `choices` (each a name and
/// what it means); an empty value is the first, the default. Every choice
/// setting is read by this one parser, so each refuses a value it does not
/// know in the same words: the key, the value, and every name it knows.
///
/// # Errors
///
/// A value that names no choice, said with `key` and every choice's name.
pub(super) fn choose<T: Copy>(key: &str, value: &str, choices: &[(&str, T)]) -> Result<T> {
    let value = value.trim();
    let chosen = match value {
        "" => choices.first(),
        named => choices.iter().find(|(name, _)| *name == named),
    };
    chosen.map(|&(_, choice)| choice).ok_or_else(|| {
        let names: Vec<String> = choices
            .iter()
            .map(|(name, _)| format!("{name:?}"))
            .collect();
        let expected = match names.split_last() {
            Some((last, [])) => last.clone(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => "no value".to_string(),
        };
        DataFusionError::Configuration(format!(
            "dfx config: `{key}` is {value:?}; expected {expected}"
        ))
    })
}

/// `value`, the number setting `key` holds, when it is at least `least`.
///
/// # Errors
///
/// A smaller number, or not a number, said with the key.
pub(super) fn at_least(key: &str, value: f64, least: f64) -> Result<f64> {
    if value.is_nan() || value < least {
        return Err(DataFusionError::Configuration(format!(
            "dfx config: `{key}` is {value}; expected a number of at least {least}"
        )));
    }
    Ok(value)
}

/// Whether a ready stage's partitioned joins run as broadcast joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BroadcastSwitch {
    /// When the build stages published at most `bytes`.
    Auto {
        /// The most bytes.
        bytes: u64,
    },
    /// Every join that can switch, whatever its build side's bytes.
    On,
    /// Never.
    Off,
}

/// Whether a ready stage's skewed partitions are read by several tasks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SkewSplit {
    /// A partition past `factor` times the median and past `bytes`.
    Auto {
        /// The factor over the median.
        factor: f64,
        /// The fewest bytes.
        bytes: u64,
    },
    /// Every partition that can be split, one task per map it reads.
    On,
    /// Never.
    Off,
}

/// Where map files live between stages: `dfx_engine.shuffle_durability`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShuffleDurability {
    /// In the location: a map outlives its worker.
    ObjectStore,
    /// Only on the disk of the worker that wrote it, read from its map
    /// server: never from the location by its marker.
    Local,
    /// On the worker's disk and in the location, which a reader falls back
    /// to when the worker cannot be reached.
    Both,
}

/// Whether ready stages' small partitions share tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coalesce {
    /// Up to the target bytes a task.
    Auto,
    /// At least two partitions a task, whatever their bytes.
    On,
    /// One task per partition, as planned.
    Off,
}

/// Whether a plan whose every stage would be one task is cut at all, and
/// where it runs when it is not: `dfx_engine.collapse_stages`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollapseStages {
    /// When no operator of the plan runs more partitions than a task does:
    /// uncut, run by the driver that planned it when it runs no more
    /// partitions than the driver has cores either, else one stage.
    Auto,
    /// When no operator of the plan runs more partitions than a task does:
    /// one stage, its one task run by a worker.
    Task,
    /// Never: the plan is cut as the split rule says.
    Off,
}

/// Whether the planner adds filters that cross stages.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum JoinFilters {
    /// When the build stage published at most this many times the probe
    /// table's rows.
    Auto(f64),
    /// Whatever the sizes.
    On,
    /// Never.
    Off,
}

/// How a writer compresses the segments of its map files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShuffleCompression {
    /// Arrow IPC with LZ4 frame compression per buffer.
    Lz4,
    /// Uncompressed Arrow IPC.
    None,
}

/// Where the planner cuts a plan into stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitMode {
    /// At every exchange: hash repartitions, below merges, broadcast builds,
    /// and around operators that need every partition of an input.
    Exchange,
    /// At each topmost partial aggregate (a plan with none is one stage).
    Aggregate,
}

impl SplitMode {
    /// The config value naming this mode.
    pub fn as_str(self) -> &'static str {
        match self {
            SplitMode::Exchange => "exchange",
            SplitMode::Aggregate => "aggregate",
        }
    }
}
