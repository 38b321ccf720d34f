//! Handshake and refusal: the real plugin file loads and declares its
//! versions; every other file is refused at the right check, with an error
//! naming both sides, and without the host ever calling into the library.

use std::path::Path;

use dfx_abi::{DFX_ABI_VERSION, LoadCheck, LoadError, host_datafusion_ffi_major};
use dfx_ffi_tests::locate::{plugin, plugin_path, test_library, test_library_calls};

/// Load `path`, which must be refused; returns the error.
fn refused(path: &Path) -> LoadError {
    match dfx_abi::load(path) {
        Ok(plugin) => panic!("{} was accepted as {plugin:?}", path.display()),
        Err(err) => err,
    }
}

/// The message names the file, the check and both sides' values.
fn assert_names(err: &LoadError, check: LoadCheck, expected: &str, found: &str) {
    let message = err.to_string();
    assert_eq!(err.check, check, "{message}");
    assert!(
        message.contains(&err.path.display().to_string()),
        "no file in: {message}"
    );
    assert!(
        message.contains(&check.to_string()),
        "no check in: {message}"
    );
    assert!(message.contains(expected), "no `{expected}` in: {message}");
    assert!(message.contains(found), "no `{found}` in: {message}");
}

#[test]
fn real_plugin_loads_and_declares_its_versions() {
    let plugin = plugin();
    assert_eq!(plugin.path(), plugin_path());
    assert_eq!(plugin.abi_version(), DFX_ABI_VERSION);
    assert_eq!(plugin.datafusion_ffi_major(), host_datafusion_ffi_major());
    assert_eq!(plugin.datafusion_ffi_major(), datafusion_ffi::version());
    assert_eq!(plugin.name(), "dfx-plugin");
    assert_eq!(plugin.stage_node_name(), "ShuffleWriterExec");
    assert_eq!(plugin.reader_node_name(), Some("ShuffleReaderExec"));
    assert_eq!(plugin.codec_id(), "dfx_engine.physical.v5");
    assert_eq!(plugin.config_prefix(), "dfx_engine");
    // The exchange's exports are all present (appended after ABI version 1's).
    let module = plugin.module();
    assert!(module.stage_info().is_some(), "no stage_info");
    assert!(
        module.encoded_stage_info().is_some(),
        "no encoded_stage_info"
    );
    assert!(module.bucket_path().is_some(), "no bucket_path");
}

#[test]
fn a_file_that_is_not_a_shared_library_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("libgarbage.so");
    std::fs::write(&path, b"this is not an ELF file, just some bytes\n").unwrap();
    let err = refused(&path);
    assert_names(
        &err,
        LoadCheck::Open,
        "a loadable shared library",
        "libgarbage.so",
    );
}

#[test]
fn a_missing_file_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let err = refused(&dir.path().join("libabsent.so"));
    assert_names(
        &err,
        LoadCheck::Open,
        "a loadable shared library",
        "libabsent.so",
    );
}

#[test]
fn a_shared_library_without_a_root_module_is_not_a_dfx_plugin() {
    let path = test_library("dfx_test_not_a_plugin");
    let err = refused(&path);
    assert_names(
        &err,
        LoadCheck::NotADfxPlugin,
        "a dfx plugin",
        "not a dfx plugin",
    );
    assert_eq!(
        test_library_calls(&path).constructors,
        0,
        "the host called into the library"
    );
}

#[test]
fn another_dfx_abi_version_is_refused_without_calling_in() {
    let path = test_library("dfx_test_wrong_abi");
    let err = refused(&path);
    assert_names(
        &err,
        LoadCheck::DfxAbiVersion,
        &format!("dfx ABI version {DFX_ABI_VERSION}"),
        &format!("dfx ABI version {}", DFX_ABI_VERSION + 1),
    );
    // The initializer only builds the table of declared values; no function
    // of the refused plugin may run.
    assert_eq!(
        test_library_calls(&path).constructors,
        0,
        "the host called into the library"
    );
}

#[test]
fn another_datafusion_ffi_major_is_refused_without_calling_in() {
    let path = test_library("dfx_test_wrong_major");
    let host = host_datafusion_ffi_major();
    let err = refused(&path);
    assert_names(
        &err,
        LoadCheck::DataFusionMajor,
        &format!("datafusion-ffi major {host}"),
        &format!("datafusion-ffi major {}", host - 1),
    );
    assert_eq!(
        test_library_calls(&path).constructors,
        0,
        "the host called into the library"
    );
}

