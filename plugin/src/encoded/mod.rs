//! Encoded plans without decoding them: a plan cut into its stages
//! ([`split_plan`]), and each stage cut for its maps.
//!
//! Each map task carries its own files: an encoded stage cut so that a
//! task's plan names only the file groups its map reads.
//!
//! A stage over a table of N files scans N file groups (one partition per
//! file), and map M runs partition M. Shipped whole, every task of the stage
//! would carry, vet and decode all N groups: N² for the stage. So the driver
//! cuts each encoded stage once ([`cut_stage`]) into
//!
//! ```text
//! shared part: the stage, each scan a map reads replaced by
//!     MapScanExec (map UNCUT, N partitions) ── the scan with no file group
//! per map M:   the file group of each such scan that map M reads
//!     (its "map files", a few hundred bytes for a one-file group)
//! ```
//!
//! and a worker puts its map's groups back in ([`stage_for_map`]): its plan
//! holds `MapScanExec (map M, N partitions, runs p) ── scan (group p)`,
//! which declares the N partitions of the scan it stands for, so every
//! operator above it runs as planned, and fails any partition but `p`
//! rather than read nothing.
//!
//! Which partition of a scan map M reads follows from the plan, node by
//! node from the writer down ([`Reads`]): most operators run partition p
//! from partition p of their inputs; a union runs it from one input, at an
//! offset; a collected build side, a merge or a repartition reads every
//! partition of its input, so a scan below one stays whole; and a reader
//! has nothing below it (the stage it reads is published already, and
//! [`split_plan`] took it out). The cut
//! works on the encoded protobuf, not on a decoded plan: it moves file
//! groups and never decodes an expression, so no host function is needed.
//!
//! A worker that runs a stage under a memory limit it cannot enforce itself
//! seals the stage's input ([`seal_stage_input`]): the writer's input as one
//! node the plugin decodes and runs alone (see [`crate::exec::sealed_input`]).

mod assemble;
mod cut;
mod map_files;
mod seal;
mod split;
mod walk;

pub use assemble::stage_for_map;
pub use cut::{CutStage, MIN_GROUPS_TO_CUT, cut_stage};
pub use map_files::{MAP_FILES_MAGIC, MAP_FILES_VERSION};
pub use seal::seal_stage_input;
pub use split::split_plan;
pub(crate) use walk::{Reads, child_reads, children_mut, find_payload, is_file_scan};

#[cfg(test)]
mod tests;
