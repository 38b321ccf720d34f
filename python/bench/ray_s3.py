"""dfx on Ray with the shuffle on S3: one session shown, TPC-H timed.

What a Ray deployment of dfx does, on one machine: a local Ray of two CPUs
runs the tasks, an S3 API server holds the shuffle, and the driver is this
process::

    python python/bench/ray_s3.py --dfx PATH/TO/dfx [--scale 0.1] [--partitions 2]
        [--queries 1,3,9,18 | all] [--runs 1] [--endpoint URL] [--data-dir DIR]

The S3 server is ``moto_server`` (``moto[server]``, installed beside the
tests), started on 127.0.0.1 and a free port and stopped at the end; with
``--endpoint URL`` an S3 endpoint already running (MinIO...) is used
instead, with the keys of ``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY``
and a prefix of this run's own. The TPC-H tables come from the Rust host's
generator, ``dfx tpch`` (hence ``--dfx``), cached where the Python tests
cache theirs (``--data-dir``).

Two parts:

- **The session**: TPC-H q9 through :class:`~dfx_engine.ray.RayExecutor`,
  its shuffle at ``s3://BUCKET/session/q9``. Printed: the stages the driver
  planned (id, maps, buckets, the stages each reads, the partitioning of its
  output), the waves they ran in, what the tasks reported, the answer's row
  count, and every object the tasks left under the prefix, with its size.
- **The timing**: each query asked for, in four ways, the median wall time
  of ``--runs`` runs each: in this process (``run_local``); on the
  subprocess executor (one :class:`~dfx_engine.driver.WorkerPool` of
  long-lived workers, warmed first, as Ray's workers are) with a local
  shuffle directory, then with the shuffle on S3; and on Ray with the
  shuffle on S3. Every distributed answer is compared with the local one
  (rows sorted; floats to 1e-6 relative, all else exactly). The ratio
  ``ray/sub-S3`` is what Ray costs over the subprocess executor for the
  same shuffle.

Both executors run at most two tasks at once (``--workers``, Ray's
``num_cpus``). Run it with the interpreter the wheel is installed in
(``python/.venv`` once ``run-tests.sh`` has run), from outside ``python/``:
Ray puts the driver's working directory on its workers' ``sys.path``, and
the source tree's ``dfx_engine`` has no native module. Not a test: the
figures depend on the machine, and on a build's profile most of all.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import math
import os
import pathlib
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import ray

from dfx_engine import _internal
from dfx_engine.driver import WorkerPool, run_distributed, run_local
from dfx_engine.ray import RayExecutor
from dfx_engine.session import SessionSpec

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

ROOT = pathlib.Path(__file__).resolve().parents[2]
"""The repository: its ``host/queries`` and, by default, its ``target``."""

QUERIES = ROOT / "host" / "queries"
"""The TPC-H queries the Rust host runs, ``q1.sql`` to ``q22.sql``."""

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

SESSION_QUERY = 9
"""The query of the session: six tables, joins feeding an aggregate."""

LISTED_IN_FULL = 80
"""A prefix holding fewer objects than this is listed key by key."""

MODES = ("local", "sub+dir", "sub+S3", "ray+S3")
"""The ways each query runs, in the table's column order."""

KEY_NAMES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
"""What the driver and every worker read S3 credentials from."""

MOTO_KEY = "test"
"""Access key and secret alike for moto, which takes any."""


def default_data_dir() -> pathlib.Path:
    """Where the Python tests cache TPC-H data: beside the build output."""
    if "DFX_TPCH_DATA_DIR" in os.environ:
        return pathlib.Path(os.environ["DFX_TPCH_DATA_DIR"])
    target = os.environ.get("CARGO_TARGET_DIR", str(ROOT / "target"))
    return pathlib.Path(target) / "tpch-data"


def parse_queries(text: str) -> list[int]:
    """``all``, or numbers and ranges such as ``1,3,9-11``: query numbers."""
    if text.strip() == "all":
        return list(range(1, 23))
    numbers: list[int] = []
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        numbers.extend(range(int(first), int(last or first) + 1))
    bad = [n for n in numbers if not 1 <= n <= 22]
    if bad:
        message = f"TPC-H queries are 1 to 22, not {bad}"
        raise argparse.ArgumentTypeError(message)
    return numbers


