"""The worker's refusals and failures, through real worker processes."""

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
from typing import TYPE_CHECKING, Any

import pytest
from conftest import (
    REVENUE_SQL,
    SQL_ONLY,
    alive,
    published_files,
    read_marker,
    serve_workers_of,
)

from dfx_engine.driver import (
    WORKER_MODES,
    WorkerPool,
    _Attempts,
    _run_workers,
    plan_stages,
    run_distributed,
    waves_of,
)
from dfx_engine.session import build_session

if TYPE_CHECKING:
    from collections.abc import Callable

    from dfx_engine import _internal
    from dfx_engine.session import SessionSpec


def encode_stage(
    spec: SessionSpec, sql: str, directory: pathlib.Path
) -> tuple[pathlib.Path, _internal.StageInfo]:
    """Plan ``sql`` and write its first stage that reads no other stage.

    Such a stage a worker can run alone. Returns its path and info.
    """
    ctx, _engine = build_session(spec)
    for stage in plan_stages(ctx, ctx.sql(sql).execution_plan()):
        if not stage.info.deps:
            directory.mkdir(parents=True, exist_ok=True)
            path = directory / f"stage-{stage.stage_id}.plan"
            path.write_bytes(stage.plan_bytes)
            return path, stage.info
    message = f"no leaf stage in the plan of {sql!r}"
    raise AssertionError(message)


def write_envelope(
    path: pathlib.Path,
    spec_json: dict[str, Any],
    plan: pathlib.Path,
    partition: int,
    stage_id: int = 1,
) -> pathlib.Path:
    """A task envelope as the driver writes one."""
    envelope = {
        "spec": spec_json,
        "plan": str(plan),
        "stage_id": stage_id,
        "partition": partition,
    }
    path.write_text(json.dumps(envelope))
    return path