#[test]
fn another_root_module_layout_is_refused_before_its_initializer_runs() {
    let path = test_library("dfx_test_wrong_layout");
    let err = refused(&path);
    assert_names(
        &err,
        LoadCheck::RootModuleLayout,
        "dfx root module layout",
        "incompatible layout",
    );
    // abi_stable compares the static layout description: not even the
    // initializer of the wrong module is run.
    assert_eq!(
        test_library_calls(&path),
        dfx_ffi_tests::locate::TestLibraryCalls {
            root: 0,
            constructors: 0
        },
        "the host called into the library"
    );
}

#[test]
fn refusing_twice_gives_the_same_answer() {
    // A host may retry; a refused library must stay refused (abi_stable
    // caches a loaded module per library, not per type).
    let path = test_library("dfx_test_wrong_abi");
    assert_eq!(refused(&path).check, LoadCheck::DfxAbiVersion);
    assert_eq!(refused(&path).check, LoadCheck::DfxAbiVersion);
}

#[test]
fn a_root_module_of_abi_version_one_is_refused_without_calling_in() {
    // The prefix of ABI version 1: no `bucket_path` and no
    // `reader_node_name`, `partition_path` naming its last argument
    // `partition`, `encoded_stage_info` returning that version's
    // `DfxStagePayload`. abi_stable's prefix-type check refuses a root module
    // with fewer fields than the host's (19, against every field of the
    // current module) and names each field whose type changed, all before
    // the declared ABI version 1 is even read.
    let path = test_library("dfx_test_older_root");
    let err = refused(&path);
    assert_names(
        &err,
        LoadCheck::RootModuleLayout,
        "dfx root module layout",
        "incompatible layout",
    );
    let message = err.to_string();
    for culprit in [
        "too many fields",
        "encoded_stage_info",
        "DfxStagePayload",
        "partition_path",
    ] {
        assert!(message.contains(culprit), "no `{culprit}` in: {message}");
    }
    // Refused from the static layout description: neither the initializer
    // nor any function (least of all a field the file lacks) ran.
    assert_eq!(
        test_library_calls(&path),
        dfx_ffi_tests::locate::TestLibraryCalls {
            root: 0,
            constructors: 0
        },
        "the host called into the library"
    );
}

#[test]
fn a_newer_root_module_with_a_trailing_field_loads_and_works() {
    let path = test_library("dfx_test_newer_root");
    let plugin = dfx_abi::load(&path).unwrap_or_else(|err| panic!("refused: {err}"));
    assert_eq!(plugin.abi_version(), DFX_ABI_VERSION);
    assert_eq!(plugin.name(), "dfx-test-plugin-newer-root");
    assert_eq!(plugin.stage_node_name(), "ShuffleWriterExec");
    assert_eq!(plugin.reader_node_name(), Some("ShuffleReaderExec"));
    assert_eq!(plugin.codec_id(), "dfx_engine.physical.v5");
    assert_eq!(plugin.config_prefix(), "dfx_engine");
    // A field the host does not know is not an error.
    let calls = test_library_calls(&path);
    assert_eq!(calls.root, 1, "the initializer ran once");
    let before = calls.constructors;
    assert_eq!(plugin.stage_id(2), 3);
    assert_eq!(
        plugin.marker_path(Path::new("/s"), 1, 2),
        Path::new("/s/stage-1/map-2.json")
    );
    assert_eq!(
        plugin.bucket_path(Path::new("/s"), 1, 2, 3).unwrap(),
        Path::new("/s/stage-1/map-2.arrow")
    );
    assert_eq!(plugin.partition_glob(), "stage-*");
    let counters = plugin.counters();
    assert_eq!(
        (counters.planner_calls, counters.live_objects),
        (11, 15),
        "{counters:?}"
    );
    let info = plugin.encoded_stage_info(b"/shuffle").unwrap();
    assert_eq!(info.shuffle_dir.as_str(), "/shuffle");
    assert_eq!(info.deps.as_slice(), &[4, 5]);
    // The last field the host knows: nothing recorded, an empty list.
    assert_eq!(plugin.take_failures("/shuffle"), Ok(Vec::new()));
    assert_eq!(
        plugin.session_settings(),
        Ok(vec![(
            "datafusion.optimizer.repartition_file_scans".to_string(),
            "false".to_string()
        )])
    );
    // The last fields the host knows (an id: no call).
    assert_eq!(plugin.logical_codec_id(), Some("dfx_engine.logical.v1"));
    // Each of the eight calls above ran the library's function, and nothing
    // else was called (the appended function would count too).
    assert_eq!(test_library_calls(&path).constructors, before + 8);
}