# --- The S3 endpoint --------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """An S3 endpoint, the bucket used on it and this run's key prefix."""

    url: str
    region: str
    bucket: str
    prefix: str

    @property
    def store_options(self) -> dict[str, str]:
        """A spec's ``store_options`` (credentials stay in the environment)."""
        return {
            "s3_endpoint": self.url,
            "s3_region": self.region,
            "s3_allow_http": str(self.url.startswith("http://")).lower(),
        }

    def location(self, path: str) -> str:
        """The ``s3://`` shuffle location of ``path`` under this run's prefix."""
        return f"s3://{self.bucket}/{self.key(path)}"

    def key(self, path: str) -> str:
        """The object key (or key prefix) of ``path`` under this run's prefix."""
        return f"{self.prefix}/{path}" if self.prefix else path

    def client(self) -> Any:  # noqa: ANN401 - boto3 declares no types
        """A boto3 S3 client of this endpoint, with the environment's keys."""
        # Imported here: boto3 comes with moto[server] and has no type hints.
        boto3 = importlib.import_module("boto3")
        return boto3.client("s3", endpoint_url=self.url, region_name=self.region)

    def objects(self, path: str) -> list[tuple[str, int]]:
        """Every object under ``path``/ as (key, size), sorted by key."""
        pages = self.client().get_paginator("list_objects_v2")
        return sorted(
            (item["Key"], int(item["Size"]))
            for page in pages.paginate(Bucket=self.bucket, Prefix=self.key(path) + "/")
            for item in page.get("Contents", [])
        )

    def remove(self, path: str) -> None:
        """Delete every object under ``path``/: a run's shuffle, once timed.

        moto keeps objects in memory; a full TPC-H sweep's shuffles would
        otherwise pile up there.
        """
        client = self.client()
        keys = [key for key, _size in self.objects(path)]
        for start in range(0, len(keys), 1000):
            batch = [{"Key": key} for key in keys[start : start + 1000]]
            client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch})


