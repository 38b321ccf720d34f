#!/usr/bin/env python3
"""How far dfx scales, on paper: TPC-H wall time on k machines of c cores.

    scripts/scaling-model.py model [FILE] [--cores C]
    scripts/scaling-model.py measure --dfx DIR/dfx --data D/sf0.1-p2 D/sf1-p2 ...
        [--runs 5] [--overhead] [--shuffle-dir s3://B/P --suffix=-s3
        --request-log MOTO_LOG] [--out FILE]
    python/.venv/bin/python scripts/scaling-model.py measure-s3 [--out FILE]

`measure` runs each TPC-H query with `dfx run --analyze-json` over each
data set in turn and keeps every stage (maps, buckets, deps) with its
tasks' times, rows and bytes, the final read and the wall time;
`measure-s3` times an S3 endpoint (boto3); `model` reads the figures back
(FILE: scripts/scaling-measurements.json by default) and prints the check
against the measured runs and the predictions for k machines. `model`
needs only the standard library. docs/SCALING.md explains the model.
"""

from __future__ import annotations

import argparse
import functools
import heapq
import json
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

TABLES = (
    "customer",
    "lineitem",
    "nation",
    "orders",
    "part",
    "partsupp",
    "region",
    "supplier",
)
QUERIES = [f"q{n}" for n in range(1, 23)]
REPO = Path(__file__).resolve().parent.parent
DEFAULT_FILE = REPO / "scripts" / "scaling-measurements.json"


# --------------------------------------------------------------------------
# measure


def slim(doc: dict) -> dict:
    """What the model reads of an `--analyze-json` document."""
    return {
        "wall_ms": doc["wall_ms"],
        "final_read_ms": doc["final_read_ms"],
        "stages": [
            {
                "stage_id": s["stage_id"],
                "maps": s["maps"],
                "buckets": s["buckets"],
                "deps": s["deps"],
                "tasks": [
                    {k: round(t[k], 3) if k == "wall_ms" else t[k] for k in TASK_KEYS}
                    for t in s["tasks"]
                ],
            }
            for s in doc["stages"]
        ],
    }


TASK_KEYS = ("rows", "bytes", "wall_ms")


def write(path: Path, figures: dict) -> None:
    """One line per run, so the file stays small and diffs run by run."""
    lines = [json.dumps({k: v for k, v in figures.items() if k != "sets"})]
    for label, meta in sorted(figures.get("sets", {}).items()):
        head = {k: v for k, v in meta.items() if k != "runs"}
        lines.append(json.dumps({"set": label, **head}, sort_keys=True))
        lines += [json.dumps({"set": label, "run": r}) for r in meta["runs"]]
    path.write_text("\n".join(lines) + "\n")


def read(path: Path) -> dict:
    """The figures `write` wrote."""
    lines = path.read_text().splitlines()
    figures = {**json.loads(lines[0]), "sets": {}}
    for line in lines[1:]:
        item = json.loads(line)
        label = item.pop("set")
        if "run" in item:
            figures["sets"][label]["runs"].append(item["run"])
        else:
            figures["sets"][label] = {**item, "runs": []}
    return figures


def run_query(
    dfx: Path, tables: str, query: str, partitions: int, slots: int, shuffle: str | None
) -> dict:
    """One `dfx run` of `query`, its `--analyze-json` document and our clocks."""
    sql = REPO / "host" / "queries" / f"{query}.sql"
    with tempfile.TemporaryDirectory(prefix="dfx-scaling-") as tmp:
        doc_path = Path(tmp) / "analyze.json"
        args = [str(dfx), "run", "--partitions", str(partitions)]
        args += ["--max-workers", str(slots), "--format", "csv"]
        args += ["--analyze-json", str(doc_path), "-f", str(sql)]
        for table in TABLES:
            args += ["--table", f"{table}={tables.rstrip('/')}/{table}"]
        if shuffle:
            # One location per run: a location must hold no stage output yet.
            args += ["--shuffle-dir", f"{shuffle.rstrip('/')}/{query}-{time.time_ns()}"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        out = subprocess.run(args, check=False, capture_output=True, text=True)
        wall_ms = (time.perf_counter() - started) * 1e3
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if out.returncode != 0:
            raise SystemExit(f"{query}: dfx run failed:\n{out.stderr}")
        doc = slim(json.loads(doc_path.read_text()))
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "query": query,
        "process_wall_ms": wall_ms,
        "cpu_ms": cpu * 1e3,
        "analyze": doc,
    }


_LOG_SEEN = [0]
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_REQUEST = re.compile(r'"(GET|PUT|POST|HEAD|DELETE) /(\S+) HTTP')


def count_requests(log: Path, shuffle: str | None) -> dict[str, int]:
    """Requests an S3 server logged since the last call (one werkzeug line
    each, colored by status: `"GET /bucket/key HTTP/1.1" 206 -`), by method
    and by whether they were the shuffle's (under `shuffle`) or the tables'."""
    lines = log.read_text(errors="replace").splitlines()
    new, _LOG_SEEN[0] = lines[_LOG_SEEN[0] :], len(lines)
    under = (shuffle or "").removeprefix("s3://").rstrip("/") + "/"
    counts: dict[str, int] = {}
    for line in new:
        found = _REQUEST.search(_ANSI.sub("", line))
        if found:
            method, key = found.groups()
            kind = "shuffle" if shuffle and key.startswith(under) else "tables"
            counts[f"{kind} {method}"] = counts.get(f"{kind} {method}", 0) + 1
    return counts


def measure(args: argparse.Namespace) -> None:
    """Run the queries `--runs` times over each `--data` set, interleaved (each
    query over every set in turn, so a busy spell of the machine falls on
    every set alike), and merge the runs into `--out`, one set per `--data`
    (named after it: sf1-p2, plus `--suffix`)."""
    queries = args.queries.split(",") if args.queries else QUERIES
    sets = {}
    for spec in args.data:
        # sf1-p2: the scale and file count `dfx tpch` generated the data with.
        name = spec.rstrip("/").rsplit("/", 1)[-1]
        local = "://" not in spec
        sets[name + args.suffix] = {
            "tables_at": str(Path(spec).resolve()) if local else spec,
            "scale": float(name.split("-")[0].removeprefix("sf")),
            "partitions": int(name.split("-")[1].removeprefix("p")),
            "local": local,
            "runs": [],
            "loads": [],
        }
    if args.request_log:
        # What came before is not ours.
        count_requests(Path(args.request_log), args.shuffle_dir)
    for run in range(args.runs):
        for query in queries:
            for label, meta in sets.items():
                meta["loads"].append(os.getloadavg()[0])
                record = run_query(
                    Path(args.dfx),
                    meta["tables_at"],
                    query,
                    meta["partitions"],
                    args.max_workers,
                    args.shuffle_dir,
                )
                record["run"] = run
                if args.request_log:
                    record["requests"] = count_requests(
                        Path(args.request_log), args.shuffle_dir
                    )
                meta["runs"].append(record)
                print(
                    f"{label} run {run} {query}: {record['analyze']['wall_ms']:.0f} ms",
                    file=sys.stderr,
                )
    out = Path(args.out)
    figures = read(out) if out.exists() else {"sets": {}}
    for label, meta in sets.items():
        loads = meta["loads"]
        figures["sets"][label] = {
            "scale": meta["scale"],
            "partitions": meta["partitions"],
            "slots": args.max_workers,
            "tables": "local" if meta["local"] else "s3",
            "shuffle": "s3"
            if (args.shuffle_dir or "").startswith("s3://")
            else "local",
            "load_average_1min": {
                "min": min(loads),
                "median": statistics.median(loads),
                "max": max(loads),
            },
            "runs": meta["runs"],
        }
        if meta["local"] and meta["scale"] == 1:
            # The tables' bytes, for their reads from S3 in the model.
            data = Path(meta["tables_at"])
            figures["table_bytes_scale"] = meta["scale"]
            figures["table_bytes"] = {
                table: sum(f.stat().st_size for f in (data / table).iterdir())
                for table in TABLES
            }
    if args.overhead:
        # What one task costs with no data, in each worker mode.
        with tempfile.TemporaryDirectory(prefix="dfx-scaling-") as tmp:
            path = Path(tmp) / "overhead.json"
            subprocess.run(
                [args.dfx, "bench", "overhead", "--tasks", "40", "--json", str(path)],
                check=True,
                capture_output=True,
            )
            figures["overhead"] = json.loads(path.read_text())
    write(out, figures)


