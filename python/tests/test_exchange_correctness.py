"""Distributed answers equal local ones, query shape by query shape.

Each query runs through the Python driver with Python workers, in both split
modes, and its rows (sorted, unless the query orders them) are compared with
the same query run in one process. The shapes are the ones an exchange can get
wrong: joins of every type with equi and non-equi conditions (NULL keys on
both sides), semi and anti joins (``EXISTS``, ``IN``, the null-aware
``NOT IN``), a cross join, windows with and without ``PARTITION BY``, set
operations, ``ORDER BY`` with ``LIMIT``, scalar subqueries and recursive
CTEs.

The fixture, two tables of four Parquet files each::

    a(k INT NULL, v INT)   48 rows, k in 0..59 or NULL (every 7th row), v = row
    b(k INT NULL, w INT)   40 rows, k in 0..44 or NULL (every 6th row), w = 3*row

so equi joins match some keys and leave others unmatched on each side, and
``a.k > b.k + 40`` holds for some pairs and not for others.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import assert_same_columns, assert_same_rows, sorted_rows

from dfx_engine.driver import run_distributed, run_local
from dfx_engine.session import SessionSpec

if TYPE_CHECKING:
    import pathlib
    from collections.abc import Callable

FILES_PER_TABLE = 4


def _a_rows() -> list[dict[str, int | None]]:
    return [{"k": None if i % 7 == 3 else (i * 11) % 60, "v": i} for i in range(48)]


def _b_rows() -> list[dict[str, int | None]]:
    return [{"k": None if i % 6 == 2 else (i * 7) % 45, "w": 3 * i} for i in range(40)]


def _write_table(
    directory: pathlib.Path, rows: list[dict[str, int | None]], schema: pa.Schema
) -> None:
    directory.mkdir()
    per_file = -(-len(rows) // FILES_PER_TABLE)
    for index in range(FILES_PER_TABLE):
        chunk = rows[index * per_file : (index + 1) * per_file]
        table = pa.Table.from_pylist(chunk, schema)
        pq.write_table(table, directory / f"part-{index}.parquet")


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Tables ``a`` and ``b``: four Parquet files each, NULL join keys in both."""
    root = tmp_path_factory.mktemp("joins")
    a_schema = pa.schema([("k", pa.int32(), True), ("v", pa.int32(), False)])
    b_schema = pa.schema([("k", pa.int32(), True), ("w", pa.int32(), False)])
    _write_table(root / "a", _a_rows(), a_schema)
    _write_table(root / "b", _b_rows(), b_schema)
    return {"a": str(root / "a"), "b": str(root / "b")}


@pytest.fixture
def spec_for(
    tables: dict[str, str], tmp_path: pathlib.Path
) -> Callable[[str], SessionSpec]:
    """A spec over the fixture in the given split mode, fresh shuffle dir each."""
    counter = itertools.count()

    def make(split: str) -> SessionSpec:
        return SessionSpec(
            tables=dict(tables),
            shuffle_dir=str(tmp_path / f"shuffle-{next(counter)}"),
            target_partitions=FILES_PER_TABLE,
            split=split,
        )

    return make


