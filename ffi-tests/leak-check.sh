#!/usr/bin/env bash
# Leak check of the ABI suite: runs the tests that load the real plugin file
# under valgrind memcheck and fails on any definitely-lost block.
#
# Separate from the suite's test command because it is slow (see README.md for
# the measured duration). Needs valgrind, and the plugin files the suite needs
# (run ffi-tests/run-suite.sh first, or pass --build to build them here).
#
#   ffi-tests/leak-check.sh [--build] [extra cargo test filters...]
#
# The accepted leaks, each with its reason, are in ffi-tests/valgrind.supp.
# Worker processes spawned by the codec/functions tests are not traced (they
# exit right after their report); the host process is.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--build" ]]; then
    shift
    ffi-tests/build-plugins.sh
fi
command -v valgrind >/dev/null || { echo "leak-check: valgrind is not installed" >&2; exit 2; }

logs="$(mktemp -d)"
runner="valgrind --leak-check=full --errors-for-leak-kinds=definite --error-exitcode=99"
runner+=" --suppressions=$PWD/ffi-tests/valgrind.supp --log-file=$logs/memcheck.%p.log"
start=$(date +%s)
status=0
# One thread at a time: valgrind serializes threads anyway, and the reports
# stay readable. The suite's own threads (lifetimes) still run concurrently.
CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$runner" \
    cargo test --no-fail-fast -p dfx-ffi-tests --tests "$@" -- --test-threads=1 || status=$?
echo "leak-check: $(( $(date +%s) - start ))s, valgrind logs in $logs"
grep -h "definitely lost:" "$logs"/*.log | sort | uniq -c || true
if [[ $status -ne 0 ]]; then
    echo "leak-check: FAILED (exit status $status); see the logs above" >&2
fi
exit $status
