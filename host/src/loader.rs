//! Finding and loading the plugin file.
//!
//! The host links no engine code; everything it knows about stages comes from
//! the one plugin file. Where that file is, in order:
//!
//! 1. the path the caller names (`--plugin PATH`);
//! 2. the `DFX_PLUGIN` environment variable;
//! 3. beside the running executable, so `target/<profile>/dfx` finds
//!    `target/<profile>/libdfx_plugin.so` without being told. A test or
//!    example binary lives one level further down (`target/<profile>/deps`,
//!    `target/<profile>/examples`), so the parent directory is looked at too.
//!
//! The first rule that names a path decides: an explicit path that does not
//! exist is an error, not a reason to go looking elsewhere, because loading a
//! different file than the one asked for would be a silent surprise.

use std::path::{Path, PathBuf};

use dfx_abi::Plugin;

use crate::error::{HostError, Result};

/// Environment variable naming the plugin file.
pub const PLUGIN_ENV: &str = "DFX_PLUGIN";

/// Where a plugin file was found, and by which rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginLocation {
    /// The file.
    pub path: PathBuf,
    /// The rule that produced it, for messages.
    pub via: String,
}

/// Find the plugin file without loading it.
///
/// # Errors
///
/// [`HostError::PluginNotFound`], listing every place looked at.
pub fn locate_plugin(explicit: Option<&Path>) -> Result<PluginLocation> {
    let file = dfx_abi::plugin_file_name();
    let mut looked = Vec::new();
    if let Some(path) = explicit {
        if path.is_file() {
            return Ok(PluginLocation {
                path: path.to_path_buf(),
                via: "--plugin".into(),
            });
        }
        looked.push(format!("{} (--plugin)", path.display()));
        return Err(not_found(&file, looked));
    }
    if let Some(value) = std::env::var_os(PLUGIN_ENV).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(value);
        if path.is_file() {
            return Ok(PluginLocation {
                path,
                via: format!("${PLUGIN_ENV}"),
            });
        }
        looked.push(format!("{} (${PLUGIN_ENV})", path.display()));
        return Err(not_found(&file, looked));
    }
    match std::env::current_exe() {
        Ok(exe) => {
            for dir in exe.parent().into_iter().flat_map(|d| [Some(d), d.parent()]) {
                let Some(dir) = dir else { continue };
                let path = dir.join(&file);
                if path.is_file() {
                    return Ok(PluginLocation {
                        path,
                        via: format!("beside the executable {}", exe.display()),
                    });
                }
                looked.push(format!("{} (beside the executable)", path.display()));
            }
        }
        Err(err) => looked.push(format!(
            "beside the executable (its path is unknown: {err})"
        )),
    }
    Err(not_found(&file, looked))
}

fn not_found(file: &str, looked: Vec<String>) -> HostError {
    HostError::PluginNotFound {
        file: file.to_string(),
        looked: looked.join("; "),
    }
}

/// Find and load the plugin, performing the ABI handshake.
///
/// # Errors
///
/// [`HostError::PluginNotFound`] when no file is found,
/// [`HostError::PluginRefused`] when the handshake refuses it.
pub fn load_plugin(explicit: Option<&Path>) -> Result<Plugin> {
    let location = locate_plugin(explicit)?;
    dfx_abi::load(&location.path).map_err(|source| HostError::PluginRefused {
        via: location.via,
        source,
    })
}
