"""Tables of every format, Hive-partitioned and on S3, against stock DataFusion.

A table of a spec is a location of Parquet files or a :class:`Table` (a
format, its options, declared columns, Hive partition columns); both hosts
register it by the ``CREATE EXTERNAL TABLE`` statement the runtime writes.
Each answer here is compared with stock DataFusion's, a plain
datafusion-python ``SessionContext`` running ``CREATE EXTERNAL TABLE``
statements written by hand for the same files, and, on the small sample,
with the answer worked out below.

The sample: ``sales``, 300 rows in three files (ids 0-99, 100-199, 200-299),
and ``products``, 12 rows in two files (ids 0-5, 6-11)::

    sales     id  product_id  qty          price            region
              i   i % 12      i % 4 + 1    (i % 10) / 4     east, north, south by i % 3
    products  product_id  category                   name
              p           a if p < 2, b if p < 6,    product-<p>
                          else c

:data:`JOIN_SQL` by category: ``qty`` depends on the product only (``p % 4 +
1``, as 4 divides 12), and each product has 25 sales; ``price`` repeats
every 60 ids (5 times in 300), where an even product's five ids end in 0, 2,
4, 6, 8 (sum 20) and an odd one's in 1, 3, 5, 7, 9 (sum 25)::

    a: products 0-1   n 50   qty (1+2)*25 = 75          price 5*(20+25)/4   = 56.25
    b: products 2-5   n 100  qty (3+4+1+2)*25 = 250     price 5*(2*45)/4    = 112.5
    c: products 6-11  n 150  qty (3+4+1+2+3+4)*25 = 425 price 5*(3*45)/4    = 168.75

:data:`GROUP_SQL` by region (``i % 3``): 100 ids each, summing to
``3 * (0 + ... + 99) + 100 * r``; every last digit 10 times (3 and 10 are
coprime), so ``price`` is ``10 * 45 / 4``::

    east   n 100  total 14850  price 112.5  first 0  last 297
    north  n 100  total 14950  price 112.5  first 1  last 298
    south  n 100  total 15050  price 112.5  first 2  last 299

``events``, Hive-partitioned as ``year=Y/month=M/part.parquet`` for Y in
2023-2024 and M in 1-3: ``10 * M + 5 * (Y - 2023)`` rows each, ``qty = M``::

    2023: months 10, 20, 30 rows  -> n 60, qty 10 + 40 + 90  = 140
    2024: months 15, 25, 35 rows  -> n 75, qty 15 + 50 + 105 = 170

The TPC-H tables (scale 0.01, conftest's) are copied to a bucket of
conftest's S3 server and read from there by the Python driver and its
workers, by Ray and by the Rust host, with the shuffle on S3 too.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
from conftest import (
    BUCKET,
    DFX,
    PARTITIONS,
    QUERIES,
    S3_CREDENTIALS,
    S3_KEY,
    S3_REGION,
    SCALE,
    S3Server,
    as_rows,
    assert_same,
    assert_same_columns,
    assert_same_rows,
    free_port,
    published_files,
    require_dfx,
    tpch_rows,
)
from datafusion import SessionConfig, SessionContext
from datafusion.object_store import AmazonS3

from dfx_engine import _internal
from dfx_engine.driver import DistributedResult, WorkerPool, run_distributed
from dfx_engine.session import SessionSpec, Table

if TYPE_CHECKING:
    from collections.abc import Iterator

    from dfx_engine.ray import RayExecutor

TABLE_BUCKET = "dfx-tables"
"""The bucket the S3 tables are in, beside conftest's shuffle bucket."""

SALES_FILES = 3
SALES_ROWS = 300
PRODUCT_FILES = 2
PRODUCTS = 12

JOIN_SQL = """
SELECT p.category, count(*) AS n, sum(s.qty) AS qty, sum(s.price) AS price
FROM sales s JOIN products p ON s.product_id = p.product_id
GROUP BY p.category
ORDER BY p.category
"""

JOIN_ANSWER = [
    {"category": "a", "n": 50, "qty": 75, "price": 56.25},
    {"category": "b", "n": 100, "qty": 250, "price": 112.5},
    {"category": "c", "n": 150, "qty": 425, "price": 168.75},
]

GROUP_SQL = """
SELECT region, count(*) AS n, sum(id) AS total, sum(price) AS price,
       min(id) AS first, max(id) AS last
FROM sales
GROUP BY region
ORDER BY region
"""

