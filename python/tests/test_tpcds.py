"""The 99 TPC-DS queries through both hosts, against stock DataFusion.

Every query runs distributed through the Python host (``run_distributed`` on
a pool of Python workers) and through the Rust host (``dfx run``, its own
pool of ``dfx worker`` processes), in both split modes, over the same
Parquet files, and each answer must agree with stock DataFusion's: a plain
datafusion-python ``SessionContext`` with no dfx in it. Rows are compared as
multisets (both sides sorted fully: ties under an ``ORDER BY`` may come out
in either order), floats to 1e-6 relative, integers and decimals exactly.

The data is TPC-DS at scale 0.01 from ``tpcgen-cli``, a TPC-DS generator
that ``run-tests.sh`` installs beside the tests, generated once into a
temporary directory; every table is split into two Parquet files, so each
scan has two maps. The query texts are the 99 that DuckDB's ``tpcds``
extension ships (``tpcds_queries()``, from the ``duckdb-extension-tpcds``
package, also installed there), read at test time and run unchanged: stock
DataFusion answers all of them. DuckDB only supplies the texts; it runs no
query here.

A query stock fails would be listed in :data:`STOCK_FAILS`, with the error,
and checked to fail still. A query where dfx fails or disagrees while stock
answers is a bug in dfx: it is listed in :data:`DFX_FAILS` with the error it
ends with, as a strict expected failure that only that error satisfies.
"""

from __future__ import annotations

import contextlib
import datetime
import decimal
import json
import math
import pathlib
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb
import duckdb_extension_tpcds
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import DFX, assert_same_columns, require_dfx
from datafusion import SessionConfig, SessionContext

from dfx_engine import _internal
from dfx_engine.driver import WorkerPool, run_distributed
from dfx_engine.session import SessionSpec

if TYPE_CHECKING:
    from collections.abc import Iterator

    from _pytest.mark.structures import ParameterSet

SCALE = "0.01"
"""The generator's scale factor: about 120 000 store sales, in seconds."""

PARTITIONS = 2
"""Target partitions of every context, stock's included; files per table."""

SPLITS = ("exchange", "aggregate")

QUERIES = range(1, 100)

GENERATOR = pathlib.Path(sys.executable).parent / "tpcgen-cli"
"""The TPC-DS generator: a console script of the tests' environment."""

STOCK_FAILS: dict[int, str] = {}
"""Queries stock DataFusion cannot answer: number -> part of its error.

Empty: stock answers all 99. A query added here is checked to fail on
stock with that error, and is skipped (with the reason) by the dfx tests.
"""


@dataclass(frozen=True)
class DfxFailure:
    """How a query is known to fail in dfx while stock answers it.

    Attributes:
        error: Part of the error it ends with; any other failure fails the
            test outright.
        reason: What goes wrong, and the smallest query that shows it.
    """

    error: str
    reason: str


DFX_FAILS: dict[tuple[str, str, int], DfxFailure] = {}
"""(host, split, query) -> how dfx fails it while stock answers.

Empty: dfx answers all 99 in both hosts and both splits. A query listed
here is a strict expected failure: it must fail with that error.
"""


class KnownDfxFailure(Exception):
    """A listed query failed in dfx with the error it is listed with."""


def cases(host: str) -> list[ParameterSet]:
    """Every (split, query) of ``host``, marked as listed above."""
    params = []
    for split in SPLITS:
        for number in QUERIES:
            marks: list[pytest.MarkDecorator] = []
            if number in STOCK_FAILS:
                marks.append(
                    pytest.mark.skip(
                        reason=f"stock DataFusion fails q{number}: "
                        f"{STOCK_FAILS[number]}"
                    )
                )
            elif (known := DFX_FAILS.get((host, split, number))) is not None:
                marks.append(
                    pytest.mark.xfail(
                        raises=KnownDfxFailure, strict=True, reason=known.reason
                    )
                )
            params.append(
                pytest.param(split, number, marks=marks, id=f"{split}-q{number}")
            )
    return params


@contextlib.contextmanager
def listed_failure(host: str, split: str, number: int) -> Iterator[None]:
    """Turn the listed failure of ``number`` into :class:`KnownDfxFailure`.

    Only the error it is listed with: any other failure stays itself, so the
    strict expected failure cannot hide a new bug.
    """
    known = DFX_FAILS.get((host, split, number))
    try:
        yield
    except Exception as error:
        if known is not None and known.error in str(error):
            raise KnownDfxFailure(str(error)) from error
        raise


