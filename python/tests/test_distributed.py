"""The driver end to end: real worker processes, the real plugin file."""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest
from conftest import (
    FILES,
    REVENUE_SQL,
    SQL_ONLY,
    as_rows,
    assert_revenue,
    assert_same,
)

from dfx_engine import _internal
from dfx_engine.driver import (
    dataframe_for,
    find_stage,
    find_stages,
    require_empty_shuffle,
    run_distributed,
    run_local,
)
from dfx_engine.session import build_session

if TYPE_CHECKING:
    from collections.abc import Callable

    from dfx_engine.session import SessionSpec


def stage_files(shuffle_dir: str) -> list[str]:
    """Names of the published stage files in ``shuffle_dir``."""
    return sorted(p.name for p in pathlib.Path(shuffle_dir).glob("stage-*"))


def test_distributed_equals_local_equals_hand_answer(
    make_spec: Callable[..., SessionSpec],
) -> None:
    spec = make_spec()
    result = run_distributed(REVENUE_SQL, spec)
    assert_revenue(as_rows(result.batches))
    assert_revenue(as_rows(run_local(REVENUE_SQL, spec)))
    assert result.tasks == [(1, p) for p in range(FILES)]
    # Each task's partial aggregate: one row per flag present in its file.
    assert result.task_rows == {(1, 0): 2, (1, 1): 2, (1, 2): 2, (1, 3): 2}
    for (stage, partition), rows in result.task_rows.items():
        path = _internal.partition_path(spec.shuffle_dir, stage, partition)
        assert pa.ipc.open_stream(path).read_all().num_rows == rows


def test_default_partitions_still_give_one_task_per_file(
    make_spec: Callable[..., SessionSpec],
) -> None:
    # target_partitions=2 over four files: the floor is the file count, as in
    # the Rust host, so one spec plans alike in both.
    spec = make_spec(target_partitions=2)
    result = run_distributed(SQL_ONLY, spec)
    assert result.tasks == [(1, 0), (1, 1), (1, 2), (1, 3)]
    assert_same(as_rows(result.batches), as_rows(run_local(SQL_ONLY, spec)))
    assert as_rows(result.batches) == [
        {"flag": "A", "n": 3, "qty": 90},
        {"flag": "B", "n": 3, "qty": 130},
        {"flag": "R", "n": 2, "qty": 140},
    ]


def test_union_of_two_aggregates_ships_both_stages(
    make_spec: Callable[..., SessionSpec],
) -> None:
    spec = make_spec()
    sql = """
        SELECT 'q' AS k, sum(l_quantity) AS v FROM lineitem
        UNION ALL
        SELECT 'n' AS k, CAST(sum(dfx_net_revenue(l_extendedprice, l_discount, l_tax))
                              AS BIGINT) AS v FROM lineitem
        ORDER BY k
    """
    _ctx, df = dataframe_for(sql, spec)
    assert len(find_stages(df.execution_plan())) == 2

    result = run_distributed(sql, spec)
    assert as_rows(result.batches) == [{"k": "n", "v": 3150}, {"k": "q", "v": 360}]
    assert sorted(result.tasks) == [(s, p) for s in (1, 2) for p in range(FILES)]
    assert len(set(result.tasks)) == 8
    assert stage_files(spec.shuffle_dir) == sorted(
        f"stage-{s}-part-{p}.arrow" for s in (1, 2) for p in range(FILES)
    )


def test_one_file_per_task_and_no_temp_left(
    make_spec: Callable[..., SessionSpec],
) -> None:
    spec = make_spec()
    result = run_distributed(REVENUE_SQL, spec)
    expected = sorted(
        pathlib.Path(_internal.partition_path(spec.shuffle_dir, s, p)).name
        for s, p in result.tasks
    )
    assert stage_files(spec.shuffle_dir) == expected
    leftovers = [p.name for p in pathlib.Path(spec.shuffle_dir).rglob("*.tmp")]
    assert leftovers == []


def test_driver_reads_the_published_files(
    make_spec: Callable[..., SessionSpec],
) -> None:
    spec = make_spec()
    run_distributed(REVENUE_SQL, spec)
    victim = pathlib.Path(_internal.partition_path(spec.shuffle_dir, 1, 2))
    victim.write_bytes(b"not an arrow stream")
    ctx, _engine = build_session(spec)
    with pytest.raises(Exception, match=str(victim)):
        ctx.sql(REVENUE_SQL).collect()


def test_no_shuffle_dir_means_no_stage(make_spec: Callable[..., SessionSpec]) -> None:
    spec = make_spec(shuffle=False)
    _ctx, df = dataframe_for(REVENUE_SQL, spec)
    assert find_stage(df.execution_plan()) is None
    assert_revenue(as_rows(df.collect()))
    with pytest.raises(ValueError, match="shuffle_dir"):
        run_distributed(REVENUE_SQL, spec)


def test_reused_shuffle_dir_is_refused_before_anything_runs(
    make_spec: Callable[..., SessionSpec],
) -> None:
    spec = make_spec()
    run_distributed(SQL_ONLY, spec)
    before = _internal.counters()
    files = stage_files(spec.shuffle_dir)
    with pytest.raises(RuntimeError, match="already holds stage output") as info:
        run_distributed(SQL_ONLY, spec)
    assert "previous query" in str(info.value)
    # Nothing was planned, encoded or written.
    assert _internal.counters()["planner_calls"] == before["planner_calls"]
    assert _internal.counters()["stages_encoded"] == before["stages_encoded"]
    assert stage_files(spec.shuffle_dir) == files


def test_require_empty_shuffle_ignores_other_files(tmp_path: pathlib.Path) -> None:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    require_empty_shuffle(tmp_path)
    require_empty_shuffle(tmp_path / "does-not-exist")
    pathlib.Path(_internal.partition_path(str(tmp_path), 1, 0)).write_bytes(b"")
    with pytest.raises(RuntimeError, match=r"stage-1-part-0\.arrow"):
        require_empty_shuffle(tmp_path)
