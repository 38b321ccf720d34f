#!/usr/bin/env bash
# The one test command: everything CI checks, from a fresh clone.
#
# Checks the format and the layout (scripts/check-layout.py), then builds
# the plugin file (every host test loads it from disk) and the host, then
# runs the Rust suites and the Python suite (whose host, datafusion-python,
# is a release build loading the debug plugin: the optimized/debug pairing
# CI keeps, see ffi-tests/README.md). Later steps assume the earlier ones: a
# plugin that does not build fails here, not in a host.
# Every step prints how long it took, and the summary at the end lists them.
set -euo pipefail
cd "$(dirname "$0")/.."

# Clippy lints every workspace crate as it is compiled for the tests, rather
# than in a `cargo clippy` pass of its own: that pass checks all of DataFusion
# a second time (check-mode artifacts are not the build's: other file hashes),
# minutes on a 2-core machine. This is how `cargo clippy` itself works (a
# wrapper for workspace crates, lint flags in CLIPPY_ARGS), over `cargo build`
# and `cargo test` instead of `cargo check`; dependencies are compiled by plain
# rustc and shared with every other step. The lints are those of
# `cargo clippy --workspace --all-targets -- -D warnings`: each target of each
# crate is compiled by some step below (libraries with their tests, binaries,
# examples, integration tests, the test plugins, the Python module).
if ! clippy_driver="$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver)"; then
    echo "scripts/test.sh: clippy-driver not found; install it with 'rustup component add clippy'" >&2
    exit 1
fi
export RUSTC_WORKSPACE_WRAPPER="$clippy_driver"
# `-D warnings`, spelled as cargo clippy hands it to clippy-driver (each
# argument followed by the separator).
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"

timings=()
step_name=""
step_start=$SECONDS
run_start=$SECONDS

# End the current step: print and record its elapsed seconds.
end_step() {
    [[ -n "$step_name" ]] || return 0
    local took=$((SECONDS - step_start))
    printf '== %s: %d s\n' "$step_name" "$took"
    timings+=("$(printf '%6d s  %s%s' "$took" "$step_name" "${1:-}")")
    step_name=""
}

# Start a step named "$*" (ending the previous one).
step() {
    end_step
    step_name="$*"
    step_start=$SECONDS
    printf '\n== %s\n' "$step_name"
}

# At exit, even a failed one: every step's time, the failed step marked.
summary() {
    local status=$?
    if ((status != 0)); then
        end_step "  (failed, exit $status)"
    else
        end_step
    fi
    printf '\n== step times\n'
    ((${#timings[@]} == 0)) || printf '%s\n' "${timings[@]}"
    printf '%6d s  total\n' "$((SECONDS - run_start))"
}
trap summary EXIT

step "format"
cargo fmt --all -- --check

step "layout: no import circle, no file over 600 lines"
# The self-test first: a check that cannot find a planted circle would pass
# anything.
python3 scripts/check-layout.py --self-test
python3 scripts/check-layout.py

step "features: one feature set per dependency across the builds below"
# A crate with two feature sets compiles, with everything above it, twice:
# for libc or tokio that is all of DataFusion.
python3 scripts/check-features.py

step "build the plugin files and the host binary (debug, linted)"
# The test-hooks plugin first (the host's fault-injection tests load it as
# well as the ABI suite), then the shipped one and everything else.
ffi-tests/build-plugins.sh
cargo build -p dfx-plugin -p dfx-host --all-targets

step "Rust tests: plugin, host (real worker processes), TPC-H, plan shapes (linted)"
# The shell's and the progress line's tests drive a real terminal with tmux,
# and fail (they do not skip) without it.
command -v tmux >/dev/null || (apt-get update && apt-get install -y tmux)
# A plan-shape snapshot that differs or is missing fails, whatever the
# environment says: INSTA_UPDATE=always would accept any plan in silence.
INSTA_UPDATE=no INSTA_FORCE_PASS=0 cargo test --workspace --exclude dfx-ffi-tests

step "ABI suite: debug host and plugin"
DFX_PLUGINS_BUILT=1 ffi-tests/run-suite.sh

step "Python tests (the module linted as it is built)"
# The simulated cluster's latency between nodes redirects each node's
# inbound connections with nft; its tests fail (they do not skip) without it.
command -v nft >/dev/null || (apt-get update && apt-get install -y nftables)
python/run-tests.sh