GROUP_ANSWER = [
    {
        "region": "east",
        "n": 100,
        "total": 14850,
        "price": 112.5,
        "first": 0,
        "last": 297,
    },
    {
        "region": "north",
        "n": 100,
        "total": 14950,
        "price": 112.5,
        "first": 1,
        "last": 298,
    },
    {
        "region": "south",
        "n": 100,
        "total": 15050,
        "price": 112.5,
        "first": 2,
        "last": 299,
    },
]

SAMPLE_QUERIES = [(JOIN_SQL, JOIN_ANSWER), (GROUP_SQL, GROUP_ANSWER)]

SALES_COLUMNS = [
    ("id", "BIGINT"),
    ("product_id", "BIGINT"),
    ("qty", "BIGINT"),
    ("price", "DOUBLE"),
    ("region", "VARCHAR"),
]
PRODUCT_COLUMNS = [
    ("product_id", "BIGINT"),
    ("category", "VARCHAR"),
    ("name", "VARCHAR"),
]

HEADER = {"format.has_header": "true"}
NO_HEADER = {"format.has_header": "false"}


def sales_rows(first: int, last: int) -> list[dict[str, Any]]:
    """The sample's sales with ids ``first`` up to ``last``, excluded."""
    return [
        {
            "id": i,
            "product_id": i % 12,
            "qty": i % 4 + 1,
            "price": (i % 10) / 4,
            "region": ("east", "north", "south")[i % 3],
        }
        for i in range(first, last)
    ]


def product_rows(first: int, last: int) -> list[dict[str, Any]]:
    """The sample's products with ids ``first`` up to ``last``, excluded."""
    return [
        {
            "product_id": p,
            "category": "a" if p < 2 else "b" if p < 6 else "c",
            "name": f"product-{p}",
        }
        for p in range(first, last)
    ]


def write_rows(path: pathlib.Path, rows: list[dict[str, Any]], fmt: str) -> None:
    """``rows`` as one file of ``fmt`` (``csv-headerless``: CSV, no header row)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows)
    if fmt == "parquet":
        pq.write_table(table, path)
    elif fmt in ("csv", "csv-headerless"):
        options = pa_csv.WriteOptions(include_header=fmt == "csv")
        pa_csv.write_csv(table, path, options)
    elif fmt == "json":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    elif fmt == "arrow":
        with pa.ipc.new_file(path, table.schema) as writer:
            writer.write_table(table)
    else:
        message = f"no writer for {fmt}"
        raise AssertionError(message)


def create(
    name: str,
    stored_as: str,
    location: str,
    *,
    columns: list[tuple[str, str]] | None = None,
    partitioned_by: str = "",
    options: dict[str, str] | None = None,
) -> str:
    """A ``CREATE EXTERNAL TABLE`` statement as a user writes one."""
    declared = f" ({', '.join(f'{n} {t}' for n, t in columns)})" if columns else ""
    partitions = f" PARTITIONED BY ({partitioned_by})" if partitioned_by else ""
    listed = ", ".join(f"'{k}' '{v}'" for k, v in (options or {}).items())
    with_options = f" OPTIONS ({listed})" if listed else ""
    return (
        f"CREATE EXTERNAL TABLE {name}{declared} STORED AS {stored_as}{partitions} "
        f"LOCATION '{location}'{with_options}"
    )


@dataclass(frozen=True)
class Layout:
    """One way the sample is stored: its two tables, and stock's statements."""

    sales: Table
    products: Table
    ddl: str

    @property
    def tables(self) -> dict[str, str | Table]:
        """The spec's tables."""
        return {"sales": self.sales, "products": self.products}


