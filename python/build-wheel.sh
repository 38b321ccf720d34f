#!/usr/bin/env bash
# Build the dfx-engine wheel with the dfx plugin inside, the wheel a Ray
# cluster's nodes (or any machine) install:
#
#   python/build-wheel.sh [--dev] [OUT_DIR]
#
# Release profile by default; --dev builds the debug profile (what the tests
# install: no optimized DataFusion to compile). The wheel goes to OUT_DIR
# (default: python/dist), replacing an earlier dfx-engine wheel there, and
# its path is the last line printed. It is `pip wheel ./python` through the
# package's build backend (build_backend/dfx_build.py), which builds the plugin
# crate with cargo and bundles it; `pip install ./python` does the same.
#
# Needs python3 (3.10 or later, with pip; or PYTHON=...) and cargo.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
profile=release
out="$here/dist"
for arg in "$@"; do
    case "$arg" in
    --dev) profile=dev ;;
    -h | --help)
        sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    -*)
        echo "build-wheel.sh: unknown option $arg (want --dev, or an output directory)" >&2
        exit 2
        ;;
    *) out="$arg" ;;
    esac
done

mkdir -p "$out"
rm -f "$out"/dfx_engine-*.whl
# --strip applies to the extension module maturin compiles, not to the
# bundled plugin, which is copied as cargo built it.
MATURIN_PEP517_ARGS="--profile $profile --strip" \
    "$python" -m pip wheel --quiet --no-deps --wheel-dir "$out" "$here"
wheels=("$out"/dfx_engine-*.whl)
if [[ ! -f "${wheels[0]}" ]]; then
    echo "build-wheel.sh: pip reported success but left no dfx_engine wheel in $out" >&2
    exit 1
fi
echo "${wheels[0]}"
