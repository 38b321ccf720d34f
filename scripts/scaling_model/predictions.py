"""The prediction tables of docs/SCALING.md."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .costs import (
    FOOTER_BYTES,
    KEY_PREFIXES,
    MB,
    PARSE_MB_S,
    RAY_TASK_MS,
    REQUEST_CUT,
    S3_TYPICAL,
    TAIL_GUESS,
    Costs,
    MapFile,
    Store,
    Terms,
)
from .designs import Design, Target, predict
from .fit import fits_for
from .profile import QUERIES, Profile, query_table_bytes


def fmt_s(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.2f}"
    if seconds < 100:
        return f"{seconds:.1f}"
    return f"{seconds:.0f}"


KS = (1, 4, 16, 64)


# Flight: the shuffle between workers (Arrow Flight `do_get` of a map
# server, runtime/src/flight), not through S3: a stream a millisecond to its
# first byte, the machine's interface, no request rate. Assumed figures,
# until the simulated cluster measures them.
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
    ranged = Design("ranges in reports", ranges=True)
    # As built: a stage's keys over KEY_PREFIXES prefixes.
    after = Design("machine-sized", machine_tasks=True, prefixes=KEY_PREFIXES)
    one_prefix = Design("machine-sized, one key prefix", machine_tasks=True)
    sliced = Design(
        "slices, a request per reader partition",
        machine_tasks=True,
        request_per_partition=True,
    )
    # Enough in flight to fill a 25 Gb/s interface at 85 MB/s a request.
    wide = Design(
        "machine-sized, wide",
        machine_tasks=True,
        bytes_in_flight=40 * REQUEST_CUT,
        parts_in_flight=40,
    )
    spread = Design(
        "machine-sized, wide, 16 prefixes",
        machine_tasks=True,
        bytes_in_flight=40 * REQUEST_CUT,
        parts_in_flight=40,
        prefixes=16,
        table_prefixes=16,
    )
    flight = Design(
        "machine-sized, Flight, wide",
        machine_tasks=True,
        shuffle_store=FLIGHT,
        owner_reads_disk=True,
        bytes_in_flight=40 * REQUEST_CUT,
        parts_in_flight=40,
        prefixes=16,
        table_prefixes=16,
    )
    # As built: read_bytes_in_flight's 64 MiB, eight parts of an upload.
    served = Design(
        "machine-sized, Flight (local)",
        machine_tasks=True,
        shuffle_store=FLIGHT,
        owner_reads_disk=True,
        prefixes=KEY_PREFIXES,
    )
    copied = Design(
        "machine-sized, Flight with an S3 copy (both)",
        machine_tasks=True,
        shuffle_store=FLIGHT,
        owner_reads_disk=True,
        put_store=S3_TYPICAL,
        prefixes=KEY_PREFIXES,
    )
    # What one machine runs (`collapse_stages`): each query whole, the
    # driver pipelining the whole plan; no map file, no shuffle request.
    one_machine = Case(
        "each query whole: one machine as it runs",
        Design("one stage", machine_tasks=True, one_stage=True),
    )
    two_parts = Design("machine-sized, two parts", machine_tasks=True, parts_in_flight=2)
    ray = options.ray_task_ms
    parse = options.parse_mb_s
    as_built = Case("as built before ranges (corrected), pool", parse_mb_s=parse)
    machine_sized = Case(
        "machine-sized: slices, shared reads, keys over 8 prefixes (built), pool",
        after,
        parse_mb_s=parse,
    )
    cases = [
        as_built,
        Case(
            f"as built before ranges (corrected), Ray {ray:g} ms",
            task_ms=ray,
            parse_mb_s=parse,
        ),
        Case(
            "ranges in reports, a task per core, pool",
            ranged,
            parse_mb_s=parse,
        ),
        Case(
            "slices, a request per reader partition, pool",
            sliced,
            parse_mb_s=parse,
        ),
        Case(
            "machine-sized, two parts of an upload in flight, one key prefix, pool",
            two_parts,
            parse_mb_s=parse,
        ),
        Case(
            "machine-sized, eight parts, one key prefix, pool",
            one_prefix,
            parse_mb_s=parse,
        ),
        machine_sized,
        Case(f"machine-sized, Ray {ray:g} ms", after, task_ms=ray, parse_mb_s=parse),
        Case("machine-sized, filling the interface, pool", wide, parse_mb_s=parse),
        Case("machine-sized, filling it, 16 prefixes", spread, parse_mb_s=parse),
        Case("machine-sized, Flight: local (built), pool", served, parse_mb_s=parse),
        Case("machine-sized, Flight: both (built), pool", copied, parse_mb_s=parse),
        Case(
            "machine-sized, Flight: local, 320 MiB in flight, tables over 16 prefixes",
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
    print("speedup is k = 64 against the row's k = 1, and against one machine as")
    print("it runs (each query whole); GETs and given-up requests at k = 64.\n")
    print(
        f"| scale | design | {head} | speedup | over one machine | GETs | given up |"
    )
    print("|--:|---|" + "--:|" * (len(KS) + 4))
    for scale in (100.0, 1000.0):
        alone = total(one_machine, scale, 1)
        cells = [fmt_s(alone)] + [""] * (len(KS) + 3)
        print(f"| {scale:.0f} | {one_machine.name} | {' | '.join(cells)} |")
        for case in cases:
            cells = [total(case, scale, k) for k in KS]
            gets = total(case, scale, KS[-1], "get")
            lost = total(case, scale, KS[-1], "given_up")
            text = " | ".join(fmt_s(c) for c in cells)
            print(
                f"| {scale:.0f} | {case.name} | {text} | {cells[0] / cells[-1]:.2f} "
                f"| {alone / cells[-1]:.2f} | {gets:.2g} | {lost:.2g} |"
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
    k = KS[-1]
    built = total(as_built, scale, k, "tasks")
    after_tasks = total(machine_sized, scale, k, "tasks")
    pool_ms = costs.dispatch_ms
    print(
        f"\n- Scale {scale:.0f}, k = {k}: {built:,.0f} tasks as built (the driver's "
        f"loop: {built * pool_ms / 1e3:.0f} s at the pool's {pool_ms:.2f} ms, "
        f"{built * ray / 1e3:.0f} s at {ray:g} ms), {after_tasks:,.0f} machine-sized."
    )
    conn = store.conn_bw / MB
    in_flight = after.bytes_in_flight // REQUEST_CUT
    print(
        f"- A machine's bandwidth to S3: as built {cores} tasks x {conn:.0f} MB/s = "
        f"{cores * conn:,.0f} MB/s; machine-sized, one task reads {in_flight} x "
        f"{conn:.0f} = {in_flight * conn:,.0f} MB/s and uploads "
        f"{after.parts_in_flight} x {conn:.0f} = {after.parts_in_flight * conn:,.0f} "
        f"MB/s, of the interface's {store.machine_bw / MB:,.0f}."
    )
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

    before, later = as_built, machine_sized
    print(f"\n### Each query: scale {scale:.0f}, {store.name}, pool, seconds\n")
    print(
        "| query | as built k=1 | as built k=64 | machine-sized k=1 | machine-sized k=64 "
        "| shuffle GETs at k=64, as built | machine-sized | driver's GETs, as built |"
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
    GETs per marker, the readers' GETs as built and machine-sized."""
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
        "driver's, one read | T | machine-sized: T² | cut at 8 MiB |"
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
