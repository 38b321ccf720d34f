#!/usr/bin/env bash
# The ABI suite's test command: build every plugin file it loads, then run it.
#
#   ffi-tests/run-suite.sh            debug host, debug plugin
#   ffi-tests/run-suite.sh --optimized-plugin
#                                     also: debug host + `ci-release` plugin
#                                     (optimized, no debug assertions; see
#                                     README.md for why this pairing)
#   ffi-tests/run-suite.sh --mixed    also: debug host + release plugin, and
#                                     release host + debug plugin
#
# Every test loads the plugin from disk: target/<profile>/libdfx_plugin.so next
# to the test executable, or the file named by DFX_PLUGIN (and the test-hooks
# build from DFX_PLUGIN_TEST_HOOKS). The mixed runs use those variables to hand
# each host the other profile's plugin. Every test file runs even when an
# earlier one fails (--no-fail-fast), so one run reports every failure.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
target="$(cd "$(dirname "$target")" && pwd)/$(basename "$target")"

# scripts/test.sh builds the debug plugins before the host tests (they load
# the test-hooks one too) and says so, rather than flip the plugin's
# features twice more here.
[[ -n "${DFX_PLUGINS_BUILT:-}" ]] || ffi-tests/build-plugins.sh
cargo test -p dfx-ffi-tests --no-fail-fast

if [[ "${1:-}" == "--optimized-plugin" ]]; then
    # Only the plugin files in the other profile: the debug test executables
    # just built load them, so no test code is compiled again.
    ffi-tests/build-plugins.sh --plugin-only ci-release
    echo "=== mixed: debug host, ci-release plugin"
    DFX_PLUGIN="$target/ci-release/libdfx_plugin.so" \
    DFX_PLUGIN_TEST_HOOKS="$target/ci-release/test-hooks/libdfx_plugin.so" \
        cargo test -p dfx-ffi-tests --no-fail-fast
fi

if [[ "${1:-}" == "--mixed" ]]; then
    # Plain rustc for the release builds, even under scripts/test.sh's clippy
    # wrapper (clippy-driver turns MIR optimizations off).
    plain=(env -u RUSTC_WORKSPACE_WRAPPER -u CLIPPY_ARGS)
    "${plain[@]}" ffi-tests/build-plugins.sh --release
    echo "=== mixed: debug host, release plugin"
    DFX_PLUGIN="$target/release/libdfx_plugin.so" \
    DFX_PLUGIN_TEST_HOOKS="$target/release/test-hooks/libdfx_plugin.so" \
        cargo test -p dfx-ffi-tests --no-fail-fast
    echo "=== mixed: release host, debug plugin"
    DFX_PLUGIN="$target/debug/libdfx_plugin.so" \
    DFX_PLUGIN_TEST_HOOKS="$target/debug/test-hooks/libdfx_plugin.so" \
        "${plain[@]}" cargo test --release -p dfx-ffi-tests --no-fail-fast
fi