LAYOUTS = [
    "parquet",
    "csv",
    "csv-headerless",
    "json",
    "arrow",
    "single-file",
]
"""The sample's layouts: each format as directories, and one file."""


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Layout]:
    """The sample written in every layout of :data:`LAYOUTS`, by name.

    A directory per table per format; ``single-file`` is one CSV file of all
    the sales.
    """
    root = tmp_path_factory.mktemp("sample")
    per_file = SALES_ROWS // SALES_FILES
    per_product_file = PRODUCTS // PRODUCT_FILES
    extension = {"csv-headerless": "csv"}
    stored_as = {
        "parquet": "PARQUET",
        "csv": "CSV",
        "csv-headerless": "CSV",
        "json": "JSON",
        "arrow": "ARROW",
    }
    layouts: dict[str, Layout] = {}
    for fmt, sql_format in stored_as.items():
        suffix = extension.get(fmt, fmt)
        for index in range(SALES_FILES):
            rows = sales_rows(index * per_file, (index + 1) * per_file)
            write_rows(root / fmt / "sales" / f"part-{index}.{suffix}", rows, fmt)
        for index in range(PRODUCT_FILES):
            rows = product_rows(
                index * per_product_file, (index + 1) * per_product_file
            )
            write_rows(root / fmt / "products" / f"part-{index}.{suffix}", rows, fmt)
        table_format = "csv" if fmt == "csv-headerless" else fmt
        options = {"csv": HEADER, "csv-headerless": NO_HEADER}.get(fmt, {})
        declared = fmt == "csv-headerless"
        sales_dir, products_dir = root / fmt / "sales", root / fmt / "products"
        layouts[fmt] = Layout(
            sales=Table(
                str(sales_dir),
                format=table_format,
                options=dict(options),
                columns=list(SALES_COLUMNS) if declared else [],
            ),
            products=Table(
                str(products_dir),
                format=table_format,
                options=dict(options),
                columns=list(PRODUCT_COLUMNS) if declared else [],
            ),
            ddl=";\n".join(
                [
                    create(
                        "sales",
                        sql_format,
                        f"{sales_dir}/",
                        columns=SALES_COLUMNS if declared else None,
                        options=options,
                    ),
                    create(
                        "products",
                        sql_format,
                        f"{products_dir}/",
                        columns=PRODUCT_COLUMNS if declared else None,
                        options=options,
                    ),
                ]
            ),
        )
    parquet_products = layouts["parquet"].products
    products_ddl = create("products", "PARQUET", f"{root}/parquet/products/")

    single = root / "single" / "sales.csv"
    write_rows(single, sales_rows(0, SALES_ROWS), "csv")
    layouts["single-file"] = Layout(
        sales=Table(str(single), format="csv", options=dict(HEADER)),
        products=parquet_products,
        ddl=f"{create('sales', 'CSV', str(single), options=HEADER)};\n{products_ddl}",
    )

    assert sorted(layouts) == sorted(LAYOUTS)
    return layouts


def stock_context(ddl: str, server: S3Server | None = None) -> SessionContext:
    """Stock DataFusion with the tables ``ddl`` creates; nothing of dfx.

    With ``server``, the table bucket is reached through it.
    """
    ctx = SessionContext(SessionConfig().with_target_partitions(PARTITIONS))
    if server is not None:
        store = AmazonS3(
            bucket_name=TABLE_BUCKET,
            region=S3_REGION,
            access_key_id=S3_KEY,
            secret_access_key=S3_KEY,
            endpoint=server.endpoint,
            allow_http=True,
        )
        # Scheme and host: datafusion-python joins them into the store's URL,
        # the host defaulting to the store's bucket.
        ctx.register_object_store("s3://", store)
    for statement in ddl.split(";"):
        if statement.strip():
            ctx.sql(statement)
    return ctx


def assert_stocks_answer(
    got: list[pa.RecordBatch], stock: list[pa.RecordBatch], label: str
) -> None:
    """``got`` is stock's answer: the same columns and types, the same rows.

    In order: every query here orders its rows by a unique key.
    """
    assert_same_columns(got, stock, label)
    assert_same_rows(tpch_rows(got), tpch_rows(stock), label)


@pytest.fixture(scope="module")
def pool(s3: S3Server) -> Iterator[WorkerPool]:
    """Python workers kept across the module's queries.

    After the S3 server's keys are in the environment: a worker inherits
    its environment when it starts, and reads S3 tables with those keys.
    """
    with WorkerPool(max_workers=PARTITIONS) as workers:
        yield workers


