"""Cross-host: stages move between this package and the Rust host's ``dfx``.

The two hosts are built against different DataFusion 55 minors (the wheel of
datafusion-python, and the workspace's), and both load the same plugin file.
A stage encoded by one must decode and run in the other, for a SQL-only query.

The Python driver runs the Rust workers long-lived (``dfx worker --serve``)
when the binary offers it, and one process per task otherwise; the pool test
runs only when it does.

Needs the workspace's ``target/debug/dfx`` (``cargo build -p dfx-host``;
``run-tests.sh`` builds it), or the binary ``DFX_HOST_BINARY`` names. Without
it every test here fails, so a CI run cannot pass having tested nothing
across hosts; set ``DFX_SKIP_CROSS_HOST=1`` to skip them instead.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

import pytest
from conftest import (
    SQL_ONLY,
    alive,
    as_rows,
    assert_same,
    assert_same_columns,
    serve_workers_of,
)
from test_worker import encode_stage, write_envelope

from dfx_engine import _internal
from dfx_engine.driver import (
    WorkerPool,
    _Attempts,
    _run_workers,
    execute_plan,
    run_distributed,
    run_local,
    waves_of,
)
from dfx_engine.session import SessionSpec, build_session

if TYPE_CHECKING:
    from collections.abc import Callable

DFX = pathlib.Path(
    os.environ.get(
        "DFX_HOST_BINARY",
        pathlib.Path(__file__).resolve().parents[2] / "target" / "debug" / "dfx",
    )
)


@pytest.fixture(autouse=True)
def _rust_host_binary() -> None:
    """Fail (or, only when asked to, skip) without the Rust host binary."""
    if DFX.is_file():
        return
    missing = f"the Rust host binary {DFX} is not built (cargo build -p dfx-host)"
    if os.environ.get("DFX_SKIP_CROSS_HOST") == "1":
        pytest.skip(missing)
    pytest.fail(f"{missing}; set DFX_SKIP_CROSS_HOST=1 to skip", pytrace=False)


def rust_worker_serves() -> bool:
    """Whether the Rust host's ``dfx worker`` has the long-lived mode."""
    if not DFX.is_file():
        return False
    done = subprocess.run(
        [str(DFX), "worker", "--help"], capture_output=True, text=True, check=False
    )
    return "--serve" in done.stdout


RUST_SERVES = rust_worker_serves()
RUST_MODE = "pool" if RUST_SERVES else "process"
"""How the Python driver runs Rust workers: long-lived if they can be."""


HAND_ANSWER = [
    {"flag": "A", "n": 3, "qty": 90},
    {"flag": "B", "n": 3, "qty": 130},
    {"flag": "R", "n": 2, "qty": 140},
]


@pytest.mark.parametrize("split", ["exchange", "aggregate"])
def test_python_driver_rust_workers(
    make_spec: Callable[..., SessionSpec], split: str
) -> None:
    spec = make_spec(split=split)
    result = run_distributed(
        SQL_ONLY, spec, worker_command=[str(DFX), "worker"], worker_mode=RUST_MODE
    )
    assert sorted(result.tasks) == sorted(
        (info.stage_id, m) for info in result.stages for m in range(info.maps)
    )
    assert as_rows(result.batches) == HAND_ANSWER
    # Each file holds two flags, so each leaf stage's partial aggregate
    # publishes two rows per map.
    for info in result.stages:
        if not info.deps:
            assert all(
                result.task_rows[(info.stage_id, m)] == 2 for m in range(info.maps)
            )
    local = run_local(SQL_ONLY, spec)
    assert_same_columns(result.batches, local)
    assert_same(as_rows(result.batches), as_rows(local))


@pytest.mark.skipif(not RUST_SERVES, reason="dfx worker has no --serve yet")
def test_python_driver_rust_worker_pool_across_queries(
    make_spec: Callable[..., SessionSpec],
) -> None:
    with WorkerPool(max_workers=2, worker_command=[str(DFX), "worker"]) as pool:
        for split in ("exchange", "aggregate", "exchange"):
            spec = make_spec(split=split)
            result = run_distributed(SQL_ONLY, spec, pool=pool)
            assert as_rows(result.batches) == HAND_ANSWER
            assert sum(result.task_rows.values()) > 0
        workers = pool.pids()
        assert len(workers) == 2
        assert all(alive(pid) for pid in workers)
    assert [pid for pid in workers if alive(pid)] == []


