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

import collections
import dataclasses
import json
import os
import pathlib
import re
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import (
    BUCKET,
    QUERIES,
    REVENUE_SQL,
    S3_CREDENTIALS,
    SQL_ONLY,
    S3Server,
    as_rows,
    assert_revenue,
    assert_same,
    assert_same_columns,
    assert_same_rows,
    tpch_rows,
)
from datafusion import udf
from test_retries import stage_infos

from dfx_engine import _internal, last_run, session_for
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


@pytest.mark.parametrize("number", [3, 9, 18])
def test_ray_tasks_run_slices_of_partitions(
    executor: RayExecutor, tpch_spec: Callable[[], SessionSpec], number: int
) -> None:
    sql = (QUERIES / f"q{number}.sql").read_text()
    # Kept as stages: a plan no wider than a task's four partitions would be
    # one stage.
    options = {"partitions_per_task": "4", "collapse_stages": "off"}
    spec = dataclasses.replace(tpch_spec(), target_partitions=4, engine_options=options)
    result = run_distributed(sql, spec, executor=executor)
    local = run_local(sql, spec)
    # One task per stage: each runs all four of its stage's partitions.
    assert len(result.stages) > 1
    assert len(result.tasks) == len(result.stages)
    assert_same_columns(result.batches, local, f"q{number}")
    assert_same_rows(tpch_rows(result.batches), tpch_rows(local), f"q{number}")


@pytest.mark.parametrize("number", [1, 3, 9, 13])
def test_a_session_on_ray_collects_distributed(
    executor: RayExecutor, tpch_spec: Callable[[], SessionSpec], number: int
) -> None:
    # The plan runs inside collect(), which waits with the GIL released;
    # each Ray task's call takes it on the runtime's blocking thread.
    sql = (QUERIES / f"q{number}.sql").read_text()
    spec = tpch_spec()
    ctx = session_for(spec, executor=executor)
    got = ctx.sql(sql).collect()
    local = run_local(sql, spec)
    run = last_run(ctx)
    assert run is not None
    assert run.tasks
    assert run.retries == []
    assert_same_columns(got, local, f"q{number}")
    assert_same_rows(tpch_rows(got), tpch_rows(local), f"q{number}")


@pytest.fixture(scope="module")
def s3_executor(executor: RayExecutor, s3: S3Server) -> RayExecutor:
    """An executor on the module's Ray whose tasks carry the S3 keys.

    As on a cluster: the driver's environment does not reach the Ray
    workers, the task's ``runtime_env`` does.
    """
    return RayExecutor(options={"runtime_env": {"env_vars": dict(S3_CREDENTIALS)}})


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
    # Every map of every stage is one object, a coalesced group's members
    # (published empty by their group's task) included.
    maps = {key for key in keys if key.endswith(".arrow")}
    assert maps == {
        _internal.map_path(prefix, stage.stage_id, m)
        for stage in result.stages
        for m in range(stage.maps)
    }, keys


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


def test_a_failing_ray_task_is_reported_with_stage_map_and_its_error(
    executor: RayExecutor, make_spec: Callable[..., SessionSpec]
) -> None:
    def refuse(values: pa.Array) -> pa.Array:
        message = "py_check refuses this batch"
        raise ValueError(message)

    failing = udf(refuse, [pa.int64()], pa.int64(), "immutable", name="py_check")
    with pytest.raises(RuntimeError, match=r"worker task\(s\) failed") as info:
        run_distributed(
            SQL + "GROUP BY l_returnflag", make_spec(), [failing], executor=executor
        )
    text = str(info.value)
    failures = re.findall(r"- stage (\d+) map (\d+) failed: stage \1 map \2: ", text)
    # One line per failed map, each naming its stage and map, with the
    # worker's own error.
    assert failures
    assert len(set(failures)) == len(failures)
    assert "py_check refuses this batch" in text
    # An error the task reported would recur: not retried.
    assert "attempts" not in text


def test_a_ray_worker_that_dies_is_retried_then_reported(
    executor: RayExecutor, make_spec: Callable[..., SessionSpec]
) -> None:
    def die(values: pa.Array) -> pa.Array:
        os._exit(3)

    dying = udf(die, [pa.int64()], pa.int64(), "immutable", name="py_check")
    spec = make_spec(target_partitions=1)
    with pytest.raises(RuntimeError, match=r"worker task\(s\) failed") as info:
        run_distributed(
            SQL + "GROUP BY l_returnflag",
            spec,
            [dying],
            executor=executor,
            max_attempts=2,
        )
    text = str(info.value)
    assert re.search(r"stage \d+ map \d+ failed 2 attempts", text)
    assert "Ray worker running it died" in text


def test_a_query_after_a_dead_ray_worker_runs_on_the_same_executor(
    executor: RayExecutor, make_spec: Callable[..., SessionSpec]
) -> None:
    def die(values: pa.Array) -> pa.Array:
        os._exit(3)

    dying = udf(die, [pa.int64()], pa.int64(), "immutable", name="py_check")
    sql = SQL + "GROUP BY l_returnflag"
    with pytest.raises(RuntimeError, match=r"worker task\(s\) failed"):
        run_distributed(sql, make_spec(), [dying], executor=executor, max_attempts=1)
    spec = make_spec()
    result = run_distributed(SQL_ONLY, spec, executor=executor)
    assert result.retries == []
    assert_same(as_rows(result.batches), as_rows(run_local(SQL_ONLY, spec)))


