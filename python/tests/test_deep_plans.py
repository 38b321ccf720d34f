"""Plans at the edge of datafusion-python's planner boundary, through the driver.

Deep plans: thirty scalar subqueries summed in one select list, and chains
of 20 and 50 filtered copies of a table joined on its unique key. The
plugin decodes plans of any depth, but the physical plan its planner hands
back, and each stage cut from it, is decoded by datafusion-python's prost,
which stops at 100 nested messages. Stages do not add up: each reader
carries the stage it reads as bytes, so a plan of many stages runs; what
nests too deep in one piece (the whole plan run locally, or one stage) is
refused as :class:`UnsupportedQueryError`, and the Rust host runs the same
query to the same answer.

Relations in FROM that are not tables: ``generate_series`` and ``range``
(their rows carried into the plan by the plugin's logical codec, as an
in-memory table's are) and ``unnest`` of a literal array: all run. And
quantified subqueries, ``> ANY`` and ``> ALL``.

The fixture table ``t``, two Parquet files of 40 rows: ``k`` is 0..79 (one
file each half), ``v = k % 7``. Every answer below is worked out by hand.
"""

from __future__ import annotations

import itertools
import json
import pathlib
import subprocess
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import DFX, as_rows, require_dfx

from dfx_engine import _internal
from dfx_engine.driver import WorkerPool, run_distributed, run_local
from dfx_engine.session import SessionSpec, UnsupportedQueryError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

FILES = 2
ROWS_PER_FILE = 40
KEYS = range(FILES * ROWS_PER_FILE)


@pytest.fixture(scope="module")
def numbers(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The table ``t``: ``k`` 0..79 over two files, ``v = k % 7``."""
    directory = tmp_path_factory.mktemp("numbers")
    for index in range(FILES):
        keys = list(KEYS)[index * ROWS_PER_FILE : (index + 1) * ROWS_PER_FILE]
        table = pa.table(
            {
                "k": pa.array(keys, pa.int64()),
                "v": pa.array([k % 7 for k in keys], pa.int64()),
            }
        )
        pq.write_table(table, directory / f"part-{index}.parquet")
    return directory


@pytest.fixture(scope="module")
def pool() -> Iterator[WorkerPool]:
    """One pool for the module: a worker's start is most of a small query."""
    with WorkerPool(max_workers=2) as workers:
        yield workers


@pytest.fixture
def spec(numbers: pathlib.Path, tmp_path: pathlib.Path) -> Callable[[], SessionSpec]:
    """Specs over ``t``, each with a fresh shuffle directory (2 partitions)."""
    made = itertools.count()

    def make() -> SessionSpec:
        return SessionSpec(
            tables={"t": str(numbers)},
            shuffle_dir=str(tmp_path / f"shuffle-{next(made)}"),
            target_partitions=FILES,
        )

    return make


def scalar_subqueries(terms: int) -> str:
    """``terms`` scalar subqueries summed: the ``i``-th counts ``v = i % 7, k >= i``.

    Built of numbers only, as every query here is: nothing reaches the SQL
    from outside.
    """
    term = "(SELECT count(*) FROM t WHERE v = {} AND k >= {})"
    counts = [term.format(i % 7, i) for i in range(terms)]
    return f"SELECT {' + '.join(counts)} AS total"


def scalar_subqueries_expected(terms: int) -> int:
    """:func:`scalar_subqueries`'s answer, counted key by key."""
    return sum(1 for i in range(terms) for k in KEYS if k % 7 == i % 7 and k >= i)


def join_chain(tables: int) -> str:
    """``tables`` filtered copies of ``t`` joined in a chain on ``k``."""
    last = tables - 1
    sql = f"SELECT count(*) AS n, sum(t0.v) AS s, max(t{last}.k) AS m FROM t t0"  # noqa: S608
    copy = " JOIN (SELECT k, v + {j} AS v FROM t WHERE v >= 0) t{j} ON t{i}.k = t{j}.k"
    for j in range(1, tables):
        sql += copy.format(i=j - 1, j=j)
    return sql


# Every key meets itself once in each copy: every row once, t0's v summed.
JOIN_CHAIN_ANSWER = [{"n": 80, "s": sum(k % 7 for k in KEYS), "m": 79}]


def dfx_run(sql: str, spec: SessionSpec) -> list[dict[str, Any]]:
    """The Rust host's distributed answer to ``sql`` over ``spec``'s tables."""
    require_dfx()
    command = [str(DFX), "run", "--plugin", _internal.plugin_path()]
    for name, directory in sorted(spec.tables.items()):
        command += ["--table", f"{name}={directory}"]
    command += ["--partitions", str(spec.target_partitions), "--format", "json", sql]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    answer: list[dict[str, Any]] = json.loads(done.stdout)
    return answer


def assert_too_deep(err: pytest.ExceptionInfo[UnsupportedQueryError]) -> None:
    """``err`` says, in plain words, that datafusion-python stops at the depth."""
    message = str(err.value)
    assert err.value.reason == "deep_plan"
    assert "nests deeper than datafusion-python 55 decodes" in message
    assert "prost's limit of 100 nested messages" in message
    assert "the Rust host (`dfx run`) runs it" in message
    cause = str(err.value.__cause__)
    assert "recursion limit reached" in cause
    assert cause.splitlines()[0] in message


def test_the_hand_counts_of_the_scalar_subqueries_hold() -> None:
    # 80 keys: 12 with v = 0 (0, 7, .., 77), 12 with v = 1 and k >= 1
    # (1, 8, .., 78); the eighth term, v = 0 and k >= 7, is the first's
    # keys but 0: 11.
    assert scalar_subqueries_expected(1) == 12
    assert scalar_subqueries_expected(2) == 12 + 12
    assert scalar_subqueries_expected(8) - scalar_subqueries_expected(7) == 11
    assert scalar_subqueries_expected(30) == 294


def test_thirty_scalar_subqueries_run_distributed_as_they_run_locally(
    spec: Callable[[], SessionSpec], pool: WorkerPool
) -> None:
    sql = scalar_subqueries(30)
    expected = [{"total": scalar_subqueries_expected(30)}]
    assert as_rows(run_local(sql, spec())) == expected
    # Sixty stages and more, one inside the other: nested as messages, they
    # passed prost's limit; carried as bytes, each decodes on its own.
    result = run_distributed(sql, spec(), pool=pool)
    assert as_rows(result.batches) == expected
    assert len(result.stages) >= 60, len(result.stages)
    assert dfx_run(sql, spec()) == expected


def test_a_chain_of_twenty_joins_runs_distributed_as_it_runs_locally(
    spec: Callable[[], SessionSpec], pool: WorkerPool
) -> None:
    sql = join_chain(20)
    assert as_rows(run_local(sql, spec())) == JOIN_CHAIN_ANSWER
    result = run_distributed(sql, spec(), pool=pool)
    assert as_rows(result.batches) == JOIN_CHAIN_ANSWER
    assert len(result.stages) > 1, result.stages


def test_a_chain_of_fifty_joins_is_too_deep_locally_and_in_its_one_deep_stage(
    spec: Callable[[], SessionSpec], pool: WorkerPool
) -> None:
    sql = join_chain(50)
    with pytest.raises(UnsupportedQueryError) as local:
        run_local(sql, spec())
    assert_too_deep(local)
    # Distributed, the probe side's fifty joins are one stage (each build
    # side a broadcast stage of its own): that stage alone is too deep, and
    # it is refused before any task runs.
    shipped = spec()
    with pytest.raises(UnsupportedQueryError) as distributed:
        run_distributed(sql, shipped, pool=pool)
    assert_too_deep(distributed)
    assert "one stage of it" in str(distributed.value)
    assert not list(pathlib.Path(shipped.shuffle_dir).glob("stage-*"))
    assert dfx_run(sql, spec()) == JOIN_CHAIN_ANSWER


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT count(*) AS n FROM generate_series(1, 10)", [{"n": 10}]),
        ("SELECT count(*) AS n FROM range(1, 10)", [{"n": 9}]),
        # Inside a subquery, decorrelated into a join before it crosses: the
        # keys 1 and 2.
        (
            "SELECT count(*) AS n FROM t WHERE k IN (SELECT value FROM range(1, 3))",
            [{"n": 2}],
        ),
    ],
)
def test_a_table_function_runs_distributed_as_it_runs_locally(
    spec: Callable[[], SessionSpec], pool: WorkerPool, sql: str, expected: list[Any]
) -> None:
    assert as_rows(run_local(sql, spec())) == expected
    assert as_rows(run_distributed(sql, spec(), pool=pool).batches) == expected


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT count(*) AS n FROM unnest([1, 2, 3])", [{"n": 3}]),
        # Joined with t: 1, 2 and 3 are keys, 80 is not.
        (
            "SELECT count(*) AS n, sum(t.v) AS s "
            "FROM t JOIN unnest([1, 2, 3, 80]) AS u(x) ON t.k = u.x",
            [{"n": 3, "s": 1 + 2 + 3}],
        ),
    ],
)
def test_unnest_of_a_literal_array_runs_distributed_as_it_runs_locally(
    spec: Callable[[], SessionSpec], pool: WorkerPool, sql: str, expected: list[Any]
) -> None:
    assert as_rows(run_local(sql, spec())) == expected
    assert as_rows(run_distributed(sql, spec(), pool=pool).batches) == expected


