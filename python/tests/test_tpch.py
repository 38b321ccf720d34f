"""The 22 TPC-H queries through the Python driver and Python workers.

Every query runs distributed (exchange split) and in one process over the
same TPC-H data at scale 0.01, two files per table, and the answers must agree
row for row in the query's order (floats to 1e-6 relative: the sort keys of
the 22 queries are unique, so the order is defined).

The data comes from the Rust host's generator (``dfx tpch``), cached beside
the build output like the Rust tests' data; the module is skipped when the
``dfx`` binary is not built. The queries are the host's, ``host/queries``.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from conftest import assert_same_columns, assert_same_rows

from dfx_engine import _internal
from dfx_engine.driver import run_distributed, run_local
from dfx_engine.session import SessionSpec

if TYPE_CHECKING:
    from collections.abc import Callable

ROOT = pathlib.Path(__file__).resolve().parents[2]
DFX = pathlib.Path(os.environ.get("DFX_HOST_BINARY", ROOT / "target" / "debug" / "dfx"))
QUERIES = ROOT / "host" / "queries"
SCALE = "0.01"
PARTITIONS = 2
TABLES = [
    "nation",
    "region",
    "part",
    "supplier",
    "partsupp",
    "customer",
    "orders",
    "lineitem",
]

pytestmark = pytest.mark.skipif(
    not DFX.is_file(),
    reason=f"the Rust host binary {DFX} (the TPC-H generator) is not built",
)


def _data_dir() -> pathlib.Path:
    """Where generated data is cached: beside the build output."""
    if "DFX_TPCH_DATA_DIR" in os.environ:
        return pathlib.Path(os.environ["DFX_TPCH_DATA_DIR"])
    target = os.environ.get("CARGO_TARGET_DIR", str(ROOT / "target"))
    return pathlib.Path(target) / "tpch-data"


@pytest.fixture(scope="module")
def tpch_tables() -> dict[str, str]:
    """The eight tables at scale 0.01, generated on first use."""
    data_dir = _data_dir()
    dataset = data_dir / f"sf{SCALE}-p{PARTITIONS}"
    if not (dataset / "_COMPLETE").is_file():
        # `dfx tpch` generates (or reuses) the dataset before running its one
        # query; whether that query agrees is the Rust suite's business.
        done = subprocess.run(
            [
                str(DFX),
                "tpch",
                "--plugin",
                _internal.plugin_path(),
                "--scale",
                SCALE,
                "--partitions",
                str(PARTITIONS),
                "--queries",
                "6",
                "--runs",
                "1",
                "--data-dir",
                str(data_dir),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert (dataset / "_COMPLETE").is_file(), done.stderr
    return {table: str(dataset / table) for table in TABLES}


@pytest.fixture
def tpch_spec(
    tpch_tables: dict[str, str], tmp_path: pathlib.Path
) -> Callable[[], SessionSpec]:
    """A distributing spec over the TPC-H tables, fresh shuffle dir each."""

    def make() -> SessionSpec:
        return SessionSpec(
            tables=dict(tpch_tables),
            shuffle_dir=str(tmp_path / "shuffle"),
            target_partitions=PARTITIONS,
        )

    return make


def _rows(batches: list[pa.RecordBatch]) -> list[tuple[Any, ...]]:
    if not batches:
        return []
    return [tuple(r.values()) for r in pa.Table.from_batches(batches).to_pylist()]


@pytest.mark.parametrize("number", range(1, 23), ids=lambda n: f"q{n}")
def test_tpch_query_agrees_with_local(
    tpch_spec: Callable[[], SessionSpec], number: int
) -> None:
    sql = (QUERIES / f"q{number}.sql").read_text()
    spec = tpch_spec()
    result = run_distributed(sql, spec)
    local = run_local(sql, spec)
    assert result.stages
    assert_same_columns(result.batches, local, f"q{number}")
    assert_same_rows(_rows(result.batches), _rows(local), f"q{number}")
