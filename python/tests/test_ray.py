"""The Ray executor: tasks as Ray tasks on a local Ray of two CPUs.

Ray is started once for the module (``ray.init(num_cpus=2)``) and shut down
after it. Its worker processes import the installed ``dfx_engine`` and load
the plugin bundled in it, as on a cluster's nodes. The shuffle is a local
directory, which every worker of a one-machine Ray can read, or an ``s3://``
location on conftest's S3 server, as on a cluster: the Ray tasks get their
envelopes and plans by value and their keys through the executor's
``runtime_env``.
"""

from __future__ import annotations

import os
import pathlib
import re
import tempfile
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import (
    BUCKET,
    QUERIES,
    S3_CREDENTIALS,
    SQL_ONLY,
    TPCH_SKIP,
    S3Server,
    alive,
    as_rows,
    assert_same,
    assert_same_columns,
    assert_same_rows,
    tpch_rows,
)
from datafusion import udf

from dfx_engine.driver import run_distributed, run_local
from dfx_engine.session import SessionSpec

ray = pytest.importorskip("ray")

from dfx_engine.ray import RayExecutor  # noqa: E402 - only once Ray is importable

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


@pytest.fixture(scope="module")
def executor() -> Iterator[RayExecutor]:
    """A Ray executor over a local Ray of two CPUs, shut down afterwards."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield RayExecutor()
    finally:
        ray.shutdown()


def test_the_executor_runs_as_many_tasks_at_once_as_ray_has_cpus(
    executor: RayExecutor,
) -> None:
    assert executor.max_workers == 2
    assert RayExecutor(options={"num_cpus": 2}).max_workers == 1
    with pytest.raises(ValueError, match="max_retries"):
        RayExecutor(options={"max_retries": 3})


def test_an_executor_refuses_settings_of_the_subprocess_workers(
    executor: RayExecutor, make_spec: Callable[..., SessionSpec]
) -> None:
    with pytest.raises(ValueError, match="worker_mode"):
        run_distributed(
            "SELECT 1", make_spec(), executor=executor, worker_mode="process"
        )
    with pytest.raises(ValueError, match="max_workers"):
        run_distributed("SELECT 1", make_spec(), executor=executor, max_workers=2)


@TPCH_SKIP
@pytest.mark.parametrize("number", range(1, 23), ids=lambda n: f"q{n}")
def test_tpch_query_through_ray_agrees_with_local(
    executor: RayExecutor, tpch_spec: Callable[[], SessionSpec], number: int
) -> None:
    sql = (QUERIES / f"q{number}.sql").read_text()
    spec = tpch_spec()
    result = run_distributed(sql, spec, executor=executor)
    local = run_local(sql, spec)
    assert result.stages
    assert set(result.reports) == set(result.tasks)
    assert result.retries == []
    assert_same_columns(result.batches, local, f"q{number}")
    assert_same_rows(tpch_rows(result.batches), tpch_rows(local), f"q{number}")


@pytest.fixture(scope="module")
def s3_executor(executor: RayExecutor, s3: S3Server) -> RayExecutor:
    """An executor on the module's Ray whose tasks carry the S3 keys.

    As on a cluster: the driver's environment does not reach the Ray
    workers, the task's ``runtime_env`` does.
    """
    return RayExecutor(options={"runtime_env": {"env_vars": dict(S3_CREDENTIALS)}})


@TPCH_SKIP
@pytest.mark.parametrize("number", range(1, 23), ids=lambda n: f"q{n}")
def test_tpch_query_through_ray_and_s3_agrees_with_local(
    s3_executor: RayExecutor,
    s3: S3Server,
    tpch_tables: dict[str, str],
    number: int,
) -> None:
    sql = (QUERIES / f"q{number}.sql").read_text()
    prefix = f"ray/tpch-q{number}"
    spec = SessionSpec(
        tables=dict(tpch_tables),
        shuffle_dir=f"s3://{BUCKET}/{prefix}",
        target_partitions=2,
        store_options=s3.store_options,
    )
    result = run_distributed(sql, spec, executor=s3_executor)
    local = run_local(sql, spec)
    assert result.retries == []
    assert_same_columns(result.batches, local, f"q{number}")
    assert_same_rows(tpch_rows(result.batches), tpch_rows(local), f"q{number}")
    keys = s3.keys(BUCKET, f"{prefix}/")
    maps = [key for key in keys if key.endswith(".arrow")]
    assert len(maps) == len(result.tasks), keys
    assert all(key.startswith(f"{prefix}/stage-") for key in maps), keys


SQL = "SELECT l_returnflag AS flag, sum(py_check(l_quantity)) AS q FROM lineitem "


def test_revenue_with_an_inline_udf_through_ray(
    executor: RayExecutor, make_spec: Callable[..., SessionSpec]
) -> None:
    def check(values: pa.Array) -> pa.Array:
        return pc.multiply(values, 1)

    inline = udf(check, [pa.int64()], pa.int64(), "immutable", name="py_check")
    spec = make_spec()
    sql = SQL + "GROUP BY l_returnflag ORDER BY flag"
    result = run_distributed(sql, spec, extra_udfs=[inline], executor=executor)
    expected = [
        {"flag": "A", "q": 90},
        {"flag": "B", "q": 130},
        {"flag": "R", "q": 140},
    ]
    assert_same(as_rows(result.batches), expected)
    assert len(result.tasks) >= 4


def test_a_failing_ray_task_is_reported_with_stage_map_and_remote_traceback(
    executor: RayExecutor, make_spec: Callable[..., SessionSpec]
) -> None:
    def refuse(values: pa.Array) -> pa.Array:
        message = "py_check refuses this batch"
        raise ValueError(message)

    failing = udf(refuse, [pa.int64()], pa.int64(), "immutable", name="py_check")
    with pytest.raises(RuntimeError, match="dfx tasks failed") as info:
        run_distributed(
            SQL + "GROUP BY l_returnflag", make_spec(), [failing], executor=executor
        )
    text = str(info.value)
    failures = re.findall(r"stage (\d+) map (\d+): the Ray task failed", text)
    # One line per failed map, each naming its stage and map.
    assert failures
    assert len(set(failures)) == len(failures)
    assert "Traceback" in text
    assert "py_check refuses this batch" in text
    # The worker's own error says which task it ran, envelope included: the
    # copy the Ray task wrote from the envelope it was passed by value.
    assert re.search(
        r"stage \d+ map \d+ \(.*/dfx-ray-tasks-\d+/\d+/task-[^/]+/task-\d+-\d+\.json\)",
        text,
    )
    # An error the task raised would recur: not retried.
    assert "attempts" not in text


def test_a_ray_worker_that_dies_is_retried_then_reported(
    executor: RayExecutor, make_spec: Callable[..., SessionSpec]
) -> None:
    def die(values: pa.Array) -> pa.Array:
        os._exit(3)

    dying = udf(die, [pa.int64()], pa.int64(), "immutable", name="py_check")
    spec = make_spec(target_partitions=1)
    with pytest.raises(RuntimeError, match="dfx tasks failed") as info:
        run_distributed(
            SQL + "GROUP BY l_returnflag",
            spec,
            [dying],
            executor=executor,
            max_attempts=2,
        )
    text = str(info.value)
    assert re.search(r"stage \d+ map \d+: failed 2 attempts", text)
    assert "Ray worker running it died" in text


def test_the_files_of_a_dead_ray_worker_are_swept_by_a_later_task(
    executor: RayExecutor, make_spec: Callable[..., SessionSpec]
) -> None:
    def die(values: pa.Array) -> pa.Array:
        os._exit(3)

    dying = udf(die, [pa.int64()], pa.int64(), "immutable", name="py_check")
    sql = SQL + "GROUP BY l_returnflag"
    with pytest.raises(RuntimeError, match="dfx tasks failed"):
        run_distributed(sql, make_spec(), [dying], executor=executor, max_attempts=1)
    # Each task sweeps the directories of processes that are gone.
    result = run_distributed(SQL_ONLY, make_spec(), executor=executor)
    assert result.tasks
    root = pathlib.Path(tempfile.gettempdir()) / f"dfx-ray-tasks-{os.getuid()}"
    left = [entry.name for entry in root.iterdir()]
    assert all(alive(int(name)) for name in left), left
    # And a task's own directory is gone once it ended.
    assert all(list((root / name).iterdir()) == [] for name in left), left
