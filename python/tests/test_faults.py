"""Faults through the Python driver: a worker SIGKILLed mid-write, many times.

The Python driver's side of the Rust host's ``host/tests/faults.rs``. The
plugin's ``test-hooks`` build kills the worker that has just written its
k-th batch into a map file (``DFX_TEST_KILL_AFTER_BATCHES=K:FLAG``, read by
``plugin/src/test_hooks.rs``): SIGKILL from inside the writer, so the kill
always lands mid-write, as a crash or the OOM killer would, with no
destructor run and the temp file left behind. Only the first task to get
there dies (the one that creates FLAG, just before the kill); its retry, and
every other task, runs through.

The driver is ``run_distributed`` with the package's own plugin; only the
workers load the test-hooks build, each run from a fresh :class:`WorkerPool`
whose command sets the hook's variable: Python workers (the package's
``python -m dfx_engine.worker --serve``) are pointed at it by ``DFX_PLUGIN``,
Rust ``dfx worker --serve`` processes by ``--plugin``. The test-hooks plugin
is ``ffi-tests/build-plugins.sh``'s (see :func:`conftest.hooks_plugin`); the
tests fail without it, and the Rust workers' without the ``dfx`` binary.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import DFX, alive, as_rows, hooks_plugin, require_dfx, split_map_file
from test_retries import assert_one_retry

from dfx_engine import _internal
from dfx_engine.driver import (
    DistributedResult,
    WorkerPool,
    python_worker,
    run_distributed,
)
from dfx_engine.session import SessionSpec

SELF_JOIN = "SELECT count(*) AS n, sum(a.v) AS s FROM t a JOIN t b ON a.k = b.k"
"""Every key meets its own row; every row of ``t`` is written by a scan stage."""

FILES = 4
ROWS_PER_FILE = 30_000

KILL_ENV = "DFX_TEST_KILL_AFTER_BATCHES"
"""The test-hooks plugin's kill point, ``K:FLAG``."""

SEED_ENV = "DFX_FAULT_SEED"
"""Replays a run of kill points; the Rust test reads the same variable."""

RUNS = 50


def numbers_table(directory: pathlib.Path) -> pathlib.Path:
    """Table ``t``: ``FILES`` Parquet files of ``ROWS_PER_FILE`` rows each.

    ``k`` runs 0, 1, 2, ... over all files (unique), ``v = k % 7``; the Rust
    test's fixture, row for row.
    """
    table = directory / "t"
    table.mkdir()
    for index in range(FILES):
        keys = range(index * ROWS_PER_FILE, (index + 1) * ROWS_PER_FILE)
        columns = {
            "k": pa.array(keys, pa.int64()),
            "v": pa.array([k % 7 for k in keys], pa.int64()),
        }
        pq.write_table(pa.table(columns), table / f"part-{index}.parquet")
    return table


def self_join_expected() -> list[dict[str, int]]:
    """``SELF_JOIN``'s answer, by hand: every key once, ``k % 7`` summed."""
    total = FILES * ROWS_PER_FILE
    return [{"n": total, "s": sum(k % 7 for k in range(total))}]


class Lcg:
    """The Rust test's LCG, so one ``DFX_FAULT_SEED`` gives both the same kills."""

    def __init__(self, seed: int) -> None:
        """A generator at ``seed`` (taken modulo 2**64)."""
        self.state = seed % 2**64

    def below(self, bound: int) -> int:
        """The next number in ``0..bound``."""
        self.state = (
            self.state * 6_364_136_223_846_793_005 + 1_442_695_040_888_963_407
        ) % 2**64
        return (self.state >> 33) % bound


def killing_worker(kind: str, kill: str) -> list[str]:
    """The command of a ``kind`` worker loading the test-hooks plugin, ``kill`` set."""
    return hooked_worker(kind, f"{KILL_ENV}={kill}")


def hooked_worker(kind: str, setting: str) -> list[str]:
    """The command of a ``kind`` worker loading the test-hooks plugin, ``setting`` set.

    ``env`` execs the worker, so the pool's pid is the worker's own.
    """
    hooks = hooks_plugin()
    if kind == "python":
        return ["env", f"DFX_PLUGIN={hooks}", setting, *python_worker()]
    return ["env", setting, str(DFX), "worker", "--plugin", str(hooks)]


