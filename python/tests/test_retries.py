"""Retries: a task whose worker died, hung or lost upstream output runs again.

Real worker processes, the real plugin file; a worker is killed by its real
pid, and a map's published output is really deleted.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import threading
import time
from typing import TYPE_CHECKING

import pytest
from conftest import (
    REVENUE_SQL,
    SQL_ONLY,
    alive,
    as_rows,
    assert_revenue,
    losing_worker,
    read_marker,
)
from test_pool import UDF_ANSWER, UDF_SQL, probe

from dfx_engine import _internal
from dfx_engine.driver import WORKER_MODES, encode_stages, run_distributed
from dfx_engine.session import build_session

if TYPE_CHECKING:
    from collections.abc import Callable

    import pyarrow as pa
    from datafusion.user_defined import ScalarUDF

    from dfx_engine.session import SessionSpec


def blocking_once(scratch: pathlib.Path) -> tuple[ScalarUDF, pathlib.Path]:
    """A ``py_probe`` whose first call, in any worker, blocks until killed.

    Returns the UDF and the file the blocked worker writes its pid to; every
    other call (a retry included) passes its input through.
    """
    claim, pid_file, fifo = (str(scratch / n) for n in ("claim", "pid", "fifo"))
    os.mkfifo(fifo)

    def block_once(values: pa.Array) -> pa.Array:
        try:
            os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return values
        pathlib.Path(pid_file + ".tmp").write_text(str(os.getpid()))
        pathlib.Path(pid_file + ".tmp").rename(pid_file)
        # Nobody writes the FIFO: this blocks until the worker is killed.
        pathlib.Path(fifo).read_text()
        return values

    return probe(block_once), pathlib.Path(pid_file)


def blocked_pid(pid_file: pathlib.Path) -> int:
    """The pid the blocked worker wrote, once it has."""
    while not pid_file.exists():
        time.sleep(0.05)
    return int(pid_file.read_text())


def assert_one_retry(
    attempts: dict[tuple[int, int], int], retries: list[str], because: str
) -> tuple[int, int]:
    """Exactly one task ran twice, for ``because``; that task."""
    retried = [task for task, made in attempts.items() if made > 1]
    assert len(retried) == 1, attempts
    (task,) = retried
    assert attempts[task] == 2
    stage, map_index = task
    assert len(retries) == 1, retries
    assert retries[0].startswith(f"stage {stage} map {map_index} attempt 0: ")
    assert because in retries[0]
    return task


def stage_infos(spec: SessionSpec, sql: str) -> list[_internal.StageInfo]:
    """The stages ``sql`` is cut into under ``spec``, as the plugin says."""
    ctx, _engine = build_session(spec)
    plans = encode_stages(ctx, ctx.sql(sql).execution_plan())
    return [_internal.encoded_stage_info(plan) for plan in plans]


@pytest.mark.parametrize("mode", WORKER_MODES)
def test_a_task_whose_worker_is_killed_runs_again_and_the_answer_is_right(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path, mode: str
) -> None:
    block, pid_file = blocking_once(tmp_path)
    killed: list[int] = []

    def kill_the_blocked_worker() -> None:
        pid = blocked_pid(pid_file)
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    killer = threading.Thread(target=kill_the_blocked_worker, daemon=True)
    killer.start()
    spec = make_spec(split="aggregate")
    result = run_distributed(UDF_SQL, spec, [block], worker_mode=mode, max_workers=2)
    killer.join(timeout=60)
    assert as_rows(result.batches) == UDF_ANSWER
    stage, map_index = assert_one_retry(result.attempts, result.retries, "SIGKILL")
    assert not alive(killed[0])
    # The retry was attempt 1, and its worker was told so.
    assert result.reports[(stage, map_index)].attempt == 1
    if mode == "process":
        # A process is given a file: the retry's is a copy with its number.
        retry = pathlib.Path(spec.shuffle_dir) / "tasks"
        retry /= f"task-{stage}-{map_index}.attempt-1.json"
        assert json.loads(retry.read_text())["attempt"] == 1
        first = retry.with_name(f"task-{stage}-{map_index}.json")
        assert json.loads(first.read_text())["attempt"] == 0
    # The retry published the map whole: its marker counts what it reported.
    marker = read_marker(spec.shuffle_dir, stage, map_index)
    assert (
        sum(b["rows"] for b in marker["buckets"])
        == result.task_rows[(stage, map_index)]
    )


@pytest.mark.parametrize("mode", WORKER_MODES)
def test_a_task_past_its_timeout_is_killed_and_runs_again(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path, mode: str
) -> None:
    block, pid_file = blocking_once(tmp_path)
    spec = make_spec(split="aggregate")
    result = run_distributed(
        UDF_SQL, spec, [block], worker_mode=mode, max_workers=2, task_timeout=10
    )
    assert as_rows(result.batches) == UDF_ANSWER
    assert_one_retry(result.attempts, result.retries, "timed out after 10s")
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)


def test_a_worker_killed_on_every_attempt_fails_after_max_attempts(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    spec = make_spec(split="aggregate")
    # A worker that dies by a signal every time: another attempt never helps.
    dying = tmp_path / "dying.sh"
    dying.write_text('#!/bin/sh\nkill -9 "$$"\n')
    dying.chmod(0o755)
    with pytest.raises(RuntimeError) as raised:
        run_distributed(
            SQL_ONLY,
            spec,
            worker_command=[str(dying)],
            worker_mode="process",
            max_attempts=3,
        )
    message = str(raised.value)
    assert "4 of 4 worker task(s) failed" in message
    for map_index in range(4):
        assert (
            f"stage 1 map {map_index} failed 3 attempts; the last was killed by "
            "signal 9 (SIGKILL)"
        ) in message
    # Each attempt had its own numbered envelope; there was no fourth.
    tasks = pathlib.Path(spec.shuffle_dir) / "tasks"
    assert (tasks / "task-1-0.attempt-2.json").is_file()
    assert not (tasks / "task-1-0.attempt-3.json").exists()


def counting(scratch: pathlib.Path, error: str) -> ScalarUDF:
    """``py_probe`` failing with ``error``, each call leaving a file behind."""
    calls = str(scratch)
    scratch.mkdir()

    def fail(values: pa.Array) -> pa.Array:
        (pathlib.Path(calls) / f"{os.getpid()}-{time.monotonic_ns()}").touch()
        raise ValueError(error)

    return probe(fail)


@pytest.mark.parametrize("mode", WORKER_MODES)
@pytest.mark.parametrize(
    "error",
    [
        "py_probe refuses this batch",
        # The plugin's words for lost output, in a message: still the UDF's
        # own error, final, since no driver reads a message to decide.
        "dfx stage 2 map 3: lost output: file missing",
    ],
)
def test_an_error_the_worker_reports_is_not_retried(
    make_spec: Callable[..., SessionSpec],
    tmp_path: pathlib.Path,
    mode: str,
    error: str,
) -> None:
    calls = tmp_path / "calls"
    failing = counting(calls, error)
    with pytest.raises(RuntimeError) as raised:
        run_distributed(
            UDF_SQL, make_spec(split="aggregate"), [failing], worker_mode=mode
        )
    message = str(raised.value)
    assert "4 of 4 worker task(s) failed" in message
    assert error in message
    assert "attempts" not in message
    # One call per task: none ran twice.
    assert len(list(calls.iterdir())) == 4


@pytest.mark.parametrize("mode", WORKER_MODES)
def test_lost_upstream_output_is_run_again_before_its_reader(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path, mode: str
) -> None:
    spec = make_spec()
    infos = stage_infos(make_spec(), REVENUE_SQL)
    reader = next(info for info in infos if info.deps)
    lost_stage = reader.deps[0]
    # Lose what map 1 of a stage the reader reads published (its one file,
    # holding its buckets and its marker), just before the reader's stage
    # starts.
    command = losing_worker(
        tmp_path / "losing", spec.shuffle_dir, (lost_stage, 1), before=reader.stage_id
    )
    result = run_distributed(
        REVENUE_SQL,
        spec,
        worker_command=command,
        worker_mode=mode,
        max_workers=1,
    )
    assert_revenue(as_rows(result.batches))
    assert (tmp_path / "losing" / "claimed").is_file()
    # The lost map ran once more (not once per reader that missed it), and
    # the reader that missed it ran again after it.
    assert result.attempts[(lost_stage, 1)] == 2
    # Readers are handed the maps' layouts and read only buckets holding
    # rows: the first to miss the file is the reader (one per bucket, no
    # coalescing) of the map's first bucket with rows, as republished.
    marker = _internal.marker_path(spec.shuffle_dir, lost_stage, 1)
    assert pathlib.Path(marker).is_file()
    buckets = read_marker(spec.shuffle_dir, lost_stage, 1)["buckets"]
    first = next(index for index, bucket in enumerate(buckets) if bucket["rows"])
    reran = [r for r in result.retries if "run again" in r]
    assert reran == [
        f"stage {lost_stage} map 1 attempt 1: run again, its output was lost "
        f"(read by stage {reader.stage_id} map {first})"
    ]
    readers = [r for r in result.retries if "run again" not in r]
    assert readers
    assert all(
        r.startswith(f"stage {reader.stage_id} map {first} attempt 0: ")
        for r in readers
    )


@pytest.mark.parametrize("mode", WORKER_MODES)
def test_output_lost_to_the_root_is_run_again_and_the_root_read_again(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path, mode: str
) -> None:
    spec = make_spec()
    # Stage 1, the first writer in pre-order, is what the root reads: its
    # first map holding rows is lost once the last of its maps has run (the
    # root, handed the layouts, reads no map published empty).
    command = losing_worker(
        tmp_path / "losing", spec.shuffle_dir, (1, None), after_last_of=1
    )
    result = run_distributed(
        REVENUE_SQL, spec, worker_command=command, worker_mode=mode, max_workers=1
    )
    assert_revenue(as_rows(result.batches))
    lost = int((tmp_path / "losing" / "claimed").read_text())
    assert result.attempts[(1, lost)] == 2
    assert result.retries == [
        f"stage 1 map {lost} attempt 1: run again, its output was lost (read by "
        "the query's root)"
    ]
    assert pathlib.Path(_internal.marker_path(spec.shuffle_dir, 1, lost)).is_file()
