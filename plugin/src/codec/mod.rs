//! The plugin's codecs: how its nodes and its in-memory tables cross a
//! process boundary.
//!
//! - [`physical`]: [`DfxPhysicalCodec`], every dfx node (the payloads are
//!   [`crate::wire`]'s);
//! - [`join_filter`]: the body of the two join filter nodes' payload;
//! - [`reader`]: what a reader promises its consumer, in its payload;
//! - [`logical`]: [`DfxLogicalCodec`], an in-memory table carried by value
//!   into the plugin's planner.

pub mod join_filter;
pub mod logical;
pub mod physical;
pub mod reader;

pub use logical::{DfxLogicalCodec, LOGICAL_CODEC_ID};
pub use physical::DfxPhysicalCodec;
