//! The version checks of the handshake, and the error that reports them.

use std::fmt;
use std::path::PathBuf;

/// The dfx ABI version: bumped whenever the meaning of a root-module field or
/// of an exported function's arguments changes.
pub const DFX_ABI_VERSION: u32 = 3;

/// The DataFusion major this build's `datafusion-ffi` structs belong to.
///
/// FFI structs are only compatible within one major, so a host refuses a
/// plugin whose major differs from this.
pub fn host_datafusion_ffi_major() -> u64 {
    datafusion_ffi::version()
}

/// Which step of the handshake refused a plugin file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadCheck {
    /// The file could not be opened as a shared library.
    Open,
    /// The library does not export a dfx root module.
    NotADfxPlugin,
    /// `abi_stable`'s library header or version numbers are incompatible.
    AbiStableVersion,
    /// The root module's layout differs from the one this host expects.
    RootModuleLayout,
    /// The plugin's root-module initializer failed.
    RootModuleInit,
    /// The plugin declares another dfx ABI version.
    DfxAbiVersion,
    /// The plugin was built against another DataFusion major.
    DataFusionMajor,
}

impl fmt::Display for LoadCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LoadCheck::Open => "open",
            LoadCheck::NotADfxPlugin => "dfx root module",
            LoadCheck::AbiStableVersion => "abi_stable version",
            LoadCheck::RootModuleLayout => "root module layout",
            LoadCheck::RootModuleInit => "root module initializer",
            LoadCheck::DfxAbiVersion => "dfx ABI version",
            LoadCheck::DataFusionMajor => "datafusion-ffi major",
        })
    }
}

/// A plugin file refused by [`crate::load()`]: which check failed, and both
/// sides' values.
#[derive(Debug, Clone)]
pub struct LoadError {
    /// The file that was refused.
    pub path: PathBuf,
    /// The check that failed.
    pub check: LoadCheck,
    /// What this host expected.
    pub expected: String,
    /// What the plugin file had.
    pub found: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "dfx plugin {} refused at the {} check: this host expects {}, the file has {}",
            self.path.display(),
            self.check,
            self.expected,
            self.found
        )
    }
}

impl std::error::Error for LoadError {}

/// Compare the two versions a plugin declares with this host's.
pub(crate) fn check_versions(
    path: &std::path::Path,
    plugin_abi: u32,
    plugin_major: u64,
) -> Result<(), LoadError> {
    if plugin_abi != DFX_ABI_VERSION {
        return Err(LoadError {
            path: path.to_path_buf(),
            check: LoadCheck::DfxAbiVersion,
            expected: format!("dfx ABI version {DFX_ABI_VERSION}"),
            found: format!("dfx ABI version {plugin_abi}"),
        });
    }
    let host_major = host_datafusion_ffi_major();
    if plugin_major != host_major {
        return Err(LoadError {
            path: path.to_path_buf(),
            check: LoadCheck::DataFusionMajor,
            expected: format!("datafusion-ffi major {host_major}"),
            found: format!("datafusion-ffi major {plugin_major}"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn matching_versions_pass() {
        check_versions(
            Path::new("p.so"),
            DFX_ABI_VERSION,
            host_datafusion_ffi_major(),
        )
        .unwrap();
    }

    #[test]
    fn another_abi_version_names_both_sides() {
        let err = check_versions(
            Path::new("p.so"),
            DFX_ABI_VERSION + 1,
            host_datafusion_ffi_major(),
        )
        .unwrap_err();
        assert_eq!(err.check, LoadCheck::DfxAbiVersion);
        let message = err.to_string();
        assert!(
            message.contains(&format!("dfx ABI version {DFX_ABI_VERSION}")),
            "{message}"
        );
        assert!(
            message.contains(&format!("dfx ABI version {}", DFX_ABI_VERSION + 1)),
            "{message}"
        );
        assert!(message.contains("p.so"), "{message}");
    }

    #[test]
    fn another_major_names_both_sides() {
        let err = check_versions(Path::new("p.so"), DFX_ABI_VERSION, 54).unwrap_err();
        assert_eq!(err.check, LoadCheck::DataFusionMajor);
        let message = err.to_string();
        assert!(message.contains("datafusion-ffi major 54"), "{message}");
        assert!(
            message.contains(&format!(
                "datafusion-ffi major {}",
                host_datafusion_ffi_major()
            )),
            "{message}"
        );
    }
}
