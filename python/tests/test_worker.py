"""The worker's refusals and failures, through real worker processes."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
from conftest import REVENUE_SQL, SQL_ONLY

from dfx_engine import _internal
from dfx_engine.driver import _run_workers, find_stages, run_distributed
from dfx_engine.session import build_session

if TYPE_CHECKING:
    from collections.abc import Callable

    from dfx_engine.session import SessionSpec


def encode_stage(spec: SessionSpec, sql: str, directory: pathlib.Path) -> pathlib.Path:
    """Plan ``sql`` on ``spec``'s session and write its first stage's bytes."""
    ctx, _engine = build_session(spec)
    stages = find_stages(ctx.sql(sql).execution_plan())
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "stage-1.plan"
    path.write_bytes(stages[0].to_bytes(ctx))
    return path


def write_envelope(
    path: pathlib.Path, spec_json: dict[str, Any], plan: pathlib.Path, partition: int
) -> pathlib.Path:
    """A task envelope as the driver writes one."""
    envelope = {
        "spec": spec_json,
        "plan": str(plan),
        "stage_id": 1,
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


def test_worker_runs_one_task_and_reports_last(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    spec = make_spec()
    plan = encode_stage(spec, REVENUE_SQL, tmp_path / "scratch")
    envelope = write_envelope(tmp_path / "task.json", spec.to_json(), plan, 3)
    done = run_worker(envelope)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"stage_id": 1, "partition": 3, "rows": 2}
    published = pathlib.Path(_internal.partition_path(spec.shuffle_dir, 1, 3))
    assert published.is_file()


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
    assert "dfx_engine.physical.v1" in done.stderr
    assert "stage 1 partition 0" in done.stderr
    assert "missing.plan" not in done.stderr.replace(str(envelope), "")


def test_worker_refuses_a_stage_for_another_shuffle_dir(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    encoded_for = make_spec()
    spec = make_spec()
    plan = encode_stage(encoded_for, REVENUE_SQL, tmp_path / "scratch")
    envelope = write_envelope(tmp_path / "task.json", spec.to_json(), plan, 0)
    done = run_worker(envelope)
    assert done.returncode == 1
    assert encoded_for.shuffle_dir in done.stderr
    assert spec.shuffle_dir in done.stderr
    assert "refusing to write outside" in done.stderr
    for directory in (encoded_for.shuffle_dir, spec.shuffle_dir):
        assert not list(pathlib.Path(directory).glob(_internal.partition_glob()))


def test_out_of_range_partition_is_named_with_stderr(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    spec = make_spec()
    plan = encode_stage(spec, SQL_ONLY, tmp_path / "scratch")
    good = write_envelope(tmp_path / "good.json", spec.to_json(), plan, 0)
    bad = write_envelope(tmp_path / "bad.json", spec.to_json(), plan, 99)
    with pytest.raises(RuntimeError) as info:
        _run_workers({(1, 0): good, (1, 99): bad})
    message = str(info.value)
    assert "1 of 2 dfx tasks failed" in message
    assert "stage 1 partition 99" in message
    assert "partition 99 does not exist" in message  # the worker's stderr
    assert workers_mentioning(str(tmp_path)) == []


def test_a_worker_that_cannot_start_fails_its_task_by_name(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    spec = make_spec()
    missing = tmp_path / "no-such-worker"
    with pytest.raises(RuntimeError) as info:
        run_distributed(SQL_ONLY, spec, worker_command=[str(missing)])
    message = str(info.value)
    # Every task is reported, each naming its stage, its partition and the
    # program, rather than one bare FileNotFoundError for the first.
    assert "4 of 4 dfx tasks failed" in message
    for partition in range(4):
        assert f"stage 1 partition {partition}: could not start worker" in message
    assert str(missing) in message


def test_killed_worker_is_reported_and_none_survive(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    spec = make_spec()
    plan = encode_stage(spec, SQL_ONLY, tmp_path / "scratch")
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
    with pytest.raises(RuntimeError) as info:
        _run_workers({(1, 0): stuck, (1, 1): good})
    killer.join(timeout=60)
    message = str(info.value)
    assert "stage 1 partition 0" in message
    assert f"status -{signal.SIGKILL.value}" in message
    assert "partition 1" not in message
    assert workers_mentioning(str(tmp_path)) == []


DRIVER_WAITING_ON = """
import pathlib, signal, subprocess, sys, time
from dfx_engine.driver import _run_workers

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

_run_workers({(1, 0): pathlib.Path(sys.argv[1]), (1, 1): pathlib.Path(sys.argv[2])})
"""


def test_interrupted_driver_leaves_no_worker_running(tmp_path: pathlib.Path) -> None:
    # Two workers that block on FIFOs nobody writes: the driver waits on them
    # until it is interrupted.
    stuck = [tmp_path / "stuck-0.json", tmp_path / "stuck-1.json"]
    for path in stuck:
        os.mkfifo(path)
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER_WAITING_ON, *map(str, stuck)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while len(workers_mentioning(str(tmp_path))) < len(stuck):
            assert driver.poll() is None, driver.communicate()
            time.sleep(0.05)
        driver.send_signal(signal.SIGINT)
        _stdout, stderr = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert "KeyboardInterrupt" in stderr
    assert workers_mentioning(str(tmp_path)) == []
