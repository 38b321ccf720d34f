"""Shared fixtures: a hand-checked lineitem-like table and fresh specs.

The table is four Parquet files of two rows each::

    file  l_returnflag  l_quantity  l_extendedprice  l_discount  l_tax
    0     A             10          100.0            0.10        0.00
    0     B             20          200.0            0.00        0.50
    1     A             30          300.0            0.00        0.10
    1     B             40          400.0            0.50        0.00
    2     A             50          500.0            0.20        0.00
    2     R             60          600.0            0.00        0.00
    3     B             70          700.0            0.10        0.00
    3     R             80          800.0            0.50        0.50

Worked out by hand, per flag, with net = price * (1 - discount) * (1 + tax)
and the quantity-weighted average price = sum(price * qty) / sum(qty):

    A: net 90 + 330 + 400 = 820;   qty 90;  weighted 35000 / 90  = 388.888...
    B: net 300 + 200 + 630 = 1130; qty 130; weighted 69000 / 130 = 530.769...
    R: net 600 + 600 = 1200;       qty 140; weighted 100000 / 140 = 714.285...

    all: 8 rows, quantity 360, net 3150.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import pathlib
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dfx_engine import _internal
from dfx_engine.session import SessionSpec

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

ROWS = [
    ("A", 10, 100.0, 0.10, 0.00),
    ("B", 20, 200.0, 0.00, 0.50),
    ("A", 30, 300.0, 0.00, 0.10),
    ("B", 40, 400.0, 0.50, 0.00),
    ("A", 50, 500.0, 0.20, 0.00),
    ("R", 60, 600.0, 0.00, 0.00),
    ("B", 70, 700.0, 0.10, 0.00),
    ("R", 80, 800.0, 0.50, 0.50),
]
FILES = 4

NET_BY_FLAG = {"A": 820.0, "B": 1130.0, "R": 1200.0}
QTY_BY_FLAG = {"A": 90, "B": 130, "R": 140}
WEIGHTED_BY_FLAG = {"A": 35000 / 90, "B": 69000 / 130, "R": 100000 / 140}

REVENUE_SQL = """
SELECT l_returnflag AS flag,
       sum(l_quantity) AS qty,
       sum(dfx_net_revenue(l_extendedprice, l_discount, l_tax)) AS net,
       dfx_weighted_avg(l_extendedprice, CAST(l_quantity AS DOUBLE)) AS weighted
FROM lineitem
GROUP BY l_returnflag
ORDER BY flag
"""
"""Both plugin functions, an aggregate split into partial and final."""

SQL_ONLY = """
SELECT l_returnflag AS flag, count(*) AS n, sum(l_quantity) AS qty
FROM lineitem GROUP BY l_returnflag ORDER BY flag
"""
"""No plugin function: what any host can run."""


@pytest.fixture(scope="session")
def lineitem(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The fixture table's directory: four Parquet files, two rows each."""
    directory = tmp_path_factory.mktemp("lineitem")
    schema = pa.schema(
        [
            ("l_returnflag", pa.string()),
            ("l_quantity", pa.int64()),
            ("l_extendedprice", pa.float64()),
            ("l_discount", pa.float64()),
            ("l_tax", pa.float64()),
        ]
    )
    per_file = len(ROWS) // FILES
    for index in range(FILES):
        pair = ROWS[index * per_file : (index + 1) * per_file]
        table = pa.Table.from_pylist(
            [dict(zip(schema.names, row, strict=True)) for row in pair], schema
        )
        pq.write_table(table, directory / f"part-{index}.parquet")
    return directory


