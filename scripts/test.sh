#!/usr/bin/env bash
# The one test command: everything CI checks, from a fresh clone.
#
# Builds the plugin file first (every host test loads it from disk), then
# lints, then runs the Rust suites (the ABI suite also with a release plugin
# in a debug host and the reverse) and the Python suite. Later steps assume
# the earlier ones: a plugin that does not build fails here, not in a host.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "build the plugin file and the host binary (debug)"
cargo build -p dfx-plugin -p dfx-host

step "format and lint"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings

step "Rust tests: plugin, host (real worker processes), TPC-H"
cargo test --workspace --exclude dfx-ffi-tests

step "ABI suite: debug/debug, then mixed debug/release builds"
ffi-tests/run-suite.sh --mixed

step "Python tests"
python/run-tests.sh