@pytest.fixture(scope="session")
def tpcds_tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The 24 TPC-DS tables at :data:`SCALE`, two Parquet files each."""
    if not GENERATOR.is_file():
        pytest.fail(
            f"no {GENERATOR}: install tpcgen-cli beside the tests "
            "(python/run-tests.sh does)",
            pytrace=False,
        )
    generated = tmp_path_factory.mktemp("tpcds-generated")
    subprocess.run(
        [
            str(GENERATOR),
            "tpcds",
            "parquet",
            "--scale-factor",
            SCALE,
            "--output-dir",
            str(generated),
            "--parts",
            str(PARTITIONS),
            "--quiet",
        ],
        check=True,
        capture_output=True,
    )
    # The generator splits only tables of a million rows and more: split the
    # rest by halves, so that each scan has two maps.
    tables = tmp_path_factory.mktemp("tpcds")
    for directory in sorted(generated.iterdir()):
        if directory.name == "dbgen_version":
            continue  # the generator's own metadata, no TPC-DS table
        table = pq.read_table(directory)
        assert table.num_rows > 0, directory.name
        half = (table.num_rows + 1) // 2
        parts = [table.slice(0, half), table.slice(half)]
        (tables / directory.name).mkdir()
        for index, part in enumerate(p for p in parts if p.num_rows):
            pq.write_table(part, tables / directory.name / f"part-{index}.parquet")
    shutil.rmtree(generated)  # split into `tables`: the disk holds one copy
    found = {path.name: str(path) for path in sorted(tables.iterdir())}
    assert len(found) == 24, sorted(found)
    return found


@pytest.fixture(scope="session")
def tpcds_queries() -> dict[int, str]:
    """The 99 query texts DuckDB's ``tpcds`` extension ships, by number."""
    # The extension file of the installed package, loaded by path: nothing is
    # fetched.
    (extension,) = pathlib.Path(duckdb_extension_tpcds.__file__).parent.glob(
        "extensions/*/tpcds.duckdb_extension"
    )
    connection = duckdb.connect()
    try:
        connection.load_extension(str(extension))
        rows = connection.execute(
            "SELECT query_nr, query FROM tpcds_queries()"
        ).fetchall()
    finally:
        connection.close()
    queries = {int(number): str(text) for number, text in rows}
    assert sorted(queries) == list(QUERIES)
    return queries


@dataclass
class Stock:
    """Stock DataFusion over the tables, each query's outcome kept once."""

    tables: dict[str, str]
    queries: dict[int, str]
    outcomes: dict[int, list[pa.RecordBatch] | Exception] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """A plain ``SessionContext``: no dfx, the default config and files."""
        self.ctx = SessionContext(SessionConfig().with_target_partitions(PARTITIONS))
        for name, directory in self.tables.items():
            self.ctx.register_parquet(name, directory)

    def outcome(self, number: int) -> list[pa.RecordBatch] | Exception:
        """Stock's answer of query ``number``, or the error it failed with."""
        if number not in self.outcomes:
            try:
                self.outcomes[number] = self.ctx.sql(self.queries[number]).collect()
            except Exception as error:
                self.outcomes[number] = error
        return self.outcomes[number]

    def answer(self, number: int) -> list[pa.RecordBatch]:
        """Stock's answer of a query stock answers."""
        outcome = self.outcome(number)
        assert not isinstance(outcome, Exception), f"stock fails q{number}"
        return outcome

    def schema(self, number: int) -> pa.Schema:
        """The schema of stock's answer, an empty answer's included."""
        return pa.schema(self.ctx.sql(self.queries[number]).schema())


@pytest.fixture(scope="session")
def stock(tpcds_tables: dict[str, str], tpcds_queries: dict[int, str]) -> Stock:
    """Stock DataFusion's answers, computed on first use."""
    return Stock(tpcds_tables, tpcds_queries)


@pytest.fixture(scope="module")
def pool() -> Iterator[WorkerPool]:
    """Python workers kept across the module's queries."""
    with WorkerPool(max_workers=PARTITIONS) as workers:
        yield workers