def rust_host(
    script: str, directory: pathlib.Path, *flags: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``dfx run -f`` of ``script`` (statements, then queries), answers as JSON."""
    require_dfx()
    path = directory / f"script-{len(list(directory.glob('script-*')))}.sql"
    path.write_text(script)
    command = [
        str(DFX),
        "run",
        "--plugin",
        _internal.plugin_path(),
        "--partitions",
        str(PARTITIONS),
        "--max-workers",
        str(PARTITIONS),
        # On a worker: a plan no wider than a task of this machine's cores
        # would otherwise run whole in the driver, reading no stage.
        "--set",
        "collapse_stages=task",
        "--format",
        "json",
        *flags,
        "-f",
        str(path),
    ]
    return subprocess.run(
        command, capture_output=True, text=True, check=False, env=env, timeout=300
    )


def rust_answers(done: subprocess.CompletedProcess[str]) -> list[list[dict[str, Any]]]:
    """Each query's rows as ``dfx run --format json`` printed them, in turn."""
    assert done.returncode == 0, done.stderr
    assert re.search(r"^stages: [1-9]", done.stderr, re.MULTILINE), done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_format_and_location_kind_gives_stocks_and_the_worked_out_answer(
    sample: dict[str, Layout],
    pool: WorkerPool,
    tmp_path: pathlib.Path,
    layout: str,
) -> None:
    tables = sample[layout]
    stock = stock_context(tables.ddl)
    for index, (sql, answer) in enumerate(SAMPLE_QUERIES):
        label = f"{layout} query {index}"
        spec = SessionSpec(
            tables=tables.tables,
            shuffle_dir=str(tmp_path / f"shuffle-{index}"),
            target_partitions=PARTITIONS,
        )
        result = run_distributed(sql, spec, pool=pool)
        assert result.stages, label
        expected = stock.sql(sql).collect()
        assert_stocks_answer(result.batches, expected, label)
        assert_same(as_rows(result.batches), answer)
        assert_same(as_rows(expected), answer)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_rust_host_reads_each_layout_from_its_create_statements(
    sample: dict[str, Layout], tmp_path: pathlib.Path, layout: str
) -> None:
    queries = [sql for sql, _ in SAMPLE_QUERIES]
    script = ";\n".join([sample[layout].ddl, *queries])
    answers = rust_answers(rust_host(script, tmp_path))
    stock = stock_context(sample[layout].ddl)
    assert len(answers) == len(SAMPLE_QUERIES)
    for rows, (sql, answer) in zip(answers, SAMPLE_QUERIES, strict=True):
        assert_same(rows, as_rows(stock.sql(sql).collect()))
        assert_same(rows, answer)


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json", "arrow"])
def test_the_rust_hosts_table_flags_take_a_format(
    sample: dict[str, Layout], tmp_path: pathlib.Path, fmt: str
) -> None:
    tables = sample[fmt]
    # CSV as the flag reads it: DataFusion's default, a header row.
    flags = [
        "--table",
        f"sales={tables.sales.location}",
        "--table",
        f"products={tables.products.location}",
        "--table-format",
        fmt,
    ]
    answers = rust_answers(rust_host(f"{JOIN_SQL};\n{GROUP_SQL}", tmp_path, *flags))
    assert_same(answers[0], JOIN_ANSWER)
    assert_same(answers[1], GROUP_ANSWER)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_tables_from_create_statements_answer_as_the_same_definitions(
    sample: dict[str, Layout],
    pool: WorkerPool,
    tmp_path: pathlib.Path,
    layout: str,
) -> None:
    tables = sample[layout]
    from_sql = SessionSpec().with_tables_from_sql(tables.ddl + ";").tables
    assert sorted(from_sql) == ["products", "sales"]
    for name, table in from_sql.items():
        given = tables.tables[name]
        assert isinstance(table, Table)
        assert isinstance(given, Table)
        assert (table.format, table.options, table.columns) == (
            given.format,
            given.options,
            given.columns,
        ), name
    for index, (sql, answer) in enumerate(SAMPLE_QUERIES):
        answers = {}
        for source, defined in (("sql", from_sql), ("definitions", tables.tables)):
            spec = SessionSpec(
                tables=defined,
                shuffle_dir=str(tmp_path / f"shuffle-{source}-{index}"),
                target_partitions=PARTITIONS,
            )
            answers[source] = run_distributed(sql, spec, pool=pool).batches
        label = f"{layout} query {index}"
        assert_stocks_answer(answers["sql"], answers["definitions"], label)
        assert_same(as_rows(answers["sql"]), answer)


# Hive partitions.
EVENT_YEARS = (2023, 2024)
EVENT_MONTHS = (1, 2, 3)
EVENT_COLUMNS = [("id", "BIGINT"), ("qty", "BIGINT"), ("region", "VARCHAR")]


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """``events`` as ``year=Y/month=M/part.parquet``: ``10 M + 5 (Y - 2023)`` rows.

    Each row's ``qty`` is its month; the files hold neither year nor month.
    """
    root = tmp_path_factory.mktemp("events")
    first = 0
    for year in EVENT_YEARS:
        for month in EVENT_MONTHS:
            count = 10 * month + 5 * (year - 2023)
            rows = [
                {"id": first + i, "qty": month, "region": ("east", "west")[i % 2]}
                for i in range(count)
            ]
            first += count
            write_rows(
                root / f"year={year}" / f"month={month}" / "part.parquet",
                rows,
                "parquet",
            )
    return root


HIVE_CASES = {
    "strings": (
        [("year", None), ("month", None)],
        [],
        "year, month",
        [
            (
                "SELECT year, month, count(*) AS n, sum(qty) AS qty FROM events "
                "WHERE year = '2024' GROUP BY year, month ORDER BY month",
                [
                    {"year": "2024", "month": "1", "n": 15, "qty": 15},
                    {"year": "2024", "month": "2", "n": 25, "qty": 50},
                    {"year": "2024", "month": "3", "n": 35, "qty": 105},
                ],
            ),
            (
                "SELECT year, count(*) AS n, sum(qty) AS qty FROM events "
                "GROUP BY year ORDER BY year",
                [
                    {"year": "2023", "n": 60, "qty": 140},
                    {"year": "2024", "n": 75, "qty": 170},
                ],
            ),
        ],
    ),
    "typed": (
        [("year", "INT"), ("month", "INT")],
        EVENT_COLUMNS,
        "year INT, month INT",
        [
            (
                "SELECT year, month, count(*) AS n, sum(qty) AS qty FROM events "
                "WHERE year = 2024 AND month >= 2 GROUP BY year, month ORDER BY month",
                [
                    {"year": 2024, "month": 2, "n": 25, "qty": 50},
                    {"year": 2024, "month": 3, "n": 35, "qty": 105},
                ],
            ),
            (
                "SELECT year, count(*) AS n, sum(qty) AS qty FROM events "
                "WHERE month <> 2 GROUP BY year ORDER BY year",
                [
                    {"year": 2023, "n": 40, "qty": 100},
                    {"year": 2024, "n": 50, "qty": 120},
                ],
            ),
        ],
    ),
}
"""Partition columns as strings, or typed beside declared file columns:
the definition's partition columns, its columns, stock's ``PARTITIONED BY``,
and queries with their worked-out answers."""


@pytest.mark.parametrize("case", sorted(HIVE_CASES))
def test_hive_partition_columns_filter_and_group_as_stock_does(
    events: pathlib.Path, pool: WorkerPool, tmp_path: pathlib.Path, case: str
) -> None:
    partition_columns, columns, partitioned_by, queries = HIVE_CASES[case]
    table = Table(
        str(events), columns=list(columns), partition_columns=list(partition_columns)
    )
    stock = stock_context(
        create(
            "events",
            "PARQUET",
            f"{events}/",
            columns=columns or None,
            partitioned_by=partitioned_by,
        )
    )
    for index, (sql, answer) in enumerate(queries):
        label = f"{case} query {index}"
        spec = SessionSpec(
            tables={"events": table},
            shuffle_dir=str(tmp_path / f"shuffle-{index}"),
            target_partitions=PARTITIONS,
        )
        result = run_distributed(sql, spec, pool=pool)
        assert result.stages, label
        expected = stock.sql(sql).collect()
        assert_stocks_answer(result.batches, expected, label)
        assert_same(as_rows(result.batches), answer)
        assert_same(as_rows(expected), answer)


@pytest.fixture(scope="module")
def tpch_on_s3(s3: S3Server, tpch_tables: dict[str, str]) -> dict[str, str]:
    """The TPC-H tables of conftest copied to the table bucket, their locations by name.

    Each under the dataset's directory name (``sf0.01-p2/lineitem/...``),
    where ``dfx tpch --tables-on s3://BUCKET`` puts them: the Rust host finds
    them there and reads the same objects.
    """
    client = s3.client()
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=TABLE_BUCKET)
    locations = {}
    for name, directory in tpch_tables.items():
        prefix = f"{pathlib.Path(directory).parent.name}/{name}"
        for path in sorted(pathlib.Path(directory).glob("*.parquet")):
            client.upload_file(str(path), TABLE_BUCKET, f"{prefix}/{path.name}")
        locations[name] = f"s3://{TABLE_BUCKET}/{prefix}"
    return locations