UNORDERED = {
    "inner_equi": "SELECT a.k, a.v, b.w FROM a JOIN b ON a.k = b.k",
    "left_equi": "SELECT a.k, a.v, b.w FROM a LEFT JOIN b ON a.k = b.k",
    "right_equi": "SELECT b.k, a.v, b.w FROM a RIGHT JOIN b ON a.k = b.k",
    "full_equi": "SELECT a.k, b.k, a.v, b.w FROM a FULL JOIN b ON a.k = b.k",
    "inner_equi_with_filter": (
        "SELECT a.v, b.w FROM a JOIN b ON a.k = b.k AND a.v * 3 < b.w"
    ),
    "inner_non_equi": "SELECT a.v, b.w FROM a JOIN b ON a.k > b.k + 20",
    "left_non_equi": "SELECT a.v, b.w FROM a LEFT JOIN b ON a.k > b.k + 20",
    "right_non_equi": "SELECT a.v, b.w FROM a RIGHT JOIN b ON a.k > b.k + 20",
    "full_non_equi": "SELECT a.v, b.w FROM a FULL JOIN b ON a.k > b.k + 20",
    "full_non_equi_count": "SELECT count(*) FROM a FULL JOIN b ON a.k > b.k + 40",
    "left_equi_or_non_equi": (
        "SELECT a.v, b.w FROM a LEFT JOIN b ON a.k = b.k OR a.v = b.w"
    ),
    "semi_exists": "SELECT * FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k = a.k)",
    "anti_not_exists": (
        "SELECT * FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.k = a.k)"
    ),
    "semi_in": "SELECT * FROM a WHERE a.k IN (SELECT k FROM b)",
    # Empty, as b.k holds NULL: counted, so that the answer is a row.
    "null_aware_not_in": "SELECT count(*) FROM a WHERE a.k NOT IN (SELECT k FROM b)",
    "not_in_non_null_count": (
        "SELECT count(*) FROM a WHERE a.k NOT IN (SELECT k FROM b WHERE k IS NOT NULL)"
    ),
    "not_in_non_null_rows": (
        "SELECT v FROM a WHERE a.k NOT IN (SELECT k FROM b WHERE k IS NOT NULL)"
    ),
    "correlated_exists_non_equi": (
        "SELECT v FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.w > a.v * 2)"
    ),
    "cross_join": "SELECT a.v, b.w FROM a CROSS JOIN b",
    "cross_join_count": "SELECT count(*), sum(a.v + b.w) FROM a CROSS JOIN b",
    "group_by": "SELECT k, count(*), sum(v), min(v) FROM a GROUP BY k",
    "join_then_group": (
        "SELECT a.k, count(*), sum(b.w) FROM a JOIN b ON a.k = b.k GROUP BY a.k"
    ),
    "count_distinct": "SELECT count(DISTINCT k), count(k), count(*) FROM b",
    "window_no_partition": (
        "SELECT v, row_number() OVER (ORDER BY v) AS n, "
        "sum(v) OVER (ORDER BY v ROWS UNBOUNDED PRECEDING) AS running FROM a"
    ),
    "window_partitioned": (
        "SELECT k, v, sum(v) OVER (PARTITION BY k ORDER BY v) AS s, "
        "rank() OVER (PARTITION BY k ORDER BY v DESC) AS r, "
        "count(*) OVER (PARTITION BY k) AS c FROM a"
    ),
    "window_literal_arguments": (
        "SELECT v, lag(v, 2) OVER (ORDER BY v) AS l2, "
        "lead(v, 1, -1) OVER (ORDER BY v) AS l1, ntile(4) OVER (ORDER BY v) AS q, "
        "nth_value(v, 2) OVER (PARTITION BY k ORDER BY v) AS second FROM a"
    ),
    "union": "SELECT k FROM a UNION SELECT k FROM b",
    "union_all": "SELECT k FROM a UNION ALL SELECT k FROM b",
    "intersect": "SELECT k FROM a INTERSECT SELECT k FROM b",
    "except": "SELECT k FROM a EXCEPT SELECT k FROM b",
    "scalar_subquery_filter": "SELECT v FROM a WHERE v > (SELECT avg(w) FROM b) / 4",
    "scalar_subquery_projection": (
        "SELECT k, v, (SELECT max(w) FROM b) - v AS gap FROM a"
    ),
    "correlated_scalar_subquery": (
        "SELECT v, (SELECT count(*) FROM b WHERE b.k = a.k) AS matches FROM a"
    ),
    # A recursive CTE is sealed by the planner and runs whole in one task.
    "recursive_cte_joined_to_a_table": (
        "WITH RECURSIVE r(k, d) AS (SELECT k, 0 FROM a WHERE k < 10 UNION "
        "SELECT b.k, r.d + 1 FROM r JOIN b ON b.k = r.k + 3 WHERE r.d < 4) "
        "SELECT k, d FROM r"
    ),
    "recursive_cte_with_a_projected_work_table_read": (
        "WITH RECURSIVE r(x, y, z) AS (SELECT 1, 2, 3 UNION ALL "
        "SELECT z, x + 1, y FROM r WHERE x < 30) SELECT x FROM r"
    ),
}
"""Queries whose row order is not defined: compared as sorted rows."""

