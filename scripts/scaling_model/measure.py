"""Taking the figures: TPC-H runs with `dfx run --analyze-json`, and an
S3 endpoint timed."""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from .profile import QUERIES, REPO, TABLES, read, write


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
    sets: dict[str, dict] = {}
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

    def timed(fn: Callable[[int], object], n: int) -> list[float]:
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
