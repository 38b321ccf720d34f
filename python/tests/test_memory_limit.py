"""A spec's memory limit in Python workers: real worker processes.

A Python worker's operators are datafusion-python's, and a memory pool
given to them is lost when the plugin's writer runs them, so under a
limit the plugin runs the stage's operators itself with the spec's pool.
Sorts and aggregations then spill past the limit; the rest fail naming
stage and map. Answers are compared with an unlimited run in one process.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import (
    DFX,
    QUERIES,
    assert_same_columns,
    assert_same_rows,
    require_dfx,
    sorted_rows,
    tpch_rows,
)
from datafusion import udf

from dfx_engine.driver import run_distributed, run_local
from dfx_engine.session import SessionSpec

if TYPE_CHECKING:
    import pathlib
    from collections.abc import Callable

WINDOW_SQL = (
    "SELECT sum(rn * k) AS s, count(*) AS n FROM "
    "(SELECT k, row_number() OVER (PARTITION BY v ORDER BY k) AS rn FROM t)"
)
"""Sorts each hash partition (about 200 000 rows of two Int64 columns,
over 3 MiB) in its stage: over a 1 MiB limit, it must spill."""

GROUP_SQL = (
    "SELECT count(*) AS groups, sum(c) AS n FROM "
    "(SELECT k, count(*) AS c FROM t GROUP BY k)"
)
"""Groups 400 000 distinct keys: over a 1 MiB limit, the aggregation spills."""

JOIN_SQL = "SELECT count(*) AS n FROM t a JOIN t b ON a.k = b.k"
"""A hash join's build side, which cannot spill."""


@pytest.fixture(scope="module")
def numbers(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Four Parquet files of 100 000 rows: ``k`` 0..400 000 once, ``v = k % 7``."""
    directory = tmp_path_factory.mktemp("numbers")
    rows = 100_000
    for file in range(4):
        keys = pa.array(range(file * rows, (file + 1) * rows), pa.int64())
        values = pa.array([k % 7 for k in keys.to_pylist()], pa.int64())
        pq.write_table(
            pa.table({"k": keys, "v": values}), directory / f"part-{file}.parquet"
        )
    return directory


def limited(
    table: pathlib.Path, shuffle: pathlib.Path, limit: int | None
) -> SessionSpec:
    """A spec over ``table`` with ``limit`` bytes a task."""
    return SessionSpec(
        tables={"t": str(table)},
        shuffle_dir=str(shuffle),
        target_partitions=2,
        memory_limit=limit,
    )


@pytest.fixture
def spill_dir(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """The temporary directory the workers started from here spill into."""
    directory = tmp_path / "spill"
    directory.mkdir()
    monkeypatch.setenv("TMPDIR", str(directory))
    return directory


@pytest.mark.parametrize("sql", [WINDOW_SQL, GROUP_SQL], ids=["sort", "aggregate"])
def test_a_sort_or_aggregation_over_the_limit_spills_and_answers_right(
    numbers: pathlib.Path,
    tmp_path: pathlib.Path,
    spill_dir: pathlib.Path,
    sql: str,
) -> None:
    expected = sorted_rows(run_local(sql, limited(numbers, tmp_path / "l", None)))
    assert expected[0][1] == 400_000

    result = run_distributed(sql, limited(numbers, tmp_path / "s", 1 << 20))
    assert sorted_rows(result.batches) == expected

    # The workers spilled: with no spill directory they cannot run the
    # same query under the same limit, every failure naming its map...
    spill_dir.rmdir()
    with pytest.raises(RuntimeError) as failed:
        run_distributed(sql, limited(numbers, tmp_path / "n", 1 << 20))
    message = str(failed.value)
    assert f'at path "{spill_dir}/' in message, message
    assert re.search(r"stage \d+ map \d+: execution failed", message), message
    # ...but can without the limit: the limit made them spill.
    unlimited = run_distributed(sql, limited(numbers, tmp_path / "u", None))
    assert sorted_rows(unlimited.batches) == expected


@pytest.mark.parametrize("number", [1, 7, 9, 13, 18, 21, 22], ids=lambda n: f"q{n}")
def test_tpch_under_a_limit_answers_as_one_process(
    tpch_spec: Callable[..., SessionSpec], number: int
) -> None:
    # The plugin decodes and runs every operator of each stage: functions
    # (q7's date_part, q22's substring), joins of every kind, subqueries.
    sql = (QUERIES / f"q{number}.sql").read_text()
    spec = dataclasses.replace(tpch_spec("exchange"), memory_limit=64 << 20)
    result = run_distributed(sql, spec)
    local = run_local(sql, spec)
    assert_same_columns(result.batches, local, f"q{number}")
    assert_same_rows(tpch_rows(result.batches), tpch_rows(local), f"q{number}")


@pytest.mark.parametrize("worker", ["python", "dfx"])
def test_a_join_over_the_limit_fails_naming_stage_and_map(
    numbers: pathlib.Path, tmp_path: pathlib.Path, worker: str
) -> None:
    # A Python worker fails as `dfx worker` does.
    command = None
    if worker == "dfx":
        require_dfx()
        command = [str(DFX), "worker"]
    with pytest.raises(RuntimeError) as failed:
        run_distributed(
            JOIN_SQL,
            limited(numbers, tmp_path / "j", 64 << 10),
            worker_command=command,
        )
    message = str(failed.value)
    assert re.search(r"stage \d+ map \d+: .*Resources exhausted", message), message


def test_a_function_carried_by_value_is_refused_under_a_limit_saying_why(
    make_spec: Callable[..., SessionSpec],
) -> None:
    def double(values: pa.Array) -> pa.Array:
        return pc.multiply(values, 2)

    inline = udf(double, [pa.int64()], pa.int64(), "immutable", name="py_double")
    spec = dataclasses.replace(make_spec(), memory_limit=1 << 24)
    with pytest.raises(RuntimeError) as failed:
        run_distributed(
            "SELECT sum(py_double(l_quantity)) AS q FROM lineitem", spec, [inline]
        )
    message = str(failed.value)
    assert "never one carried by value" in message, message
    assert "py_double" in message, message