def free_port() -> int:
    """A port of 127.0.0.1 nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def moto_server(log: pathlib.Path | None = None) -> Iterator[str]:
    """``moto_server`` on 127.0.0.1 and a free port: its URL; killed after.

    The executable is the one installed beside this interpreter. With
    ``log``, its request log (a line per request) is written there.
    """
    server = pathlib.Path(sys.executable).parent / "moto_server"
    if not server.is_file():
        message = (
            f"no {server.name} beside {sys.executable}: install moto[server] "
            "there, or give --endpoint URL of a running S3 endpoint"
        )
        raise SystemExit(message)
    port = free_port()
    with log.open("wb") if log else contextlib.nullcontext() as written:
        process = subprocess.Popen(  # noqa: S603 - our own interpreter's moto
            [str(server), "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=written or subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                message = f"{server.name} exited with status {process.returncode}"
                raise SystemExit(message)
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", port), timeout=1),
            ):
                break
            if time.monotonic() > deadline:
                message = f"{server.name} did not listen on port {port} in 60 s"
                raise SystemExit(message)
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.kill()
        process.wait()


@contextlib.contextmanager
def s3_endpoint(args: argparse.Namespace) -> Iterator[Endpoint]:
    """The S3 endpoint of this run, its bucket created, keys in the environment.

    Without ``--endpoint``: a ``moto_server`` of its own, keys made up, no
    prefix (the server is new). With it: that endpoint, the environment's
    keys, and a prefix naming this run, so that an earlier run's output
    (which the driver refuses to write over) is never in the way.
    """
    # Endpoint, region and plain http come only from the spec's
    # store_options, as on a cluster; stray settings would muddle that.
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_ALLOW_HTTP", "AWS_PROFILE"):
        os.environ.pop(name, None)
    with contextlib.ExitStack() as stack:
        if args.endpoint:
            missing = [n for n in KEY_NAMES[:2] if not os.environ.get(n)]
            if missing:
                message = f"--endpoint needs the keys in the environment: {missing}"
                raise SystemExit(message)
            url = args.endpoint
            stamp = datetime.datetime.now(datetime.timezone.utc)
            prefix = args.prefix or f"dfx-bench-{stamp:%Y%m%dT%H%M%S}"
        else:
            url = stack.enter_context(moto_server())
            # The driver's, and its subprocess workers' (they inherit them).
            os.environ["AWS_ACCESS_KEY_ID"] = MOTO_KEY
            os.environ["AWS_SECRET_ACCESS_KEY"] = MOTO_KEY
            prefix = args.prefix
        endpoint = Endpoint(url, args.region, args.bucket, prefix.strip("/"))
        client = endpoint.client()
        with contextlib.suppress(
            client.exceptions.BucketAlreadyOwnedByYou,
            client.exceptions.BucketAlreadyExists,
        ):
            client.create_bucket(Bucket=endpoint.bucket)
        yield endpoint


# --- TPC-H data and answers -------------------------------------------------


def tpch_tables(
    dfx: pathlib.Path, plugin: str, scale: str, partitions: int, data_dir: pathlib.Path
) -> dict[str, str]:
    """The eight tables at ``scale``, generated by ``dfx tpch`` unless cached.

    As the Python tests do: ``dfx tpch`` generates (or reuses) the dataset
    before running its one query, q6, whose answer is its own business.
    """
    dataset = data_dir / f"sf{scale}-p{partitions}"
    if not (dataset / "_COMPLETE").is_file():
        print(f"generating TPC-H sf{scale} in {dataset} ...", flush=True)
        done = subprocess.run(  # noqa: S603 - the dfx binary we were given
            [
                str(dfx),
                "tpch",
                "--plugin",
                plugin,
                "--scale",
                scale,
                "--partitions",
                str(partitions),
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
        if not (dataset / "_COMPLETE").is_file():
            message = f"`dfx tpch` generated no data in {dataset}:\n{done.stderr}"
            raise SystemExit(message)
    return {table: str(dataset / table) for table in TABLES}


def sorted_rows(batches: list[pa.RecordBatch]) -> list[tuple[Any, ...]]:
    """The rows of ``batches`` as tuples, in a canonical order.

    NULLs first, floats sorted on a rounded value so that two answers equal
    to 1e-6 sort alike (the tests' order, for answers of any ORDER BY).
    """

    def key(row: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(
            (value is not None, round(value, 6) if isinstance(value, float) else value)
            for value in row
        )

    if not batches:
        return []
    rows = [tuple(row.values()) for row in pa.Table.from_batches(batches).to_pylist()]
    return sorted(rows, key=key)


def same_rows(left: list[tuple[Any, ...]], right: list[tuple[Any, ...]]) -> bool:
    """Equal rows: floats to 1e-6 relative, all else (decimals too) exactly."""
    if len(left) != len(right):
        return False
    for a, b in zip(left, right, strict=True):
        if len(a) != len(b):
            return False
        for x, y in zip(a, b, strict=True):
            if isinstance(x, float) and isinstance(y, float):
                if not math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9):
                    return False
            elif x != y:
                return False
    return True


def row_count(batches: list[pa.RecordBatch]) -> int:
    """Rows over all of ``batches``."""
    return sum(batch.num_rows for batch in batches)


# --- The session ------------------------------------------------------------


def human(size: float) -> str:
    """``size`` bytes as B, KiB or MiB."""
    for unit in ("B", "KiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} MiB"


STAGE_KEY = re.compile(r"stage-(\d+)/")


def show_session(
    endpoint: Endpoint,
    tables: dict[str, str],
    partitions: int,
    executor: RayExecutor,
) -> None:
    """Run q9 through Ray with an S3 shuffle; print what happened and where."""
    path = f"session/q{SESSION_QUERY}"
    sql = (QUERIES / f"q{SESSION_QUERY}.sql").read_text()
    spec = SessionSpec(
        tables=dict(tables),
        shuffle_dir=endpoint.location(path),
        target_partitions=partitions,
        store_options=endpoint.store_options,
    )
    print(f"== The session: TPC-H q{SESSION_QUERY} on Ray, shuffle on S3")
    print(f"query:     {sql.strip().splitlines()[0]}")
    print(f"location:  {spec.shuffle_dir}  (endpoint {endpoint.url})")
    # Not the executor's repr: its options hold the keys.
    env_vars = executor.options.get("runtime_env", {}).get("env_vars", {})
    print(
        f"executor:  RayExecutor(max_workers={executor.max_workers}), "
        f"runtime_env env_vars {sorted(env_vars)}"
    )
    started = time.perf_counter()
    result = run_distributed(sql, spec, executor=executor)
    wall = (time.perf_counter() - started) * 1000.0
    print(f"wall:      {wall:.0f} ms (Ray workers starting included)")

    # What each stage's tasks reported, summed over its maps.
    rows: dict[int, int] = defaultdict(int)
    sent: dict[int, int] = defaultdict(int)
    inside: dict[int, list[float]] = defaultdict(list)
    for (stage, _map), report in result.reports.items():
        rows[stage] += report.rows
        sent[stage] += report.bytes or 0
        if report.elapsed_ms is not None:
            inside[stage].append(report.elapsed_ms)
    print()
    print("stages (as the plugin describes each encoded stage; rows, bytes and")
    print("ms/task are what its Ray tasks reported):")
    print(
        f"  {'stage':>5} {'maps':>4} {'buckets':>7} {'deps':<10} "
        f"{'rows':>8} {'bytes':>10} {'ms/task':>8}  partitioning"
    )
    for info in result.stages:
        stage = info.stage_id
        deps = ",".join(map(str, info.deps)) or "-"
        mean = statistics.fmean(inside[stage]) if inside[stage] else float("nan")
        print(
            f"  {stage:>5} {info.maps:>4} {info.buckets:>7} {deps:<10} "
            f"{rows[stage]:>8} {human(sent[stage]):>10} {mean:>8.0f}  "
            f"{info.partitioning}"
        )
    print(f"waves:     {result.waves}")
    print(f"tasks:     {len(result.tasks)}, retries: {len(result.retries)}")
    print(f"rows:      {row_count(result.batches)} (the answer, read by the driver)")

    # What the tasks left on S3: only stage output (one object per map, its
    # buckets closed by its marker) and the driver's lock; the envelopes
    # and plans reached the Ray tasks by value, never through the bucket.
    objects = endpoint.objects(path)
    base = endpoint.key(path) + "/"
    total = sum(size for _key, size in objects)
    print()
    print(
        f"objects under s3://{endpoint.bucket}/{base}: {len(objects)}, "
        f"{human(total)} in all"
    )
    shown = objects if len(objects) < LISTED_IN_FULL else objects[:40]
    for key, size in shown:
        print(f"  {size:>10}  {key.removeprefix(base)}")
    if len(shown) < len(objects):
        print(f"  ... and {len(objects) - len(shown)} more")
    # Per stage: its maps' files (.arrow), anything else; "other" is outside
    # every stage (the driver's lock).
    per_stage: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for key, size in objects:
        match = STAGE_KEY.match(key.removeprefix(base))
        counts = per_stage[f"stage {match.group(1)}" if match else "other"]
        counts[0 if key.endswith(".arrow") else 1] += 1
        counts[2] += size
    print("  per stage   maps  other       bytes")
    for group in sorted(per_stage, key=lambda g: (g == "other", len(g), g)):
        maps, other, size = per_stage[group]
        print(f"  {group:<10} {maps:>4} {other:>6} {human(size):>11}")
    print(flush=True)


# --- The timing -------------------------------------------------------------


@dataclass
class Timing:
    """One query's runs: wall ms per mode, and answers that differed."""

    number: int
    walls: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    differ: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)
    rows: int = 0

    def median(self, mode: str) -> float | None:
        """The median wall ms of ``mode``, or ``None`` if it failed."""
        if mode in self.failed or not self.walls[mode]:
            return None
        return statistics.median(self.walls[mode])

    @property
    def answer(self) -> str:
        """``agree``, or which modes differed from local or failed."""
        if self.failed:
            return "FAILED " + ",".join(sorted(self.failed))
        if self.differ:
            return "DIFFER " + ",".join(m for m in MODES if m in self.differ)
        return "agree"


