"""What things cost: the fixed costs measured, the store (S3's figures),
and the requests the exchange makes (a map file's marker, the client's
back-off on 503), with which of the as-built terms the model counts."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass

MB = 1e6


MIB = 1024 * 1024


# The writer's multipart part size (`PART_SIZE` in plugin/src/exchange/store.rs)
# and a segment's rows at most (DataFusion's batch size: one segment per
# coalesced batch per bucket, plugin/src/exchange/publish.rs).
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


# A remote reader's first GET of a map file is its last TAIL_GUESS bytes
# (`TAIL_GUESS`, plugin/src/exchange/marker.rs); the index ends FOOTER_BYTES
# before the file does (its length, u64, and the magic).
TAIL_GUESS = 64 * 1024


FOOTER_BYTES = 16


# Parts of one upload in flight at once (`MAX_PARTS_IN_FLIGHT`,
# plugin/src/exchange/store.rs).
MAX_PARTS_IN_FLIGHT = 8


# Key prefixes a stage's map objects are spread over (`KEY_PREFIXES`,
# plugin/src/paths.rs): map M's key leads with M mod 8.
KEY_PREFIXES = 8


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

    def compact(value: dict) -> str:
        return json.dumps(value, separators=(",", ":"))

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
    one = len(compact(entry)) + segments * len(compact(segment))
    one += max(0, segments - 1)  # the commas between segments
    return len(compact(head)) + buckets * one + max(0, buckets - 1)


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


# A Ray task's cost in the driver: its dispatch-to-report time less the
# worker's own time, for a near-empty task on a warm local Ray
# (`python/bench/overhead.py --ray`: 12.0 ms against 7.5 ms in the worker,
# median of 9 runs of 32 tasks; the pool's is 3.4 against 3.3).
RAY_TASK_MS = 4.5


# Machine-sized tasks' reads: ranges cut at 8 MiB (AWS's advice for parallel ranged
# GETs, and the writer's part size), 64 MiB of them in flight per task.
REQUEST_CUT = 8 * MIB


BYTES_IN_FLIGHT = 64 * MIB


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
