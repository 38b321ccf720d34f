"""The worker's refusals and failures, through real worker processes."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from conftest import (
    REVENUE_SQL,
    SQL_ONLY,
    alive,
    published_files,
    read_marker,
    serve_workers_of,
)

from dfx_engine import _internal
from dfx_engine.driver import WORKER_MODES, encode_stages, run_distributed
from dfx_engine.session import build_session

if TYPE_CHECKING:
    from collections.abc import Callable

    from dfx_engine.session import SessionSpec


def encode_stage(
    spec: SessionSpec, sql: str, directory: pathlib.Path
) -> tuple[pathlib.Path, _internal.StageInfo]:
    """Plan ``sql`` and write its first stage that reads no other stage.

    Such a stage a worker can run alone. Returns its path and info.
    """
    ctx, _engine = build_session(spec)
    for plan in encode_stages(ctx, ctx.sql(sql).execution_plan()):
        info = _internal.encoded_stage_info(plan)
        if not info.deps:
            directory.mkdir(parents=True, exist_ok=True)
            path = directory / f"stage-{info.stage_id}.plan"
            path.write_bytes(plan)
            return path, info
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


def last_response(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The response a one-task worker printed: its last line of stdout."""
    response: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return response


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
        if (
            "dfx_engine.worker" in cmdline
            and text in cmdline
            and alive(int(entry.name))
        ):
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
    # Where each bucket lies: contiguous, as the marker's segments say.
    layout = report.pop("layout")
    buckets = marker["buckets"]
    assert layout["rows"] == [bucket["rows"] for bucket in buckets]
    assert layout["bytes"] == [bucket["bytes"] for bucket in buckets]
    for offset, bucket in zip(layout["offsets"], buckets, strict=True):
        if bucket["segments"]:
            assert offset == bucket["segments"][0]["offset"]
    (published,) = published_files(spec.shuffle_dir)
    assert layout["size"] == published.stat().st_size
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
    assert {p.name for p in published_files(spec.shuffle_dir)} == {"3-map-3.arrow"}


def test_worker_refuses_an_envelope_that_is_not_a_json_object(
    tmp_path: pathlib.Path,
) -> None:
    # Valid JSON whose text holds every key name: only the parse stops it.
    envelope = tmp_path / "task.json"
    envelope.write_text(json.dumps("spec plan stage_id partition"))
    done = run_worker(envelope)
    assert done.returncode == 1
    assert f"cannot parse envelope {envelope}" in done.stderr
    assert "Traceback" not in done.stderr
    response = last_response(done)
    assert (response["stage_id"], response["partition"]) == (None, None)
    assert response["retry"] == "final"