@pytest.fixture(scope="module")
def tpch_stock(s3: S3Server, tpch_on_s3: dict[str, str]) -> SessionContext:
    """Stock DataFusion reading the TPC-H tables from the bucket."""
    ddl = ";\n".join(
        create(name, "PARQUET", f"{location}/")
        for name, location in sorted(tpch_on_s3.items())
    )
    return stock_context(ddl, s3)


def tpch_spec(s3: S3Server, tables: dict[str, str], shuffle_prefix: str) -> SessionSpec:
    """A spec over the S3 TPC-H tables, publishing under ``shuffle_prefix``."""
    return SessionSpec(
        tables=dict(tables),
        shuffle_dir=f"s3://{BUCKET}/{shuffle_prefix}",
        target_partitions=PARTITIONS,
        store_options=s3.store_options,
    )


def assert_published_on_s3(
    s3: S3Server, prefix: str, result: DistributedResult
) -> None:
    """Every map of every stage is an object under ``prefix``, as its shuffle.

    A coalesced group's members included: their group's task publishes them
    empty.
    """
    keys = s3.keys(BUCKET, f"{prefix}/")
    maps = {key for key in keys if key.endswith(".arrow")}
    expected = {
        _internal.map_path(prefix, stage.stage_id, index)
        for stage in result.stages
        for index in range(stage.maps)
    }
    assert maps == expected, keys