def sort_key(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A total order of answer rows: NULLs first, then NaNs, then values.

    Floats sort on a value rounded to 1e-6, so that two floats equal to the
    tolerance sort alike; NaN has a place of its own, or no order is total.
    """
    return tuple(
        (0,)
        if value is None
        else (1,)
        if isinstance(value, float) and math.isnan(value)
        else (2, round(value, 6) if isinstance(value, float) else value)
        for value in row
    )


def assert_same_answer(
    left: list[tuple[Any, ...]], right: list[tuple[Any, ...]], label: str
) -> None:
    """Same rows in the same order: floats to 1e-6 relative, all else exactly.

    Decimals too: their sums are exact, so a tolerance would hide a lost
    row. NaN equals NaN here (a ratio over a zero sum gives one each side).
    """
    assert len(left) == len(right), f"{label}: {len(left)} rows, not {len(right)}"
    for index, (a, b) in enumerate(zip(left, right, strict=True)):
        assert len(a) == len(b), f"{label} row {index}: {a} vs {b}"
        for x, y in zip(a, b, strict=True):
            if isinstance(x, float) and isinstance(y, float):
                same = (math.isnan(x) and math.isnan(y)) or math.isclose(
                    x, y, rel_tol=1e-6, abs_tol=1e-9
                )
            else:
                same = x == y
            assert same, f"{label} row {index}: {a} vs {b}"


def arrow_rows(batches: list[pa.RecordBatch]) -> list[tuple[Any, ...]]:
    """The rows of ``batches`` as tuples, sorted by :func:`sort_key`."""
    if not batches:
        return []
    rows = [tuple(row.values()) for row in pa.Table.from_batches(batches).to_pylist()]
    return sorted(rows, key=sort_key)


def from_json(value: Any, kind: pa.DataType) -> Any:  # noqa: ANN401 - any cell
    """A cell of the Rust host's JSON answer as pyarrow gives a ``kind`` cell.

    Decimals are parsed from their digits, never through a float.
    """
    if value is None:
        return None
    if pa.types.is_decimal(kind):
        return decimal.Decimal(str(value))
    if pa.types.is_floating(kind):
        return float(value)
    if pa.types.is_date(kind):
        return datetime.date.fromisoformat(value)
    return value


def json_rows(text: str, schema: pa.Schema) -> list[tuple[Any, ...]]:
    """The rows of a ``dfx run --format json`` answer, sorted by :func:`sort_key`.

    The JSON writer leaves NULL cells out of their object, so each row is
    read by the names of stock's columns (unique in all 99 answers).
    """
    names = schema.names
    assert len(set(names)) == len(names), f"columns {names} are not unique"
    objects = json.loads(text, parse_float=decimal.Decimal)
    rows = []
    for row in objects:
        assert set(row) <= set(names), f"columns {sorted(row)} vs {names}"
        rows.append(
            tuple(
                from_json(row.get(name), kind)
                for name, kind in zip(names, schema.types, strict=True)
            )
        )
    return sorted(rows, key=sort_key)


def as_json_reads(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Stock's rows as they would read back from JSON, sorted again.

    JSON has no NaN or infinity: the writer prints NULL for them.
    """
    return sorted(
        (
            tuple(
                None if isinstance(v, float) and not math.isfinite(v) else v
                for v in row
            )
            for row in rows
        ),
        key=sort_key,
    )


@pytest.mark.parametrize(("split", "number"), cases("python"))
def test_tpcds_query_through_the_python_host_agrees_with_stock(
    stock: Stock,
    tpcds_queries: dict[int, str],
    pool: WorkerPool,
    tmp_path: pathlib.Path,
    split: str,
    number: int,
) -> None:
    expected = stock.answer(number)
    spec = SessionSpec(
        tables=dict(stock.tables),
        shuffle_dir=str(tmp_path / "shuffle"),
        target_partitions=PARTITIONS,
        split=split,
    )
    label = f"q{number} ({split} split, Python host)"
    with listed_failure("python", split, number):
        result = run_distributed(tpcds_queries[number], spec, pool=pool)
        assert result.stages, f"{label}: no stage"
        assert_same_columns(result.batches, expected, label)
        assert_same_answer(arrow_rows(result.batches), arrow_rows(expected), label)


@pytest.mark.parametrize(("split", "number"), cases("rust"))
def test_tpcds_query_through_the_rust_host_agrees_with_stock(
    stock: Stock,
    tpcds_queries: dict[int, str],
    tmp_path: pathlib.Path,
    split: str,
    number: int,
) -> None:
    require_dfx()
    expected = stock.answer(number)
    query = tmp_path / f"q{number}.sql"
    query.write_text(tpcds_queries[number])
    command = [str(DFX), "run", "--plugin", _internal.plugin_path()]
    for name, directory in sorted(stock.tables.items()):
        command += ["--table", f"{name}={directory}"]
    command += [
        "--partitions",
        str(PARTITIONS),
        "--split",
        split,
        "--max-workers",
        str(PARTITIONS),
        # On a worker: a plan no wider than a task of this machine's cores
        # would otherwise run whole in the driver, with no stage.
        "--set",
        "collapse_stages=task",
        "--format",
        "json",
        "-f",
        str(query),
    ]
    label = f"q{number} ({split} split, Rust host)"
    with listed_failure("rust", split, number):
        # Without --shuffle-dir: a fresh temporary location, removed after.
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"{label}: {done.stderr}"
        # The run's summary line: a plan with no stage ran nothing distributed.
        assert re.search(r"^stages: [1-9]", done.stderr, re.MULTILINE), (
            f"{label} ran no stage: {done.stderr}"
        )
        schema = stock.schema(number)
        assert_same_answer(
            json_rows(done.stdout, schema),
            as_json_reads(arrow_rows(expected)),
            label,
        )


def test_stock_fails_exactly_the_listed_queries(stock: Stock) -> None:
    failed = {
        number: outcome
        for number in QUERIES
        if isinstance(outcome := stock.outcome(number), Exception)
    }
    assert sorted(failed) == sorted(STOCK_FAILS), {
        number: str(error).splitlines()[0] for number, error in failed.items()
    }
    for number, error in failed.items():
        assert STOCK_FAILS[number] in str(error), f"q{number}: {error}"