@pytest.fixture
def make_spec(
    lineitem: pathlib.Path, tmp_path: pathlib.Path
) -> Callable[..., SessionSpec]:
    """A factory of specs over the fixture, each with a fresh shuffle directory.

    Four target partitions: one per file, and a task per partition (coalescing
    off unless ``coalesce`` says otherwise), so a stage has four tasks.
    """
    counter = itertools.count()

    def make(
        *,
        shuffle: bool = True,
        target_partitions: int = FILES,
        split: str = "exchange",
        coalesce: str = "off",
    ) -> SessionSpec:
        shuffle_dir = tmp_path / f"shuffle-{next(counter)}" if shuffle else None
        return SessionSpec(
            tables={"lineitem": str(lineitem)},
            shuffle_dir=str(shuffle_dir) if shuffle_dir else "",
            target_partitions=target_partitions,
            split=split,
            engine_options={"coalesce": coalesce},
        )

    return make


def as_rows(batches: list[pa.RecordBatch]) -> list[dict[str, object]]:
    """The rows of ``batches`` as dicts, in order."""
    return pa.Table.from_batches(batches).to_pylist() if batches else []


def assert_revenue(rows: list[dict[str, object]]) -> None:
    """``rows`` is the hand-checked answer of :data:`REVENUE_SQL`."""
    assert [row["flag"] for row in rows] == ["A", "B", "R"]
    for row in rows:
        flag = row["flag"]
        assert row["qty"] == QTY_BY_FLAG[flag]
        assert row["net"] == pytest.approx(NET_BY_FLAG[flag], rel=1e-9)
        assert row["weighted"] == pytest.approx(WEIGHTED_BY_FLAG[flag], rel=1e-9)