def timed(
    run: Callable[[SessionSpec], list[pa.RecordBatch]], spec: SessionSpec
) -> tuple[float, list[pa.RecordBatch]]:
    """Wall ms of ``run(spec)``, and its batches."""
    started = time.perf_counter()
    batches = run(spec)
    return (time.perf_counter() - started) * 1000.0, batches


def time_query(
    number: int,
    runs: int,
    *,
    spec_of: Callable[[str], SessionSpec],
    endpoint: Endpoint,
    pool: WorkerPool,
    executor: RayExecutor,
    scratch: pathlib.Path,
) -> Timing:
    """``runs`` runs of query ``number`` in every mode, answers compared.

    Each distributed run gets a fresh shuffle location (the driver refuses
    one holding output), removed after the run, outside the timed span.
    """
    sql = (QUERIES / f"q{number}.sql").read_text()
    timing = Timing(number)
    for run in range(runs):
        directory = scratch / f"q{number}-run{run}"
        s3_path = f"bench/q{number}/run{run}"
        # Each mode's run, by the shuffle location it gets.
        modes: dict[str, tuple[str, Callable[[SessionSpec], list[pa.RecordBatch]]]] = {
            "local": ("", lambda spec: run_local(sql, spec)),
            "sub+dir": (
                str(directory),
                lambda spec: run_distributed(sql, spec, pool=pool).batches,
            ),
            "sub+S3": (
                endpoint.location(f"{s3_path}/sub"),
                lambda spec: run_distributed(sql, spec, pool=pool).batches,
            ),
            "ray+S3": (
                endpoint.location(f"{s3_path}/ray"),
                lambda spec: run_distributed(sql, spec, executor=executor).batches,
            ),
        }
        expected: list[tuple[Any, ...]] | None = None
        for mode, (location, call) in modes.items():
            if mode in timing.failed:
                continue
            try:
                wall, batches = timed(call, spec_of(location))
            except Exception as err:  # reported, and the sweep goes on
                first = str(err).strip().splitlines()[0] if str(err).strip() else ""
                timing.failed[mode] = f"{type(err).__name__}: {first}"
                print(f"  q{number} {mode}: {timing.failed[mode]}", file=sys.stderr)
                continue
            timing.walls[mode].append(wall)
            answer = sorted_rows(batches)
            if mode == "local":
                expected = answer
                timing.rows = len(answer)
            elif expected is not None and not same_rows(answer, expected):
                timing.differ.add(mode)
        # Out of the timed span: the run's shuffle, local and on S3.
        shutil.rmtree(directory, ignore_errors=True)
        endpoint.remove(s3_path)
    return timing