ORDERED = {
    "order_by_limit": "SELECT v, k FROM a ORDER BY v DESC LIMIT 7",
    "order_by_nullable_limit": (
        "SELECT k, v FROM a ORDER BY k NULLS FIRST, v LIMIT 12"
    ),
    "join_order_by_limit": (
        "SELECT a.v, b.w FROM a JOIN b ON a.k = b.k ORDER BY a.v, b.w LIMIT 9"
    ),
    "group_order_by": (
        "SELECT k, sum(w) AS s FROM b GROUP BY k ORDER BY s DESC, k NULLS LAST"
    ),
}
"""Queries that order every row (their sort keys are unique): compared in order."""


def _compare(sql: str, spec: SessionSpec, *, ordered: bool) -> None:
    result = run_distributed(sql, spec)
    local = run_local(sql, spec)
    if ordered:
        distributed_rows = [
            tuple(row.values())
            for row in pa.Table.from_batches(result.batches).to_pylist()
        ]
        local_rows = [
            tuple(row.values()) for row in pa.Table.from_batches(local).to_pylist()
        ]
    else:
        distributed_rows = sorted_rows(result.batches)
        local_rows = sorted_rows(local)
    assert local_rows, f"{sql}: the fixture gives this query no rows"
    assert_same_columns(result.batches, local, f"{spec.split}: {sql}")
    assert_same_rows(distributed_rows, local_rows, f"{spec.split}: {sql}")


@pytest.mark.parametrize("split", ["exchange", "aggregate"])
@pytest.mark.parametrize("name", sorted(UNORDERED))
def test_unordered_query_agrees_with_local(
    spec_for: Callable[[str], SessionSpec], split: str, name: str
) -> None:
    _compare(UNORDERED[name], spec_for(split), ordered=False)


@pytest.mark.parametrize("split", ["exchange", "aggregate"])
@pytest.mark.parametrize("name", sorted(ORDERED))
def test_ordered_query_agrees_with_local(
    spec_for: Callable[[str], SessionSpec], split: str, name: str
) -> None:
    _compare(ORDERED[name], spec_for(split), ordered=True)


def test_the_fixture_exercises_null_keys_and_both_join_outcomes(
    spec_for: Callable[[str], SessionSpec],
) -> None:
    # Guards the fixture itself: without these, the joins above could agree
    # for want of a case to get wrong.
    spec = spec_for("exchange")

    def count(sql: str) -> int:
        value = run_local(sql, spec)[0].column(0)[0].as_py()
        assert isinstance(value, int)
        return value

    assert count("SELECT count(*) FROM a WHERE k IS NULL") > 0
    assert count("SELECT count(*) FROM b WHERE k IS NULL") > 0
    # Some a rows match b, some do not; the same the other way round.
    matched = count("SELECT count(DISTINCT a.v) FROM a JOIN b ON a.k = b.k")
    assert 0 < matched < count("SELECT count(*) FROM a WHERE k IS NOT NULL")
    # NOT IN over a set holding NULL is empty; without the NULLs it is not.
    assert count("SELECT count(*) FROM a WHERE k NOT IN (SELECT k FROM b)") == 0
    assert (
        count(
            "SELECT count(*) FROM a WHERE k NOT IN "
            "(SELECT k FROM b WHERE k IS NOT NULL)"
        )
        > 0
    )
    # The non-equi FULL JOIN has matched pairs and unmatched rows on both sides.
    pairs = count("SELECT count(*) FROM a JOIN b ON a.k > b.k + 40")
    full = count("SELECT count(*) FROM a FULL JOIN b ON a.k > b.k + 40")
    assert 0 < pairs < full


@pytest.mark.parametrize("split", ["exchange", "aggregate"])
def test_a_recursive_query_answers_as_worked_out_by_hand(
    spec_for: Callable[[str], SessionSpec], split: str
) -> None:
    # 1 + 2 + ... + 20, over 20 rows.
    sql = (
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r "
        "WHERE n < 20) SELECT sum(n) AS s, count(*) AS c FROM r"
    )
    # Through a worker: over literals, one partition, it would be kept whole
    # for the driver.
    spec = dataclasses.replace(
        spec_for(split), engine_options={"collapse_stages": "task"}
    )
    result = run_distributed(sql, spec)
    assert result.stages, f"{split}: no stage"
    assert pa.Table.from_batches(result.batches).to_pylist() == [{"s": 210, "c": 20}]
    local = run_local(sql, spec)
    assert pa.Table.from_batches(local).to_pylist() == [{"s": 210, "c": 20}]
