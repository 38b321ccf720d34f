"""Cross-host: stages move between this package and the Rust host's ``dfx``.

The two hosts are built against different DataFusion 55 minors (the wheel of
datafusion-python, and the workspace's), and both load the same plugin file.
A stage encoded by one must decode and run in the other, for a SQL-only
query; and what a spec asks (compression, the location however it is
spelled) and what the runtime does on a failure (lost output found by the
root's read runs again) must hold whichever host drives and whichever works.

Needs the workspace's ``target/debug/dfx`` (``cargo build -p dfx-host``;
``run-tests.sh`` builds it), or the binary ``DFX_HOST_BINARY`` names. Without
it every test here fails, so a CI run cannot pass having tested nothing
across hosts; set ``DFX_SKIP_CROSS_HOST=1`` to skip them instead.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import (
    DFX,
    SQL_ONLY,
    alive,
    as_rows,
    assert_same,
    assert_same_columns,
    losing_worker,
    map_compressions,
    require_dfx,
)

from dfx_engine import _internal
from dfx_engine.driver import (
    WorkerPool,
    encode_stages,
    execute_plan,
    run_distributed,
    run_local,
)
from dfx_engine.session import SessionSpec, build_session

if TYPE_CHECKING:
    from collections.abc import Callable

RUST_WORKER = [str(DFX), "worker"]


@pytest.fixture(autouse=True)
def _rust_host_binary() -> None:
    """Fail (or, only when asked to, skip) without the Rust host binary."""
    require_dfx()


PYTHON_WORKER = [sys.executable, "-m", "dfx_engine.worker"]

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
    result = run_distributed(SQL_ONLY, spec, worker_command=RUST_WORKER)
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


def test_python_driver_rust_worker_pool_across_queries(
    make_spec: Callable[..., SessionSpec],
) -> None:
    with WorkerPool(max_workers=2, worker_command=RUST_WORKER) as pool:
        for split in ("exchange", "aggregate", "exchange"):
            spec = make_spec(split=split)
            result = run_distributed(SQL_ONLY, spec, pool=pool)
            assert as_rows(result.batches) == HAND_ANSWER
            assert sum(result.task_rows.values()) > 0
        workers = pool.pids()
        assert len(workers) == 2
        assert all(alive(pid) for pid in workers)
    assert [pid for pid in workers if alive(pid)] == []


def test_a_rust_pooled_worker_killed_while_idle_is_replaced(
    make_spec: Callable[..., SessionSpec],
) -> None:
    with WorkerPool(max_workers=1, worker_command=RUST_WORKER) as pool:
        run_distributed(SQL_ONLY, make_spec(split="aggregate"), pool=pool)
        (first,) = pool.pids()
        os.kill(first, signal.SIGKILL)
        # The dead worker is dropped when the next task checks it out, not
        # handed the task: the query runs on a new one, without a retry.
        result = run_distributed(SQL_ONLY, make_spec(split="aggregate"), pool=pool)
        assert as_rows(result.batches) == HAND_ANSWER
        assert result.retries == []
        (replacement,) = pool.pids()
        assert replacement != first
        assert pool.started == 2
        assert not alive(first)
    assert not alive(replacement)


def deps_of(infos: list[_internal.StageInfo], stage_id: int) -> list[int]:
    """The stages ``stage_id`` reads."""
    return next(info.deps for info in infos if info.stage_id == stage_id)


def dfx_run(
    spec: SessionSpec, split: str, cwd: pathlib.Path, *extra: str, sql: str = SQL_ONLY
) -> subprocess.CompletedProcess[str]:
    """``dfx run`` of ``sql`` with the Rust driver, over ``spec``.

    Its tables, partitions, shuffle location, compression and plugin
    settings, the partitions a task runs among them (the spec's default is
    one, the command line's the cores); JSON on stdout.
    """
    command = [str(DFX), "run", "--plugin", _internal.plugin_path()]
    for name, directory in sorted(spec.tables.items()):
        command += ["--table", f"{name}={directory}"]
    command += ["--partitions", str(spec.target_partitions)]
    per_task = spec.engine_options.get("partitions_per_task", "1")
    command += ["--partitions-per-task", per_task]
    command += ["--shuffle-dir", str(spec.shuffle_dir), "--split", split]
    if spec.shuffle_compression != "auto":
        command += ["--shuffle-compression", spec.shuffle_compression]
    for key, value in sorted(spec.engine_options.items()):
        command += ["--set", f"{key}={value}"]
    command += [*extra, "--format", "json", sql]
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
    done: set[int] = set()
    while len(done) < len(infos):
        # The stages whose inputs are all published, as a wave of the driver.
        wave = [i.stage_id for i in infos if i.stage_id not in done]
        wave = [s for s in wave if set(deps_of(infos, s)) <= done]
        assert wave, infos
        done.update(wave)
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
    done = dfx_run(spec, split, tmp_path, *as_dfx_worker(PYTHON_WORKER))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == HAND_ANSWER
    # Every map was published, and no envelope was written for it.
    assert list(shuffle_dir.glob(_internal.partition_glob()))
    assert not list((shuffle_dir / "tasks").glob("task-*.json"))


def as_dfx_worker(command: list[str]) -> list[str]:
    """``dfx run``'s arguments starting workers with ``command``."""
    program, *args = command
    return ["--worker", program, *(f"--worker-arg={arg}" for arg in args)]


def published_compressions(spec: SessionSpec) -> set[str]:
    """How the record batches of the map files under ``spec``'s location are packed."""
    files = pathlib.Path(spec.shuffle_dir).glob(f"{_internal.partition_glob()}/*")
    found: set[str] = set()
    for path in files:
        found |= map_compressions(path)
    return found


JOIN_SQL = "SELECT count(*) AS n, max(a.s) AS s FROM t a JOIN t b ON a.k = b.k"
"""A join of ``t`` with itself: its hash exchanges publish every row."""

JOIN_ANSWER = [{"n": 20_000, "s": "x" * 32}]


@pytest.fixture
def compressible(tmp_path: pathlib.Path) -> SessionSpec:
    """A spec over ``t``: two files of 10 000 rows that LZ4 shrinks.

    A key and a repeated string: the writer stores a buffer LZ4 would not
    shrink (a tiny one) uncompressed, whatever it was asked.
    """
    table = tmp_path / "t"
    table.mkdir()
    for index in range(2):
        keys = pa.array(range(index * 10_000, (index + 1) * 10_000), pa.int64())
        strings = pa.array(["x" * 32] * 10_000)
        pq.write_table(
            pa.table({"k": keys, "s": strings}), table / f"part-{index}.parquet"
        )
    return SessionSpec(
        tables={"t": str(table)},
        shuffle_dir=str(tmp_path / "shuffle"),
        target_partitions=2,
    )


def assert_compressed_as(spec: SessionSpec, compression: str) -> None:
    """Every map file under ``spec``'s location is compressed as asked."""
    found = published_compressions(spec)
    if compression == "lz4":
        assert "lz4" in found, found
    else:
        assert found == {"none"}, found


@pytest.mark.parametrize("compression", ["lz4", "none"])
def test_rust_workers_honour_the_python_drivers_shuffle_compression(
    compressible: SessionSpec, compression: str
) -> None:
    spec = dataclasses.replace(compressible, shuffle_compression=compression)
    result = run_distributed(JOIN_SQL, spec, worker_command=RUST_WORKER)
    assert as_rows(result.batches) == JOIN_ANSWER
    assert_compressed_as(spec, compression)


@pytest.mark.parametrize("compression", ["lz4", "none"])
def test_python_workers_honour_the_rust_drivers_shuffle_compression(
    compressible: SessionSpec, tmp_path: pathlib.Path, compression: str
) -> None:
    spec = dataclasses.replace(compressible, shuffle_compression=compression)
    done = dfx_run(
        spec, "exchange", tmp_path, *as_dfx_worker(PYTHON_WORKER), sql=JOIN_SQL
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == JOIN_ANSWER
    assert_compressed_as(spec, compression)


def stage_one_maps(spec: SessionSpec) -> int:
    """The maps of stage 1 (the one the root reads) of ``SQL_ONLY``."""
    ctx, _engine = build_session(spec)
    first = encode_stages(ctx, ctx.sql(SQL_ONLY).execution_plan())[0]
    return int(_internal.encoded_stage_info(first).maps)


def test_output_lost_to_the_python_drivers_root_is_rerun_on_rust_workers(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    spec = make_spec()
    maps = stage_one_maps(make_spec())
    claim = tmp_path / "claimed"
    # A Rust worker per task; after the last map of stage 1 has run, the
    # file of its first map holding rows (the root, handed the layouts,
    # reads no map published empty) is deleted, once, before the root
    # reads it.
    lose = tmp_path / "lose.py"
    lose.write_text(
        "import json, pathlib, sys\n"
        "from conftest import read_marker\n"
        f"shuffle, maps = {spec.shuffle_dir!r}, {maps}\n"
        "def holds_rows(m):\n"
        "    return any(b['rows'] for b in read_marker(shuffle, 1, m)['buckets'])\n"
        "lost = next(m for m in range(maps) if holds_rows(m))\n"
        f"pathlib.Path({str(claim)!r}).write_text(str(lost))\n"
        "from dfx_engine import _internal\n"
        "pathlib.Path(_internal.marker_path(shuffle, 1, lost)).unlink()\n"
    )
    lock = tmp_path / "losing"
    wrapper = tmp_path / "losing-dfx-worker.sh"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'"{DFX}" worker "$1"; status=$?\n'
        'case "$(basename "$1")" in\n'
        f'  task-1-{maps - 1}.json) mkdir "{lock}" 2>/dev/null && '
        f'PYTHONPATH="{pathlib.Path(__file__).parent}" "{sys.executable}" "{lose}";;\n'
        "esac\n"
        'exit "$status"\n'
    )
    wrapper.chmod(0o755)
    result = run_distributed(
        SQL_ONLY,
        spec,
        worker_command=[str(wrapper)],
        worker_mode="process",
        max_workers=1,
    )
    assert as_rows(result.batches) == HAND_ANSWER
    lost = int(claim.read_text())
    assert result.attempts[(1, lost)] == 2
    assert result.retries == [
        f"stage 1 map {lost} attempt 1: run again, its output was lost (read by "
        "the query's root)"
    ]
    assert pathlib.Path(_internal.marker_path(spec.shuffle_dir, 1, lost)).is_file()


def test_output_lost_to_the_rust_drivers_root_is_rerun_on_python_workers(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    spec = make_spec()
    command = losing_worker(
        tmp_path / "losing", spec.shuffle_dir, (1, None), after_last_of=1
    )
    done = dfx_run(
        spec, "exchange", tmp_path, "--max-workers", "1", *as_dfx_worker(command)
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == HAND_ANSWER
    # The loss happened, and the map was published again for the root.
    lost = int((tmp_path / "losing" / "claimed").read_text())
    assert pathlib.Path(_internal.marker_path(spec.shuffle_dir, 1, lost)).is_file()


def test_a_location_spelled_two_ways_is_one_location_to_either_host(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    first, second = make_spec(), make_spec()
    # The Python driver, with Rust workers, on `file://DIR/`: the stages name
    # the location as the driver spells it, the workers take it as theirs.
    url = SessionSpec(
        tables=first.tables,
        shuffle_dir=f"file://{first.shuffle_dir}/",
        target_partitions=4,
    )
    result = run_distributed(SQL_ONLY, url, worker_command=RUST_WORKER)
    assert as_rows(result.batches) == HAND_ANSWER
    assert pathlib.Path(_internal.marker_path(first.shuffle_dir, 1, 0)).is_file()
    # The Rust driver, on the plain path: the same location, used already.
    reused = dfx_run(first, "exchange", tmp_path)
    assert reused.returncode != 0
    assert "already holds stage output" in reused.stderr

    # The Rust driver, with Python workers, on `file://DIR/`; then the
    # Python driver on the plain path.
    url = SessionSpec(
        tables=second.tables,
        shuffle_dir=f"file://{second.shuffle_dir}/",
        target_partitions=4,
    )
    done = dfx_run(url, "exchange", tmp_path, *as_dfx_worker(PYTHON_WORKER))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == HAND_ANSWER
    with pytest.raises(ValueError, match="already holds stage output"):
        run_distributed(SQL_ONLY, second)
