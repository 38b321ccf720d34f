"""DataFrame actions on a session from ``session_for`` run distributed.

``collect()``, ``to_pandas()``, ``count()`` and ``execute_stream()`` plan
the query with dfx's root node; executing it runs
the stages on real worker processes (the session's pool) and reads the head
in this process. All 22 TPC-H queries (scale 0.01, two files a table) agree
with stock datafusion-python over the same files; a query's location under
the root is removed once read and kept, named, when the query fails.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest
from conftest import QUERIES, assert_same_columns, assert_same_rows, tpch_rows
from datafusion import SessionContext

from dfx_engine import last_run, session_for
from dfx_engine.driver import WorkerPool, run_distributed
from dfx_engine.session import SessionSpec

if TYPE_CHECKING:
    import pathlib
    from collections.abc import Iterator


@pytest.fixture(scope="module")
def pool() -> Iterator[WorkerPool]:
    """Two serving workers for the module's sessions."""
    with WorkerPool(max_workers=2) as workers:
        yield workers


@pytest.fixture(scope="module")
def stock(tpch_tables: dict[str, str]) -> SessionContext:
    """Stock datafusion-python over the TPC-H files: no dfx at all."""
    ctx = SessionContext()
    for name, location in tpch_tables.items():
        ctx.register_parquet(name, location)
    return ctx


def locations(root: pathlib.Path) -> list[str]:
    """The query locations under ``root`` (its marker file left out)."""
    return sorted(p.name for p in root.iterdir() if p.is_dir())


def test_the_22_tpch_queries_collected_agree_with_stock(
    tpch_tables: dict[str, str],
    stock: SessionContext,
    pool: WorkerPool,
    tmp_path: pathlib.Path,
) -> None:
    root = tmp_path / "root"
    spec = SessionSpec(tables=dict(tpch_tables), shuffle_root=str(root))
    ctx = session_for(spec, pool=pool)
    seen = None
    for number in range(1, 23):
        label = f"q{number}"
        sql = (QUERIES / f"q{number}.sql").read_text()
        got = ctx.sql(sql).collect()
        expected = stock.sql(sql).collect()
        assert_same_columns(got, expected, label)
        assert_same_rows(tpch_rows(got), tpch_rows(expected), label)
        run = last_run(ctx)
        assert run is not None, label
        assert run.tasks, label
        # This query's run, not the last one's: the driver's times differ.
        assert run.reports != seen, f"{label} ran no stage of its own"
        seen = run.reports
        # Every task ran in a worker process of the pool, none in this one.
        workers = {report["worker"] for report in run.reports.values()}
        assert None not in workers, label
        assert os.getpid() not in workers, label
        assert workers <= set(pool.pids()), label
    # Each query's location went once its answer was read.
    assert locations(root) == []


@pytest.mark.parametrize("number", [1, 3, 10, 18])
def test_to_pandas_agrees_with_stock(
    tpch_tables: dict[str, str],
    stock: SessionContext,
    pool: WorkerPool,
    tmp_path: pathlib.Path,
    number: int,
) -> None:
    spec = SessionSpec(tables=dict(tpch_tables), shuffle_root=str(tmp_path))
    ctx = session_for(spec, pool=pool)
    sql = (QUERIES / f"q{number}.sql").read_text()
    got = ctx.sql(sql).to_pandas()
    expected = stock.sql(sql).to_pandas()
    assert list(got.columns) == list(expected.columns)
    assert len(got) == len(expected)
    for column in got.columns:
        left, right = list(got[column]), list(expected[column])
        if got[column].dtype.kind == "f":
            assert left == pytest.approx(right, rel=1e-6), column
        else:
            assert left == right, column
    assert last_run(ctx) is not None


