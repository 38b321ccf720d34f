"""DataFrames through the driver: built on a dfx session, run by real workers.

The spec's tables: ``t``, two Parquet files of 40 rows, ``k`` 0..79 and
``v = k % 7``; ``colours``, one file mapping ``v`` 0..6 to a colour name.
In-memory tables join them from ``from_arrow`` and
``register_record_batches``. Every answer is worked out by hand below, and
the distributed one is also compared with the same DataFrame collected on
a session without a shuffle location.
"""

from __future__ import annotations

import dataclasses
import itertools
import pathlib
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import as_rows, sorted_rows
from datafusion import DataFrame, SessionContext, col, lit
from datafusion import functions as f

from dfx_engine import MemoryTableTooLargeError, last_run, session_for
from dfx_engine.dataframes import MEMORY_TABLE_LIMIT_KEY
from dfx_engine.driver import WorkerPool, run_distributed
from dfx_engine.session import SessionSpec

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

KEYS = range(80)
COLOURS = ["red", "orange", "yellow", "green", "blue", "indigo", "violet"]


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """``t`` (two files) and ``colours`` (one), as directories of Parquet."""
    t = tmp_path_factory.mktemp("t")
    for index in range(2):
        keys = list(KEYS)[index * 40 : (index + 1) * 40]
        pq.write_table(
            pa.table({"k": keys, "v": [k % 7 for k in keys]}),
            t / f"part-{index}.parquet",
        )
    colours = tmp_path_factory.mktemp("colours")
    pq.write_table(
        pa.table({"v": list(range(7)), "colour": COLOURS}),
        colours / "part-0.parquet",
    )
    return {"t": str(t), "colours": str(colours)}


@pytest.fixture(scope="module")
def pool() -> Iterator[WorkerPool]:
    """One pool for the module: a worker's start is most of a small query."""
    with WorkerPool(max_workers=2) as workers:
        yield workers


@pytest.fixture
def spec(tables: dict[str, str], tmp_path: pathlib.Path) -> Callable[[], SessionSpec]:
    """Specs over the tables, each with a fresh shuffle directory."""
    made = itertools.count()

    def make() -> SessionSpec:
        return SessionSpec(
            tables=tables,
            shuffle_dir=str(tmp_path / f"shuffle-{next(made)}"),
            target_partitions=2,
        )

    return make