def measure_s3(args: argparse.Namespace) -> None:
    """Time an S3 endpoint (`AWS_ENDPOINT_URL`, e.g. a local moto_server)
    with boto3, which only this command needs: small PUT and GET latency
    (median of 200, one connection), ranged GETs of 1 KiB, 64 MiB transfers
    (one connection), and small GETs per second from 8 threads."""
    from concurrent.futures import ThreadPoolExecutor

    import boto3  # only here: `model` needs nothing but the standard library

    client = boto3.client("s3")
    bucket = args.bucket
    try:
        client.create_bucket(Bucket=bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    small = b"x" * 1024
    big = os.urandom(64 * 1024 * 1024)

    def timed(fn, n: int) -> list[float]:
        times = []
        for i in range(n):
            started = time.perf_counter()
            fn(i)
            times.append((time.perf_counter() - started) * 1e3)
        return times

    put_ms = timed(
        lambda i: client.put_object(Bucket=bucket, Key=f"small/{i}", Body=small), 200
    )
    get_ms = timed(
        lambda i: client.get_object(Bucket=bucket, Key=f"small/{i}")["Body"].read(),
        200,
    )
    big_put_ms = timed(
        lambda i: client.put_object(Bucket=bucket, Key=f"big/{i}", Body=big), 3
    )
    big_get_ms = timed(
        lambda i: client.get_object(Bucket=bucket, Key=f"big/{i}")["Body"].read(), 3
    )
    range_ms = timed(
        lambda i: client.get_object(
            Bucket=bucket, Key="big/0", Range=f"bytes={i * 4096}-{i * 4096 + 1023}"
        )["Body"].read(),
        200,
    )
    client.put_object(Bucket=bucket, Key="mid", Body=big[: 8 * 1024 * 1024])
    range_8mib_ms = timed(
        lambda i: client.get_object(
            Bucket=bucket, Key="mid", Range=f"bytes={i * 4096}-{i * 4096 + 1023}"
        )["Body"].read(),
        200,
    )
    started = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda i: client.get_object(Bucket=bucket, Key=f"small/{i % 200}")[
                    "Body"
                ].read(),
                range(800),
            )
        )
    rate = 800 / (time.perf_counter() - started)
    mib = len(big) / 1e6
    figures = {
        "small_put_ms": statistics.median(put_ms),
        "small_get_ms": statistics.median(get_ms),
        "range_get_ms": statistics.median(range_ms),
        "range_get_8mib_ms": statistics.median(range_8mib_ms),
        "put_mb_per_s": mib / (statistics.median(big_put_ms) / 1e3),
        "get_mb_per_s": mib / (statistics.median(big_get_ms) / 1e3),
        "small_gets_per_s_8_threads": rate,
    }
    out = Path(args.out)
    doc = read(out) if out.exists() else {"sets": {}}
    doc["moto"] = figures
    write(out, doc)
    print(json.dumps(figures, indent=1))


# --------------------------------------------------------------------------
# model: the inputs


@dataclass
class Stage:
    """One stage of one query as measured."""

    id: int
    maps: int
    buckets: int
    deps: list[int]
    task_ms: list[float]  # each map's task, as the driver timed it
    bytes: float  # published, all maps
    rows: float  # published, all maps


@dataclass
class Profile:
    """One query in one set of runs: its stages and clocks."""

    query: str
    stages: dict[int, Stage]
    wall_ms: float  # `dfx run`'s own clock, start to answer, fastest run
    final_read_ms: float
    runs: int
    walls: list[float] = field(default_factory=list)


def profiles(figures: dict, label: str) -> dict[str, Profile]:
    """The queries of set `label`, each from its fastest run: other work on
    the machine only ever adds time, so the fastest run is the least
    disturbed one, and its stages and wall time are taken together."""
    by_query: dict[str, list[dict]] = {}
    for run in figures["sets"][label]["runs"]:
        by_query.setdefault(run["query"], []).append(run["analyze"])
    out = {}
    for query, docs in by_query.items():
        doc = min(docs, key=lambda d: d["wall_ms"])
        stages = {
            s["stage_id"]: Stage(
                id=s["stage_id"],
                maps=s["maps"],
                buckets=s["buckets"],
                deps=list(s["deps"]),
                task_ms=[t["wall_ms"] for t in s["tasks"]],
                bytes=sum(t["bytes"] or 0 for t in s["tasks"]),
                rows=sum(t["rows"] for t in s["tasks"]),
            )
            for s in doc["stages"]
        }
        out[query] = Profile(
            query=query,
            stages=stages,
            wall_ms=doc["wall_ms"],
            final_read_ms=doc["final_read_ms"],
            runs=len(docs),
            walls=sorted(d["wall_ms"] for d in docs),
        )
    return out


# --------------------------------------------------------------------------
# model: the parameters

MB = 1e6
MIB = 1024 * 1024
# The writer's multipart part size (`PART_SIZE` in plugin/src/exchange/store.rs)
# and a segment's rows at most (DataFusion's batch size: one segment per
# coalesced batch per bucket, plugin/src/exchange/writer.rs).
PART_SIZE = 8 * MIB
SEGMENT_ROWS = 8192
# DataFusion's `hash_join_single_partition_threshold` (bytes): a build side
# estimated above it is not collected (broadcast) but hash-partitioned.
COLLECT_LIMIT = 1024 * 1024


@dataclass
class Store:
    """Where the shuffle and the tables live: a latency per request (first
    byte), a bandwidth per connection, a bandwidth per machine, and request
    rates per partitioned prefix (GET/HEAD, PUT/POST)."""

    name: str
    latency_s: float
    conn_bw: float  # bytes/s, one request
    machine_bw: float  # bytes/s, one machine's NIC
    get_rate: float  # per second, per prefix
    put_rate: float
    put_bw: float = 0.0  # bytes/s, one upload (default: conn_bw)
    per_object_mb_s: float = 0.0  # a request's extra time per MB of its object


# AWS's published figures (docs/SCALING.md cites them): a first byte in
# 100-200 ms for a typical request (the slow end taken), small requests in
# tens of ms (the median), 85-90 MB/s per connection, 5,500 GET and 3,500
# PUT per second per partitioned prefix (a query's location is one prefix).
S3_SLOW = Store("S3, 150 ms", 0.150, 85 * MB, 25e9 / 8, 5500, 3500)
S3_TYPICAL = Store("S3, 30 ms", 0.030, 85 * MB, 25e9 / 8, 5500, 3500)
LOCAL = Store("local", 0.0, float("inf"), float("inf"), float("inf"), float("inf"))


@dataclass
class Costs:
    """The fixed costs, each measured on its own (docs/SCALING.md says how)."""

    task_fixed_ms: float  # dispatch + decode + an empty task's file, warm worker
    dispatch_ms: float  # the driver's own time per task (serial in the driver)
    driver_ms: float  # plugin load, plan, encode, pool start: once per query
    driver_per_stage_ms: float
    typical_alpha_ms: float = 0.0  # a task's intercept, for one-scale stages


# --------------------------------------------------------------------------
# model: a query's stages as lines in the scale factor


@dataclass
class StageFit:
    """A stage's task time as a line: each task pays `alpha_ms` whatever the
    scale (decode, opening its inputs, a hash table's setup, a one-file
    table's scan), and the stage's tasks together `beta_ms` per unit of
    scale factor, shared by however many tasks it is cut into."""

    stage: Stage  # the shape: maps, buckets, deps (of the largest scale)
    scale: float  # the scale the shape's bytes and rows were measured at
    alpha_ms: float
    beta_ms: float


def fit_query(
    measured: list[tuple[float, Profile]], costs: Costs
) -> dict[int, StageFit]:
    """Each stage's line through its mean task time at each measured scale
    (least squares; a stage measured at one scale only: through the typical
    per-task intercept of the stages measured at several)."""
    measured = sorted(measured, key=lambda sp: sp[0])
    top_scale, top = measured[-1]
    fits = {}
    for sid, stage in top.stages.items():
        points = [
            (sc, statistics.fmean(p.stages[sid].task_ms))
            for sc, p in measured
            if sid in p.stages
        ]
        # A scan of a one-file table (`nation`, `region`: the same rows at
        # every scale), or a stage whose rows in and out are alike at every
        # scale (over an aggregate's few groups): its time does not grow.
        # (A scan's rows in are its table's, unseen: one of a table of
        # several files grows.)
        rows = [
            p.stages[sid].rows + sum(p.stages[d].rows for d in stage.deps)
            for _, p in measured
        ]
        if stage.deps:
            # (A stage may scan a table beside its readers, the probe side of
            # a collected join: its time grows though its readers' rows do
            # not, so its time must not grow either.)
            times = [y for _, y in points]
            constant = (
                len(points) > 1
                and max(rows) <= 1.05 * min(rows)
                and times[-1] <= 1.5 * times[0]
            )
        else:
            constant = stage.maps == 1
        if constant:
            fits[sid] = StageFit(
                stage=stage,
                scale=top_scale,
                alpha_ms=statistics.fmean(y for _, y in points),
                beta_ms=0.0,
            )
            continue
        if len(points) == 1:
            sc, mean = points[0]
            alpha = min(costs.typical_alpha_ms, mean)
            beta = (mean - alpha) / sc
        else:
            xs, ys = [x for x, _ in points], [y for _, y in points]
            mx, my = statistics.fmean(xs), statistics.fmean(ys)
            sxx = sum((x - mx) ** 2 for x in xs)
            slope = max(0.0, sum((x - mx) * (y - my) for x, y in points) / sxx)
            alpha = max(0.0, my - slope * mx)
            beta = slope
        fits[sid] = StageFit(
            stage=stage, scale=top_scale, alpha_ms=alpha, beta_ms=beta * stage.maps
        )
    return fits


def target_maps(maps: int, measured_partitions: int, partitions: int) -> int:
    """A stage's maps at `partitions`: those that had one per partition (a
    scan of P files, a hash exchange's P buckets) get `partitions`; a
    single-task stage (a one-file table, an operator needing all its input)
    stays one."""
    if maps == 1:
        return 1
    return max(1, round(maps * partitions / measured_partitions))


# --------------------------------------------------------------------------
# model: the requests the code makes, each where the code makes it

