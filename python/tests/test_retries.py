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
    read_marker,
)
from test_pool import UDF_ANSWER, UDF_SQL, probe
from test_worker import encode_stage, write_envelope

from dfx_engine import _internal
from dfx_engine.driver import (
    WORKER_MODES,
    _Attempts,
    _read_root,
    _run_workers,
    _write_tasks,
    execute_plan,
    plan_stages,
    reported_failure,
    run_distributed,
    waves_of,
)
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
    # The retry ran from an envelope of its own, numbered.
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
    assert_one_retry(result.attempts, result.retries, "timed out after 10 s")
    assert not alive(int(pid_file.read_text()))


def test_a_worker_killed_on_every_attempt_fails_after_max_attempts(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    spec = make_spec(split="aggregate")
    plan, _info = encode_stage(spec, SQL_ONLY, tmp_path / "scratch")
    # A worker that dies by a signal every time: another attempt never helps.
    dying = tmp_path / "dying.sh"
    dying.write_text('#!/bin/sh\nkill -9 "$$"\n')
    dying.chmod(0o755)
    envelope = write_envelope(tmp_path / "task.json", spec.to_json(), plan, 0)
    attempts = _Attempts({(1, 0): envelope}, max_attempts=3)
    with pytest.raises(RuntimeError) as raised:
        _run_workers(
            {(1, 0): envelope},
            [str(dying)],
            worker_mode="process",
            attempts=attempts,
        )
    message = str(raised.value)
    assert "stage 1 map 0: failed 3 attempts, the last with: stage 1 map 0" in message
    assert "killed by SIGKILL" in message
    assert attempts.made == {(1, 0): 3}
    assert [r.split(":")[0] for r in attempts.retries] == [
        "stage 1 map 0 attempt 0",
        "stage 1 map 0 attempt 1",
    ]


@pytest.mark.parametrize("mode", WORKER_MODES)
def test_an_error_the_worker_reports_is_not_retried(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path, mode: str
) -> None:
    spec = make_spec()
    plan, info = encode_stage(spec, SQL_ONLY, tmp_path / "scratch")
    s = info.stage_id
    bad = write_envelope(tmp_path / "bad.json", spec.to_json(), plan, 99, s)
    attempts = _Attempts({(s, 99): bad})
    with pytest.raises(RuntimeError, match="map 99 does not exist"):
        _run_workers({(s, 99): bad}, worker_mode=mode, attempts=attempts)
    assert attempts.made == {(s, 99): 1}
    assert attempts.retries == []


def test_reported_errors_are_classified_where_they_are_made() -> None:
    # The plugin's words for shuffle storage failing under a task: retried.
    full = reported_failure(
        "stage 2 map 1: failed: dfx stage 2 map 1 bucket 0: I/O failure: cannot "
        "write /s/stage-2/map-1/bucket-0.arrow.tmp: No space left on device"
    )
    assert full.retryable
    assert full.lost is None
    # Lost upstream output: retried after that map runs again.
    lost = reported_failure("dfx stage 1 map 3 bucket 0: lost output: file missing")
    assert (lost.retryable, lost.lost) == (True, (1, 3))
    # An error about the task itself (SQL, schema, a UDF) would recur.
    sql = reported_failure("stage 2 map 0: failed: Schema error: No field named x")
    assert (sql.retryable, sql.lost) == (False, None)


@pytest.mark.parametrize("mode", WORKER_MODES)
def test_lost_upstream_output_is_run_again_before_its_reader(
    make_spec: Callable[..., SessionSpec], mode: str
) -> None:
    spec = make_spec()
    ctx, _engine = build_session(spec)
    plan = ctx.sql(REVENUE_SQL).execution_plan()
    stages = plan_stages(ctx, plan)
    envelopes = _write_tasks(stages, spec, pathlib.Path(spec.shuffle_dir) / "tasks")
    attempts = _Attempts(
        {task: path for stage in envelopes.values() for task, path in stage.items()}
    )
    waves = waves_of([stage.info for stage in stages])
    assert len(waves) >= 2

    def run_wave(wave: list[int]) -> None:
        tasks = {t: p for s in wave for t, p in envelopes[s].items()}
        _run_workers(tasks, worker_mode=mode, attempts=attempts)

    run_wave(waves[0])
    # Lose what map 1 of a first-wave stage published: its one file, which
    # holds its buckets and its marker.
    lost_stage = waves[0][0]
    marker = read_marker(spec.shuffle_dir, lost_stage, 1)
    bucket = next(b["bucket"] for b in marker["buckets"] if b["rows"] > 0)
    victim = _internal.bucket_path(spec.shuffle_dir, lost_stage, 1, bucket)
    assert victim == _internal.marker_path(spec.shuffle_dir, lost_stage, 1)
    pathlib.Path(victim).unlink()
    for wave in waves[1:]:
        run_wave(wave)

    # The lost map ran once more (not once per reader that missed it), and
    # the readers that missed it ran again after it.
    assert attempts.made[(lost_stage, 1)] == 2
    reran = [r for r in attempts.retries if "run again" in r]
    assert reran == [
        f"stage {lost_stage} map 1: run again, its output being lost to "
        + reran[0].split("lost to ")[1]
    ]
    readers = [r for r in attempts.retries if "lost output" in r]
    assert readers
    assert all(r.split(":")[0].endswith("attempt 0") for r in readers)
    assert pathlib.Path(victim).is_file()
    assert_revenue(as_rows(execute_plan(ctx, plan)))


@pytest.mark.parametrize("mode", WORKER_MODES)
def test_output_lost_to_the_root_is_run_again_and_the_root_read_again(
    make_spec: Callable[..., SessionSpec], mode: str
) -> None:
    spec = make_spec()
    ctx, _engine = build_session(spec)
    plan = ctx.sql(REVENUE_SQL).execution_plan()
    stages = plan_stages(ctx, plan)
    envelopes = _write_tasks(stages, spec, pathlib.Path(spec.shuffle_dir) / "tasks")
    attempts = _Attempts(
        {task: path for stage in envelopes.values() for task, path in stage.items()}
    )

    def run_tasks(tasks: dict[tuple[int, int], pathlib.Path]) -> None:
        _run_workers(tasks, worker_mode=mode, attempts=attempts)

    for wave in waves_of([stage.info for stage in stages]):
        run_tasks({t: p for s in wave for t, p in envelopes[s].items()})
    # Stage 1, the first writer in pre-order, is what the root reads.
    marker = pathlib.Path(_internal.marker_path(spec.shuffle_dir, 1, 0))
    marker.unlink()

    assert_revenue(as_rows(_read_root(ctx, plan, attempts, run_tasks)))
    assert attempts.made[(1, 0)] == 2
    assert attempts.retries == [
        "stage 1 map 0: run again, its output being lost to the query's root"
    ]
    assert marker.is_file()