@pytest.mark.parametrize("number", range(1, 23), ids=lambda n: f"q{n}")
def test_tpch_with_tables_and_shuffle_on_s3_gives_stocks_answer(
    s3: S3Server,
    tpch_on_s3: dict[str, str],
    tpch_stock: SessionContext,
    pool: WorkerPool,
    number: int,
) -> None:
    sql = (QUERIES / f"q{number}.sql").read_text()
    prefix = f"tables/python-q{number}"
    result = run_distributed(sql, tpch_spec(s3, tpch_on_s3, prefix), pool=pool)
    assert result.retries == []
    assert_stocks_answer(result.batches, tpch_stock.sql(sql).collect(), f"q{number}")
    assert_published_on_s3(s3, prefix, result)


@pytest.fixture(scope="module")
def ray_executor(s3: S3Server) -> Iterator[RayExecutor]:
    """A Ray of two CPUs whose tasks carry the S3 keys, shut down afterwards.

    As on a cluster, the keys reach the Ray workers through the tasks'
    ``runtime_env``, not this process's environment.
    """
    ray = pytest.importorskip("ray")
    from dfx_engine.ray import RayExecutor

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield RayExecutor(options={"runtime_env": {"env_vars": dict(S3_CREDENTIALS)}})
    finally:
        ray.shutdown()


# Five of the 22 through Ray, to keep the suite's time: a scan and
# aggregate (1), joins of three to six tables (3, 5, 9) and a semi join on a
# grouped subquery (18). The Python driver runs all 22 above.
RAY_QUERIES = [1, 3, 5, 9, 18]


@pytest.mark.parametrize("number", RAY_QUERIES, ids=lambda n: f"q{n}")
def test_tpch_through_ray_with_tables_and_shuffle_on_s3_gives_stocks_answer(
    s3: S3Server,
    tpch_on_s3: dict[str, str],
    tpch_stock: SessionContext,
    ray_executor: RayExecutor,
    number: int,
) -> None:
    sql = (QUERIES / f"q{number}.sql").read_text()
    prefix = f"tables/ray-q{number}"
    spec = tpch_spec(s3, tpch_on_s3, prefix)
    result = run_distributed(sql, spec, executor=ray_executor)
    assert result.retries == []
    assert_stocks_answer(result.batches, tpch_stock.sql(sql).collect(), f"q{number}")
    assert_published_on_s3(s3, prefix, result)


def s3_environment(s3: S3Server) -> dict[str, str]:
    """The Rust host's environment for the S3 server: it reads ``AWS_*``."""
    return {
        **os.environ,
        **S3_CREDENTIALS,
        "AWS_ENDPOINT_URL": s3.endpoint,
        "AWS_REGION": S3_REGION,
        "AWS_ALLOW_HTTP": "true",
    }


