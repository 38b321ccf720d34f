//! The options a session is built from, as a command line or a spec gives
//! them: the partitions it plans for and the plugin settings of `--set`.

use crate::error::Result;

use dfx_runtime::spec::SessionSpec;

/// The partitions a session built from `spec` plans for: the spec's
/// `target_partitions`, raised to the file count of its largest table (the
/// runtime's rule, [`dfx_runtime::tables::effective_target_partitions`],
/// which the Python host applies too).
///
/// # Errors
///
/// A `target_partitions` of 0, or a table whose location cannot be listed
/// or holds no file of its format.
pub async fn effective_target_partitions(spec: &SessionSpec) -> Result<usize> {
    Ok(dfx_runtime::tables::effective_target_partitions(spec).await?)
}

/// Partitions of a stage each task runs when a command line names none: a
/// worker's cores (those this process may use), so on one machine a stage
/// planned for its cores runs as one task over all of them.
pub fn default_partitions_per_task() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// A `KEY=VALUE` plugin setting as a command line gives it (`--set`): the
/// key with or without its `dfx_engine.` prefix, both sides trimmed.
///
/// # Errors
///
/// Text without `=`, or with an empty key, quoted in the message.
pub fn parse_engine_option(value: &str) -> std::result::Result<(String, String), String> {
    let (key, setting) = value
        .split_once('=')
        .ok_or_else(|| format!("expected KEY=VALUE, got {value:?}"))?;
    // Either spelling of the key: the plugin's prefix is implied.
    let key = key.trim().trim_start_matches("dfx_engine.");
    if key.is_empty() {
        return Err(format!("expected KEY=VALUE, got {value:?}"));
    }
    Ok((key.to_string(), setting.trim().to_string()))
}