@pytest.mark.skipif(not RUST_SERVES, reason="dfx worker has no --serve yet")
def test_a_killed_rust_pooled_worker_fails_its_task_and_is_replaced(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    spec = make_spec(split="aggregate")
    plan, info = encode_stage(spec, SQL_ONLY, tmp_path / "scratch")
    # The envelopes below are for stage 1, the aggregate split's only stage.
    assert info.stage_id == 1
    good = write_envelope(tmp_path / "good.json", spec.to_json(), plan, 1)
    bad = write_envelope(tmp_path / "bad.json", spec.to_json(), plan, 99)
    # The Rust worker blocks opening a FIFO nobody writes, until killed.
    stuck = tmp_path / "stuck.json"
    os.mkfifo(stuck)
    killed: list[int] = []

    def kill_the_only_worker() -> None:
        while not killed:
            for pid in serve_workers_of(os.getpid()):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.05)

    with WorkerPool(max_workers=1, worker_command=[str(DFX), "worker"]) as pool:
        killer = threading.Thread(target=kill_the_only_worker, daemon=True)
        killer.start()
        with pytest.raises(RuntimeError) as raised:
            _run_workers(
                {(1, 0): stuck},
                pool=pool,
                # One attempt: a retry would copy the envelope, and read the FIFO.
                attempts=_Attempts({(1, 0): stuck}, max_attempts=1),
            )
        killer.join(timeout=60)
        message = str(raised.value)
        assert (
            f"stage 1 map 0: worker (pid {killed[0]}) exited with status -9" in message
        )
        assert not alive(killed[0])

        # A task error is reported by the replacement, which then runs a task.
        with pytest.raises(RuntimeError, match="stage 1 map 99"):
            _run_workers({(1, 99): bad}, pool=pool)
        (replacement,) = pool.pids()
        reports = _run_workers({(1, 1): good}, pool=pool)
        assert reports[(1, 1)].rows == 2
        assert reports[(1, 1)].bytes is not None
        assert pool.pids() == [replacement]
        assert replacement != killed[0]
    assert not alive(replacement)


def dfx_run(
    spec: SessionSpec, split: str, cwd: pathlib.Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    """``dfx run`` of ``SQL_ONLY`` with the Rust driver, over ``spec``.

    Its lineitem table, partitions and shuffle directory; JSON on stdout.
    """
    command = [str(DFX), "run", "--plugin", _internal.plugin_path()]
    command += ["--table", f"lineitem={spec.tables['lineitem']}"]
    command += ["--partitions", str(spec.target_partitions)]
    command += ["--shuffle-dir", str(spec.shuffle_dir), "--split", split]
    command += [*extra, "--format", "json", SQL_ONLY]
    return subprocess.run(command, capture_output=True, text=True, check=False, cwd=cwd)


@pytest.mark.parametrize("split", ["exchange", "aggregate"])
def test_rust_driver_python_workers(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path, split: str
) -> None:
    spec = make_spec(split=split)
    shuffle_dir = pathlib.Path(spec.shuffle_dir)
    # Process mode: its envelopes are files, which the Python workers below
    # are given (the pool sends them inline).
    done = dfx_run(spec, split, tmp_path, "--worker-mode", "process")
    assert done.returncode == 0, done.stderr
    rust_answer = json.loads(done.stdout)
    assert rust_answer == HAND_ANSWER

    # Drop what the Rust workers published and run the Rust driver's tasks
    # with Python workers, wave by wave: each decodes a stage the Rust host
    # encoded, and reads what the Python workers of earlier waves wrote.
    for published in shuffle_dir.glob(_internal.partition_glob()):
        shutil.rmtree(published)
    plans = sorted((shuffle_dir / "tasks").glob("stage-*.plan"))
    infos = [_internal.encoded_stage_info(plan.read_bytes()) for plan in plans]
    assert infos
    envelopes = sorted((shuffle_dir / "tasks").glob("task-*.json"))
    assert len(envelopes) == sum(info.maps for info in infos)
    by_stage: dict[int, list[pathlib.Path]] = {}
    for envelope in envelopes:
        by_stage.setdefault(json.loads(envelope.read_text())["stage_id"], []).append(
            envelope
        )
    for wave in waves_of(infos):
        for stage_id in wave:
            for envelope in by_stage[stage_id]:
                worker = subprocess.run(
                    [sys.executable, "-m", "dfx_engine.worker", str(envelope)],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                assert worker.returncode == 0, worker.stderr
                report = json.loads(worker.stdout.strip().splitlines()[-1])
                assert report["stage_id"] == stage_id
    for info in infos:
        for map_index in range(info.maps):
            marker = _internal.marker_path(str(shuffle_dir), info.stage_id, map_index)
            assert pathlib.Path(marker).is_file()

    # A Python session plans the same stages; its root reads the files the
    # Python workers wrote for the Rust-encoded stages.
    ctx, _engine = build_session(spec)
    plan = ctx.sql(SQL_ONLY).execution_plan()
    assert as_rows(execute_plan(ctx, plan)) == rust_answer


@pytest.mark.parametrize("split", ["exchange", "aggregate"])
def test_rust_driver_pool_of_python_serving_workers(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path, split: str
) -> None:
    # The Rust driver's pool sends each envelope inside its request; Python
    # serving workers run them and answer as Rust ones do.
    spec = make_spec(split=split)
    shuffle_dir = pathlib.Path(spec.shuffle_dir)
    python_worker = ["--worker", sys.executable, "--worker-arg", "-m"]
    python_worker += ["--worker-arg", "dfx_engine.worker"]
    done = dfx_run(spec, split, tmp_path, *python_worker)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == HAND_ANSWER
    # Every map was published, and no envelope was written for it.
    assert list(shuffle_dir.glob(_internal.partition_glob()))
    assert not list((shuffle_dir / "tasks").glob("task-*.json"))
