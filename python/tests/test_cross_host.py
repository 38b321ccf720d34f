"""Cross-host: stages move between this package and the Rust host's ``dfx``.

The two hosts are built against different DataFusion 55 minors (the wheel of
datafusion-python, and the workspace's), and both load the same plugin file.
A stage encoded by one must decode and run in the other, for a SQL-only query.

Runs when the workspace has built ``target/debug/dfx`` (``cargo build -p
dfx-host``); skipped otherwise.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest
from conftest import FILES, SQL_ONLY, as_rows, assert_same

from dfx_engine import _internal
from dfx_engine.driver import run_distributed, run_local
from dfx_engine.session import SessionSpec, build_session

if TYPE_CHECKING:
    from collections.abc import Callable

DFX = pathlib.Path(
    os.environ.get(
        "DFX_HOST_BINARY",
        pathlib.Path(__file__).resolve().parents[2] / "target" / "debug" / "dfx",
    )
)

pytestmark = pytest.mark.skipif(
    not DFX.is_file(),
    reason=f"the Rust host binary {DFX} is not built (cargo build -p dfx-host)",
)

HAND_ANSWER = [
    {"flag": "A", "n": 3, "qty": 90},
    {"flag": "B", "n": 3, "qty": 130},
    {"flag": "R", "n": 2, "qty": 140},
]


def test_python_driver_rust_workers(make_spec: Callable[..., SessionSpec]) -> None:
    spec = make_spec()
    result = run_distributed(SQL_ONLY, spec, worker_command=[str(DFX), "worker"])
    assert result.tasks == [(1, p) for p in range(FILES)]
    assert as_rows(result.batches) == HAND_ANSWER
    # Each file holds two flags, so each partial aggregate has two rows.
    assert result.task_rows == dict.fromkeys(result.tasks, 2)
    assert_same(as_rows(result.batches), as_rows(run_local(SQL_ONLY, spec)))


def test_rust_driver_python_workers(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    spec = make_spec()
    shuffle_dir = pathlib.Path(spec.shuffle_dir)
    done = subprocess.run(
        [
            str(DFX),
            "run",
            "--plugin",
            _internal.plugin_path(),
            "--table",
            f"lineitem={spec.tables['lineitem']}",
            "--partitions",
            str(spec.target_partitions),
            "--shuffle-dir",
            str(shuffle_dir),
            "--format",
            "json",
            SQL_ONLY,
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    rust_answer = json.loads(done.stdout)
    assert rust_answer == HAND_ANSWER

    # Drop what the Rust workers published and run the Rust driver's tasks
    # with Python workers: each decodes a stage the Rust host encoded.
    for published in shuffle_dir.glob(_internal.partition_glob()):
        published.unlink()
    envelopes = sorted((shuffle_dir / "tasks").glob("task-*.json"))
    assert len(envelopes) == FILES
    for envelope in envelopes:
        worker = subprocess.run(
            [sys.executable, "-m", "dfx_engine.worker", str(envelope)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert worker.returncode == 0, worker.stderr
        report = json.loads(worker.stdout.strip().splitlines()[-1])
        assert report["rows"] == 2
    assert len(list(shuffle_dir.glob(_internal.partition_glob()))) == FILES

    # The Python session's final merge reads the files the Python workers
    # wrote for the Rust-encoded stages.
    ctx, _engine = build_session(spec)
    assert as_rows(ctx.sql(SQL_ONLY).collect()) == rust_answer
