"""Long-lived workers: the serve protocol and the driver's pool of them.

Real worker processes (``python -m dfx_engine.worker --serve``), the real
plugin file and datafusion-python; pids are checked on the live system.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from conftest import (
    REVENUE_SQL,
    SQL_ONLY,
    alive,
    as_rows,
    assert_revenue,
    assert_same,
    assert_same_columns,
    read_marker,
)
from datafusion import udf
from test_worker import encode_stage, write_envelope

from dfx_engine._internal import MALLOC_TUNABLES_VAR, SERVING_MALLOC_TUNABLES
from dfx_engine.driver import WorkerPool, run_distributed, run_local
from dfx_engine.worker import SessionCache

if TYPE_CHECKING:
    from collections.abc import Callable

    from datafusion.user_defined import ScalarUDF

    from dfx_engine.session import SessionSpec

UDF_SQL = """
SELECT l_returnflag AS flag, sum(py_probe(l_quantity)) AS qty
FROM lineitem GROUP BY l_returnflag ORDER BY flag
"""
UDF_ANSWER = [
    {"flag": "A", "qty": 90},
    {"flag": "B", "qty": 130},
    {"flag": "R", "qty": 140},
]


def probe(body: Callable[[pa.Array], pa.Array]) -> ScalarUDF:
    """``body`` as the int64 UDF ``py_probe``, shipped by value to workers.

    ``body`` must be defined inside a test: a module-level function would be
    pickled by reference, and workers cannot import the test modules.
    """
    return udf(body, [pa.int64()], pa.int64(), "immutable", name="py_probe")


class Serving:
    """A ``python -m dfx_engine.worker --serve`` process, driven by hand."""

    def __init__(self) -> None:
        """Start the worker."""
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dfx_engine.worker", "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def ask(self, line: str) -> dict[str, Any]:
        """Send one request line; the one response line, parsed."""
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        response: dict[str, Any] = json.loads(self.process.stdout.readline())
        return response

    def request(self, envelope: pathlib.Path) -> dict[str, Any]:
        """Ask for the task of ``envelope``."""
        return self.ask(json.dumps({"envelope": str(envelope)}))


def test_serve_answers_each_request_and_survives_task_errors(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    spec = make_spec()
    plan, info = encode_stage(spec, REVENUE_SQL, tmp_path / "scratch")
    s = info.stage_id
    bad = write_envelope(tmp_path / "bad.json", spec.to_json(), plan, 99, s)
    good = write_envelope(tmp_path / "good.json", spec.to_json(), plan, 2, s)
    worker = Serving()
    try:
        refused = worker.ask("not a request")
        assert refused["stage_id"] is None
        assert refused["partition"] is None
        assert "cannot read the request" in refused["error"]
        assert refused["retry"] == "final"

        unreadable = worker.request(tmp_path / "missing.json")
        assert (unreadable["stage_id"], unreadable["partition"]) == (None, None)
        assert "cannot read envelope" in unreadable["error"]
        assert str(tmp_path / "missing.json") in unreadable["error"]

        error = worker.request(bad)
        assert (error["stage_id"], error["partition"]) == (s, 99)
        assert (
            f"map 99 out of range; the stage in {plan} has {info.maps}"
            in (error["error"])
        )
        assert error["retry"] == "final"

        # The same process, after three errors, runs a task.
        report = worker.request(good)
        marker = read_marker(spec.shuffle_dir, s, 2)
        assert report["rows"] == 2
        assert report["bytes"] == sum(b["bytes"] for b in marker["buckets"]) > 0
        assert isinstance(report["elapsed_ms"], float)
        assert (report["stage_id"], report["partition"]) == (s, 2)
        assert worker.process.poll() is None
    finally:
        assert worker.process.stdin is not None
        worker.process.stdin.close()
        status = worker.process.wait()
        assert worker.process.stdout is not None
        rest = worker.process.stdout.read()
    # End of input is a clean exit, and nothing but responses was on stdout.
    assert status == 0
    assert rest == ""


def test_serve_runs_an_envelope_carried_in_the_request_as_its_file(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    spec = make_spec()
    plan, info = encode_stage(spec, REVENUE_SQL, tmp_path / "scratch")
    s = info.stage_id
    envelope = json.loads(
        write_envelope(tmp_path / "e.json", spec.to_json(), plan, 1, s).read_text()
    )
    worker = Serving()
    try:
        # What the Rust driver's pool sends: the envelope itself, no file.
        report = worker.ask(json.dumps({"task": envelope}))
        assert (report["stage_id"], report["partition"]) == (s, 1), report
        marker = read_marker(spec.shuffle_dir, s, 1)
        assert report["rows"] == sum(b["rows"] for b in marker["buckets"])
        # Refusals name the task as they do for a file.
        missing = worker.ask(json.dumps({"task": {"plan": str(plan)}}))
        assert (missing["stage_id"], missing["partition"]) == (None, None)
        assert "cannot read the request" in missing["error"], missing
        beyond = worker.ask(json.dumps({"task": {**envelope, "partition": 99}}))
        assert (beyond["stage_id"], beyond["partition"]) == (s, 99)
        assert f"stage {s} map 99: map 99 out of range" in beyond["error"], beyond
    finally:
        assert worker.process.stdin is not None
        worker.process.stdin.close()
        assert worker.process.wait() == 0


def test_session_cache_keeps_the_last_stage_for_maps_not_run_from_it(
    make_spec: Callable[..., SessionSpec],
) -> None:
    cache = SessionCache()
    spec = make_spec()
    ctx = cache.get(spec.to_json_text())
    plan = ctx.sql("SELECT 1 AS one").execution_plan()
    assert cache.kept_stage(ctx, 1, b"stage", 0) is None
    cache.keep_stage(ctx, 1, b"stage", 0, plan)
    assert cache.kept_stage(ctx, 1, b"stage", 1) is plan
    # A map already run from it, other bytes, a plan file written later (a
    # later query reusing the directory), a plan handed over by value or
    # another session: not kept.
    assert cache.kept_stage(ctx, 1, b"stage", 0) is None
    assert cache.kept_stage(ctx, 1, b"other", 2) is None
    assert cache.kept_stage(ctx, 2, b"stage", 2) is None
    assert cache.kept_stage(ctx, None, b"stage", 2) is None
    other_spec = make_spec()
    other_ctx = cache.get(other_spec.to_json_text())
    assert cache.kept_stage(other_ctx, 1, b"stage", 2) is None
    assert cache.kept_stage(ctx, 1, b"stage", 2) is plan
    cache.forget_stage()
    assert cache.kept_stage(ctx, 1, b"stage", 3) is None
    # A plan without a time is never kept in the first place.
    cache.keep_stage(ctx, None, b"stage", 0, plan)
    assert cache.kept_stage(ctx, None, b"stage", 1) is None


def test_session_cache_keeps_the_newest_specs(
    make_spec: Callable[..., SessionSpec],
) -> None:
    cache = SessionCache(size=2)
    specs = [make_spec().to_json_text() for _ in range(3)]
    first = cache.get(specs[0])
    assert cache.get(specs[0]) is first
    second = cache.get(specs[1])
    cache.get(specs[2])
    # The oldest was dropped; the two newest are kept.
    assert cache.get(specs[1]) is second
    assert cache.get(specs[0]) is not first


def test_one_pool_answers_query_after_query_like_one_process(
    make_spec: Callable[..., SessionSpec],
) -> None:
    queries = [
        (REVENUE_SQL, "exchange"),
        (SQL_ONLY, "aggregate"),
        (REVENUE_SQL, "aggregate"),
        (SQL_ONLY, "exchange"),
    ]
    with WorkerPool(max_workers=2) as pool:
        started: list[int] | None = None
        for sql, split in queries:
            spec = make_spec(split=split)
            result = run_distributed(sql, spec, pool=pool)
            local = run_local(sql, spec)
            assert_same_columns(result.batches, local, sql)
            assert_same(as_rows(result.batches), as_rows(local))
            assert all(r.bytes is not None for r in result.reports.values())
            # The same two workers ran every query: none was restarted.
            if started is None:
                started = pool.pids()
            assert pool.pids() == started
        assert started is not None
        assert len(started) == 2
        assert all(alive(pid) for pid in started)
    assert [pid for pid in started if alive(pid)] == []
    assert_revenue(as_rows(run_local(REVENUE_SQL, make_spec())))


def test_serving_workers_start_with_the_malloc_settings_unless_the_driver_has_its_own(
    make_spec: Callable[..., SessionSpec],
) -> None:
    expected = os.environ.get(MALLOC_TUNABLES_VAR, SERVING_MALLOC_TUNABLES)
    with WorkerPool(max_workers=2) as pool:
        run_distributed(SQL_ONLY, make_spec(), pool=pool)
        pids = pool.pids()
        assert pids
        for pid in pids:
            environ = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            settings = [
                entry.split(b"=", 1)[1].decode()
                for entry in environ
                if entry.startswith(MALLOC_TUNABLES_VAR.encode() + b"=")
            ]
            # glibc splits the variable in place as it parses it, so the
            # process's own copy ends at the first setting's end.
            assert len(settings) == 1, (pid, settings)
            assert settings[0], pid
            assert expected.startswith(settings[0]), (pid, settings)


def test_process_mode_agrees_with_pool_mode(
    make_spec: Callable[..., SessionSpec],
) -> None:
    pooled = run_distributed(REVENUE_SQL, make_spec())
    spec = make_spec()
    single = run_distributed(REVENUE_SQL, spec, worker_mode="process")
    assert_revenue(as_rows(single.batches))
    assert as_rows(single.batches) == as_rows(pooled.batches)
    assert single.task_rows == pooled.task_rows
    assert all(r.elapsed_ms is not None for r in single.reports.values())


def test_a_printing_udf_does_not_break_the_protocol(
    make_spec: Callable[..., SessionSpec],
) -> None:
    def noisy(values: pa.Array) -> pa.Array:
        # Each of these, on the protocol stream, would be taken for (or glued
        # to) an answer: the first two are well-formed answers for another
        # task, and would fail the task as an unreadable report.
        print(json.dumps({"stage_id": 999, "partition": 0, "rows": 1}))
        os.write(1, b'{"stage_id": 998, "partition": 0, "error": "from fd 1"}\n')
        print("no newline", end="")
        sys.stdout.flush()
        return values

    spec = make_spec()
    result = run_distributed(UDF_SQL, spec, extra_udfs=[probe(noisy)])
    assert as_rows(result.batches) == UDF_ANSWER


def test_no_pooled_worker_outlives_the_run(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    seen = tmp_path / "pids"
    seen.mkdir()
    where = str(seen)

    def record_pid(values: pa.Array) -> pa.Array:
        (pathlib.Path(where) / str(os.getpid())).touch()
        return values

    recorder = probe(record_pid)
    # A pool the caller holds keeps its workers between queries...
    with WorkerPool(max_workers=2) as pool:
        result = run_distributed(UDF_SQL, make_spec(), [recorder], pool=pool)
        assert as_rows(result.batches) == UDF_ANSWER
        held = sorted(int(p.name) for p in seen.iterdir())
        assert held
        assert all(alive(pid) for pid in held)
    # ...until it is closed.
    assert [pid for pid in held if alive(pid)] == []

    # The pool run_distributed makes for itself is closed when it returns.
    for path in seen.iterdir():
        path.unlink()
    result = run_distributed(UDF_SQL, make_spec(), [recorder], max_workers=2)
    assert as_rows(result.batches) == UDF_ANSWER
    own = sorted(int(p.name) for p in seen.iterdir())
    assert own
    assert not set(own) & set(held)
    assert [pid for pid in own if alive(pid)] == []


def test_a_pooled_worker_killed_mid_query_fails_it_by_name_and_is_replaced(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    claim, pid_file, fifo = (str(tmp_path / n) for n in ("claim", "pid", "fifo"))
    os.mkfifo(fifo)

    def block_once(values: pa.Array) -> pa.Array:
        # The first call anywhere claims the block and waits on a FIFO nobody
        # writes, until it is killed; every other call passes through.
        try:
            os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return values
        pathlib.Path(pid_file + ".tmp").write_text(str(os.getpid()))
        pathlib.Path(pid_file + ".tmp").rename(pid_file)
        pathlib.Path(fifo).read_text()
        return values

    killed: list[int] = []

    def kill_the_blocked_worker() -> None:
        path = pathlib.Path(pid_file)
        while not path.exists():
            time.sleep(0.05)
        pid = int(path.read_text())
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    with WorkerPool(max_workers=2) as pool:
        killer = threading.Thread(target=kill_the_blocked_worker, daemon=True)
        killer.start()
        with pytest.raises(RuntimeError) as raised:
            run_distributed(
                UDF_SQL,
                make_spec(split="aggregate"),
                [probe(block_once)],
                pool=pool,
                max_attempts=1,
            )
        killer.join(timeout=60)
        message = str(raised.value)
        (pid,) = killed
        assert re.search(
            rf"stage 1 map \d failed: its worker \(pid {pid}\) was killed by "
            r"signal 9 \(SIGKILL\) while running it",
            message,
        ), message
        assert message.startswith("1 of 4 worker task(s) failed in wave 1")
        assert not alive(pid)
        assert pid not in pool.pids()

        # The next query runs on the same pool, a new worker in the dead
        # one's place.
        spec = make_spec()
        result = run_distributed(SQL_ONLY, spec, pool=pool)
        assert_same(as_rows(result.batches), as_rows(run_local(SQL_ONLY, spec)))
        assert pid not in pool.pids()
        assert len(pool.pids()) == 2


def test_a_pool_refuses_settings_it_would_ignore(
    make_spec: Callable[..., SessionSpec],
) -> None:
    spec = make_spec()
    with WorkerPool(max_workers=1) as pool:
        with pytest.raises(ValueError, match="its own worker_command"):
            run_distributed(SQL_ONLY, spec, pool=pool, max_workers=3)
        with pytest.raises(ValueError, match="worker_mode='process'"):
            run_distributed(SQL_ONLY, spec, pool=pool, worker_mode="process")
    with pytest.raises(ValueError, match="worker_mode must be one of"):
        run_distributed(SQL_ONLY, spec, worker_mode="threads")