def assert_published_whole(
    shuffle_dir: str, result: DistributedResult, where: str
) -> None:
    """Nothing partial is published: every map's file is whole.

    Each ends with its marker, which describes the segments before it
    exactly (segments that tile them) and counts the rows its task reported.
    Temp files a killed attempt left behind do not count: no reader ever
    opens a name that is not final.
    """
    for info in result.stages:
        for map_index in range(info.maps):
            task = (info.stage_id, map_index)
            path = pathlib.Path(_internal.marker_path(shuffle_dir, *task))
            data, marker = split_map_file(path)
            label = f"{where}: {path}"
            rows = sum(bucket["rows"] for bucket in marker["buckets"])
            assert rows == result.task_rows[task], label
            assert len(data) == marker["bytes"], f"{label} is not what its marker says"
            segments = sorted(
                (segment["offset"], segment["bytes"])
                for bucket in marker["buckets"]
                for segment in bucket["segments"]
            )
            # The segments, in file order, cover it end to end.
            at = 0
            for offset, size in segments:
                assert offset == at, f"{label}: a gap or an overlap at {at}"
                at += size
            assert at == len(data), f"{label}: bytes no segment holds"


@pytest.mark.parametrize("kind", ["python", "rust"], ids=lambda k: f"{k}-workers")
def test_fifty_runs_each_with_a_worker_killed_at_a_random_batch_all_answer_right(
    tmp_path: pathlib.Path, kind: str
) -> None:
    if kind == "rust":
        require_dfx()
    seed_text = os.environ.get(SEED_ENV)
    seed = int(seed_text) if seed_text else time.time_ns()
    # Shown with the failure (pytest prints a failing test's output): rerun
    # with it to replay the same kill points.
    print(f"{SEED_ENV}={seed}")
    random = Lcg(seed)
    table = numbers_table(tmp_path)
    expected = self_join_expected()
    for run in range(RUNS):
        # Each map of the scan stage reads one file and writes its rows as
        # DataFusion's 8192-row batches, one segment each: 3 full and one of
        # 5424. A kill point in 1..=4 lands in every run, in whichever map
        # gets there first.
        k = 1 + random.below(4)
        where = f"run {run} ({SEED_ENV}={seed}, k {k}, {kind} workers)"
        print(where)
        flag = tmp_path / f"killed-{run}"
        shuffle = tmp_path / f"shuffle-{run}"
        spec = SessionSpec(tables={"t": str(table)}, shuffle_dir=str(shuffle))
        with WorkerPool(worker_command=killing_worker(kind, f"{k}:{flag}")) as pool:
            result = run_distributed(SELF_JOIN, spec, pool=pool)
            workers = pool.pids()
        assert as_rows(result.batches) == expected, where
        # The kill landed (the hook makes the flag just before it), mid-task,
        # and only that task ran again, as attempt 1.
        assert flag.exists(), f"{where}: no worker was killed"
        task = assert_one_retry(result.attempts, result.retries, "SIGKILL")
        assert result.reports[task].attempt == 1, where
        assert_published_whole(spec.shuffle_dir, result, where)
        # Closing the pool ended every worker it held.
        assert [pid for pid in workers if alive(pid)] == [], where
        shutil.rmtree(shuffle)


SLOW_ENV = "DFX_TEST_SLOW_PUBLISH"
"""The test-hooks plugin's straggler: ``NAME:MILLIS:FLAG``."""


@pytest.mark.parametrize("kind", ["python", "rust"], ids=lambda k: f"{k}-workers")
def test_a_straggling_map_is_overtaken_by_its_speculative_twin(
    tmp_path: pathlib.Path, kind: str
) -> None:
    if kind == "rust":
        require_dfx()
    table = numbers_table(tmp_path)
    flag = tmp_path / "slowed"
    # The first attempt anywhere to publish a map 1 (a scan stage's) waits a
    # minute first; its twin, finding the flag taken, does not.
    command = hooked_worker(kind, f"{SLOW_ENV}=1-map-1.arrow:60000:{flag}")
    shuffle = tmp_path / "shuffle"
    spec = SessionSpec(tables={"t": str(table)}, shuffle_dir=str(shuffle))
    with WorkerPool(max_workers=3, worker_command=command) as pool:
        result = run_distributed(SELF_JOIN, spec, pool=pool, speculate=2.0)
        workers = pool.pids()
    assert as_rows(result.batches) == self_join_expected()
    assert flag.exists(), "the straggler never got to its publish"
    twice = [task for task, made in result.attempts.items() if made == 2]
    assert len(twice) == 1, result.attempts
    stage_id, map_index = twice[0]
    assert map_index == 1, result.attempts
    assert result.reports[twice[0]].attempt == 1, result.retries
    name = f"stage {stage_id} map 1 attempt 1"
    assert any(r.startswith(f"{name}: speculative") for r in result.retries), (
        result.retries
    )
    won = f"{name}: published first; the first attempt was stopped"
    assert won in result.retries, result.retries
    assert_published_whole(spec.shuffle_dir, result, "speculation")
    assert [pid for pid in workers if alive(pid)] == []


def test_a_speculation_factor_not_above_one_is_refused(tmp_path: pathlib.Path) -> None:
    spec = SessionSpec(tables={}, shuffle_dir=str(tmp_path / "shuffle"))
    with pytest.raises(ValueError, match="above 1"):
        run_distributed("SELECT 1", spec, speculate=1.0)
