//! Support for the ABI compatibility suite.
//!
//! Every test loads a dfx plugin **file** from disk through [`dfx_abi::load`]:
//! this crate never links the plugin's rlib, so each test crosses a real
//! library boundary with real symbol export and real layouts. The modules:
//!
//! - [`locate`]: where the plugin file and the test-only plugins are;
//! - [`session`]: a minimal host session wired to the plugin;
//! - [`fixtures`]: small Parquet tables whose answers are known by hand;
//! - [`plans`]: finding stages, encoding them, running them.

pub mod fixtures;
pub mod locate;
pub mod plans;
pub mod session;