def test_count_a_stream_a_table_and_show_each_run_their_stages(
    tpch_tables: dict[str, str],
    stock: SessionContext,
    pool: WorkerPool,
    tmp_path: pathlib.Path,
) -> None:
    # Kept, so each action leaves its own location, stages and all; on a
    # worker, so a plan no wider than a task is a stage too, not kept whole
    # for the driver.
    root = tmp_path / "root"
    spec = SessionSpec(
        tables=dict(tpch_tables),
        shuffle_root=str(root),
        keep_shuffle=True,
        engine_options={"collapse_stages": "task"},
    )
    ctx = session_for(spec, pool=pool)
    sql = "SELECT o_orderpriority, count(*) AS n FROM orders GROUP BY o_orderpriority"

    assert ctx.sql("SELECT * FROM lineitem").count() == (
        stock.sql("SELECT * FROM lineitem").count()
    )
    assert len(locations(root)) == 1

    batches = [batch.to_pyarrow() for batch in ctx.sql(sql).execute_stream()]
    expected = stock.sql(sql).collect()
    assert sorted(tpch_rows(batches)) == sorted(tpch_rows(expected))
    assert len(locations(root)) == 2

    table = ctx.sql(sql).to_arrow_table()
    assert sorted(tpch_rows(table.to_batches())) == sorted(tpch_rows(expected))
    assert len(locations(root)) == 3

    ctx.sql(sql).show()
    assert len(locations(root)) == 4

    for location in locations(root):
        stages = [p.name for p in (root / location).iterdir() if p.is_dir()]
        assert any(name.startswith("stage-") for name in stages), (location, stages)


def test_a_failing_query_keeps_and_names_its_location(
    tpch_tables: dict[str, str], pool: WorkerPool, tmp_path: pathlib.Path
) -> None:
    root = tmp_path / "root"
    spec = SessionSpec(tables=dict(tpch_tables), shuffle_root=str(root))
    ctx = session_for(spec, pool=pool)
    with pytest.raises(Exception, match="kept for inspection") as failure:
        ctx.sql("SELECT CAST(o_comment AS INT) AS n FROM orders").collect()
    kept = locations(root)
    assert len(kept) == 1
    assert kept[0] in str(failure.value)


def test_a_shuffle_dir_runs_one_query_and_refuses_a_second(
    tpch_tables: dict[str, str], pool: WorkerPool, tmp_path: pathlib.Path
) -> None:
    # On a worker, so the query leaves stage output: one file, one partition,
    # would be kept whole for the driver, and leave none.
    spec = SessionSpec(
        tables=dict(tpch_tables),
        shuffle_dir=str(tmp_path / "own"),
        engine_options={"collapse_stages": "task"},
    )
    ctx = session_for(spec, pool=pool)
    sql = "SELECT count(*) AS n FROM nation"
    assert tpch_rows(ctx.sql(sql).collect()) == [(25,)]
    with pytest.raises(Exception, match="stage output"):
        ctx.sql(sql).collect()


def test_run_distributed_still_runs_a_dataframe_of_a_driving_session(
    tpch_tables: dict[str, str], pool: WorkerPool, tmp_path: pathlib.Path
) -> None:
    spec = SessionSpec(
        tables=dict(tpch_tables),
        shuffle_dir=str(tmp_path / "own"),
        engine_options={"collapse_stages": "task"},
    )
    ctx = session_for(spec, pool=pool)
    result = run_distributed(
        ctx.sql("SELECT count(*) AS n FROM region"), spec, pool=pool
    )
    assert tpch_rows(result.batches) == [(5,)]
    assert result.tasks


def test_a_session_in_process_mode_runs_a_process_per_task(
    tpch_tables: dict[str, str], stock: SessionContext, tmp_path: pathlib.Path
) -> None:
    spec = SessionSpec(tables=dict(tpch_tables), shuffle_root=str(tmp_path))
    ctx = session_for(spec, worker_mode="process", max_workers=2)
    sql = (QUERIES / "q3.sql").read_text()
    got = ctx.sql(sql).collect()
    expected = stock.sql(sql).collect()
    assert_same_rows(tpch_rows(got), tpch_rows(expected), "q3")
    run = last_run(ctx)
    assert run is not None
    workers = {report["worker"] for report in run.reports.values()}
    # One process per task, none of them this one.
    assert len(workers) == len(run.tasks)
    assert os.getpid() not in workers