def test_worker_refuses_other_codec_ids_before_decoding(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    spec = make_spec()
    plan, info = encode_stage(spec, SQL_ONLY, tmp_path / "scratch")
    spec_json = spec.to_json() | {"codec_ids": ["someone_else.physical.v9"]}
    envelope = write_envelope(tmp_path / "task.json", spec_json, plan, 0, info.stage_id)
    done = run_worker(envelope)
    assert done.returncode == 1
    assert "someone_else.physical.v9" in done.stderr
    assert "dfx_engine.physical.v5" in done.stderr
    assert f"stage {info.stage_id} map 0: refusing to decode {plan}" in done.stderr
    assert published_files(spec.shuffle_dir) == set()


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
    assert "must not make a worker write outside" in done.stderr
    for directory in (encoded_for.shuffle_dir, spec.shuffle_dir):
        assert published_files(directory) == set()


def test_worker_takes_its_location_however_it_is_spelled(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    spec = make_spec()
    plan, info = encode_stage(spec, REVENUE_SQL, tmp_path / "scratch")
    # The stage names the path; the envelope names it as a URL with a
    # trailing slash: one location, so the task runs and publishes there.
    respelled = spec.to_json() | {"shuffle_dir": f"file://{spec.shuffle_dir}/"}
    envelope = write_envelope(tmp_path / "task.json", respelled, plan, 1, info.stage_id)
    done = run_worker(envelope)
    assert done.returncode == 0, done.stderr
    assert last_response(done)["rows"] == 2
    assert read_marker(spec.shuffle_dir, info.stage_id, 1)["map"] == 1


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


def test_worker_refuses_a_stage_under_another_id_or_map(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    spec = make_spec()
    plan, info = encode_stage(spec, REVENUE_SQL, tmp_path / "scratch")
    other = info.stage_id + 7
    envelope = write_envelope(tmp_path / "task.json", spec.to_json(), plan, 0, other)
    done = run_worker(envelope)
    assert done.returncode == 1
    assert f"holds stage {info.stage_id}, not the envelope's stage {other}" in (
        done.stderr
    )
    beyond = write_envelope(
        tmp_path / "beyond.json", spec.to_json(), plan, 99, info.stage_id
    )
    done = run_worker(beyond)
    assert done.returncode == 1
    assert f"map 99 out of range; the stage in {plan} has {info.maps}" in done.stderr
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
    assert f"stage 1 map 0: plan {plan}" in done.stderr
    assert "Traceback" not in done.stderr


def blocking(scratch: pathlib.Path, *, once: bool = False) -> Any:  # noqa: ANN401
    """The int64 UDF ``py_probe``, blocking until its process is killed.

    Each call writes its process's pid into ``scratch/pids`` first. With
    ``once``, only the first call anywhere blocks; the others pass their
    input through.
    """
    from datafusion import udf

    pids, claim = str(scratch / "pids"), str(scratch / "claim")
    pathlib.Path(pids).mkdir(parents=True, exist_ok=True)

    def block(values: pa.Array) -> pa.Array:
        if once:
            try:
                os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return values
        (pathlib.Path(pids) / str(os.getpid())).touch()
        while True:
            time.sleep(1)

    return udf(block, [pa.int64()], pa.int64(), "immutable", name="py_probe")


UDF_SQL = """
SELECT l_returnflag AS flag, sum(py_probe(l_quantity)) AS qty
FROM lineitem GROUP BY l_returnflag ORDER BY flag
"""


def blocked_pids(scratch: pathlib.Path, count: int) -> list[int]:
    """The pids of the first ``count`` blocked workers, once they are."""
    deadline = time.monotonic() + 120
    while (
        len(pids := sorted(int(p.name) for p in (scratch / "pids").iterdir())) < count
    ):
        assert time.monotonic() < deadline, pids
        time.sleep(0.05)
    return pids


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
    # program, rather than one bare FileNotFoundError for the first; none
    # was retried (the same program would not start the next time).
    assert "4 of 4 worker task(s) failed in wave 1" in message
    for map_index in range(4):
        assert f"stage 1 map {map_index} could not start" in message
    assert str(missing) in message
    assert "attempts" not in message


@pytest.mark.parametrize("mode", WORKER_MODES)
def test_a_failed_wave_stops_the_query(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path, mode: str
) -> None:
    spec = make_spec()
    ctx, _engine = build_session(make_spec())
    infos = [
        _internal.encoded_stage_info(plan)
        for plan in encode_stages(ctx, ctx.sql(REVENUE_SQL).execution_plan())
    ]
    first_wave = [info.stage_id for info in infos if not info.deps]
    first_tasks = sum(info.maps for info in infos if not info.deps)
    assert len(first_wave) < len(infos)
    with pytest.raises(RuntimeError) as raised:
        run_distributed(
            REVENUE_SQL, spec, worker_command=[str(tmp_path / "nope")], worker_mode=mode
        )
    message = str(raised.value)
    assert f"{first_tasks} of {first_tasks} worker task(s) failed in wave 1" in message
    # Only the first wave was tried: no stage that reads it was dispatched.
    for info in infos:
        if info.stage_id not in first_wave:
            assert f"stage {info.stage_id} map" not in message


@pytest.mark.parametrize("mode", WORKER_MODES)
@pytest.mark.parametrize("bound", [1, 2])
def test_no_more_than_max_workers_run_at_once(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path, bound: int, mode: str
) -> None:
    from datafusion import udf

    running, seen = str(tmp_path / "running"), str(tmp_path / "seen")
    peaks = str(tmp_path / "peaks")
    for directory in (running, seen, peaks):
        pathlib.Path(directory).mkdir()

    def count_peers(values: pa.Array) -> pa.Array:
        me = pathlib.Path(running) / f"{os.getpid()}-{time.monotonic_ns()}"
        (pathlib.Path(seen) / str(os.getpid())).touch()
        me.touch()
        peak = len(list(pathlib.Path(running).iterdir()))
        time.sleep(0.3)
        peak = max(peak, len(list(pathlib.Path(running).iterdir())))
        me.unlink()
        (pathlib.Path(peaks) / f"{peak}-{me.name}").touch()
        return values

    probe = udf(count_peers, [pa.int64()], pa.int64(), "immutable", name="py_probe")
    result = run_distributed(
        UDF_SQL,
        make_spec(split="aggregate"),
        [probe],
        max_workers=bound,
        worker_mode=mode,
    )
    assert len(result.tasks) == 4
    assert max(int(p.name.split("-")[0]) for p in pathlib.Path(peaks).iterdir()) == (
        bound
    )
    # A pool runs every task on at most `bound` processes; without one, each
    # task has its own.
    processes = len(list(pathlib.Path(seen).iterdir()))
    assert processes == (4 if mode == "process" else bound)


def test_killed_worker_is_reported_and_none_survive(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    block = blocking(tmp_path / "udf", once=True)
    killed: list[int] = []

    def kill_the_blocked_worker() -> None:
        (pid,) = blocked_pids(tmp_path / "udf", 1)
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    killer = threading.Thread(target=kill_the_blocked_worker, daemon=True)
    killer.start()
    spec = make_spec(split="aggregate")
    with pytest.raises(RuntimeError) as raised:
        run_distributed(UDF_SQL, spec, [block], worker_mode="process", max_attempts=1)
    killer.join(timeout=60)
    message = str(raised.value)
    assert message.startswith("1 of 4 worker task(s) failed"), message
    assert "was killed by signal 9 (SIGKILL)" in message
    assert workers_mentioning(str(tmp_path)) == []


DRIVER_WAITING_ON = textwrap.dedent(
    """
    import faulthandler, json, os, pathlib, signal, sys, time
    import pyarrow as pa
    from datafusion import udf
    from dfx_engine.driver import run_distributed
    from dfx_engine.session import SessionSpec

    # If the driver hangs, the test asks it where.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # Ctrl-C as an interactive user has it, even when the tests run as a
    # background job (whose children start with SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    args = json.loads(sys.argv[1])

    def block(values):
        (pathlib.Path(args["pids"]) / str(os.getpid())).touch()
        while True:
            time.sleep(1)

    spec = SessionSpec(
        tables={"lineitem": args["lineitem"]},
        shuffle_dir=args["shuffle"],
        target_partitions=4,
        split="aggregate",
    )
    probe = udf(block, [pa.int64()], pa.int64(), "immutable", name="py_probe")
    run_distributed(
        args["sql"], spec, [probe], max_workers=2, worker_mode=args["mode"]
    )
    """
)


@pytest.mark.parametrize("mode", WORKER_MODES)
def test_interrupted_driver_leaves_no_worker_running(
    lineitem: pathlib.Path, tmp_path: pathlib.Path, mode: str
) -> None:
    # Two workers block in a UDF until killed: the driver waits on them
    # until it is interrupted.
    (tmp_path / "pids").mkdir()
    args = {
        "lineitem": str(lineitem),
        "shuffle": str(tmp_path / "shuffle"),
        "pids": str(tmp_path / "pids"),
        "sql": UDF_SQL,
        "mode": mode,
    }
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER_WAITING_ON, json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while len(list((tmp_path / "pids").iterdir())) < 2:
            assert driver.poll() is None, driver.communicate()
            time.sleep(0.05)
        started = [int(p.name) for p in (tmp_path / "pids").iterdir()]
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
    deadline = time.monotonic() + 10
    while [pid for pid in started if alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in started if alive(pid)] == []
    assert serve_workers_of(driver.pid) == []
    assert workers_mentioning(str(tmp_path)) == []
