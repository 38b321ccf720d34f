//! The handshake: [`load`] opens a plugin file and checks it before
//! anything in it is called.

use std::path::Path;

use abi_stable::library::{LibraryError, RootModule, lib_header_from_path};

use crate::compat::{self, LoadCheck, LoadError};
use crate::module::DfxPluginRef;
use crate::plugin::Plugin;

/// The file name a plugin build produces on this platform (`libdfx_plugin.so`
/// on Linux).
pub fn plugin_file_name() -> String {
    format!(
        "{}{}{}",
        std::env::consts::DLL_PREFIX,
        DfxPluginRef::BASE_NAME,
        std::env::consts::DLL_SUFFIX
    )
}

/// Load the dfx plugin at `path`, performing the whole handshake.
///
/// # Errors
///
/// A [`LoadError`] naming the check that failed, with what this host expected
/// and what the file had. A refused library is never called into.
pub fn load(path: &Path) -> Result<Plugin, LoadError> {
    let refuse = |check: LoadCheck, expected: &str, found: String| LoadError {
        path: path.to_path_buf(),
        check,
        expected: expected.to_string(),
        found,
    };
    let header = lib_header_from_path(path).map_err(|err| match err {
        LibraryError::OpenError { err, .. } => refuse(
            LoadCheck::Open,
            "a loadable shared library",
            err.to_string(),
        ),
        LibraryError::GetSymbolError { err, .. } => refuse(
            LoadCheck::NotADfxPlugin,
            "a dfx plugin (an exported abi_stable root module)",
            format!("not a dfx plugin: {err}"),
        ),
        other => refuse(
            LoadCheck::AbiStableVersion,
            "a compatible abi_stable library header",
            other.to_string(),
        ),
    })?;
    let module = header
        .init_root_module::<DfxPluginRef>()
        .map_err(|err| match err {
            LibraryError::AbiInstability(err) => refuse(
                LoadCheck::RootModuleLayout,
                "the dfx root module layout of this host's dfx-abi",
                format!("an incompatible layout: {err}"),
            ),
            LibraryError::IncompatibleVersionNumber {
                expected_version,
                actual_version,
                ..
            } => refuse(
                LoadCheck::AbiStableVersion,
                &format!("dfx-abi {expected_version}"),
                format!("dfx-abi {actual_version}"),
            ),
            LibraryError::RootModule { err, .. } => refuse(
                LoadCheck::RootModuleInit,
                "a root module that initializes",
                err.to_string(),
            ),
            other => refuse(
                LoadCheck::AbiStableVersion,
                "a compatible abi_stable library",
                other.to_string(),
            ),
        })?;
    compat::check_versions(
        path,
        module.dfx_abi_version(),
        module.datafusion_ffi_major(),
    )?;
    Ok(Plugin::new(path.to_path_buf(), module))
}
