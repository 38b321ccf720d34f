//! Describe and cut a query's stages: the one step both hosts call between
//! encoding the stages and running them.
//!
//! ```text
//! host:    plan ─► the writers in pre-order ─► each encoded with the host's
//!          session (its codecs; Python's also pickles its UDFs)
//! prepare: each stage described by the plugin from its bytes, its id
//!          checked against its pre-order position ─► each cut for its maps
//!          (a stage file, see [`crate::protocol::stage_file`])
//! run:     Scheduler::run(stages)
//! ```
//!
//! The encoding stays with the host: only its session can encode what its
//! user registered. Everything after it is here, so the two hosts describe
//! and cut a stage the same way.

use dfx_abi::Plugin;

use crate::error::{Result, RuntimeError};
use crate::protocol::stage_file::cut_stages;
use crate::scheduler::graph::EncodedStage;

/// The stages of a plan, from their encoded writers in pre-order: each
/// described by the plugin from its bytes ([`describe`]), then cut for its
/// maps ([`cut_stages`]). What [`crate::Scheduler::run`] takes.
///
/// # Errors
///
/// What [`describe`] and [`cut_stages`] report, each naming the stage.
pub fn prepare(plugin: &Plugin, encoded: Vec<Vec<u8>>) -> Result<Vec<EncodedStage>> {
    let stages = describe(plugin, encoded)?;
    // Each task carries only the files its map reads, so a task's plan does
    // not grow with the stage's file count.
    cut_stages(plugin, stages)
}

/// The stages of a plan from their encoded writers in pre-order, described
/// by the plugin from the bytes themselves, not yet cut.
///
/// # Errors
///
/// Bytes the plugin cannot describe, or a stage whose id is not the one
/// its pre-order position gives ([`check_numbering`]).
pub fn describe(plugin: &Plugin, encoded: Vec<Vec<u8>>) -> Result<Vec<EncodedStage>> {
    encoded
        .into_iter()
        .enumerate()
        .map(|(index, bytes)| {
            let expected = plugin.stage_id(index);
            let info = plugin.encoded_stage_info(&bytes).map_err(|err| {
                RuntimeError::Invalid(format!(
                    "cannot describe stage {expected} (writer {} in pre-order): {}",
                    index + 1,
                    err.strip_backtrace()
                ))
            })?;
            check_numbering(index, expected, info.stage_id)?;
            Ok(EncodedStage {
                info: info.into(),
                bytes,
            })
        })
        .collect()
}

/// Refuse a stage whose id is not the one its pre-order position gives:
/// the host and the plugin would then name different files for it.
///
/// # Errors
///
/// [`RuntimeError::Invalid`] naming both ids.
pub fn check_numbering(index: usize, expected: u64, found: u64) -> Result<()> {
    if found == expected {
        return Ok(());
    }
    Err(RuntimeError::Invalid(format!(
        "stage numbering disagrees: writer {} in pre-order should be stage {expected} but the \
         plugin says it is stage {found}; the host and the plugin would name different files \
         for it",
        index + 1
    )))
}