# A remote reader's first GET of a map file is its last TAIL_GUESS bytes
# (`TAIL_GUESS`, plugin/src/exchange/marker.rs); the index ends FOOTER_BYTES
# before the file does (its length, u64, and the magic).
TAIL_GUESS = 64 * 1024
FOOTER_BYTES = 16
# Parts of one upload in flight at once (`MAX_PARTS_IN_FLIGHT`,
# plugin/src/exchange/store.rs).
MAX_PARTS_IN_FLIGHT = 2
# object_store's retries of an S3 request answered 503 Slow Down (its
# `RetryConfig` and `BackoffConfig` defaults): up to 10 retries, the first
# after 100 ms, each next after a wait drawn uniformly between 100 ms and
# twice the last (decorrelated jitter), 15 s at most.
RETRIES = 10
BACKOFF_FIRST_S = 0.1
BACKOFF_BASE = 2.0
BACKOFF_MAX_S = 15.0


def expected_waits() -> list[float]:
    """The expected wait before each retry: the first fixed, each next the
    mean of uniform(first, base x the last)."""
    waits = [BACKOFF_FIRST_S]
    for _ in range(RETRIES - 1):
        drawn = (BACKOFF_FIRST_S + BACKOFF_BASE * waits[-1]) / 2
        waits.append(min(BACKOFF_MAX_S, drawn))
    return waits


WAITS = expected_waits()


def marker_index_bytes(
    buckets: int, segments: int, seg_rows: int, seg_bytes: int, file_bytes: int
) -> int:
    """The length of a map's index as `MapMarker::trailer` writes it
    (plugin/src/exchange/marker.rs: serde_json, compact, the fields in their
    declaration order): its head, then one `BucketEntry` per bucket listing
    its `segments` segments of `seg_rows` rows and `seg_bytes` bytes, at
    offsets below `file_bytes`. Every entry is written as long as the last
    (the widest bucket number and offset): a digit or two over."""
    compact = {"separators": (",", ":")}
    head = {
        "stage_id": 10,
        "map": buckets,
        "attempt": 0,
        "bytes": file_bytes,
        "buckets": [],
    }
    segment = {"offset": file_bytes, "bytes": seg_bytes, "rows": seg_rows}
    entry = {
        "bucket": buckets - 1,
        "rows": seg_rows * segments,
        "bytes": seg_bytes * segments,
        "segments": [],
    }
    one = len(json.dumps(entry, **compact)) + segments * len(
        json.dumps(segment, **compact)
    )
    one += max(0, segments - 1)  # the commas between segments
    return len(json.dumps(head, **compact)) + buckets * one + max(0, buckets - 1)


@dataclass
class MapFile:
    """One upstream map's file at the target: its index's size, and how
    many segments each of its buckets has."""

    index_bytes: int
    segments: int  # per bucket

    @staticmethod
    def of(rows: float, data_bytes: float, buckets: int) -> MapFile:
        """A map of `rows` rows and `data_bytes` bytes cut into `buckets`:
        each bucket's rows coalesced into segments of at most SEGMENT_ROWS
        (`BatchCoalescer` at the session's batch size, exchange/publish.rs)."""
        per_bucket = rows / buckets
        segments = max(1, math.ceil(per_bucket / SEGMENT_ROWS))
        seg_rows = max(1, round(per_bucket / segments))
        seg_bytes = max(1, round(data_bytes / buckets / segments))
        index = marker_index_bytes(
            buckets, segments, seg_rows, seg_bytes, max(1, round(data_bytes))
        )
        return MapFile(index_bytes=index, segments=segments)


@dataclass
class Terms:
    """The as-built requests and costs the model counts; each can be left
    out, to show what it adds (all of them out: the model as first
    published, `FIRST_MODEL`)."""

    # A marker past TAIL_GUESS costs a second GET (read_remote_marker,
    # exchange/locate.rs).
    marker_size: bool = True
    # The driver reads upstream markers for adaptive decisions
    # (adapt::adapt_stage, from the scheduler's queue_ready).
    driver_markers: bool = True
    # A filtered probe stage reads each build map's marker and key summary
    # (read_summaries, exec/join_filter.rs), not its rows.
    filter_summaries: bool = True
    # The driver polls the root maps concurrently, not one after another.
    final_concurrent: bool = True
    # Every marker is parsed whole by whoever reads it.
    parse: bool = True
    # Stages running at once share the prefix's request rate.
    shared_prefix: bool = True
    # Past the rate S3 answers 503 Slow Down and the client backs off
    # (else: a queue at the rate, the first model's term).
    slow_down: bool = True
    # The driver's dispatch and adaptive reads hold its scheduler loop
    # (else: dispatch beside the tasks, as the first model had it).
    driver_in_loop: bool = True


FIRST_MODEL = Terms(False, False, False, False, False, False, False, False)


# A serde_json parse of a marker: small objects of integers, about
# 200 MB/s (assumed, not measured here: see docs/SCALING.md).
PARSE_MB_S = 200.0
# A Ray task's cost in the driver, until measured (issue 37 asks for a Ray
# task's dispatch-to-report time for an empty stage): Ray's documentation
# puts its per-task overhead where tasks under about ten milliseconds see no
# speedup, and its release benchmark of many tasks ran a few hundred a
# second on a cluster; 2 ms is that order. docs/SCALING.md shows both.
RAY_TASK_MS = 2.0
# Issue 37's reads: ranges cut at 8 MiB (AWS's advice for parallel ranged
# GETs, and the writer's part size), 64 MiB of them in flight per task.
REQUEST_CUT = 8 * MIB
BYTES_IN_FLIGHT = 64 * MIB


@dataclass
class Design:
    """How tasks and the exchange are cut: as built (the defaults), or
    issue 37's (`machine_tasks`), optionally with issue 38's transport."""

    name: str = "as built"
    # Issue 37: one task per machine per stage, running its slice of the
    # stage's partitions on all c cores; byte ranges in reports and
    # envelopes (no marker GET by a reader or the driver); a reader's ranges
    # fetched concurrently, adjacent ones coalesced (one request per reader
    # task and upstream task, cut at REQUEST_CUT), BYTES_IN_FLIGHT at once.
    machine_tasks: bool = False
    bytes_in_flight: int = BYTES_IN_FLIGHT
    # Parts of a map's upload in flight (MAX_PARTS_IN_FLIGHT as built).
    parts_in_flight: int = MAX_PARTS_IN_FLIGHT
    # Issue 38: the shuffle's bytes between workers, not through S3.
    shuffle_store: Store | None = None
    # Partitioned prefixes the query's objects are spread over.
    prefixes: int = 1


@dataclass
class Target:
    """A cluster and a data size."""

    machines: int
    cores: int
    scale: float
    store: Store
    partitions: int = 0  # default: one per core
    tables_on_store: bool = True
    # Ranged GETs a Parquet scan makes per byte of its file (counted on moto;
    # the default: one per multipart part's size).
    table_gets_per_byte: float = 1 / PART_SIZE
    design: Design = field(default_factory=Design)
    terms: Terms = field(default_factory=Terms)
    # The driver's own time per task; None: the pool's, as measured.
    task_ms: float | None = None
    parse_mb_s: float = PARSE_MB_S

    @property
    def slots(self) -> int:
        """Tasks at once: one per core, or one per machine (issue 37)."""
        return (
            self.machines if self.design.machine_tasks else self.machines * self.cores
        )

    @property
    def parts(self) -> int:
        """The plan's partitions: one per core unless told."""
        return self.partitions or self.machines * self.cores


@functools.cache
def request_s(
    latency: float, at_once: float, rate: float, slow_down: bool
) -> tuple[float, float]:
    """A request's expected time when `at_once` requests are in flight on a
    prefix serving `rate` a second, and the chance it is given up.

    Under the rate: its latency. Over it, without `slow_down`: a queue at
    the rate, `at_once / rate` (the first model's term). With it: S3
    refuses the excess with 503 Slow Down and the client retries after its
    back-off. Each attempt succeeds with the chance s at which the prefix
    is kept exactly busy: the attempts the clients make, `at_once` of them
    each a(s) attempts per T(s) seconds (a latency per attempt and the
    expected waits before the retries), times s, equal the rate. A request
    then takes T(s), and is given up after RETRIES refusals more
    ((1 - s) ** (RETRIES + 1)): its task fails."""
    if latency <= 0 or at_once <= rate * latency:
        return latency, 0.0
    if not slow_down:
        return max(latency, at_once / rate), 0.0

    def cycle(s: float) -> tuple[float, float]:
        q = 1 - s
        attempts = sum(q**i for i in range(RETRIES + 1))
        waits = sum(q ** (i + 1) * w for i, w in enumerate(WAITS))
        return attempts, latency * attempts + waits

    low, high = 0.0, 1.0
    for _ in range(30):
        s = (low + high) / 2
        attempts, took = cycle(s)
        if at_once * attempts * s / took > rate:
            high = s
        else:
            low = s
    return cycle(low)[1], (1 - low) ** (RETRIES + 1)


def filter_deps(fits: dict[int, StageFit]) -> dict[int, set[int]]:
    """The deps each stage reads only through a join filter, read off the
    shape: stage s depends on d, and a third stage reads both (the join
    whose probe side s scans and whose build side d is). The planner's
    `add_join_filters` makes exactly this shape; the figures do not name
    it."""
    out: dict[int, set[int]] = {sid: set() for sid in fits}
    for reader in fits.values():
        deps = set(reader.stage.deps)
        for s in reader.stage.deps:
            out[s] |= deps & set(fits[s].stage.deps)
    return out