def geometric_mean(values: list[float]) -> float | None:
    """The geometric mean of ``values``, or ``None`` if there are none."""
    return math.exp(statistics.fmean(map(math.log, values))) if values else None


def cell(value: float | None, digits: int = 0) -> str:
    """A table cell: ``value`` to ``digits`` places, or a dash."""
    return "-" if value is None else f"{value:.{digits}f}"


def print_table(timings: list[Timing], runs: int, workers: int) -> None:
    """The table: median ms per mode, the Ray ratio, the answer; geomeans."""
    headers = (
        "query",
        "local ms",
        "sub+dir ms",
        "sub+S3 ms",
        "ray+S3 ms",
        "ray/sub-S3",
        "answer",
    )
    lines: list[tuple[str, ...]] = []
    for timing in timings:
        medians = [timing.median(mode) for mode in MODES]
        ray_ms, sub_ms = medians[3], medians[2]
        ratio = ray_ms / sub_ms if ray_ms is not None and sub_ms else None
        lines.append(
            (
                f"q{timing.number}",
                *(cell(m) for m in medians),
                cell(ratio, 2),
                timing.answer,
            )
        )
    # Over the queries every mode ran, so that each column averages the same.
    complete = [t for t in timings if all(t.median(m) is not None for m in MODES)]
    means: list[float | None] = [
        geometric_mean([t.median(mode) or 0.0 for t in complete]) for mode in MODES
    ]
    ratio_mean = geometric_mean(
        [(t.median("ray+S3") or 0.0) / (t.median("sub+S3") or 1.0) for t in complete]
    )
    lines.append(
        (
            "geomean",
            *(cell(m) for m in means),
            cell(ratio_mean, 2),
            f"{len(complete)} of {len(timings)} queries",
        )
    )
    print(
        f"== The timing: median of {runs} run(s) per mode, at most {workers} tasks "
        "at once; sub = subprocess executor (a warm worker pool), dir = local "
        "shuffle directory"
    )
    widths = [max(len(row[i]) for row in [headers, *lines]) for i in range(7)]
    for row in [headers, *lines]:
        cells = (
            text.ljust(width) if i in {0, 6} else text.rjust(width)
            for i, (text, width) in enumerate(zip(row, widths, strict=True))
        )
        print(" | ".join(cells).rstrip())
        if row is headers:
            print("-+-".join("-" * width for width in widths))


# --- Putting it together ----------------------------------------------------


