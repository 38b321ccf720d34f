//! A test-only dfx plugin declaring the next dfx ABI version.
//!
//! Its layout and `datafusion-ffi` major are right, so only the dfx ABI
//! version check can refuse it. Never called into by a correct host.

#[path = "../../refusing.rs"]
mod refusing;

use abi_stable::export_root_module;
use dfx_abi::{DFX_ABI_VERSION, DfxPluginRef};

/// The root module: one dfx ABI version ahead of this build's.
#[export_root_module]
pub fn root_module() -> DfxPluginRef {
    refusing::refusing_module(DFX_ABI_VERSION + 1, datafusion_ffi::version())
}