def adaptive_reads(
    fits: dict[int, StageFit], sid: int, filtered: set[int], at_partitions: int
) -> dict[int, int]:
    """Marker reads of each upstream stage by the driver's adaptive step
    for stage `sid` (adapt::adapt_stage, asked once per stage that reads a
    stage, from the scheduler's `queue_ready`), in its maps: only for a
    stage whose partitions are the buckets of hash reads
    (`coalesce::hash_reads`). A partitioned join (two hash reads or more)
    is read by the broadcast switch (`switch_stage`: build and probe maps),
    the skew split (`split_stage`: the probe's maps) and coalescing
    (`partition_bytes`: every read once), when none of them decides first
    (at scale none does: TPC-H has no skew, and its large builds do not
    switch); one hash read (an aggregate) by coalescing alone. The probe is
    taken as the larger side (DataFusion builds on the smaller)."""
    s = fits[sid].stage
    hash_deps = [
        d
        for d in s.deps
        if d not in filtered
        and fits[d].stage.buckets > 1
        and fits[d].stage.buckets == s.maps
    ]
    if not hash_deps:
        return {}
    times = dict.fromkeys(hash_deps, 1)
    if len(hash_deps) >= 2:
        probe = max(hash_deps, key=lambda d: fits[d].stage.rows)
        times = dict.fromkeys(hash_deps, 2)
        times[probe] = 3
    return times


