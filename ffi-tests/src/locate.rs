//! Where the plugin files under test are.
//!
//! The real plugin is `libdfx_plugin.so` in the test executable's profile
//! directory (`target/<profile>/`, the parent of `target/<profile>/deps/`),
//! unless `DFX_PLUGIN` names another file: that is how the mixed-build runs
//! point a debug host at a release plugin and the reverse. The test-only
//! plugins are always taken from the test executable's own profile directory.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use abi_stable::library::RawLibrary;
use dfx_abi::Plugin;

/// The environment variable naming the plugin file to test.
pub const PLUGIN_ENV: &str = "DFX_PLUGIN";

/// The profile directory of the running executable: `target/<profile>/`.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable has a path");
    let dir = exe.parent().expect("the test executable is in a directory");
    // Test binaries live in target/<profile>/deps, binaries in target/<profile>.
    if dir.file_name().is_some_and(|name| name == "deps") {
        dir.parent().expect("deps has a parent").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// The real plugin file under test (`DFX_PLUGIN`, else the profile directory's).
pub fn plugin_path() -> PathBuf {
    match std::env::var_os(PLUGIN_ENV) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => profile_dir().join(dfx_abi::plugin_file_name()),
    }
}

/// The real plugin, loaded once per process.
///
/// # Panics
///
/// When the file is missing or refused: every test that needs it must fail
/// loudly rather than skip.
pub fn plugin() -> &'static Plugin {
    static PLUGIN: OnceLock<Plugin> = OnceLock::new();
    PLUGIN.get_or_init(|| {
        let path = plugin_path();
        assert!(
            path.exists(),
            "the plugin file {} does not exist: build it with `cargo build -p dfx-plugin` \
             (or set {PLUGIN_ENV})",
            path.display()
        );
        dfx_abi::load(&path).unwrap_or_else(|err| panic!("the real plugin was refused: {err}"))
    })
}

/// The environment variable naming the `test-hooks` build of the plugin.
pub const TEST_HOOKS_ENV: &str = "DFX_PLUGIN_TEST_HOOKS";

/// The plugin built with its `test-hooks` feature (its panic probe panics, and
/// it registers `dfx_test_panic`): `DFX_PLUGIN_TEST_HOOKS`, else
/// `<profile dir>/test-hooks/libdfx_plugin.so`, which
/// `ffi-tests/build-plugins.sh` builds.
pub fn test_hooks_plugin_path() -> PathBuf {
    match std::env::var_os(TEST_HOOKS_ENV) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => profile_dir()
            .join("test-hooks")
            .join(dfx_abi::plugin_file_name()),
    }
}

/// The `test-hooks` plugin, loaded once per process.
///
/// # Panics
///
/// When the file is missing or refused: a test of panics must fail loudly,
/// never skip, when the build that makes them is absent.
pub fn test_hooks_plugin() -> &'static Plugin {
    static PLUGIN: OnceLock<Plugin> = OnceLock::new();
    PLUGIN.get_or_init(|| {
        let path = test_hooks_plugin_path();
        assert!(
            path.exists(),
            "{} does not exist: build the plugin with `--features test-hooks` and copy it there \
             (ffi-tests/build-plugins.sh does), or set {TEST_HOOKS_ENV}",
            path.display()
        );
        dfx_abi::load(&path)
            .unwrap_or_else(|err| panic!("the test-hooks plugin was refused: {err}"))
    })
}

/// The test-only library whose crate builds `lib<name>.so` (for example
/// `dfx_test_wrong_abi`), from the profile directory.
///
/// # Panics
///
/// When the file is missing, naming the cargo command that builds it.
pub fn test_library(lib_name: &str) -> PathBuf {
    let path = profile_dir().join(format!(
        "{}{lib_name}{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ));
    assert!(
        path.exists(),
        "the test plugin {} does not exist: build the workspace first (`cargo build --workspace`)",
        path.display()
    );
    path
}

/// How often a test-only library was entered, read from its exported
/// counters `DFX_TEST_ROOT_CALLS` and `DFX_TEST_CONSTRUCTOR_CALLS`.
///
/// Reads data symbols only: finding out never calls into the library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestLibraryCalls {
    /// Runs of the root-module initializer.
    pub root: u64,
    /// Calls of any other exported function.
    pub constructors: u64,
}

/// Read the call counters of the test-only library at `path`.
pub fn test_library_calls(path: &Path) -> TestLibraryCalls {
    use std::sync::atomic::{AtomicU64, Ordering};
    // Opening again returns the same handle (the loader refcounts by file), so
    // these are the very statics the refused load saw.
    let library = RawLibrary::load_at(path).expect("the test library opens");
    let read = |symbol: &[u8]| {
        // SAFETY: every test-only library exports these names as
        // `static AtomicU64`; a data symbol's address is a pointer to it.
        unsafe {
            let pointer = library
                .get::<*const AtomicU64>(symbol)
                .expect("the test library exports its call counters");
            (**pointer).load(Ordering::SeqCst)
        }
    };
    TestLibraryCalls {
        root: read(b"DFX_TEST_ROOT_CALLS\0"),
        constructors: read(b"DFX_TEST_CONSTRUCTOR_CALLS\0"),
    }
}

/// Copy the real plugin file into `dir` and load the copy.
///
/// A copy is a distinct file, so the dynamic loader maps it as a second,
/// independent library with its own statics (counters included): tests that
/// count plugin-side objects use their own copy, so tests running beside them
/// in this process cannot disturb the count.
///
/// # Panics
///
/// When the copy cannot be written or is refused.
pub fn load_copy(dir: &Path) -> Plugin {
    std::fs::create_dir_all(dir).expect("create the copy's directory");
    let copy = dir.join(dfx_abi::plugin_file_name());
    std::fs::copy(plugin_path(), &copy).expect("copy the plugin file");
    dfx_abi::load(&copy).unwrap_or_else(|err| panic!("the copied plugin was refused: {err}"))
}
