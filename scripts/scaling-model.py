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
import heapq
import json
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


@dataclass
class Design:
    """How the exchange reads S3: as built (the defaults), or changed."""

    # Every reader task GETs the marker of every upstream map; with the
    # markers in the task's envelope (the driver has each map's report), none.
    markers_from_driver: bool = False
    # One GET per segment (a batch of one bucket, interleaved in the map file
    # with the other buckets'); with a bucket's segments contiguous, one per
    # (map, bucket).
    one_get_per_bucket: bool = False
    # Requests a task has in flight at once.
    requests_in_flight: int = 1
    # Partitioned prefixes the query's objects are spread over.
    prefixes: int = 1
    # Cores one task uses (its operators' work split among them): fewer,
    # larger partitions, P = k c / cores_per_task.
    cores_per_task: int = 1


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

    @property
    def slots(self) -> int:
        return self.machines * self.cores // self.design.cores_per_task

    @property
    def parts(self) -> int:
        return self.partitions or self.slots


def task_times(
    fits: dict[int, StageFit],
    at_partitions: int,
    target: Target,
    table_bytes: float,
) -> tuple[dict[int, list[float]], dict[str, float]]:
    """Each stage's task durations (seconds) at `target`, and the totals of
    requests, bytes and tasks. `table_bytes`: the query's tables at scale 1."""
    p = target.parts
    store = target.store
    maps = {sid: target_maps(f.stage.maps, at_partitions, p) for sid, f in fits.items()}
    buckets = {
        sid: 1
        if f.stage.buckets == 1
        else target_maps(f.stage.buckets, at_partitions, p)
        for sid, f in fits.items()
    }
    # A task's bandwidth: its requests in flight, each at most a connection's,
    # all of them within its share of its machine's network.
    d = target.design
    tasks_per_machine = target.cores // d.cores_per_task
    per_conn = min(
        store.conn_bw * d.requests_in_flight, store.machine_bw / tasks_per_machine
    )
    totals = dict.fromkeys(("get", "table_get", "put", "bytes", "tasks", "io"), 0.0)
    scans_beta = sum(f.beta_ms for f in fits.values() if f.stage.maps > 1)
    out = {}
    for sid, f in fits.items():
        s = f.stage
        m = maps[sid]
        grow = target.scale / f.scale  # bytes and rows of the shape, scaled
        compute = (
            f.alpha_ms + f.beta_ms * target.scale / m / target.design.cores_per_task
        ) / 1e3
        # The request rate is per prefix: the stage's tasks in flight share it.
        # A task's requests go one at a time (or `in_flight` of them at once
        # in a variant), so each costs its latency, or its share of the
        # prefix's rate when the tasks' requests together reach it.
        tasks_at_once = min(target.slots, m)
        get_rate = store.get_rate * d.prefixes
        put_rate = store.put_rate * d.prefixes
        get_latency = max(
            store.latency_s / d.requests_in_flight, tasks_at_once / get_rate
        )
        put_latency = max(store.latency_s, tasks_at_once / put_rate)
        # Write: one PUT, or a multipart upload (create, parts, complete).
        out_bytes = s.bytes * grow / m
        puts = 1 if out_bytes <= PART_SIZE else 2 + -(-out_bytes // PART_SIZE)
        # Read: each upstream map's marker (a GET of its tail), then the
        # segments of this task's bucket, one request after another. On moto
        # a ranged GET costs in proportion to its whole object as well.
        gets = 0.0
        in_bytes = 0.0
        request_s = 0.0
        for dep in s.deps:
            u = fits[dep].stage
            um = maps[dep]
            rows = u.rows * grow
            # A build side past DataFusion's size for collecting it
            # (`hash_join_single_partition_threshold`) is planned as a
            # partitioned join at that scale: read here as a hash exchange.
            # (Its probe side's own exchange is not added.)
            broadcast = u.buckets == 1 and m > 1
            if u.buckets == 1 and not (broadcast and u.bytes * grow > COLLECT_LIMIT):
                # every map of it, by each task: a broadcast, or a gather
                # under a merge
                segs = um * max(1, -(-rows / um // SEGMENT_ROWS))
                in_bytes += u.bytes * grow
            else:
                ub = buckets[dep] if u.buckets > 1 else p
                segs = um * max(1, -(-rows / (um * ub) // SEGMENT_ROWS))
                in_bytes += u.bytes * grow / ub
            if d.one_get_per_bucket:
                segs = um  # a bucket's segments side by side in each map file
            markers = 0 if d.markers_from_driver else um
            gets += markers + segs
            obj = u.bytes * grow / um
            request_s += (markers + segs) * (
                get_latency + obj / MB * store.per_object_mb_s
            )
        # The tables' bytes (their files whole: an upper bound, Parquet reads
        # the columns it needs), in as many ranged GETs per byte as were
        # counted on moto, spread over the stages of many maps by their work:
        # which stage holds a scan (a leaf, or a collected join's probe side
        # beside its readers) is not in the figures.
        if m > 1 and target.tables_on_store and scans_beta > 0:
            scan = table_bytes * target.scale * f.beta_ms / scans_beta / m
            in_bytes += scan
            n = 2 + scan * target.table_gets_per_byte
            gets += n
            totals["table_get"] += n * m
            request_s += n * (get_latency + scan / MB * store.per_object_mb_s)
        io = 0.0
        if store is not LOCAL:
            put_bw = min(store.put_bw or store.conn_bw, per_conn)
            io += puts * put_latency + out_bytes / put_bw
            io += request_s + in_bytes / per_conn
        totals["get"] += gets * m
        totals["put"] += puts * m
        totals["bytes"] += (in_bytes + out_bytes) * m
        totals["tasks"] += m
        totals["io"] += io * m
        out[sid] = [compute + io] * m
    return out, totals


def schedule(
    deps: dict[int, list[int]], durations: dict[int, list[float]], slots: int
) -> float:
    """The scheduler's run, replayed: a stage's tasks are ready once every
    stage it reads is published, the ready task with the longest remaining
    path runs first, at most `slots` at once. Answers the makespan (s)."""
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
    ready: list[tuple[float, int, int]] = []  # (-remaining path, stage, task)
    running: list[tuple[float, int]] = []  # (end, stage)
    now = 0.0

    def release(sid: int) -> None:
        for i in range(len(durations[sid])):
            heapq.heappush(ready, (-rest(sid), sid, i))

    for sid, ds in waiting.items():
        if not ds:
            release(sid)
    while ready or running:
        while ready and len(running) < slots:
            _, sid, i = heapq.heappop(ready)
            heapq.heappush(running, (now + durations[sid][i], sid))
        now, sid = heapq.heappop(running)
        left[sid] -= 1
        if left[sid] == 0:
            for r in readers[sid]:
                waiting[r].discard(sid)
                if not waiting[r]:
                    release(r)
    return now


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


def predict(
    fits: dict[int, StageFit],
    final_read_ms: float,
    at_partitions: int,
    target: Target,
    costs: Costs,
    table_bytes: float = 0.0,
) -> dict[str, float]:
    """The wall time of a query at `target` (seconds), and its parts."""
    durations, totals = task_times(fits, at_partitions, target, table_bytes)
    deps = {sid: f.stage.deps for sid, f in fits.items()}
    makespan = schedule(deps, durations, target.slots)
    # The driver hands out every task itself, one after another.
    dispatch = totals["tasks"] * costs.dispatch_ms / 1e3
    driver = (costs.driver_ms + costs.driver_per_stage_ms * len(fits)) / 1e3
    # The head reads few rows in TPC-H (an aggregate, a top-k): its own time
    # is taken as measured, plus a GET of each root map's marker and segment.
    final = final_read_ms / 1e3
    if target.store is not LOCAL:
        root = fits[min(fits)].stage
        final += (
            2
            * target_maps(root.maps, at_partitions, target.parts)
            * (target.store.latency_s)
        )
    return {
        "wall": driver + max(makespan, dispatch) + final,
        "makespan": makespan,
        "critical": critical_path(deps, durations),
        "work": sum(sum(d) for d in durations.values()) / target.slots,
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
    return schedule(deps, measured, slots) * 1e3


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


def model(path: Path, cores: int) -> None:
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
            ),
            costs,
            sizes,
            sizes_at,
        )

    ks = (1, 4, 16, 64)
    head = " | ".join(f"k={k}" for k in ks)
    print(f"\n## Predictions: k machines of c = {cores} cores\n")
    print("All 22 queries one after another, seconds; P: partitions (tasks per")
    print("stage, buckets per exchange); best P: the fastest power of two up to")
    print("k c.\n")
    print(f"| scale | S3 | P | {head} |")
    print("|--:|---|---|" + "--:|" * len(ks))
    per_query = {}
    for scale in (100.0, 1000.0):
        for store in (S3_TYPICAL, S3_SLOW):
            rows = {"k c": [0.0] * len(ks), "best": [0.0] * len(ks)}
            best_ps: list[list[int]] = [[] for _ in ks]
            for query in QUERIES:
                fits = fits_for(query, all_p2, costs)
                final = runs["sf1-p2"][query].final_read_ms
                tb = query_table_bytes(query, sizes) / sizes_at
                for i, k in enumerate(ks):
                    tgt = Target(
                        machines=k,
                        cores=cores,
                        scale=scale,
                        store=store,
                        table_gets_per_byte=gets_per_byte,
                    )
                    full = predict(fits, final, 2, tgt, costs, tb)
                    rows["k c"][i] += full["wall"]
                    per_query[(scale, store.name, query, k)] = full
                    options = []
                    p = cores
                    while p <= k * cores:
                        tgt.partitions = p
                        options.append((predict(fits, final, 2, tgt, costs, tb), p))
                        p *= 2
                    pick = min(options, key=lambda o: o[0]["wall"])
                    rows["best"][i] += pick[0]["wall"]
                    best_ps[i].append(pick[1])
            for name, cells in rows.items():
                text = " | ".join(fmt_s(c) for c in cells)
                print(f"| {scale:.0f} | {store.name} | {name} | {text} |")
            common = [statistics.median_low(ps) for ps in best_ps]
            text = " | ".join(str(p) for p in common)
            print(f"| {scale:.0f} | {store.name} | best P, median | {text} |")

    scale, store = 1000.0, S3_TYPICAL
    print(f"\n### Scale {scale:.0f}, {store.name}, P = k c: each query, seconds\n")
    print(
        f"| query | {head} | at k=64: critical path | S3 share of task time "
        "| GETs | GETs / 5,500 per s |"
    )
    print("|---|" + "--:|" * len(ks) + "--:|--:|--:|--:|")
    for query in QUERIES:
        cells = [per_query[(scale, store.name, query, k)] for k in ks]
        last = cells[-1]
        text = " | ".join(fmt_s(c["wall"]) for c in cells)
        share = last["io"] / (last["work"] * ks[-1] * cores)
        print(
            f"| {query} | {text} | {fmt_s(last['critical'])} | {share:.0%} "
            f"| {last['get']:.1e} | {fmt_s(last['get'] / store.get_rate)} |"
        )

    print(
        f"\n### What changes to the exchange would buy: scale {scale:.0f}, "
        f"{store.name}, P = k c, all 22 queries, seconds\n"
    )
    print(f"| design | {head} |")
    print("|---|" + "--:|" * len(ks))
    variants = [
        ("as built", Design()),
        ("markers in the envelope", Design(markers_from_driver=True)),
        ("one GET per (map, bucket)", Design(one_get_per_bucket=True)),
        ("both", Design(markers_from_driver=True, one_get_per_bucket=True)),
        (
            "both, 16 GETs in flight per task",
            Design(True, True, requests_in_flight=16),
        ),
        (
            "both, 16 in flight, 16 prefixes",
            Design(True, True, requests_in_flight=16, prefixes=16),
        ),
    ]
    for name, design in variants:
        totals = [0.0] * len(ks)
        for query in QUERIES:
            fits = fits_for(query, all_p2, costs)
            final = runs["sf1-p2"][query].final_read_ms
            tb = query_table_bytes(query, sizes) / sizes_at
            for i, k in enumerate(ks):
                tgt = Target(
                    machines=k,
                    cores=cores,
                    scale=scale,
                    store=store,
                    table_gets_per_byte=gets_per_byte,
                    design=design,
                )
                totals[i] += predict(fits, final, 2, tgt, costs, tb)["wall"]
        print(f"| {name} | {' | '.join(fmt_s(t) for t in totals)} |")
    ideal = []
    for k in ks:
        work = 0.0
        for query in QUERIES:
            fits = fits_for(query, all_p2, costs)
            work += sum(f.beta_ms * scale for f in fits.values()) / 1e3
        ideal.append(work / (k * cores))
    print(
        f"| the queries' CPU alone, over k c cores | {' | '.join(fmt_s(t) for t in ideal)} |"
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
        print(
            f"| {query} | {meas.wall_ms:.0f} ({every}) | {pred['wall'] * 1e3:.0f} "
            f"| {ratio:.2f} | {shuffle:.0f} | {pred['get'] - pred['table_get']:.0f} "
            f"| {tables:.0f} | {pred['table_get']:.0f} |"
        )
    worst = max(ratios, key=lambda r: abs(r - 1))
    print(
        f"\nworst predicted/measured {worst:.2f}; geometric mean "
        f"{statistics.geometric_mean(ratios):.2f}; "
        f"{sum(abs(r - 1) <= 0.25 for r in ratios)} of {len(ratios)} within 25 %"
    )


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
    args = parser.parse_args()
    if args.command == "measure":
        measure(args)
    elif args.command == "measure-s3":
        measure_s3(args)
    else:
        model(Path(getattr(args, "file", DEFAULT_FILE)), getattr(args, "cores", 16))


if __name__ == "__main__":
    main()
