//! A test-only plugin whose root module carries the dfx name and version but
//! another layout: the version fields are swapped in width and the
//! constructors are missing. `abi_stable`'s layout check must refuse it
//! before its initializer runs, which the exported counters prove.

use std::sync::atomic::{AtomicU64, Ordering};

use abi_stable::library::RootModule;
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::sabi_types::VersionStrings;
use abi_stable::std_types::RStr;
use abi_stable::{
    StableAbi, declare_root_module_statics, export_root_module, package_version_strings,
};

/// Calls of the root-module initializer: must stay zero.
#[unsafe(no_mangle)]
pub static DFX_TEST_ROOT_CALLS: AtomicU64 = AtomicU64::new(0);

/// Calls of any exported function: must stay zero.
#[unsafe(no_mangle)]
pub static DFX_TEST_CONSTRUCTOR_CALLS: AtomicU64 = AtomicU64::new(0);

/// A root module with the dfx plugin's name and another layout.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = DfxPluginRef)))]
pub struct DfxPlugin {
    /// Wider than dfx-abi's `u32`.
    pub dfx_abi_version: u64,
    /// Narrower than dfx-abi's `u64`.
    pub datafusion_ffi_major: u32,
    /// A plain string where dfx-abi has the plugin name.
    #[sabi(last_prefix_field)]
    pub plugin_name: RStr<'static>,
}

impl RootModule for DfxPluginRef {
    declare_root_module_statics! {DfxPluginRef}
    // The same names as dfx-abi's root module, so only the layout differs.
    const BASE_NAME: &'static str = "dfx_plugin";
    const NAME: &'static str = "dfx_plugin";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}

/// The root module; never run by a correct host.
#[export_root_module]
pub fn root_module() -> DfxPluginRef {
    DFX_TEST_ROOT_CALLS.fetch_add(1, Ordering::SeqCst);
    DfxPlugin {
        dfx_abi_version: 1,
        datafusion_ffi_major: 55,
        plugin_name: RStr::from_str("wrong-layout"),
    }
    .leak_into_prefix()
}