@pytest.mark.parametrize(
    ("predicate", "n"),
    [
        # The v = 6 keys are 6, 13, .., 76: above the least, 7..79.
        ("o.k > ANY (SELECT i.k FROM t AS i WHERE i.v = 6)", 73),
        # Above the greatest: 77, 78, 79.
        ("o.k > ALL (SELECT i.k FROM t AS i WHERE i.v = 6)", 3),
        # No v = 7: ALL of nothing holds for every row, ANY for none.
        ("o.k > ALL (SELECT i.k FROM t AS i WHERE i.v = 7)", 80),
        ("o.k > ANY (SELECT i.k FROM t AS i WHERE i.v = 7)", 0),
        # Correlated: a smaller key of the same v exists from k = 7 on.
        ("o.k > ANY (SELECT i.k FROM t AS i WHERE i.v = o.v)", 73),
    ],
)
def test_quantified_subqueries_run_distributed_as_they_run_locally(
    spec: Callable[[], SessionSpec], pool: WorkerPool, predicate: str, n: int
) -> None:
    sql = f"SELECT count(*) AS n FROM t AS o WHERE {predicate}"  # noqa: S608
    assert as_rows(run_local(sql, spec())) == [{"n": n}]
    result = run_distributed(sql, spec(), pool=pool)
    assert as_rows(result.batches) == [{"n": n}]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT count(v) AS n FROM t WHERE false",
        "SELECT sum(s.v) AS n FROM (SELECT v FROM t WHERE 1 = 0) s",
    ],
)
def test_an_empty_relation_is_refused_in_plain_words(
    spec: Callable[[], SessionSpec], pool: WorkerPool, sql: str
) -> None:
    for run in (
        lambda: run_local(sql, spec()),
        lambda: run_distributed(sql, spec(), pool=pool),
    ):
        with pytest.raises(
            UnsupportedQueryError, match="proved part of it empty"
        ) as err:
            run()
        assert err.value.reason == "empty_relation"
        assert "dfx run" in str(err.value)