def run_worker(envelope: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """``python -m dfx_engine.worker ENVELOPE`` as the driver starts it."""
    return subprocess.run(
        [sys.executable, "-m", "dfx_engine.worker", str(envelope)],
        capture_output=True,
        text=True,
        check=False,
    )


def workers_mentioning(text: str) -> list[int]:
    """Pids of live worker processes whose command line mentions ``text``."""
    pids = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "dfx_engine.worker" in cmdline and text in cmdline:
            pids.append(int(entry.name))
    return pids


def test_worker_runs_one_map_and_reports_last(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    spec = make_spec()
    plan, info = encode_stage(spec, REVENUE_SQL, tmp_path / "scratch")
    envelope = write_envelope(
        tmp_path / "task.json", spec.to_json(), plan, 3, info.stage_id
    )
    done = run_worker(envelope)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    elapsed = report.pop("elapsed_ms")
    assert isinstance(elapsed, float)
    assert elapsed > 0
    marker = read_marker(spec.shuffle_dir, info.stage_id, 3)
    # The leaf stage is the partial aggregate of one file: two flags.
    assert report == {
        "stage_id": info.stage_id,
        "partition": 3,
        "rows": 2,
        "bytes": sum(bucket["bytes"] for bucket in marker["buckets"]),
    }
    assert report["bytes"] > 0
    assert sum(bucket["rows"] for bucket in marker["buckets"]) == 2
    # Only this map published.
    assert {p.name for p in published_files(spec.shuffle_dir)} == {"map-3.arrow"}


def test_worker_refuses_an_envelope_that_is_not_a_json_object(
    tmp_path: pathlib.Path,
) -> None:
    # Valid JSON whose text holds every key name: only the type check stops it.
    envelope = tmp_path / "task.json"
    envelope.write_text(json.dumps("spec plan stage_id partition"))
    done = run_worker(envelope)
    assert done.returncode != 0
    assert f"task envelope {envelope} is not a JSON object" in done.stderr
    assert "Traceback" not in done.stderr


def test_worker_refuses_other_codec_ids_before_decoding(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    spec = make_spec()
    spec_json = spec.to_json() | {"codec_ids": ["someone_else.physical.v9"]}
    # The plan file does not even exist: a worker that got as far as reading
    # it would fail with a different message.
    envelope = write_envelope(
        tmp_path / "task.json", spec_json, tmp_path / "missing.plan", 0
    )
    done = run_worker(envelope)
    assert done.returncode == 1
    assert "someone_else.physical.v9" in done.stderr
    assert "dfx_engine.physical.v2" in done.stderr
    assert "stage 1 map 0" in done.stderr
    assert "missing.plan" not in done.stderr.replace(str(envelope), "")


def test_worker_refuses_a_stage_for_another_shuffle_dir(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    encoded_for = make_spec()
    spec = make_spec()
    plan, info = encode_stage(encoded_for, REVENUE_SQL, tmp_path / "scratch")
    envelope = write_envelope(
        tmp_path / "task.json", spec.to_json(), plan, 0, info.stage_id
    )
    done = run_worker(envelope)
    assert done.returncode == 1
    assert encoded_for.shuffle_dir in done.stderr
    assert spec.shuffle_dir in done.stderr
    assert "refusing to write outside" in done.stderr
    for directory in (encoded_for.shuffle_dir, spec.shuffle_dir):
        assert published_files(directory) == set()


def test_worker_refuses_a_stage_reading_outside_its_tables(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    spec = make_spec()
    plan, info = encode_stage(spec, REVENUE_SQL, tmp_path / "scratch")
    # The envelope's spec names another directory as the table (a real one:
    # the worker lists it when it builds its session); the stage's scan
    # reads the fixture's files, which are under none of its tables.
    other = tmp_path / "other-table"
    other.mkdir()
    first = sorted(pathlib.Path(spec.tables["lineitem"]).glob("*.parquet"))[0]
    shutil.copy(first, other / first.name)
    shipped = spec.to_json()
    shipped["tables"] = {"lineitem": str(other)}
    envelope = write_envelope(tmp_path / "task.json", shipped, plan, 0, info.stage_id)
    done = run_worker(envelope)
    assert done.returncode == 1
    assert "refusing the stage" in done.stderr
    assert "under none of the spec's tables" in done.stderr
    assert f"stage {info.stage_id} map 0" in done.stderr
    assert published_files(spec.shuffle_dir) == set()


def test_worker_refuses_a_memory_limit_it_cannot_enforce(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    spec = make_spec()
    plan, info = encode_stage(spec, REVENUE_SQL, tmp_path / "scratch")
    shipped = spec.to_json() | {"memory_limit": 1 << 20}
    envelope = write_envelope(tmp_path / "task.json", shipped, plan, 0, info.stage_id)
    done = run_worker(envelope)
    assert done.returncode == 1
    assert "memory_limit" in done.stderr
    assert "dfx worker" in done.stderr
    assert published_files(spec.shuffle_dir) == set()


def test_worker_refuses_a_stage_under_another_id(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    spec = make_spec()
    plan, info = encode_stage(spec, REVENUE_SQL, tmp_path / "scratch")
    other = info.stage_id + 7
    envelope = write_envelope(tmp_path / "task.json", spec.to_json(), plan, 0, other)
    done = run_worker(envelope)
    assert done.returncode == 1
    assert f"holds stage {info.stage_id}, not stage {other}" in done.stderr
    assert published_files(spec.shuffle_dir) == set()


def test_worker_refuses_a_plan_that_is_not_a_stage(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    spec = make_spec()
    local_ctx, _engine = build_session(make_spec(shuffle=False))
    plan = tmp_path / "not-a-stage.plan"
    plan.write_bytes(local_ctx.sql(SQL_ONLY).execution_plan().to_bytes(local_ctx))
    envelope = write_envelope(tmp_path / "task.json", spec.to_json(), plan, 0)
    done = run_worker(envelope)
    assert done.returncode == 1
    assert "stage 1 map 0" in done.stderr
    assert "encoded stage" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("mode", WORKER_MODES)
def test_out_of_range_map_is_named_with_stderr(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path, mode: str
) -> None:
    spec = make_spec()
    plan, info = encode_stage(spec, SQL_ONLY, tmp_path / "scratch")
    s = info.stage_id
    good = write_envelope(tmp_path / "good.json", spec.to_json(), plan, 0, s)
    bad = write_envelope(tmp_path / "bad.json", spec.to_json(), plan, 99, s)
    with pytest.raises(RuntimeError) as raised:
        _run_workers({(s, 0): good, (s, 99): bad}, worker_mode=mode)
    message = str(raised.value)
    assert "1 of 2 dfx tasks failed" in message
    assert f"stage {s} map 99" in message
    assert f"the stage has {info.maps} maps, so map 99 does not exist" in message
    assert workers_mentioning(str(tmp_path)) == []


@pytest.mark.parametrize("mode", WORKER_MODES)
def test_a_worker_that_cannot_start_fails_its_task_by_name(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path, mode: str
) -> None:
    spec = make_spec(split="aggregate")
    missing = tmp_path / "no-such-worker"
    with pytest.raises(RuntimeError) as raised:
        run_distributed(SQL_ONLY, spec, worker_command=[str(missing)], worker_mode=mode)
    message = str(raised.value)
    # Every task is reported, each naming its stage, its map and the
    # program, rather than one bare FileNotFoundError for the first.
    assert "4 of 4 dfx tasks failed" in message
    for map_index in range(4):
        assert f"stage 1 map {map_index}: could not start worker" in message
    assert str(missing) in message


@pytest.mark.parametrize("mode", WORKER_MODES)
def test_a_failed_wave_stops_the_query(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path, mode: str
) -> None:
    spec = make_spec()
    ctx, _engine = build_session(make_spec())
    stages = plan_stages(ctx, ctx.sql(REVENUE_SQL).execution_plan())
    first_wave = waves_of([stage.info for stage in stages])[0]
    first_tasks = sum(s.info.maps for s in stages if s.stage_id in first_wave)
    assert len(first_wave) < len(stages)
    with pytest.raises(RuntimeError) as raised:
        run_distributed(
            REVENUE_SQL, spec, worker_command=[str(tmp_path / "nope")], worker_mode=mode
        )
    message = str(raised.value)
    assert f"{first_tasks} of {first_tasks} dfx tasks failed" in message
    # Only the first wave was tried: no stage that reads it was dispatched.
    later = [s.stage_id for s in stages if s.stage_id not in first_wave]
    for stage_id in later:
        assert f"stage {stage_id} map" not in message


WORKER_COUNTING_PEERS = """
import json, os, pathlib, sys, time

def run(path):
    envelope = json.loads(pathlib.Path(path).read_text())
    scratch = pathlib.Path(path).parent
    (scratch / "seen" / str(os.getpid())).touch()
    me = scratch / "running" / str(os.getpid())
    me.touch()
    peak = len(list((scratch / "running").iterdir()))
    time.sleep(0.3)
    peak = max(peak, len(list((scratch / "running").iterdir())))
    me.unlink()
    report = {"stage_id": envelope["stage_id"], "partition": envelope["partition"],
              "rows": peak}
    print(json.dumps(report), flush=True)

if sys.argv[1] == "--serve":
    for line in sys.stdin:
        run(json.loads(line)["envelope"])
else:
    run(sys.argv[1])
"""


@pytest.mark.parametrize("mode", WORKER_MODES)
@pytest.mark.parametrize("bound", [1, 2])
def test_no_more_than_max_workers_run_at_once(
    tmp_path: pathlib.Path, bound: int, mode: str
) -> None:
    (tmp_path / "running").mkdir()
    (tmp_path / "seen").mkdir()
    script = tmp_path / "worker.py"
    script.write_text(WORKER_COUNTING_PEERS)
    envelopes = {}
    for map_index in range(5):
        path = tmp_path / f"task-1-{map_index}.json"
        path.write_text(json.dumps({"stage_id": 1, "partition": map_index}))
        envelopes[(1, map_index)] = path
    reports = _run_workers(
        envelopes,
        [sys.executable, str(script)],
        max_workers=bound,
        worker_mode=mode,
    )
    assert sorted(reports) == sorted(envelopes)
    assert max(report.rows for report in reports.values()) == bound
    # A pool runs every task on at most `bound` processes; without one, each
    # task has its own.
    processes = len(list((tmp_path / "seen").iterdir()))
    assert processes == (len(envelopes) if mode == "process" else bound)


def test_killed_worker_is_reported_and_none_survive(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    spec = make_spec(split="aggregate")
    plan, _info = encode_stage(spec, SQL_ONLY, tmp_path / "scratch")
    good = write_envelope(tmp_path / "good.json", spec.to_json(), plan, 1)
    # A worker opening a FIFO with no writer blocks until killed.
    stuck = tmp_path / "stuck.json"
    os.mkfifo(stuck)
    killed: list[int] = []

    def kill_the_stuck_worker() -> None:
        while not killed:
            for pid in workers_mentioning(str(stuck)):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.05)

    killer = threading.Thread(target=kill_the_stuck_worker, daemon=True)
    killer.start()
    envelopes = {(1, 0): stuck, (1, 1): good}
    with pytest.raises(RuntimeError) as raised:
        _run_workers(
            envelopes,
            worker_mode="process",
            # One attempt: a retry would copy the envelope, and read the FIFO.
            attempts=_Attempts(envelopes, max_attempts=1),
        )
    killer.join(timeout=60)
    message = str(raised.value)
    assert "stage 1 map 0" in message
    assert f"status -{signal.SIGKILL.value}" in message
    assert "map 1" not in message
    assert workers_mentioning(str(tmp_path)) == []


def test_killed_pooled_worker_fails_its_task_and_is_replaced(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    spec = make_spec(split="aggregate")
    plan, _info = encode_stage(spec, SQL_ONLY, tmp_path / "scratch")
    good = write_envelope(tmp_path / "good.json", spec.to_json(), plan, 1)
    stuck = tmp_path / "stuck.json"
    os.mkfifo(stuck)
    killed: list[int] = []

    def kill_the_only_worker() -> None:
        # One worker in the pool: the one blocked opening the FIFO.
        while not killed:
            for pid in serve_workers_of(os.getpid()):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.05)

    with WorkerPool(max_workers=1) as pool:
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
        assert "stage 1 map 0" in message
        assert f"pid {killed[0]}" in message
        assert f"status -{signal.SIGKILL.value} (killed by SIGKILL)" in message
        assert not alive(killed[0])
        # The dead worker is gone from the pool; the next task gets another.
        assert pool.pids() == []
        reports = _run_workers({(1, 1): good}, pool=pool)
        assert reports[(1, 1)].rows == 2
        (replacement,) = pool.pids()
        assert replacement != killed[0]
        assert alive(replacement)
    assert not alive(replacement)


DRIVER_WAITING_ON = """
import faulthandler, pathlib, signal, subprocess, sys, time
from dfx_engine.driver import _run_workers

# If the driver hangs, the test asks it where.
faulthandler.register(signal.SIGUSR1, all_threads=True)

# Ctrl-C as an interactive user has it, even when the tests run as a
# background job (whose children start with SIGINT ignored).
signal.signal(signal.SIGINT, signal.default_int_handler)

# Widen the window between a worker's exec and Popen returning its handle: an
# interrupt landing there must not leave that worker behind.
start_child = subprocess.Popen._execute_child
def start_child_slowly(self, *args, **kwargs):
    start_child(self, *args, **kwargs)
    time.sleep(1)
subprocess.Popen._execute_child = start_child_slowly

_run_workers(
    {(1, 0): pathlib.Path(sys.argv[1]), (1, 1): pathlib.Path(sys.argv[2])},
    max_workers=2,
    worker_mode=sys.argv[3],
)
"""


@pytest.mark.parametrize("mode", WORKER_MODES)
def test_interrupted_driver_leaves_no_worker_running(
    tmp_path: pathlib.Path, mode: str
) -> None:
    # Two workers that block on FIFOs nobody writes: the driver waits on them
    # until it is interrupted.
    stuck = [tmp_path / "stuck-0.json", tmp_path / "stuck-1.json"]
    for path in stuck:
        os.mkfifo(path)
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER_WAITING_ON, *map(str, stuck), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def workers() -> list[int]:
        if mode == "process":
            return workers_mentioning(str(tmp_path))
        return serve_workers_of(driver.pid)

    try:
        while len(started := workers()) < len(stuck):
            assert driver.poll() is None, driver.communicate()
            time.sleep(0.05)
        driver.send_signal(signal.SIGINT)
        try:
            _stdout, stderr = driver.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            driver.send_signal(signal.SIGUSR1)
            time.sleep(2)
            driver.kill()
            _stdout, stderr = driver.communicate()
            pytest.fail(f"the interrupted driver hung; its threads:\n{stderr}")
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert "KeyboardInterrupt" in stderr
    assert [pid for pid in started if alive(pid)] == []
    assert workers_mentioning(str(tmp_path)) == []
