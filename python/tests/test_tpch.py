"""The 22 TPC-H queries through the Python driver and Python workers.

Every query runs distributed (in both split modes) and in one process over the
same TPC-H data at scale 0.01, two files per table, and the answers must agree
row for row in the query's order (floats to 1e-6 relative: the sort keys of
the 22 queries are unique, so the order is defined). Each query runs once
more with every plugin decision forced on (join filters, coalescing, at four
partitions so coalesced groups sit beside each other) and once with every one
off.

The data, the queries and the fixtures are conftest's (TPC-H from the Rust
host's generator); without the ``dfx`` binary every test here fails (see
``conftest.require_dfx``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pytest
from conftest import (
    QUERIES,
    assert_same_columns,
    assert_same_rows,
    tpch_rows,
)

from dfx_engine.driver import run_distributed, run_local

if TYPE_CHECKING:
    from collections.abc import Callable

    from dfx_engine.session import SessionSpec


@pytest.mark.parametrize("split", ["exchange", "aggregate"])
@pytest.mark.parametrize("number", range(1, 23), ids=lambda n: f"q{n}")
def test_tpch_query_agrees_with_local(
    tpch_spec: Callable[..., SessionSpec], number: int, split: str
) -> None:
    sql = (QUERIES / f"q{number}.sql").read_text()
    spec = tpch_spec(split)
    result = run_distributed(sql, spec)
    local = run_local(sql, spec)
    assert result.stages
    assert_same_columns(result.batches, local, f"q{number}")
    assert_same_rows(tpch_rows(result.batches), tpch_rows(local), f"q{number}")


# Every decision the plugin makes per query, forced one way.
DECISIONS = {
    "on": {
        "join_filters": "on",
        "coalesce": "on",
        "skew_split": "on",
        "broadcast_switch": "on",
    },
    "off": {
        "join_filters": "off",
        "coalesce": "off",
        "skew_split": "off",
        "broadcast_switch": "off",
    },
}

# DataFusion partitions every hash join, however small its build side: at
# this scale it would collect every one, and the decisions about partitioned
# joins would find none.
PARTITIONED_JOINS = {
    "datafusion.optimizer.hash_join_single_partition_threshold": "0",
    "datafusion.optimizer.hash_join_single_partition_threshold_rows": "0",
}


@pytest.mark.parametrize("decisions", ["on", "off"])
@pytest.mark.parametrize("split", ["exchange", "aggregate"])
@pytest.mark.parametrize("number", range(1, 23), ids=lambda n: f"q{n}")
def test_tpch_query_agrees_with_every_decision_forced(
    tpch_spec: Callable[..., SessionSpec], number: int, split: str, decisions: str
) -> None:
    sql = (QUERIES / f"q{number}.sql").read_text()
    spec = dataclasses.replace(
        tpch_spec(split),
        target_partitions=4,
        engine_options=DECISIONS[decisions],
        datafusion_options=PARTITIONED_JOINS,
    )
    result = run_distributed(sql, spec)
    local = run_local(sql, spec)
    assert_same_columns(result.batches, local, f"q{number}")
    assert_same_rows(tpch_rows(result.batches), tpch_rows(local), f"q{number}")
    coalesced = [d for d in result.decisions if d["tasks"] < d["planned_tasks"]]
    if decisions == "off":
        assert not coalesced, result.decisions


@pytest.mark.parametrize("split", ["exchange", "aggregate"])
@pytest.mark.parametrize("number", range(1, 23), ids=lambda n: f"q{n}")
def test_tpch_query_agrees_with_local_in_slices_of_two_partitions(
    tpch_spec: Callable[..., SessionSpec], number: int, split: str
) -> None:
    # Each task runs two of a stage's four partitions at once and publishes
    # one map file for them. Kept as stages: a plan whose operators run at
    # most two partitions (q14's) would be one stage.
    sql = (QUERIES / f"q{number}.sql").read_text()
    spec = dataclasses.replace(
        tpch_spec(split),
        target_partitions=4,
        engine_options={"partitions_per_task": "2", "collapse_stages": "off"},
    )
    result = run_distributed(sql, spec)
    local = run_local(sql, spec)
    # A task per partition, as planned.
    one_each = {"coalesce": "off", "skew_split": "off", "broadcast_switch": "off"}
    unsliced = run_distributed(
        sql,
        dataclasses.replace(
            tpch_spec(split), target_partitions=4, engine_options=one_each
        ),
    )
    assert_same_columns(result.batches, local, f"q{number}")
    assert_same_rows(tpch_rows(result.batches), tpch_rows(local), f"q{number}")
    # The same stages, and fewer tasks wherever a stage had several: a
    # slice of each scan's two partitions, and of four after an exchange.
    assert len(result.stages) == len(unsliced.stages)
    assert len(result.tasks) <= len(unsliced.tasks), (result.tasks, unsliced.tasks)
    if len(unsliced.tasks) > len(unsliced.stages):
        assert len(result.tasks) < len(unsliced.tasks), (result.tasks, unsliced.tasks)