def test_tpch_through_the_rust_host_with_tables_and_shuffle_on_s3_agrees_with_stock(
    s3: S3Server,
    tpch_on_s3: dict[str, str],
    tpch_tables: dict[str, str],
    tmp_path: pathlib.Path,
) -> None:
    require_dfx()
    report = tmp_path / "report.json"
    data_dir = pathlib.Path(next(iter(tpch_tables.values()))).parents[1]
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
            "all",
            "--runs",
            "1",
            "--data-dir",
            str(data_dir),
            "--tables-on",
            f"s3://{TABLE_BUCKET}",
            "--shuffle-dir",
            f"s3://{BUCKET}/tables/rust",
            "--json",
            str(report),
            # Each query a stage whose output goes to the bucket.
            "--set",
            "collapse_stages=task",
        ],
        capture_output=True,
        text=True,
        check=False,
        env=s3_environment(s3),
        timeout=600,
    )
    # 0: every query ran in every mode (stock DataFusion reading the same
    # bucket among them) and every answer agreed with stock's.
    assert done.returncode == 0, done.stdout + done.stderr
    queries = json.loads(report.read_text())["queries"]
    assert [query["query"] for query in queries] == list(range(1, 23))
    for query in queries:
        assert query["outcome"] == {"kind": "agree"}, query
        assert query["stages"] >= 1, query
    keys = s3.keys(BUCKET, "tables/rust/")
    assert any(key.endswith(".arrow") for key in keys), keys


# Bad input: each refused with an error naming the table and what is wrong,
# before any worker starts, and nothing published.
BAD_SQL = "SELECT count(*) AS n FROM feed"

TRAP = 'touch "$0"; exec sleep 600'
"""A worker that leaves a trace file behind: none may start."""


def refused(
    host: str,
    table: Table,
    tmp_path: pathlib.Path,
    *,
    ddl: str,
    store_options: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
) -> str:
    """The error ``host`` refuses a query over ``table`` (as ``feed``) with.

    Asserts that no worker started and nothing was published: the Python
    host is given ``table``, the Rust host ``ddl``, each a fresh shuffle
    directory and a worker that would leave a trace.
    """
    trace = tmp_path / "a-worker-started"
    shuffle = tmp_path / "shuffle"
    if host == "python":
        spec = SessionSpec(
            tables={"feed": table},
            shuffle_dir=str(shuffle),
            target_partitions=PARTITIONS,
            store_options=store_options or {},
        )
        with pytest.raises(ValueError) as info:  # noqa: PT011 - the text is checked
            run_distributed(
                BAD_SQL,
                spec,
                worker_mode="process",
                worker_command=["/bin/sh", "-c", TRAP, str(trace)],
                max_attempts=1,
                task_timeout=30,
            )
        message = str(info.value)
    else:
        flags = [
            "--shuffle-dir",
            str(shuffle),
            "--worker-mode",
            "process",
            "--worker",
            "/bin/sh",
            *("--worker-arg", "-c", "--worker-arg", TRAP, "--worker-arg", str(trace)),
            "--max-attempts",
            "1",
            "--task-timeout",
            "30",
        ]
        done = rust_host(f"{ddl};\n{BAD_SQL}", tmp_path, *flags, env=env)
        assert done.returncode != 0, done.stdout
        message = done.stderr
    assert not trace.exists(), message
    assert published_files(str(shuffle)) == set(), message
    assert re.search(r"\btable \"?feed\b", message), message
    return message


HOSTS = ["python", "rust"]


def bad_parquet_directory(directory: pathlib.Path) -> pathlib.Path:
    """A directory of one good Parquet file and a text file named ``.parquet``."""
    write_rows(directory / "good.parquet", [{"a": 1}, {"a": 2}], "parquet")
    (directory / "broken.parquet").write_text("id,name\n1,not parquet\n")
    return directory


@pytest.mark.parametrize("host", HOSTS)
def test_a_file_that_is_not_of_the_tables_format_is_named(
    tmp_path: pathlib.Path, host: str
) -> None:
    directory = bad_parquet_directory(tmp_path / "feed")
    message = refused(
        host,
        Table(str(directory)),
        tmp_path,
        ddl=create("feed", "PARQUET", f"{directory}/"),
    )
    assert "broken.parquet" in message