def test_a_ray_task_past_its_timeout_is_cancelled_and_runs_again(
    executor: RayExecutor, make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    claim = str(tmp_path / "claim")

    def hang_once(values: pa.Array) -> pa.Array:
        try:
            os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return values
        time.sleep(600)
        return values

    hanging = udf(hang_once, [pa.int64()], pa.int64(), "immutable", name="py_check")
    spec = make_spec(split="aggregate")
    sql = SQL + "GROUP BY l_returnflag ORDER BY flag"
    result = run_distributed(sql, spec, [hanging], executor=executor, task_timeout=15)
    assert as_rows(result.batches) == [
        {"flag": "A", "q": 90},
        {"flag": "B", "q": 130},
        {"flag": "R", "q": 140},
    ]
    assert len(result.retries) == 1
    assert "timed out" in result.retries[0]


@pytest.fixture(scope="module")
def serving(executor: RayExecutor) -> RayExecutor:
    """Two long-lived dfx worker actors on the one node, serving their map files."""
    return RayExecutor(serve_maps=True, workers_per_node=2)


@pytest.mark.parametrize("durability", ["local", "both"])
@pytest.mark.parametrize("number", [3, 9, 18])
def test_tpch_on_ray_actors_serving_their_maps_agrees_with_local(
    serving: RayExecutor,
    tpch_spec: Callable[[], SessionSpec],
    number: int,
    durability: str,
) -> None:
    sql = (QUERIES / f"q{number}.sql").read_text()
    spec = dataclasses.replace(tpch_spec(), shuffle_durability=durability)
    result = run_distributed(sql, spec, executor=serving)
    local = run_local(sql, spec)
    assert result.retries == []
    assert len(serving.actors()) == 2
    # The driver's root, at least, streamed the last stage's maps.
    assert serving.served()["streams"] > 0
    assert_same_columns(result.batches, local, f"q{number}")
    assert_same_rows(tpch_rows(result.batches), tpch_rows(local), f"q{number}")


def test_serving_actors_choose_the_durability_a_spec_leaves_open(
    serving: RayExecutor,
    executor: RayExecutor,
    make_spec: Callable[..., SessionSpec],
) -> None:
    # A directory: each node keeps its own maps; a bucket: a copy there too.
    assert serving.default_durability("/mnt/dfx/q1") == "local"
    assert serving.default_durability("file:///mnt/dfx/q1") == "local"
    assert serving.default_durability("s3://dfx/q1") == "both"
    # Ray tasks serve nothing: the location alone.
    assert executor.default_durability("/mnt/dfx/q1") == "object_store"
    assert executor.default_durability("s3://dfx/q1") == "object_store"

    spec = make_spec()
    assert spec.shuffle_durability is None
    before = serving.served()["streams"]
    result = run_distributed(REVENUE_SQL, spec, executor=serving)
    assert_revenue(as_rows(result.batches))
    # Streamed between the actors: the spec ran under local.
    assert serving.served()["streams"] > before

    # Once the query is done, each actor removes its node's directory of a
    # location it wrote under, and nothing else.
    location = pathlib.Path(spec.shuffle_dir)
    assert any(location.glob("stage-*/*-map-*.arrow"))
    stranger = location.parent / "not-a-location"
    stranger.mkdir()
    assert serving.forget_location(str(stranger)) == 0
    assert stranger.is_dir()
    assert serving.forget_location(spec.shuffle_dir) >= 1
    assert not location.exists()


def test_maps_on_worker_disks_need_ray_actors(
    executor: RayExecutor, make_spec: Callable[..., SessionSpec]
) -> None:
    spec = dataclasses.replace(make_spec(), shuffle_durability="local")
    with pytest.raises(Exception, match="do not outlive their tasks"):
        run_distributed(SQL_ONLY, spec, executor=executor)


class LosingExecutor(RayExecutor):
    """Serving actors, one of which is lost mid-query.

    The actor that ran the most maps of stage ``upstream`` is killed when the
    first task of stage ``reader`` is handed out, as a lost node would be.
    """

    def __init__(self, upstream: int, reader: int) -> None:
        """Two actors on the node; nothing lost yet."""
        super().__init__(serve_maps=True, workers_per_node=2)
        self.upstream, self.reader = upstream, reader
        self.ran: dict[int, str] = {}
        self.lost: set[int] = set()

    def run(self, envelope_json: str, plan: bytes, timeout: float | None) -> str:
        """The task, after the loss when it is the reader's first."""
        task = json.loads(envelope_json)
        if task["stage_id"] == self.reader and self.ran and not self.lost:
            victim = collections.Counter(self.ran.values()).most_common(1)[0][0]
            self.lost = {m for m, a in self.ran.items() if a == victim}
            ray.kill(self.actors()[victim])
            # Its death is found as its maps are read, as a node's would be.
        return super().run(envelope_json, plan, timeout)

    def _choose(self, task: _internal.TaskPlacement) -> tuple[str, Any]:
        address, actor = super()._choose(task)
        if task.stage_id == self.upstream:
            self.ran[task.map] = address
        return address, actor


@pytest.mark.parametrize("durability", ["local", "both"])
def test_a_lost_ray_actor_costs_its_maps_under_local_and_nothing_under_both(
    executor: RayExecutor, make_spec: Callable[..., SessionSpec], durability: str
) -> None:
    spec = dataclasses.replace(make_spec(), shuffle_durability=durability)
    reader = next(info for info in stage_infos(spec, REVENUE_SQL) if info.deps)
    losing = LosingExecutor(reader.deps[0], reader.stage_id)
    result = run_distributed(REVENUE_SQL, spec, executor=losing, max_attempts=5)
    assert_revenue(as_rows(result.batches))
    assert losing.lost
    rerun = {
        m
        for (s, m), made in result.attempts.items()
        if s == losing.upstream and made > 1
    }
    assert rerun == (losing.lost if durability == "local" else set()), result.retries
