//! A test-only dfx plugin declaring the previous `datafusion-ffi` major.
//!
//! Its layout and dfx ABI version are right, so only the DataFusion major
//! check can refuse it. Never called into by a correct host.

#[path = "../../refusing.rs"]
mod refusing;

use abi_stable::export_root_module;
use dfx_abi::{DFX_ABI_VERSION, DfxPluginRef};

/// The root module: one `datafusion-ffi` major behind this build's (FFI
/// structs of another major have other layouts).
#[export_root_module]
pub fn root_module() -> DfxPluginRef {
    refusing::refusing_module(DFX_ABI_VERSION, datafusion_ffi::version() - 1)
}