def assert_same(left: list[dict[str, object]], right: list[dict[str, object]]) -> None:
    """Same rows: floats to 1e-6 relative, all else (decimals too) exactly."""
    assert len(left) == len(right)
    for a, b in zip(left, right, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(a[key], float):
                assert a[key] == pytest.approx(b[key], rel=1e-6), key
            else:
                assert a[key] == b[key], key


def sorted_rows(batches: list[pa.RecordBatch]) -> list[tuple[Any, ...]]:
    """The rows of ``batches`` as tuples, in a canonical order.

    For queries whose order is not defined: NULLs first, floats sorted on a
    rounded value so that two answers equal to 1e-6 sort alike.
    """

    def key(row: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(
            (
                value is not None,
                round(value, 6) if isinstance(value, float) else value,
            )
            for value in row
        )

    table = pa.Table.from_batches(batches) if batches else None
    rows = [tuple(row.values()) for row in table.to_pylist()] if table else []
    return sorted(rows, key=key)


def assert_same_columns(
    left: list[pa.RecordBatch], right: list[pa.RecordBatch], label: str = ""
) -> None:
    """Same column names and types, in order, decimal scales included.

    An answer without batches has no schema; its rows decide.
    """
    if not left or not right:
        return
    names, types = (
        (left[0].schema.names, right[0].schema.names),
        (
            left[0].schema.types,
            right[0].schema.types,
        ),
    )
    assert names[0] == names[1], f"{label}: columns {names[0]} vs {names[1]}"
    assert types[0] == types[1], f"{label}: column types {types[0]} vs {types[1]}"


def assert_same_rows(
    left: list[tuple[Any, ...]], right: list[tuple[Any, ...]], label: str = ""
) -> None:
    """Same rows in the same order: floats to 1e-6 relative, all else exactly.

    Decimals too: their sums are exact, so a tolerance would hide a lost row.
    """
    assert len(left) == len(right), f"{label}: {len(left)} rows, not {len(right)}"
    for index, (a, b) in enumerate(zip(left, right, strict=True)):
        assert len(a) == len(b), f"{label} row {index}: {a} vs {b}"
        for x, y in zip(a, b, strict=True):
            if isinstance(x, float) and isinstance(y, float):
                assert math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9), (
                    f"{label} row {index}: {a} vs {b}"
                )
            else:
                assert x == y, f"{label} row {index}: {a} vs {b}"


def split_map_file(path: pathlib.Path) -> tuple[bytes, dict[str, Any]]:
    """A published map file's segments and its commit marker, by its footer."""
    magic, footer_len = _internal.map_footer()
    data = path.read_bytes()
    footer = len(data) - footer_len
    assert data[footer + 8 :] == magic, f"{path} does not end with a marker"
    index = footer - int.from_bytes(data[footer : footer + 8], "little")
    marker: dict[str, Any] = json.loads(data[index:footer])
    return data[:index], marker


LZ4_FRAME_MAGIC = b"\x04\x22\x4d\x18"
"""The first bytes of an LZ4 frame: how Arrow IPC's LZ4 codec starts each buffer."""


def map_compressions(path: pathlib.Path) -> set[str]:
    """How the record batches of a published map file are compressed.

    Each segment is an Arrow IPC stream; pyarrow reads its messages, and a
    record batch body whose buffers are LZ4 frames is ``lz4``, any other
    ``none`` (an empty map has no batch, hence no answer).
    """
    data, marker = split_map_file(path)
    found = set()
    for bucket in marker["buckets"]:
        for segment in bucket["segments"]:
            start = segment["offset"]
            stream = pa.BufferReader(data[start : start + segment["bytes"]])
            for message in pa.ipc.MessageReader.open_stream(stream):
                if message.type == "record batch":
                    body = message.body.to_pybytes()
                    found.add("lz4" if LZ4_FRAME_MAGIC in body else "none")
    return found


def read_marker(shuffle_dir: str, stage: int, map_index: int) -> dict[str, Any]:
    """The commit marker closing a map's file (the plugin names its path)."""
    path = pathlib.Path(_internal.marker_path(shuffle_dir, stage, map_index))
    return split_map_file(path)[1]


def published_files(shuffle_dir: str) -> set[pathlib.Path]:
    """Every file under the stage output entries of ``shuffle_dir``."""
    root = pathlib.Path(shuffle_dir)
    return {
        path
        for entry in root.glob(_internal.partition_glob())
        for path in ([entry] if entry.is_file() else entry.rglob("*"))
        if path.is_file()
    }


LOSING_WORKER = """
import json, os, pathlib, sys
from dfx_engine import _internal, worker

rules = json.loads(pathlib.Path(sys.argv.pop(1)).read_text())
run_task = worker.run_task


def holds_rows(stage, map_index):
    magic, footer_len = _internal.map_footer()
    path = pathlib.Path(_internal.marker_path(rules["dir"], stage, map_index))
    data = path.read_bytes()
    footer = len(data) - footer_len
    start = footer - int.from_bytes(data[footer : footer + 8], "little")
    marker = json.loads(data[start:footer])
    return any(bucket["rows"] for bucket in marker["buckets"])


def lose_once():
    try:
        claim = os.open(rules["claim"], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    stage, map_index = rules["victim"]
    if map_index is None:
        map_index = next(m for m in range(rules["maps"]) if holds_rows(stage, m))
    os.write(claim, str(map_index).encode())
    os.close(claim)
    pathlib.Path(_internal.marker_path(rules["dir"], stage, map_index)).unlink()


def losing(task):
    if task.stage_id == rules.get("before"):
        lose_once()
    published = run_task(task)
    maps = _internal.encoded_stage_info(task.plan).maps
    if task.stage_id == rules.get("after_last_of") and task.map == maps - 1:
        rules["maps"] = maps
        lose_once()
    return published


worker.run_task = losing
sys.exit(worker.main())
"""
"""A Python worker that deletes one published map file, once (see
:func:`losing_worker`)."""


def losing_worker(
    directory: pathlib.Path,
    shuffle_dir: str,
    victim: tuple[int, int | None],
    *,
    before: int | None = None,
    after_last_of: int | None = None,
) -> list[str]:
    """The command of a Python worker that loses ``victim``'s output once.

    It deletes the published file of map ``victim`` (stage, map) under
    ``shuffle_dir`` just before it runs the first task of stage ``before``
    it is given, or just after it runs the last map of stage
    ``after_last_of``; only the first time, in whichever worker gets there
    first, writing the map's index into ``directory / "claimed"``. A map of
    ``None`` (with ``after_last_of``) is the stage's first map holding rows:
    a reader handed the layouts reads no map published empty. With one
    worker at a time, tasks run in dispatch order, so the loss lands between
    the victim's publication and its first reader.
    """
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "losing_worker.py"
    script.write_text(LOSING_WORKER)
    rules = directory / "rules.json"
    rules.write_text(
        json.dumps(
            {
                "claim": str(directory / "claimed"),
                "dir": shuffle_dir,
                "victim": list(victim),
                "before": before,
                "after_last_of": after_last_of,
            }
        )
    )
    return [sys.executable, str(script), str(rules)]


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited.

    A zombie (exited, not yet reaped by a parent that is gone or slow) counts
    as exited: it runs nothing and holds nothing open.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state follows the parenthesised command name, which may hold spaces.
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def serve_workers_of(parent: int) -> list[int]:
    """Pids of live long-lived workers (``... --serve``) whose parent is ``parent``."""
    pids = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"--serve" in cmdline and alive(int(entry.name)):
            pids.append(int(entry.name))
    return sorted(pids)


# The Rust host's ``dfx`` binary: the TPC-H generator, and the other host of
# the cross-host tests. A test that needs it fails without it, so a run
# cannot pass having tested nothing; DFX_SKIP_CROSS_HOST=1 skips instead.
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


def require_dfx() -> None:
    """Fail (or, only when asked to, skip) without the Rust host binary."""
    if DFX.is_file():
        return
    missing = f"the Rust host binary {DFX} is not built (cargo build -p dfx-host)"
    if os.environ.get("DFX_SKIP_CROSS_HOST") == "1":
        pytest.skip(missing)
    pytest.fail(f"{missing}; set DFX_SKIP_CROSS_HOST=1 to skip", pytrace=False)


HOOKS_ENV = "DFX_PLUGIN_TEST_HOOKS"
"""Names the plugin built with its ``test-hooks`` feature, overriding the default."""


def hooks_plugin() -> pathlib.Path:
    """The plugin built with its ``test-hooks`` feature (fault injection in it).

    ``DFX_PLUGIN_TEST_HOOKS``, else ``<target>/debug/test-hooks/``, where
    ``ffi-tests/build-plugins.sh`` puts it (``scripts/test.sh`` runs that
    before this suite). Fails the test when it is absent: a fault test that
    skipped would pass having injected nothing.
    """
    named = os.environ.get(HOOKS_ENV)
    if named:
        path = pathlib.Path(named)
    else:
        target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
        # The file name of the plugin this package loaded: one spelling.
        name = pathlib.Path(_internal.plugin_path()).name
        path = target / "debug" / "test-hooks" / name
    if not path.is_file():
        pytest.fail(
            f"the test-hooks plugin {path} is missing: build it with "
            f"ffi-tests/build-plugins.sh (or name it in {HOOKS_ENV})",
            pytrace=False,
        )
    return path


def _data_dir() -> pathlib.Path:
    """Where generated data is cached: beside the build output."""
    if "DFX_TPCH_DATA_DIR" in os.environ:
        return pathlib.Path(os.environ["DFX_TPCH_DATA_DIR"])
    target = os.environ.get("CARGO_TARGET_DIR", str(ROOT / "target"))
    return pathlib.Path(target) / "tpch-data"


@pytest.fixture(scope="session")
def tpch_tables() -> dict[str, str]:
    """The eight tables at scale 0.01, generated on first use."""
    require_dfx()
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
) -> Callable[..., SessionSpec]:
    """A distributing spec over the TPC-H tables, fresh shuffle dir each."""
    counter = itertools.count()

    def make(split: str = "exchange") -> SessionSpec:
        return SessionSpec(
            tables=dict(tpch_tables),
            shuffle_dir=str(tmp_path / f"shuffle-{next(counter)}"),
            target_partitions=PARTITIONS,
            split=split,
        )

    return make


