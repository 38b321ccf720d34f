#!/usr/bin/env bash
# Build every plugin file the ABI suite loads, for one cargo profile:
#
#   ffi-tests/build-plugins.sh [--release]
#   ffi-tests/build-plugins.sh --plugin-only PROFILE
#
# - the shipped plugin, target/<profile>/libdfx_plugin.so;
# - the same plugin built with its `test-hooks` feature (the panic probe
#   panics), kept as target/<profile>/test-hooks/libdfx_plugin.so;
# - the test-only plugins of ffi-tests/plugins/ (wrong ABI version, wrong
#   DataFusion major, wrong root-module layout, not a plugin at all, the
#   older root module of ABI version 1, a newer root module with one more
#   field).
#
# `--plugin-only PROFILE` builds only the first two, in cargo profile PROFILE
# (CI's `ci-release`), for a host of another profile to load: the test-only
# plugins and the test executables come from the host's own profile.
#
# The test-hooks build is done FIRST and the shipped plugin rebuilt after it,
# so target/<profile>/libdfx_plugin.so is always the plugin without hooks when
# this script returns.
set -euo pipefail
cd "$(dirname "$0")/.."

profile_flag=()
profile_dir=debug
# Every build here also selects dfx-ffi-tests, so cargo unifies features exactly
# as for the suite's own `cargo test -p dfx-ffi-tests`: the DataFusion stack is
# compiled once per profile, not once for the plugin and again for the tests.
# A plugin-only profile has no tests, so the plugin alone is selected.
suite=(-p dfx-ffi-tests)
case "${1:-}" in
    --release)
        profile_flag=(--release)
        profile_dir=release
        ;;
    --plugin-only)
        profile_flag=(--profile "${2:?--plugin-only needs a cargo profile}")
        profile_dir="$2"
        suite=()
        # Plain rustc, even under scripts/test.sh's clippy wrapper: this file
        # stands for an optimized build, and clippy-driver turns MIR
        # optimizations off.
        unset RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS
        ;;
esac
target="${CARGO_TARGET_DIR:-target}/$profile_dir"

cargo build "${profile_flag[@]}" "${suite[@]}" -p dfx-plugin --features dfx-plugin/test-hooks
mkdir -p "$target/test-hooks"
# Copy then rename: a reader never maps a half-written library.
cp "$target/libdfx_plugin.so" "$target/test-hooks/libdfx_plugin.so.tmp"
mv "$target/test-hooks/libdfx_plugin.so.tmp" "$target/test-hooks/libdfx_plugin.so"

if [[ ${#suite[@]} -eq 0 ]]; then
    cargo build "${profile_flag[@]}" -p dfx-plugin
    exit 0
fi
cargo build "${profile_flag[@]}" \
    "${suite[@]}" \
    -p dfx-plugin \
    -p dfx-test-plugin-wrong-abi \
    -p dfx-test-plugin-wrong-major \
    -p dfx-test-plugin-wrong-layout \
    -p dfx-test-plugin-not-a-plugin \
    -p dfx-test-plugin-older-root \
    -p dfx-test-plugin-newer-root