def run_both(
    build: Callable[[SessionContext], DataFrame],
    spec: SessionSpec,
    pool: WorkerPool,
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """``build``'s DataFrame run distributed, and collected on a local session.

    Each session is held while its DataFrame is used: a DataFrame does not
    keep its session alive (datafusion-python's rule).
    """
    ctx = session_for(spec)
    distributed = run_distributed(build(ctx), spec, pool=pool)
    local_ctx = session_for(dataclasses.replace(spec, shuffle_dir=""))
    return as_rows(distributed.batches), as_rows(build(local_ctx).collect())


def by_colour(ctx: SessionContext) -> DataFrame:
    """Keys of 10 or more, counted and summed per colour of their ``v``."""
    return (
        ctx.table("t")
        .filter(col("k") >= lit(10))
        .join(ctx.table("colours"), on="v")
        .aggregate(
            [col("colour")], [f.count(col("k")).alias("n"), f.sum(col("k")).alias("s")]
        )
        .sort(col("colour"))
    )


# Keys 10..79 are ten of each v: k = 7j + v, j 2..11 for v 0..2 (14..79)
# and 1..10 for v 3..6 (10..76), so each sum is 7 * (sum of j) + 10 * v.
BY_COLOUR = [
    {"colour": "blue", "n": 10, "s": 7 * 55 + 40},
    {"colour": "green", "n": 10, "s": 7 * 55 + 30},
    {"colour": "indigo", "n": 10, "s": 7 * 55 + 50},
    {"colour": "orange", "n": 10, "s": 7 * 65 + 10},
    {"colour": "red", "n": 10, "s": 7 * 65},
    {"colour": "violet", "n": 10, "s": 7 * 55 + 60},
    {"colour": "yellow", "n": 10, "s": 7 * 65 + 20},
]


def test_a_dataframe_of_filter_join_and_aggregate_runs_distributed_as_locally(
    spec: Callable[[], SessionSpec], pool: WorkerPool
) -> None:
    distributed, local = run_both(by_colour, spec(), pool)
    assert distributed == local == BY_COLOUR
    # The same answer counted key by key.
    for row in BY_COLOUR:
        v = COLOURS.index(str(row["colour"]))
        keys = [k for k in KEYS if k >= 10 and k % 7 == v]
        assert (row["n"], row["s"]) == (len(keys), sum(keys)), row


# Bands of ``v``, held in memory: three of the seven values have one.
BANDS = pa.table({"v": [0, 3, 6], "band": ["low", "middle", "high"]})


def band_counts(ctx: SessionContext, bands: DataFrame) -> DataFrame:
    """Rows of ``t`` per band of their ``v`` (an inner join drops the rest)."""
    return (
        ctx.table("t")
        .join(bands, on="v")
        .aggregate([col("band")], [f.count(col("k")).alias("n")])
        .sort(col("band"))
    )


# v 0: 0, 7, .., 77 (12 keys); v 3: 3, .., 73 (11); v 6: 6, .., 76 (11).
BAND_COUNTS = [
    {"band": "high", "n": 11},
    {"band": "low", "n": 12},
    {"band": "middle", "n": 11},
]


def test_a_from_arrow_table_joined_with_a_spec_table_is_written_once_and_read(
    spec: Callable[[], SessionSpec], pool: WorkerPool
) -> None:
    made = spec()
    distributed, local = run_both(
        lambda ctx: band_counts(ctx, ctx.from_arrow(BANDS)), made, pool
    )
    assert distributed == local == BAND_COUNTS
    # Written once into the location, one file per partition, for the workers.
    sources = pathlib.Path(made.shuffle_dir) / "sources"
    written = sorted(path.relative_to(sources) for path in sources.rglob("*.arrow"))
    assert len(written) == 1, written
    assert written[0].name == "part-0.arrow", written


def test_a_registered_record_batch_table_runs_distributed(
    spec: Callable[[], SessionSpec], pool: WorkerPool
) -> None:
    def build(ctx: SessionContext) -> DataFrame:
        # Two partitions of one batch each: both reach the workers.
        batches = BANDS.to_batches(max_chunksize=2)
        ctx.register_record_batches("bands", [[batches[0]], batches[1:]])
        return ctx.sql(
            "SELECT band, count(*) AS n FROM t JOIN bands USING (v) "
            "GROUP BY band ORDER BY band"
        )

    distributed, local = run_both(build, spec(), pool)
    assert distributed == local == BAND_COUNTS


def test_a_table_over_the_limit_is_refused_naming_its_size_limit_and_setting(
    spec: Callable[[], SessionSpec], pool: WorkerPool
) -> None:
    made = spec()
    ctx = session_for(made, memory_table_limit=10_000)
    big = ctx.from_arrow(pa.table({"v": list(range(10_000))}))
    with pytest.raises(MemoryTableTooLargeError) as err:
        run_distributed(
            band_counts(ctx, big.with_column("band", lit("x"))), made, pool=pool
        )
    message = str(err.value)
    assert MEMORY_TABLE_LIMIT_KEY in message, message
    assert "over the limit of 10000 bytes" in message, message
    # 10,000 int64 values are 80,000 bytes before any framing.
    size = int(message.split(" holds ")[1].split(" ")[0])
    assert 80_000 < size < 90_000, message
    assert err.value.setting == MEMORY_TABLE_LIMIT_KEY
    # Under the default limit (64 MiB) the same table runs.
    within = spec()
    ctx = session_for(within)
    count = ctx.from_arrow(pa.table({"v": list(range(10_000))})).aggregate(
        [], [f.count(col("v")).alias("n")]
    )
    assert as_rows(run_distributed(count, within, pool=pool).batches) == [{"n": 10_000}]


def test_collecting_a_dataframe_of_a_distributed_session_runs_it(
    spec: Callable[[], SessionSpec], pool: WorkerPool
) -> None:
    made = spec()
    expected = run_distributed(by_colour(session_for(made)), made, pool=pool)
    ctx = session_for(spec(), pool=pool)
    got = by_colour(ctx).collect()
    assert sorted_rows(got) == sorted_rows(expected.batches)
    run = last_run(ctx)
    assert run is not None
    assert run.tasks


def test_a_dataframe_of_another_session_is_refused_plainly(
    spec: Callable[[], SessionSpec], pool: WorkerPool, tables: dict[str, str]
) -> None:
    plain = SessionContext()
    for name, directory in tables.items():
        plain.register_parquet(name, directory)
    with pytest.raises(ValueError, match=r"session_for\(spec\)"):
        run_distributed(by_colour(plain), spec(), pool=pool)
    # A dfx session of another spec runs its own queries, in its own
    # location: its DataFrame is collected there, not by this spec's run.
    other_spec = spec()
    other = session_for(other_spec, pool=pool)
    with pytest.raises(ValueError, match=r"runs its queries itself .*collect\(\)"):
        run_distributed(by_colour(other), spec(), pool=pool)
    # Refused before any stage ran: the other session's location is given
    # back untouched, and its own collect() still answers there.
    assert not any(pathlib.Path(other_spec.shuffle_dir).glob("stage-*"))
    assert as_rows(by_colour(other).collect()) == as_rows(by_colour(plain).collect())