def tpch_rows(batches: list[pa.RecordBatch]) -> list[tuple[Any, ...]]:
    """The rows of ``batches`` as tuples, in their order."""
    if not batches:
        return []
    return [tuple(r.values()) for r in pa.Table.from_batches(batches).to_pylist()]


# An S3 endpoint for the tests: moto's server (``moto[server]``, which
# run-tests.sh installs beside the tests, boto3 with it) on 127.0.0.1 and a
# free port, one for the whole session, with one bucket.
BUCKET = "dfx-shuffle"
"""The bucket the session's server holds."""

S3_KEY = "test"
"""Access key and secret alike: moto takes any unless told to check."""

S3_REGION = "us-east-1"


def free_port() -> int:
    """A port of 127.0.0.1 nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass(frozen=True)
class S3Server:
    """A running S3 endpoint and what reaches it."""

    endpoint: str

    @property
    def store_options(self) -> dict[str, str]:
        """A spec's ``store_options`` for this endpoint (credentials aside)."""
        return {
            "s3_endpoint": self.endpoint,
            "s3_region": S3_REGION,
            "s3_allow_http": "true",
        }

    def client(self) -> Any:  # noqa: ANN401 - boto3 declares no types
        """A boto3 S3 client of this endpoint."""
        boto3 = pytest.importorskip("boto3")
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=S3_KEY,
            aws_secret_access_key=S3_KEY,
            region_name=S3_REGION,
        )

    def keys(self, bucket: str, prefix: str) -> list[str]:
        """Every object key under ``prefix``, sorted."""
        pages = self.client().get_paginator("list_objects_v2")
        return sorted(
            item["Key"]
            for page in pages.paginate(Bucket=bucket, Prefix=prefix)
            for item in page.get("Contents", [])
        )