def arguments() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dfx",
        type=pathlib.Path,
        required=True,
        help="the Rust host binary, the TPC-H generator (dfx tpch)",
    )
    parser.add_argument("--scale", default="0.1", help="TPC-H scale factor")
    parser.add_argument(
        "--partitions",
        type=int,
        default=2,
        help="files per table, and partitions every session plans for",
    )
    parser.add_argument(
        "--queries",
        type=parse_queries,
        default=parse_queries("1,3,9,18"),
        help="queries to time: all, or a list such as 1,3,9-11",
    )
    parser.add_argument("--runs", type=int, default=1, help="runs per query and mode")
    parser.add_argument(
        "--workers", type=int, default=2, help="Ray's CPUs = the pool's workers"
    )
    parser.add_argument(
        "--data-dir",
        type=pathlib.Path,
        default=default_data_dir(),
        help="where generated TPC-H data is cached (default: %(default)s)",
    )
    parser.add_argument(
        "--plugin",
        default=os.environ.get("DFX_PLUGIN") or _internal.plugin_path(),
        help="the plugin dfx tpch loads (default: $DFX_PLUGIN, else the wheel's)",
    )
    parser.add_argument(
        "--endpoint",
        help="a running S3 endpoint to use instead of starting moto_server",
    )
    parser.add_argument("--region", default="us-east-1", help="the S3 region")
    parser.add_argument("--bucket", default="dfx-bench", help="created if missing")
    parser.add_argument(
        "--prefix",
        default="",
        help="key prefix of this run (default: none on moto, a timestamp else)",
    )
    args = parser.parse_args()
    if args.runs < 1 or args.workers < 1:
        parser.error("--runs and --workers must be at least 1")
    if not args.dfx.is_file():
        parser.error(f"no dfx binary at {args.dfx}")
    if (pathlib.Path.cwd() / "dfx_engine").is_dir():
        parser.error(
            "run from outside python/: Ray workers would import the source "
            "tree's dfx_engine, which has no native module"
        )
    return args


def main() -> None:
    """Start the S3 server and Ray, show the session, time the queries."""
    args = arguments()
    began = time.perf_counter()
    tables = tpch_tables(
        args.dfx, args.plugin, args.scale, args.partitions, args.data_dir
    )
    print(
        f"TPC-H sf{args.scale}, {args.partitions} partitions, tables in "
        f"{pathlib.Path(tables['lineitem']).parent}"
    )
    with contextlib.ExitStack() as stack:
        endpoint = stack.enter_context(s3_endpoint(args))
        print(f"S3 endpoint {endpoint.url}, bucket {endpoint.bucket}")

        # A local Ray, its workers this machine's processes. The keys reach
        # them through the runtime_env, as on a cluster, where the driver's
        # environment would not.
        ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
        stack.callback(ray.shutdown)
        keys = {name: os.environ[name] for name in KEY_NAMES if os.environ.get(name)}
        executor = RayExecutor(options={"runtime_env": {"env_vars": keys}})
        print(f"Ray {ray.__version__}: {ray.cluster_resources()}")  # type: ignore[no-untyped-call]
        print()

        show_session(endpoint, tables, args.partitions, executor)

        pool = stack.enter_context(WorkerPool(max_workers=args.workers))
        scratch = pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory()))

        def spec_of(location: str) -> SessionSpec:
            return SessionSpec(
                tables=dict(tables),
                shuffle_dir=location,
                target_partitions=args.partitions,
                store_options=endpoint.store_options,
            )

        # Warm the pool's workers (interpreter, DataFusion, plugin) as the
        # session warmed Ray's, so that neither column pays for starting.
        warm = "SELECT n_regionkey, count(*) AS n FROM nation GROUP BY n_regionkey"
        run_distributed(warm, spec_of(str(scratch / "warm")), pool=pool)

        timings = []
        for number in args.queries:
            timing = time_query(
                number,
                args.runs,
                spec_of=spec_of,
                endpoint=endpoint,
                pool=pool,
                executor=executor,
                scratch=scratch,
            )
            timings.append(timing)
            medians = "  ".join(f"{mode} {cell(timing.median(mode))}" for mode in MODES)
            print(f"  q{number}: {medians} ms, {timing.rows} rows, {timing.answer}")
            sys.stdout.flush()
        print()
        print_table(timings, args.runs, args.workers)
    print(f"\nall in {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