def task_times(
    fits: dict[int, StageFit],
    at_partitions: int,
    target: Target,
    table_bytes: float,
    load: dict[int, float] | None = None,
) -> tuple[dict[int, list[float]], dict[str, float], dict[int, float]]:
    """Each stage's task durations (seconds) at `target`, the totals of
    requests, bytes and tasks, and the driver's adaptive time per stage.
    `table_bytes`: the query's tables at scale 1. `load`: tasks of any
    stage running beside each stage's (default: its own, up to the slots)."""
    store = target.store
    d = target.design
    terms = target.terms
    shuffle = d.shuffle_store or store
    p = target.parts
    if d.machine_tasks:
        maps = {
            sid: 1 if f.stage.maps == 1 else target.machines for sid, f in fits.items()
        }
    else:
        maps = {
            sid: target_maps(f.stage.maps, at_partitions, p) for sid, f in fits.items()
        }
    # Buckets per map file: the plan's partitions (a slice's buckets are
    # contiguous ranges in issue 37's files).
    buckets = {
        sid: 1
        if f.stage.buckets == 1
        else target_maps(f.stage.buckets, at_partitions, p)
        for sid, f in fits.items()
    }
    filtered = filter_deps(fits)
    tasks_per_machine = 1 if d.machine_tasks else target.cores
    # Requests one task has in flight: the as-built reader awaits each
    # (exchange/stream.rs: the markers, then one segment at a time).
    in_flight = max(1, d.bytes_in_flight // REQUEST_CUT) if d.machine_tasks else 1
    # A task's scans: one partition's requests one at a time, a machine's
    # task its c partitions at once.
    scanning = target.cores if d.machine_tasks else 1
    bandwidth = min(store.conn_bw * scanning, store.machine_bw / tasks_per_machine)
    shuffle_bw = min(
        shuffle.conn_bw * in_flight, shuffle.machine_bw / tasks_per_machine
    )
    parse_per_byte = 1 / (target.parse_mb_s * MB) if terms.parse else 0.0
    keys = ("get", "table_get", "shuffle_get", "driver_get", "put", "bytes", "tasks")
    totals = dict.fromkeys(keys + ("io", "parse", "given_up"), 0.0)
    scans_beta = sum(f.beta_ms for f in fits.values() if f.stage.maps > 1)
    files: dict[int, MapFile] = {}
    for sid, f in fits.items():
        u = f.stage
        grow = target.scale / f.scale
        files[sid] = MapFile.of(
            u.rows * grow / maps[sid], u.bytes * grow / maps[sid], buckets[sid]
        )

    def marker_gets(dep: int) -> int:
        # read_remote_marker (exchange/locate.rs): the tail, then the rest of
        # the index when the tail does not hold it (`Located::At`).
        big = files[dep].index_bytes > TAIL_GUESS - FOOTER_BYTES
        return 2 if terms.marker_size and big else 1

    out: dict[int, list[float]] = {}
    adapt_s: dict[int, float] = {}
    for sid, f in fits.items():
        s = f.stage
        m = maps[sid]
        grow = target.scale / f.scale
        # A machine's task runs its slice of partitions on all its cores.
        cores = target.cores if d.machine_tasks and s.maps > 1 else 1
        compute = (f.alpha_ms + f.beta_ms * target.scale / m / cores) / 1e3
        at_once = (load or {}).get(sid, min(target.slots, m)) * in_flight
        prefix_gets = store.get_rate * d.prefixes
        get_s, give_up = request_s(
            store.latency_s, at_once, prefix_gets, terms.slow_down
        )
        sh_get_s, sh_give_up = request_s(
            shuffle.latency_s, at_once, shuffle.get_rate * d.prefixes, terms.slow_down
        )
        sh_put_s, _ = request_s(
            shuffle.latency_s, at_once, shuffle.put_rate * d.prefixes, terms.slow_down
        )
        # Write (exchange/store.rs): one PUT, or a multipart upload (create,
        # parts, complete), MAX_PARTS_IN_FLIGHT parts at once.
        out_bytes = s.bytes * grow / m
        parts = math.ceil(out_bytes / PART_SIZE)
        puts = 1 if out_bytes <= PART_SIZE else 2 + parts
        put_bw = min(shuffle.put_bw or shuffle.conn_bw, shuffle_bw)
        put_rounds = puts
        if d.machine_tasks and puts > 1:
            put_rounds = 2 + math.ceil(parts / d.parts_in_flight)
            put_bw = min(put_bw * d.parts_in_flight, shuffle.machine_bw)
        io = put_rounds * sh_put_s + out_bytes / put_bw
        gets = 0.0  # the shuffle's, this task's
        in_bytes = 0.0
        parse_s = 0.0
        request_cost = 0.0
        for dep in s.deps:
            u = fits[dep].stage
            um = maps[dep]
            rows = u.rows * grow
            obj = u.bytes * grow / um  # one upstream map's file
            moto = obj / MB * shuffle.per_object_mb_s
            if dep in filtered[sid] and terms.filter_summaries:
                if d.machine_tasks:
                    # The summaries in the reports when small; a large one
                    # (TPC-H's Bloom filters: some hundred KB) fetched once
                    # per task, with the other reads: counted as fetched.
                    gets += um
                    continue
                # read_summaries (exec/join_filter.rs): for each build map in
                # turn, its marker, then its key summary's range.
                n = um * (marker_gets(dep) + 1)
                gets += n
                request_cost += n * (sh_get_s + moto)
                parse_s += um * files[dep].index_bytes * parse_per_byte
                continue
            # A build side past DataFusion's size for collecting it
            # (`hash_join_single_partition_threshold`) is planned as a
            # partitioned join at that scale: read here as a hash exchange.
            # (Its probe side's own exchange is not added.)
            broadcast = u.buckets == 1 and m > 1
            whole = u.buckets == 1 and not (
                broadcast and u.bytes * grow > COLLECT_LIMIT
            )
            if whole:
                # every map of it, by each task: a broadcast, or a gather
                # under a merge
                segs = um * max(1, -(-rows / um // SEGMENT_ROWS))
                share = u.bytes * grow
            else:
                ub = buckets[dep] if u.buckets > 1 else p
                segs = um * max(1, -(-rows / (um * ub) // SEGMENT_ROWS))
                share = u.bytes * grow / (ub if not d.machine_tasks else m)
            in_bytes += share
            if d.machine_tasks:
                # One range per upstream task (the slice's buckets side by
                # side), cut at REQUEST_CUT.
                gets += um * max(1, math.ceil(share / um / REQUEST_CUT))
                continue
            # shuffle_reader -> read_markers (exchange/locate.rs): each
            # upstream map's marker, awaited in turn before the first row;
            # then exchange/stream.rs: one ranged GET per segment, each
            # awaited before the next.
            markers = um * marker_gets(dep)
            gets += markers + segs
            request_cost += (markers + segs) * (sh_get_s + moto)
            parse_s += um * files[dep].index_bytes * parse_per_byte
        if d.machine_tasks:
            # Concurrent: rounds of `in_flight` requests, the bytes at the
            # task's bandwidth.
            request_cost = math.ceil(gets / in_flight) * sh_get_s
        io += request_cost + in_bytes / shuffle_bw
        # The tables' bytes (their files whole: an upper bound, Parquet reads
        # the columns it needs), in as many ranged GETs per byte as were
        # counted on moto, spread over the stages of many maps by their work:
        # which stage holds a scan (a leaf, or a collected join's probe side
        # beside its readers) is not in the figures. A machine's task scans
        # its c partitions at once.
        table_gets = 0.0
        if s.maps > 1 and target.tables_on_store and scans_beta > 0:
            scan = table_bytes * target.scale * f.beta_ms / scans_beta / m
            table_gets = 2 + scan * target.table_gets_per_byte
            rounds = math.ceil(table_gets / cores) if d.machine_tasks else table_gets
            io += (
                rounds * (get_s + scan / MB * store.per_object_mb_s) + scan / bandwidth
            )
            totals["table_get"] += table_gets * m
            totals["given_up"] += table_gets * m * give_up
        if store is LOCAL:
            io = 0.0
            parse_s = 0.0
        # The driver's adaptive step for this stage: markers read one after
        # another (read_map_marker, each awaited) and parsed, in its loop.
        adapt_s[sid] = 0.0
        if terms.driver_markers and not d.machine_tasks and store is not LOCAL:
            for dep, times in adaptive_reads(
                fits, sid, filtered[sid], at_partitions
            ).items():
                n = times * maps[dep]
                totals["driver_get"] += n * marker_gets(dep)
                per = marker_gets(dep) * shuffle.latency_s
                per += files[dep].index_bytes * parse_per_byte
                adapt_s[sid] += n * per
        totals["shuffle_get"] += gets * m
        totals["given_up"] += gets * m * sh_give_up
        totals["get"] += (gets + table_gets) * m
        totals["put"] += puts * m
        totals["bytes"] += (in_bytes + out_bytes) * m
        totals["tasks"] += m
        totals["io"] += io * m
        totals["parse"] += parse_s * m
        out[sid] = [compute + io + parse_s] * m
    totals["root_maps"] = maps[min(fits)]
    totals["root_segments"] = files[min(fits)].segments
    totals["root_marker_gets"] = marker_gets(min(fits))
    totals["adapt_s"] = sum(adapt_s.values())
    return out, totals, adapt_s


@dataclass
class Replay:
    """A schedule replayed: when it ended, and each stage's span."""

    makespan: float
    spans: dict[int, tuple[float, float]]


def schedule(
    deps: dict[int, list[int]],
    durations: dict[int, list[float]],
    slots: int,
    adapt_s: dict[int, float] | None = None,
    dispatch_s: float = 0.0,
) -> Replay:
    """The scheduler's run, replayed: a stage's tasks are ready once every
    stage it reads is published, the ready task with the longest remaining
    path runs first, at most `slots` at once. The driver is one loop
    (runtime/src/scheduler/ready.rs): asking how a newly ready stage runs
    takes `adapt_s[stage]` and handing out a task `dispatch_s`, and
    nothing starts meanwhile."""
    adapt_s = adapt_s or {}
    readers: dict[int, list[int]] = {sid: [] for sid in deps}
    for sid, ds in deps.items():
        for dep in ds:
            readers[dep].append(sid)
    remaining: dict[int, float] = {}

    def rest(sid: int) -> float:
        if sid not in remaining:
            above = max((rest(r) for r in readers[sid]), default=0.0)
            remaining[sid] = max(durations[sid]) + above
        return remaining[sid]

    waiting = {sid: set(ds) for sid, ds in deps.items()}
    left = {sid: len(d) for sid, d in durations.items()}
    # A stage's tasks take the same time, so they are handled in batches:
    # (-remaining path, stage, tasks) ready, (end, stage, tasks) running.
    ready: list[tuple[float, int, int]] = []
    running: list[tuple[float, int, int]] = []
    spans: dict[int, tuple[float, float]] = {}
    uniform = {sid: min(ts) == max(ts) for sid, ts in durations.items()}
    now = 0.0
    busy = 0.0  # the driver's loop is busy until then
    free = slots

    def release(sid: int) -> None:
        nonlocal busy
        busy = max(busy, now) + adapt_s.get(sid, 0.0)
        heapq.heappush(ready, (-rest(sid), sid, len(durations[sid])))

    for sid, ds in waiting.items():
        if not ds:
            release(sid)
    while ready or running:
        while ready and free > 0:
            path, sid, n = heapq.heappop(ready)
            take = min(n, free)
            if take < n:
                heapq.heappush(ready, (path, sid, n - take))
            free -= take
            start = max(now, busy)
            busy = start + take * dispatch_s
            first = spans.get(sid, (start, start))[0]
            times = durations[sid]
            if uniform[sid]:
                # Handed out one after another; taken to end together, at
                # the mean of their ends.
                end = start + dispatch_s * (take - 1) / 2 + times[0]
                heapq.heappush(running, (end, sid, take))
            else:
                # Tasks timed one by one (a measured run): each its own.
                done = len(times) - n
                for i in range(done, done + take):
                    end = start + dispatch_s * (i - done) + times[i]
                    heapq.heappush(running, (end, sid, 1))
            spans[sid] = (first, end)
        now, sid, n = heapq.heappop(running)
        free += n
        left[sid] -= n
        if left[sid] == 0:
            spans[sid] = (spans[sid][0], now)
            for r in readers[sid]:
                waiting[r].discard(sid)
                if not waiting[r]:
                    release(r)
    return Replay(makespan=now, spans=spans)


def critical_path(
    deps: dict[int, list[int]], durations: dict[int, list[float]]
) -> float:
    """The longest chain of stages through their deps (each stage its slowest
    task): what no number of machines makes shorter."""
    memo: dict[int, float] = {}

    def longest(sid: int) -> float:
        if sid not in memo:
            below = max((longest(d) for d in deps[sid]), default=0.0)
            memo[sid] = below + max(durations[sid])
        return memo[sid]

    return max(longest(sid) for sid in deps)


def sharing(
    spans: dict[int, tuple[float, float]], tasks: dict[int, int], slots: int
) -> dict[int, float]:
    """Tasks in flight beside each stage's, on the one prefix: every stage's
    tasks at once (up to the slots), weighted by how much of the stage's
    span it overlaps, the whole capped at the slots."""
    load = {}
    for sid, (a, b) in spans.items():
        length = max(b - a, 1e-9)
        total = 0.0
        for other, (c, e) in spans.items():
            overlap = min(b, e) - max(a, c)
            if overlap > 0:
                total += min(slots, tasks[other]) * overlap / length
        load[sid] = min(float(slots), max(total, float(min(slots, tasks[sid]))))
    return load


def predict(
    fits: dict[int, StageFit],
    final_read_ms: float,
    at_partitions: int,
    target: Target,
    costs: Costs,
    table_bytes: float = 0.0,
) -> dict[str, float]:
    """The wall time of a query at `target` (seconds), and its parts."""
    terms = target.terms
    deps = {sid: f.stage.deps for sid, f in fits.items()}
    task_ms = costs.dispatch_ms if target.task_ms is None else target.task_ms
    dispatch_s = task_ms / 1e3 if terms.driver_in_loop else 0.0

    def run(load: dict[int, float] | None) -> tuple:
        durations, totals, adapt = task_times(
            fits, at_partitions, target, table_bytes, load
        )
        if not terms.driver_in_loop:
            adapt = {}
        return (
            durations,
            totals,
            adapt,
            schedule(deps, durations, target.slots, adapt, dispatch_s),
        )

    durations, totals, _, replay = run(None)
    if terms.shared_prefix and target.store is not LOCAL:
        tasks = {sid: len(ds) for sid, ds in durations.items()}
        load = sharing(replay.spans, tasks, target.slots)
        durations, totals, _, replay = run(load)
    driver = (costs.driver_ms + costs.driver_per_stage_ms * len(fits)) / 1e3
    dispatch = totals["tasks"] * task_ms / 1e3
    # The head reads few rows in TPC-H (an aggregate, a top-k): its own time
    # is taken as measured, plus the root maps' requests: each map's marker
    # then its segments, the maps polled at once (or, in the first model,
    # two GETs a map one after another). Issue 37: each root task's range.
    final = final_read_ms / 1e3
    shuffle = target.design.shuffle_store or target.store
    roots = totals["root_maps"]
    if target.store is not LOCAL:
        if target.design.machine_tasks:
            final += shuffle.latency_s
            totals["shuffle_get"] += roots
        elif terms.final_concurrent:
            chain = totals["root_marker_gets"] + totals["root_segments"]
            final += chain * shuffle.latency_s
            totals["shuffle_get"] += roots * chain
        else:
            final += 2 * roots * shuffle.latency_s
            totals["shuffle_get"] += 2 * roots
    totals["shuffle_get"] += totals["driver_get"]
    totals["get"] += totals["driver_get"]
    if terms.driver_in_loop:
        wall = driver + replay.makespan + final
    else:
        # The adaptive reads one after another, beside the tasks' dispatch.
        wall = driver + max(replay.makespan, dispatch) + final + totals["adapt_s"]
    return {
        "wall": wall,
        "makespan": replay.makespan,
        "critical": critical_path(deps, durations),
        "work": sum(sum(ds) for ds in durations.values()) / target.slots,
        "driver": driver,
        "dispatch": dispatch,
        "final": final,
        **totals,
    }


# --------------------------------------------------------------------------
# model: calibration, the check, the predictions


def replay_ms(profile: Profile, slots: int) -> float:
    """The makespan of the measured tasks themselves, replayed on `slots`."""
    measured = {sid: [t / 1e3 for t in s.task_ms] for sid, s in profile.stages.items()}
    deps = {sid: s.deps for sid, s in profile.stages.items()}
    return schedule(deps, measured, slots).makespan * 1e3


def fit_driver(sets: list[dict[str, Profile]], slots: int) -> tuple[float, float]:
    """The driver's once-per-query time as d0 + d1 * stages: least squares
    over what the wall times leave once the runs' own tasks are replayed and
    their final reads taken off (plugin load, session, plan, encode, pool
    start)."""
    xs, ys = [], []
    for runs in sets:
        for prof in runs.values():
            xs.append(len(prof.stages))
            ys.append(prof.wall_ms - replay_ms(prof, slots) - prof.final_read_ms)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    d1 = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - d1 * mx, d1


def typical_alpha(
    inputs: list[tuple[float, dict[str, Profile]]], costs: Costs
) -> float:
    """The median per-task intercept of the stages that grow, over the queries
    planned alike at every input scale."""
    costs.typical_alpha_ms = costs.task_fixed_ms
    alphas = []
    for query in QUERIES:
        points = [(scale, runs[query]) for scale, runs in inputs if query in runs]
        if len(points) > 1 and all(shape(p) == shape(points[0][1]) for _, p in points):
            alphas += [
                f.alpha_ms for f in fit_query(points, costs).values() if f.beta_ms > 0
            ]
    return statistics.median(alphas) if alphas else costs.task_fixed_ms


def query_table_bytes(query: str, sizes: dict[str, int]) -> float:
    """The bytes of every table `query` names (its files whole)."""
    sql = (REPO / "host" / "queries" / f"{query}.sql").read_text().lower()
    for sep in ",()":
        sql = sql.replace(sep, " ")
    words = set(sql.split())
    return float(sum(size for table, size in sizes.items() if table in words))


def fmt_s(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.2f}"
    if seconds < 100:
        return f"{seconds:.1f}"
    return f"{seconds:.0f}"


def shape(profile: Profile) -> dict[int, tuple]:
    """A plan's stages with their deps, maps and buckets: two runs of a query
    planned alike have the same shape. DataFusion picks a join's kind from
    the tables' sizes, so a scale may plan a query otherwise."""
    return {
        sid: (tuple(s.deps), s.maps, s.buckets) for sid, s in profile.stages.items()
    }


_FITS: dict[tuple, dict[int, StageFit] | None] = {}


def fits_for(
    query: str, inputs: list[tuple[float, dict[str, Profile]]], costs: Costs
) -> dict[int, StageFit] | None:
    """The query's stage lines over the input sets that planned it as the
    largest scale did (the others are left out)."""
    key = (query, tuple((sc, id(runs)) for sc, runs in inputs), costs.typical_alpha_ms)
    if key not in _FITS:
        _FITS[key] = _fits_for(query, inputs, costs)
    return _FITS[key]


def _fits_for(
    query: str, inputs: list[tuple[float, dict[str, Profile]]], costs: Costs
) -> dict[int, StageFit] | None:
    points = [(scale, runs[query]) for scale, runs in inputs if query in runs]
    if not points:
        return None
    top = max(points, key=lambda sp: sp[0])[1]
    alike = [(sc, p) for sc, p in points if shape(p) == shape(top)]
    return fit_query(alike, costs)


def check(
    title: str,
    inputs: list[tuple[float, dict[str, Profile]]],
    at_partitions: int,
    measured: dict[str, Profile],
    target: Target,
    costs: Costs,
) -> list[float]:
    """Print predicted against measured wall time per query; answer the ratios."""
    print(f"\n### {title}\n")
    print(
        "| query | stages | tasks | measured ms | predicted ms | predicted/measured |"
    )
    print("|---|--:|--:|--:|--:|--:|")
    ratios = []
    for query in QUERIES:
        fits = fits_for(query, inputs, costs)
        if fits is None or query not in measured:
            continue
        final = statistics.median(runs[query].final_read_ms for _, runs in inputs)
        pred = predict(fits, final, at_partitions, target, costs)["wall"] * 1e3
        meas = measured[query]
        tasks = sum(len(s.task_ms) for s in meas.stages.values())
        ratio = pred / meas.wall_ms
        ratios.append(ratio)
        every = ", ".join(f"{w:.0f}" for w in meas.walls)
        print(
            f"| {query} | {len(meas.stages)} | {tasks} | {meas.wall_ms:.0f} "
            f"({every}) | {pred:.0f} | {ratio:.2f} |"
        )
    worst = max(ratios, key=lambda r: abs(r - 1))
    gmean = statistics.geometric_mean(ratios)
    print(
        f"\nworst predicted/measured {worst:.2f}; geometric mean {gmean:.2f}; "
        f"{sum(abs(r - 1) <= 0.25 for r in ratios)} of {len(ratios)} within 25 %"
    )
    return ratios


def model(path: Path, cores: int, options: Options) -> None:
    figures = read(path)
    sets = figures["sets"]
    runs = {label: profiles(figures, label) for label in sets}
    modes = figures["overhead"]["modes"]
    warm = next(m for m in modes if m["mode"].startswith("pool: warm worker, same"))
    first = next(m for m in modes if m["mode"].startswith("pool: warm worker, first"))
    costs = Costs(
        task_fixed_ms=first["median_ms"],
        dispatch_ms=warm["dispatch_median_ms"],
        driver_ms=0.0,
        driver_per_stage_ms=0.0,
    )
    small = [runs[label] for label in ("sf0.1-p2", "sf0.5-p2") if label in runs]
    costs.driver_ms, costs.driver_per_stage_ms = fit_driver(small, 2)
    costs.typical_alpha_ms = typical_alpha(
        [(sets[label]["scale"], runs[label]) for label in ("sf0.1-p2", "sf0.5-p2")],
        costs,
    )
    print("## Inputs\n")
    for label, meta in sets.items():
        load = meta["load_average_1min"]
        print(
            f"- {label}: {len(meta['runs'])} runs on {meta['slots']} slots, "
            f"tables {meta['tables']}, shuffle {meta['shuffle']}, load average "
            f"{load['min']:.1f}-{load['max']:.1f} (median {load['median']:.1f})"
        )
    print(
        f"- per task: {costs.task_fixed_ms:.2f} ms fixed (`dfx bench overhead`, "
        f"first task of a query on a warm worker), {costs.dispatch_ms:.2f} ms "
        "of the driver's"
    )
    print(
        f"- a task's intercept where a stage was measured at one scale only: "
        f"{costs.typical_alpha_ms:.1f} ms (the median of the others')"
    )
    print(
        f"- driver, once per query (fitted on scales 0.1 and 0.5): "
        f"{costs.driver_ms:.1f} ms + {costs.driver_per_stage_ms:.1f} ms per stage"
    )

    local2 = Target(machines=1, cores=2, scale=1.0, store=LOCAL)
    print("\n## The check on one machine (k = 1, c = 2)")
    check(
        "Scale 1, two partitions, from its own stages",
        [(1.0, runs["sf1-p2"])],
        2,
        runs["sf1-p2"],
        local2,
        costs,
    )
    if "sf0.5-p2" in runs:
        check(
            "Scale 1, two partitions, from scales 0.1 and 0.5",
            [(0.1, runs["sf0.1-p2"]), (0.5, runs["sf0.5-p2"])],
            2,
            runs["sf1-p2"],
            local2,
            costs,
        )
    all_p2 = [
        (sets[label]["scale"], runs[label])
        for label in ("sf0.1-p2", "sf0.5-p2", "sf1-p2")
        if label in runs
    ]
    if "sf1-p4" in runs:
        check(
            "Scale 1, four partitions on two slots, from two partitions",
            all_p2,
            2,
            runs["sf1-p4"],
            Target(machines=1, cores=2, scale=1.0, store=LOCAL, partitions=4),
            costs,
        )

    sizes = figures["table_bytes"]
    sizes_at = figures["table_bytes_scale"]
    gets_per_byte = 1 / PART_SIZE
    if "sf1-p2-s3" in runs:
        # A Parquet scan's ranged GETs per byte of the tables a query names.
        counted = [
            (r["requests"].get("tables GET", 0), r["query"])
            for r in sets["sf1-p2-s3"]["runs"]
        ]
        gets_per_byte = sum(n for n, _ in counted) / sum(
            query_table_bytes(q, sizes) / sizes_at for _, q in counted
        )
        print(
            f"- a Parquet scan on S3: {gets_per_byte * MB:.2f} ranged GETs per MB of "
            "the tables a query names (counted on moto)"
        )
    if "moto" in figures and "sf1-p2-s3" in runs:
        moto = figures["moto"]
        store = Store(
            "moto",
            latency_s=moto["small_get_ms"] / 1e3,
            conn_bw=moto["get_mb_per_s"] * MB,
            machine_bw=float("inf"),
            # One Python process serves every request: its rate is shared.
            get_rate=moto["small_gets_per_s_8_threads"],
            put_rate=moto["small_gets_per_s_8_threads"],
            put_bw=moto["put_mb_per_s"] * MB,
            # moto copies a ranged GET's whole object: 1 KiB of 64 MiB.
            per_object_mb_s=(moto["range_get_ms"] - moto["small_get_ms"])
            / 1e3
            / (64 * MIB / MB),
        )
        check_store(
            "Scale 1, two partitions, tables and shuffle on moto, from local runs",
            all_p2,
            runs["sf1-p2-s3"],
            sets["sf1-p2-s3"]["runs"],
            Target(
                machines=1,
                cores=2,
                scale=1.0,
                store=store,
                table_gets_per_byte=gets_per_byte,
                # moto queues what it cannot serve yet; it answers no 503.
                terms=Terms(slow_down=False),
            ),
            costs,
            sizes,
            sizes_at,
        )

    predictions(
        all_p2, runs["sf1-p2"], costs, cores, sizes, sizes_at, gets_per_byte, options
    )


KS = (1, 4, 16, 64)
# Issue 38: the shuffle between workers (Arrow Flight), not through S3: a
# request a millisecond, the machine's interface, no request rate. A later
# design, on assumed figures.
FLIGHT = Store("Flight", 0.001, 25e9 / 8, 25e9 / 8, float("inf"), float("inf"))


@dataclass
class Options:
    """What `model` is told: the Ray figure and the parse rate."""

    ray_task_ms: float = RAY_TASK_MS
    parse_mb_s: float = PARSE_MB_S


@dataclass
class Case:
    """One row of a prediction table: a design, its terms, its driver."""

    name: str
    design: Design = field(default_factory=Design)
    terms: Terms = field(default_factory=Terms)
    task_ms: float | None = None
    parse_mb_s: float = PARSE_MB_S


def query_set(
    case: Case,
    scale: float,
    k: int,
    cores: int,
    store: Store,
    inputs: list[tuple[float, dict[str, Profile]]],
    measured: dict[str, Profile],
    costs: Costs,
    sizes: dict[str, int],
    sizes_at: float,
    gets_per_byte: float,
) -> dict[str, dict[str, float]]:
    """Every query's prediction for `case` on k machines."""
    out = {}
    for query in QUERIES:
        fits = fits_for(query, inputs, costs)
        if fits is None:
            continue
        tgt = Target(
            machines=k,
            cores=cores,
            scale=scale,
            store=store,
            table_gets_per_byte=gets_per_byte,
            design=case.design,
            terms=case.terms,
            task_ms=case.task_ms,
            parse_mb_s=case.parse_mb_s,
        )
        tb = query_table_bytes(query, sizes) / sizes_at
        out[query] = predict(fits, measured[query].final_read_ms, 2, tgt, costs, tb)
    return out


def predictions(
    inputs: list[tuple[float, dict[str, Profile]]],
    measured: dict[str, Profile],
    costs: Costs,
    cores: int,
    sizes: dict[str, int],
    sizes_at: float,
    gets_per_byte: float,
    options: Options,
) -> None:
    """The tables of docs/SCALING.md's predictions."""
    store = S3_TYPICAL
    after = Design("after issue 37", machine_tasks=True)
    # Enough in flight to fill a 25 Gb/s interface at 85 MB/s a request.
    wide = Design(
        "after issue 37, wide",
        machine_tasks=True,
        bytes_in_flight=40 * REQUEST_CUT,
        parts_in_flight=40,
    )
    spread = Design(
        "after issue 37, wide, 16 prefixes",
        machine_tasks=True,
        bytes_in_flight=40 * REQUEST_CUT,
        parts_in_flight=40,
        prefixes=16,
    )
    flight = Design(
        "issue 37, then 38",
        machine_tasks=True,
        shuffle_store=FLIGHT,
        bytes_in_flight=40 * REQUEST_CUT,
        parts_in_flight=40,
        prefixes=16,
    )
    ray = options.ray_task_ms
    parse = options.parse_mb_s
    cases = [
        Case("as built (corrected), pool", parse_mb_s=parse),
        Case(f"as built (corrected), Ray {ray:g} ms", task_ms=ray, parse_mb_s=parse),
        Case("after issue 37, pool", after, parse_mb_s=parse),
        Case(f"after issue 37, Ray {ray:g} ms", after, task_ms=ray, parse_mb_s=parse),
        Case("after issue 37, filling the interface, pool", wide, parse_mb_s=parse),
        Case("after issue 37, filling it, 16 prefixes", spread, parse_mb_s=parse),
        Case(
            "later: issue 38 (Flight), filling it, 16 prefixes",
            flight,
            parse_mb_s=parse,
        ),
    ]
    memo: dict[tuple, dict[str, dict[str, float]]] = {}

    def run(case: Case, scale: float, k: int) -> dict[str, dict[str, float]]:
        key = (case.name, scale, k)
        if key not in memo:
            memo[key] = query_set(
                case,
                scale,
                k,
                cores,
                store,
                inputs,
                measured,
                costs,
                sizes,
                sizes_at,
                gets_per_byte,
            )
        return memo[key]

    def total(case: Case, scale: float, k: int, what: str = "wall") -> float:
        return sum(q[what] for q in run(case, scale, k).values())

    head = " | ".join(f"k={k}" for k in KS)
    print(f"\n## Predictions: k machines of c = {cores} cores, {store.name}\n")
    print("All 22 queries one after another, seconds; P = k c partitions; the")
    print("speedup is k = 64 against k = 1; GETs and given-up requests at k = 64.\n")
    print(f"| scale | design | {head} | speedup | GETs | given up |")
    print("|--:|---|" + "--:|" * (len(KS) + 3))
    for scale in (100.0, 1000.0):
        for case in cases:
            cells = [total(case, scale, k) for k in KS]
            gets = total(case, scale, KS[-1], "get")
            lost = total(case, scale, KS[-1], "given_up")
            text = " | ".join(fmt_s(c) for c in cells)
            print(
                f"| {scale:.0f} | {case.name} | {text} | {cells[0] / cells[-1]:.2f} "
                f"| {gets:.2g} | {lost:.2g} |"
            )
        ideal = []
        for k in KS:
            work = 0.0
            for query in QUERIES:
                fits = fits_for(query, inputs, costs) or {}
                work += sum(f.beta_ms * scale for f in fits.values()) / 1e3
            ideal.append(work / (k * cores))
        text = " | ".join(fmt_s(t) for t in ideal)
        print(
            f"| {scale:.0f} | the queries' CPU alone, over k c cores | {text} | "
            f"{ideal[0] / ideal[-1]:.0f} | | |"
        )

    scale = 1000.0
    print(
        f"\n### What each correction does: scale {scale:.0f}, as built, pool, seconds\n"
    )
    print("Each row adds one term to the row above; the first is the model as")
    print("first published, the last the corrected one.\n")
    print(f"| model | {head} | GETs at k=64 |")
    print("|---|" + "--:|" * (len(KS) + 1))
    steps = [
        ("as first published", "first"),
        ("+ the marker's size (a second GET past 64 KiB)", "marker_size"),
        ("+ the driver's marker reads for adaptive decisions", "driver_markers"),
        ("+ join filters: summaries, not rows, of the build", "filter_summaries"),
        ("+ the final read polled concurrently", "final_concurrent"),
        (f"+ parsing every marker ({parse:g} MB/s)", "parse"),
        ("+ the prefix's rate shared by concurrent stages", "shared_prefix"),
        ("+ the driver's loop holds dispatch and adaptive reads", "driver_in_loop"),
        ("+ 503 Slow Down and back-off (corrected)", "slow_down"),
    ]
    on: dict[str, bool] = {}
    for name, term in steps:
        if term != "first":
            on[term] = True
        terms = Terms(**{f: on.get(f, False) for f in Terms.__dataclass_fields__})
        case = Case(name, terms=terms, parse_mb_s=parse)
        cells = [total(case, scale, k) for k in KS]
        gets = total(case, scale, KS[-1], "get")
        print(f"| {name} | {' | '.join(fmt_s(c) for c in cells)} | {gets:.2g} |")

    print(f"\n### Parsing, assumed: scale {scale:.0f}, as built, pool, seconds\n")
    print(f"| serde_json on markers | {head} |")
    print("|---|" + "--:|" * len(KS))
    for rate in (50.0, 200.0, 800.0):
        case = Case(f"parse {rate:g}", parse_mb_s=rate)
        cells = [total(case, scale, k) for k in KS]
        print(f"| {rate:g} MB/s | {' | '.join(fmt_s(c) for c in cells)} |")

    before, later = cases[0], cases[2]
    print(f"\n### Each query: scale {scale:.0f}, {store.name}, pool, seconds\n")
    print(
        "| query | as built k=1 | as built k=64 | after 37 k=1 | after 37 k=64 "
        "| shuffle GETs at k=64, as built | after 37 | driver's GETs, as built |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for query in QUERIES:
        b1 = run(before, scale, 1)[query]
        b64 = run(before, scale, 64)[query]
        a1 = run(later, scale, 1)[query]
        a64 = run(later, scale, 64)[query]
        print(
            f"| {query} | {fmt_s(b1['wall'])} | {fmt_s(b64['wall'])} | "
            f"{fmt_s(a1['wall'])} | {fmt_s(a64['wall'])} | {b64['shuffle_get']:.2g} "
            f"| {a64['shuffle_get']:.2g} | {b64['driver_get']:.2g} |"
        )

    print("\n### One hash exchange of the largest stage of q9, scale 1000: requests\n")
    exchange_table(inputs, costs, cores)


def exchange_table(
    inputs: list[tuple[float, dict[str, Profile]]], costs: Costs, cores: int
) -> None:
    """Requests of q9's largest exchange at P = 16 .. 1024: the marker's size,
    GETs per marker, the readers' GETs as built and after issue 37."""
    fits = fits_for("q9", inputs, costs) or {}
    up = max(
        (f for f in fits.values() if f.stage.buckets > 1), key=lambda f: f.stage.bytes
    )
    grow = 1000.0 / up.scale
    rows, data = up.stage.rows * grow, up.stage.bytes * grow
    print(
        f"{rows:.2g} rows, {data / 1e9:.0f} GB, P maps of P buckets; T = P / {cores} "
        "machine-sized tasks.\n"
    )
    print(
        "| P | marker bytes | GETs a marker | readers' GETs as built | "
        "driver's, one read | T | after issue 37: T² | cut at 8 MiB |"
    )
    print("|--:|--:|--:|--:|--:|--:|--:|--:|")
    for p in (16, 64, 256, 512, 640, 700, 1024):
        mf = MapFile.of(rows / p, data / p, p)
        per_marker = 2 if mf.index_bytes > TAIL_GUESS - FOOTER_BYTES else 1
        readers = p * p * (per_marker + mf.segments)
        t = max(1, p // cores)
        # Each reader task's range in each upstream task's file.
        cut = t * t * max(1, math.ceil(data / (t * t) / REQUEST_CUT))
        print(
            f"| {p} | {mf.index_bytes:,} | {per_marker} | {readers:,} | "
            f"{p * per_marker:,} | {t} | {t * t:,} | {cut:,} |"
        )


def check_store(
    title: str,
    inputs: list[tuple[float, dict[str, Profile]]],
    measured: dict[str, Profile],
    measured_runs: list[dict],
    target: Target,
    costs: Costs,
    sizes: dict[str, int],
    sizes_at: float,
) -> None:
    """Print predicted against measured wall time and requests on a store."""
    print(f"\n### {title}\n")
    print(
        "| query | measured ms (fastest; all runs) | predicted ms | predicted/measured "
        "| shuffle GETs counted | predicted | tables' GETs counted | predicted |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    requests: dict[str, list[dict]] = {}
    close = 0
    for run in measured_runs:
        requests.setdefault(run["query"], []).append(run["requests"])
    ratios = []
    for query in QUERIES:
        fits = fits_for(query, inputs, costs)
        if fits is None or query not in measured:
            continue
        final = statistics.median(r[query].final_read_ms for _, r in inputs)
        tb = query_table_bytes(query, sizes) / sizes_at
        pred = predict(fits, final, 2, target, costs, tb)
        meas = measured[query]
        ratio = pred["wall"] * 1e3 / meas.wall_ms
        ratios.append(ratio)
        every = ", ".join(f"{w:.0f}" for w in meas.walls)
        shuffle = statistics.median(r.get("shuffle GET", 0) for r in requests[query])
        tables = statistics.median(r.get("tables GET", 0) for r in requests[query])
        close += abs(pred["shuffle_get"] / max(shuffle, 1) - 1) <= 0.2
        print(
            f"| {query} | {meas.wall_ms:.0f} ({every}) | {pred['wall'] * 1e3:.0f} "
            f"| {ratio:.2f} | {shuffle:.0f} | {pred['shuffle_get']:.0f} "
            f"| {tables:.0f} | {pred['table_get']:.0f} |"
        )
    worst = max(ratios, key=lambda r: abs(r - 1))
    print(
        f"\nworst predicted/measured {worst:.2f}; geometric mean "
        f"{statistics.geometric_mean(ratios):.2f}; "
        f"{sum(abs(r - 1) <= 0.25 for r in ratios)} of {len(ratios)} within 25 %; "
        f"shuffle GETs within 20 % of the counted for {close} of {len(ratios)}"
    )


# --------------------------------------------------------------------------
# check: the model's request count against one worked by hand


def tiny_query() -> dict[int, StageFit]:
    """Three stages of two maps each, every bucket one segment:

    stage 2 (B): a scan, 2 maps x 2 buckets: a join's build side
    stage 3 (F): a scan filtered by B's key summaries, 2 maps x 2 buckets
    stage 1 (J): the join of B and F, 2 maps x 1 bucket, read by the driver
    """

    def stage(sid: int, buckets: int, deps: list[int], rows: float) -> StageFit:
        shape = Stage(sid, 2, buckets, deps, [1.0, 1.0], bytes=1000.0, rows=rows)
        return StageFit(stage=shape, scale=1.0, alpha_ms=1.0, beta_ms=0.0)

    return {
        1: stage(1, 1, [2, 3], 10),
        2: stage(2, 2, [], 100),
        3: stage(3, 2, [2], 200),
    }


# The shuffle's GETs of `tiny_query` as built, by hand:
#   J's 2 tasks, each: B's 2 markers (a tail each, the index inside it), its
#     bucket's segment in B's 2 maps, the same of F                   2 x 8 = 16
#   F's 2 tasks, each: for B's 2 maps, the marker and the key summary 2 x 4 =  8
#   the driver's adaptive step for J (a join of two hash reads): the switch
#     reads B's and F's markers (4), the skew split F's (2, the probe: more
#     rows), coalescing B's and F's (4); F reads no stage partition by
#     partition, so none for it                                               10
#   the final read: J's 2 maps, a marker and a segment each              2 x 2 =  4
#                                                                             38
# After issue 37 with one task per machine, on 2 machines (T = 2):
#   J's 2 tasks, each: one range from each of B's and F's 2 tasks    2 x 4 =  8
#   F's 2 tasks, each: a summary from each of B's 2 tasks            2 x 2 =  4
#   the driver: no marker; the final read: J's 2 tasks' ranges                2
#                                                                             14
TINY_GETS_AS_BUILT = 38
TINY_GETS_AFTER_37 = 14


def self_check() -> None:
    """The model's counts against the hand-worked ones above, and a marker's
    size against serde_json's layout written out whole."""
    costs = Costs(
        task_fixed_ms=1.0, dispatch_ms=0.0, driver_ms=0.0, driver_per_stage_ms=0.0
    )
    failures = []
    cases = [
        ("as built", Design(), 1, 2, TINY_GETS_AS_BUILT),
        ("after issue 37", Design(machine_tasks=True), 2, 1, TINY_GETS_AFTER_37),
    ]
    for name, design, machines, cores, expected in cases:
        target = Target(
            machines=machines,
            cores=cores,
            scale=1.0,
            store=S3_TYPICAL,
            partitions=2,
            tables_on_store=False,
            design=design,
        )
        got = predict(tiny_query(), 0.0, 2, target, costs)["shuffle_get"]
        print(f"{name}: the model counts {got:.0f} GETs, by hand {expected}")
        if got != expected:
            failures.append(name)
    # Ten buckets (one digit each) of one segment: every entry alike, so the
    # estimate is exact.
    seg = {"offset": 5, "bytes": 7, "rows": 3}
    marker = {
        "stage_id": 10,
        "map": 10,
        "attempt": 0,
        "bytes": 5,
        "buckets": [
            {"bucket": b, "rows": 3, "bytes": 7, "segments": [seg]} for b in range(10)
        ],
    }
    written = len(json.dumps(marker, separators=(",", ":")))
    estimated = marker_index_bytes(10, 1, 3, 7, 5)
    print(f"a marker of 10 buckets: {estimated} bytes estimated, {written} written")
    if estimated != written:
        failures.append("marker size")
    if failures:
        raise SystemExit(f"check failed: {', '.join(failures)}")
    print("check passed")


# --------------------------------------------------------------------------
# main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    m = sub.add_parser("measure", help="run TPC-H with --analyze-json, keep figures")
    m.add_argument("--dfx", required=True, help="the dfx binary (plugin beside it)")
    m.add_argument(
        "--data", required=True, nargs="+", help="DIR/sf<S>-p<P> or s3://.../sf<S>-p<P>"
    )
    m.add_argument("--suffix", default="", help="appended to each set's name")
    m.add_argument(
        "--request-log", help="an S3 server's request log: count each run's requests"
    )
    m.add_argument("--runs", type=int, default=3)
    m.add_argument("--max-workers", type=int, default=2, help="slots (default: 2)")
    m.add_argument("--queries", help="q1,q5,... (default: all 22)")
    m.add_argument("--shuffle-dir", help="s3://BUCKET/PREFIX (default: a temp dir)")
    m.add_argument("--out", default=str(DEFAULT_FILE))
    m.add_argument(
        "--overhead", action="store_true", help="also run `dfx bench overhead`"
    )
    s3 = sub.add_parser("measure-s3", help="time an S3 endpoint (needs boto3)")
    s3.add_argument("--bucket", default="dfx-scaling")
    s3.add_argument("--out", default=str(DEFAULT_FILE))
    p = sub.add_parser("model", help="print the check and the predictions")
    p.add_argument("file", nargs="?", default=str(DEFAULT_FILE))
    p.add_argument("--cores", type=int, default=16, help="c, cores per machine")
    p.add_argument(
        "--ray-task-ms",
        type=float,
        default=RAY_TASK_MS,
        help="the driver's time per task under Ray, until measured (default: %(default)s)",
    )
    p.add_argument(
        "--parse-mb-s",
        type=float,
        default=PARSE_MB_S,
        help="serde_json's rate on a marker, MB/s (default: %(default)s)",
    )
    sub.add_parser("check", help="the model's request count against a hand count")
    args = parser.parse_args()
    if args.command == "check":
        self_check()
    elif args.command == "measure":
        measure(args)
    elif args.command == "measure-s3":
        measure_s3(args)
    else:
        options = Options(
            ray_task_ms=getattr(args, "ray_task_ms", RAY_TASK_MS),
            parse_mb_s=getattr(args, "parse_mb_s", PARSE_MB_S),
        )
        model(
            Path(getattr(args, "file", DEFAULT_FILE)),
            getattr(args, "cores", 16),
            options,
        )


if __name__ == "__main__":
    main()