@contextlib.contextmanager
def s3_server(*, check_keys: bool = False) -> Iterator[S3Server]:
    """A ``moto_server`` on a free port, killed and reaped afterwards.

    With ``check_keys`` it refuses every request's keys (it knows none).
    """
    server = pathlib.Path(sys.executable).parent / "moto_server"
    if not server.is_file():
        pytest.skip(f"no {server}: install moto[server] beside the tests")
    port = free_port()
    env = dict(os.environ)
    if check_keys:
        env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
    process = subprocess.Popen(
        [str(server), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, "moto_server exited"
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", port), timeout=1),
            ):
                break
            assert time.monotonic() < deadline, "moto_server did not listen"
            time.sleep(0.1)
        # A server that lost its port to another process exits: whatever
        # answered would vanish under the tests, so look again.
        time.sleep(0.2)
        assert process.poll() is None, f"moto_server exited: port {port} is held"
        yield S3Server(f"http://127.0.0.1:{port}")
    finally:
        process.kill()
        process.wait()


S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": S3_KEY, "AWS_SECRET_ACCESS_KEY": S3_KEY}
"""What the driver and its workers read their S3 keys from: the environment."""


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    """The session's S3 server, holding :data:`BUCKET`, and keys to reach it.

    The keys go into this process's environment, which workers inherit;
    endpoint, region and plain http come only from a spec's
    ``store_options``, so that is what the tests exercise.
    """
    with pytest.MonkeyPatch.context() as env, s3_server() as server:
        for name in (
            "AWS_ENDPOINT_URL",
            "AWS_ENDPOINT",
            "AWS_ALLOW_HTTP",
            "AWS_PROFILE",
        ):
            env.delenv(name, raising=False)
        for name, value in S3_CREDENTIALS.items():
            env.setenv(name, value)
        server.client().create_bucket(Bucket=BUCKET)
        yield server
