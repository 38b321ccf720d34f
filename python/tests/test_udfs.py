"""Python UDFs: inline ones travel by value, module-level ones by reference."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import as_rows, assert_same
from datafusion import udf

from dfx_engine.driver import run_distributed, run_local

if TYPE_CHECKING:
    from collections.abc import Callable

    from dfx_engine.session import SessionSpec

SQL = """
SELECT l_returnflag AS flag, sum(py_double(l_quantity)) AS doubled
FROM lineitem GROUP BY l_returnflag ORDER BY flag
"""
EXPECTED = [
    {"flag": "A", "doubled": 180},
    {"flag": "B", "doubled": 260},
    {"flag": "R", "doubled": 280},
]


def _module_level_double(values: pa.Array) -> pa.Array:
    """Importable as ``test_udfs._module_level_double``: pickled by reference."""
    return pc.multiply(values, 2)


MODULE_LEVEL_DOUBLE = udf(
    _module_level_double, [pa.int64()], pa.int64(), "immutable", name="py_double"
)


def test_inline_udf_ships_by_value_and_runs_on_workers(
    make_spec: Callable[..., SessionSpec],
) -> None:
    def double(values: pa.Array) -> pa.Array:
        return pc.multiply(values, 2)

    inline = udf(double, [pa.int64()], pa.int64(), "immutable", name="py_double")
    spec = make_spec()
    result = run_distributed(SQL, spec, extra_udfs=[inline])
    assert as_rows(result.batches) == EXPECTED
    assert len(result.tasks) >= 4
    assert_same(as_rows(run_local(SQL, spec, extra_udfs=[inline])), EXPECTED)


def test_module_level_udf_fails_on_the_worker_naming_the_module(
    make_spec: Callable[..., SessionSpec],
) -> None:
    spec = make_spec()
    with pytest.raises(RuntimeError, match="test_udfs") as info:
        run_distributed(SQL, spec, extra_udfs=[MODULE_LEVEL_DOUBLE])
    assert "map 0" in str(info.value)
    # The same function is fine in the process that defines it.
    assert as_rows(run_local(SQL, spec, extra_udfs=[MODULE_LEVEL_DOUBLE])) == EXPECTED
