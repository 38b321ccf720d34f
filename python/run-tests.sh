#!/usr/bin/env bash
# Build the dfx Python package against the workspace's plugin file and run its
# checks: ruff, mypy, then pytest.
#
# Run from anywhere. The wheel is built by build-wheel.sh --dev, the debug
# variant of the documented release command, which builds the plugin with
# cargo (a no-op after the README's `cargo build -p dfx-plugin`) and bundles
# it. Creates python/.venv on first use. Needs only python3.11 (with venv and
# pip) and cargo.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
# One target directory for the whole workspace, so the wheel build reuses the
# DataFusion the other crates already compiled.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
python="${PYTHON:-python3.11}"
venv="$here/.venv"
# The Rust host for the cross-host tests, which fail without it unless
# DFX_SKIP_CROSS_HOST=1.
export DFX_HOST_BINARY="${DFX_HOST_BINARY:-$CARGO_TARGET_DIR/debug/dfx}"

if [[ ! -x "$DFX_HOST_BINARY" && "${DFX_SKIP_CROSS_HOST:-}" != 1 ]]; then
    echo "run-tests.sh: building $DFX_HOST_BINARY for the cross-host tests" >&2
    (cd "$root" && cargo build -p dfx-host --bin dfx)
fi

if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
# pandas: DataFrame.to_pandas() on a driving session.
# ray: the Ray executor's tests start a local Ray (the `ray` extra's pin).
# moto[server]: the S3 tests' endpoint, a local moto_server (boto3 with it).
# tpcgen-cli: the TPC-DS data of test_tpcds.py; duckdb with its tpcds
# extension: the 99 query texts it ships (no engine of the comparison).
"$venv/bin/python" -m pip install --quiet \
    "maturin>=1.7,<2" "datafusion==55.0.0" pyarrow pandas pytest cloudpickle ruff mypy \
    "ray==2.60.0" "moto[server]>=5,<6" \
    "tpcgen-cli==4.0.0" "duckdb==1.5.5" "duckdb-extension-tpcds==1.5.5"

# The wheel the tests install, built as a user builds one; test_wheel.py also
# installs it into a fresh virtual environment.
DFX_WHEEL="$(PYTHON="$venv/bin/python" "$here/build-wheel.sh" --dev \
    "$CARGO_TARGET_DIR/wheels" | tail -n 1)"
export DFX_WHEEL
"$venv/bin/python" -m pip install --quiet --force-reinstall --no-deps "$DFX_WHEEL"

"$venv/bin/ruff" check "$here"
"$venv/bin/ruff" format --check "$here"
# The package ships py.typed: its annotations are checked, strictly.
(cd "$here" && "$venv/bin/mypy")
# From the repository root, through the pytest script rather than
# `python -m pytest`: neither puts python/ on sys.path, so the tests and their
# worker processes import the installed wheel, not the source tree (which has
# no native module), and a test module is not importable by a worker.
cd "$root"
exec "$venv/bin/pytest" -c "$here/pyproject.toml" -p no:cacheprovider --durations=15 "$here/tests" "$@"
