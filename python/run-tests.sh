#!/usr/bin/env bash
# Build the dfx Python package against the workspace's plugin file and run its
# checks: ruff, mypy, then pytest.
#
# Run from anywhere; expects `cargo build -p dfx-plugin` to have produced
# target/debug/libdfx_plugin.so (the README's test command does that first).
# Creates python/.venv on first use. Needs only python3.11 (with venv and pip)
# and cargo.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
# One target directory for the whole workspace, so the wheel build reuses the
# DataFusion the other crates already compiled.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
python="${PYTHON:-python3.11}"
venv="$here/.venv"
plugin="$CARGO_TARGET_DIR/debug/libdfx_plugin.so"
# The Rust host for the cross-host tests, which fail without it unless
# DFX_SKIP_CROSS_HOST=1.
export DFX_HOST_BINARY="${DFX_HOST_BINARY:-$CARGO_TARGET_DIR/debug/dfx}"

if [[ ! -f "$plugin" ]]; then
    echo "run-tests.sh: $plugin is missing; run 'cargo build -p dfx-plugin' first" >&2
    exit 1
fi

if [[ ! -x "$DFX_HOST_BINARY" && "${DFX_SKIP_CROSS_HOST:-}" != 1 ]]; then
    echo "run-tests.sh: building $DFX_HOST_BINARY for the cross-host tests" >&2
    (cd "$root" && cargo build -p dfx-host --bin dfx)
fi

if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
# ray: the Ray executor's tests start a local Ray (the `ray` extra's pin).
"$venv/bin/python" -m pip install --quiet \
    "maturin>=1.7,<2" "datafusion==55.0.0" pyarrow pytest cloudpickle ruff mypy \
    "ray==2.60.0"

# Bundle the plugin beside the package so the wheel carries it; the file is
# ignored by git (python/.gitignore).
cp "$plugin" "$here/dfx_engine/libdfx_plugin.so"

wheels="$CARGO_TARGET_DIR/wheels"
rm -rf "$wheels/dfx_engine-"*.whl
(cd "$here" && "$venv/bin/maturin" build --profile dev --out "$wheels" \
    --interpreter "$venv/bin/python" --compatibility linux --strip --quiet)
"$venv/bin/python" -m pip install --quiet --force-reinstall --no-deps \
    "$wheels"/dfx_engine-*.whl

"$venv/bin/ruff" check "$here"
"$venv/bin/ruff" format --check "$here"
# The package ships py.typed: its annotations are checked, strictly.
(cd "$here" && "$venv/bin/mypy")
# From the repository root, through the pytest script rather than
# `python -m pytest`: neither puts python/ on sys.path, so the tests and their
# worker processes import the installed wheel, not the source tree (which has
# no native module), and a test module is not importable by a worker.
cd "$root"
exec "$venv/bin/pytest" -c "$here/pyproject.toml" -p no:cacheprovider "$here/tests" "$@"