@pytest.mark.parametrize("host", HOSTS)
def test_an_unreachable_endpoint_of_a_tables_bucket_is_named(
    s3: S3Server, tmp_path: pathlib.Path, host: str
) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    location = f"s3://{TABLE_BUCKET}/feed"
    message = refused(
        host,
        Table(location),
        tmp_path,
        ddl=create("feed", "PARQUET", f"{location}/"),
        store_options={**s3.store_options, "s3_endpoint": endpoint},
        env={**s3_environment(s3), "AWS_ENDPOINT_URL": endpoint},
    )
    assert location in message
    assert endpoint.removeprefix("http://") in message


@pytest.mark.parametrize("host", HOSTS)
def test_a_missing_bucket_of_a_table_is_named(
    s3: S3Server, tmp_path: pathlib.Path, host: str
) -> None:
    location = "s3://no-such-bucket/feed"
    message = refused(
        host,
        Table(location),
        tmp_path,
        ddl=create("feed", "PARQUET", f"{location}/"),
        store_options=s3.store_options,
        env=s3_environment(s3),
    )
    assert location in message
    assert "bucket" in message.lower()


@pytest.mark.parametrize("host", HOSTS)
def test_files_whose_schemas_conflict_are_refused_naming_the_column(
    tmp_path: pathlib.Path, host: str
) -> None:
    directory = tmp_path / "feed"
    write_rows(directory / "a.parquet", [{"a": 1}], "parquet")
    write_rows(directory / "b.parquet", [{"a": "one"}], "parquet")
    message = refused(
        host,
        Table(str(directory)),
        tmp_path,
        ddl=create("feed", "PARQUET", f"{directory}/"),
    )
    # The column, its two types, and the two files that give them.
    assert re.search(r"(column|field) '?a'?\b", message), message
    assert "Int64" in message
    assert "Utf8" in message
    assert str(directory / "a.parquet") in message
    assert str(directory / "b.parquet") in message


@pytest.mark.parametrize("host", HOSTS)
def test_a_partition_column_that_is_also_a_file_column_is_refused(
    tmp_path: pathlib.Path, host: str
) -> None:
    directory = tmp_path / "feed"
    rows = [{"year": 2024, "v": 1}]
    write_rows(directory / "year=2024" / "part.parquet", rows, "parquet")
    message = refused(
        host,
        Table(str(directory), partition_columns=[("year", None)]),
        tmp_path,
        ddl=create("feed", "PARQUET", f"{directory}/", partitioned_by="year"),
    )
    assert "partition column year is also a column of its files" in message


@pytest.mark.parametrize("host", HOSTS)
def test_a_glob_location_is_refused_saying_why(
    sample: dict[str, Layout], tmp_path: pathlib.Path, host: str
) -> None:
    # The plan format drops a glob: a stage would read every file beside
    # the ones it selects, so the definition is refused before anything runs.
    pattern = f"{sample['parquet'].sales.location}/part-*.parquet"
    if host == "python":
        # Refused by the spec itself, before any session or worker.
        with pytest.raises(ValueError, match="is a glob") as info:
            SessionSpec(tables={"feed": Table(pattern)})
        message = str(info.value)
    else:
        message = refused(
            host, Table(pattern), tmp_path, ddl=create("feed", "PARQUET", pattern)
        )
    assert pattern in message
    assert "is a glob" in message


FEED_DDL = create("feed", "PARQUET", "/d/feed/")


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1",
        f"{FEED_DDL}; SELECT 1",
        f"SELECT 1; {FEED_DDL}",
        "CREATE VIEW feed AS SELECT 1",
    ],
    ids=["a-query", "a-statement-then-a-query", "a-query-then-a-statement", "a-view"],
)
def test_tables_from_sql_take_create_external_table_statements_only(sql: str) -> None:
    spec = SessionSpec(target_partitions=PARTITIONS)
    with pytest.raises(ValueError, match="CREATE EXTERNAL TABLE"):
        spec.with_tables_from_sql(sql)


def test_tables_from_sql_refuse_a_table_defined_twice(
    sample: dict[str, Layout],
) -> None:
    spec = SessionSpec(tables=sample["parquet"].tables)
    with pytest.raises(ValueError, match="tables defined twice: sales"):
        spec.with_tables_from_sql(create("sales", "PARQUET", "/d/sales/"))
