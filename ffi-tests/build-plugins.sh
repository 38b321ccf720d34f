#!/usr/bin/env bash
# Build every plugin file the ABI suite loads, for one cargo profile:
#
#   ffi-tests/build-plugins.sh [--release]
#
# - the shipped plugin, target/<profile>/libdfx_plugin.so;
# - the same plugin built with its `test-hooks` feature (the panic probe
#   panics), kept as target/<profile>/test-hooks/libdfx_plugin.so;
# - the test-only plugins of ffi-tests/plugins/ (wrong ABI version, wrong
#   DataFusion major, wrong root-module layout, not a plugin at all, round
#   1's older root module, a newer root module with one more field).
#
# The test-hooks build is done FIRST and the shipped plugin rebuilt after it,
# so target/<profile>/libdfx_plugin.so is always the plugin without hooks when
# this script returns.
set -euo pipefail
cd "$(dirname "$0")/.."

profile_flag=()
profile_dir=debug
if [[ "${1:-}" == "--release" ]]; then
    profile_flag=(--release)
    profile_dir=release
fi
target="${CARGO_TARGET_DIR:-target}/$profile_dir"

# Every build here also selects dfx-ffi-tests, so cargo unifies features exactly
# as for the suite's own `cargo test -p dfx-ffi-tests`: the DataFusion stack is
# compiled once per profile, not once for the plugin and again for the tests.
cargo build "${profile_flag[@]}" -p dfx-ffi-tests -p dfx-plugin --features dfx-plugin/test-hooks
mkdir -p "$target/test-hooks"
# Copy then rename: a reader never maps a half-written library.
cp "$target/libdfx_plugin.so" "$target/test-hooks/libdfx_plugin.so.tmp"
mv "$target/test-hooks/libdfx_plugin.so.tmp" "$target/test-hooks/libdfx_plugin.so"

cargo build "${profile_flag[@]}" \
    -p dfx-ffi-tests \
    -p dfx-plugin \
    -p dfx-test-plugin-wrong-abi \
    -p dfx-test-plugin-wrong-major \
    -p dfx-test-plugin-wrong-layout \
    -p dfx-test-plugin-not-a-plugin \
    -p dfx-test-plugin-older-root \
    -p dfx-test-plugin-newer-root
