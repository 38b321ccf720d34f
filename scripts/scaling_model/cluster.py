"""`cluster`: the model's request and byte counts beside the simulated
cluster's (python/bench/cluster_tpch.py --record).

Each recorded query is run through the model's own counting
(`designs.predict`) with its stages as the cluster ran them (maps, buckets,
deps, bytes and rows published), on k machines of one core, the design the
run's durability is: S3 for `object_store`; Flight, each machine reading its
own maps from disk, for `local`; and Flight with each map also put to S3
for `both`. So what is checked is the model's counting of requests and
bytes per exchange against the counts made on the network: moto's request
log for S3, the map servers' own counts for Flight.

Then its latency terms: with no compute in the fits, the model's wall time
of a query is its shuffle's requests on the critical path. The difference
between a query's wall under `object_store` and under `local`, at the same
k and the same S3 latency, is what S3's latency costs the shuffle (the
tables are read from S3 alike under both): measured, and as the model has
it.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from .costs import Costs, Store
from .designs import Design, Target, predict
from .fit import StageFit
from .profile import Stage


def flight_on_the_bridge(latency_s: float) -> Store:
    """Flight between the cluster's nodes: their links' 1 Gbit/s, the round
    trip the run added into each node, no request rate."""
    return Store("Flight", latency_s, 1e9 / 8, 1e9 / 8, float("inf"), float("inf"))


WITHIN = 0.2
"""How close a count must be to the model's: 20 %."""


def runs_of(paths: list[Path]) -> list[tuple[dict, list[dict]]]:
    """Every recorded run: its settings, then its queries."""
    out = []
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                settings, *queries = json.loads(line)["run"]
                out.append((settings, queries))
    return out


def fits_of(query: dict, scale: float) -> dict[int, StageFit]:
    """The query's stages as ran, as the model's fits (no time: counts only)."""
    return {
        s["stage_id"]: StageFit(
            stage=Stage(
                id=s["stage_id"],
                maps=s["maps"],
                buckets=s["buckets"],
                deps=list(s["deps"]),
                task_ms=[0.0] * s["maps"],
                bytes=float(s["bytes"]),
                rows=float(s.get("rows", 0)),
            ),
            scale=scale,
            alpha_ms=0.0,
            beta_ms=0.0,
        )
        for s in query["stages"]
    }


def design_of(settings: dict) -> tuple[Store, Design]:
    """The store and design a run's durability is."""
    latency = settings["s3_latency_ms"] / 1e3
    s3 = Store("S3 (moto)", latency, 1e9 / 8, 1e9 / 8, 5500, 3500)
    durability = settings["durability"]
    if durability == "object_store":
        return s3, Design("machine-sized, S3", machine_tasks=True)
    return s3, Design(
        f"machine-sized, Flight ({durability})",
        machine_tasks=True,
        shuffle_store=flight_on_the_bridge(settings.get("node_latency_ms", 0.0) / 1e3),
        owner_reads_disk=True,
        put_store=s3 if durability == "both" else None,
    )


def predicted(settings: dict, query: dict) -> dict[str, float]:
    """The model's counts for one recorded query, by path."""
    store, design = design_of(settings)
    k = settings["workers"]
    target = Target(
        machines=k,
        cores=settings["cpus_per_worker"],
        scale=settings["scale"],
        store=store,
        partitions=settings["partitions"],
        design=design,
    )
    costs = Costs(task_fixed_ms=0.0, dispatch_ms=0.0, driver_ms=0.0, driver_per_stage_ms=0.0)
    fits = fits_of(query, settings["scale"])
    totals = predict(fits, 0.0, settings["partitions"], target, costs)
    flight = design.shuffle_store is not None
    # The driver reads the last stage whole, from S3 or from its owners.
    read = totals["remote_bytes"] + totals["root_bytes"]
    return {
        "wall_s": totals["wall"],
        "s3_get": 0.0 if flight else totals["shuffle_get"],
        "s3_put": totals["put"] if settings["durability"] != "local" else 0.0,
        "flight_streams": totals["shuffle_get"] if flight else 0.0,
        "flight_bytes": read if flight else 0.0,
    }


COUNTS = ("s3_get", "s3_put", "flight_streams", "flight_bytes")


def close(measured: float, model: float) -> bool:
    """Within :data:`WITHIN` of each other (both nothing counts as close)."""
    if measured == model:
        return True
    return abs(measured - model) <= WITHIN * max(measured, model)


def cluster_check(paths: list[Path]) -> None:
    """Print, per durability and k, the counts measured beside the model's."""
    runs = sorted(runs_of(paths), key=lambda r: (r[0]["durability"], r[0]["workers"]))
    print(
        "| durability | k | queries | S3 GETs | model | S3 PUTs | model | "
        "Flight streams | model | Flight MB | model | queries within 20 % |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for settings, queries in runs:
        got = dict.fromkeys(COUNTS, 0.0)
        want = dict.fromkeys(COUNTS, 0.0)
        within = 0
        for query in queries:
            model = predicted(settings, query)
            within += all(close(query[c], model[c]) for c in COUNTS)
            for count in COUNTS:
                got[count] += query[count]
                want[count] += model[count]
        cells = []
        for count in COUNTS:
            scale = 1e6 if count == "flight_bytes" else 1
            digits = 1 if count == "flight_bytes" else 0
            cells += [
                f"{got[count] / scale:.{digits}f}",
                f"{want[count] / scale:.{digits}f}",
            ]
        print(
            f"| {settings['durability']} | {settings['workers']} | {len(queries)} | "
            + " | ".join(cells)
            + f" | {within} of {len(queries)} |"
        )
    print(
        "\nEach query's counts run through the model with its stages as the "
        "cluster ran them; a query is within 20 % when each of its four counts is."
    )
    latency_check(runs)


def latency_check(runs: list[tuple[dict, list[dict]]]) -> None:
    """What S3's latency costs the shuffle: measured and modelled, per k.

    The wall under `object_store` less that under `local`, at each k and
    S3 latency; where both were also run with no added latency, the part
    the latency adds (the difference at the latency less the difference
    at none): what the relay's round trips cost, without moto's own time
    per request or the codec S3's map files are written with.
    """
    by = {(r[0]["durability"], r[0]["workers"], r[0]["s3_latency_ms"]): r for r in runs}
    pairs = sorted(
        (k, latency)
        for (durability, k, latency) in by
        if durability == "object_store" and ("local", k, latency) in by
    )
    if not pairs:
        return

    def difference(k: int, latency: float) -> tuple[int, float, float, float, float]:
        s3_settings, s3_queries = by[("object_store", k, latency)]
        flight_settings, flight_queries = by[("local", k, latency)]
        flight_by = {q["query"]: q for q in flight_queries}
        both = [q for q in s3_queries if q["query"] in flight_by]
        s3_wall = sum(q["wall_s"] for q in both)
        flight_wall = sum(flight_by[q["query"]]["wall_s"] for q in both)
        model = sum(
            predicted(s3_settings, q)["wall_s"]
            - predicted(flight_settings, flight_by[q["query"]])["wall_s"]
            for q in both
        )
        return len(both), s3_wall, flight_wall, s3_wall - flight_wall, model

    print(
        "\n| k | S3 latency | queries | wall, object_store | wall, local | "
        "difference | the model's | the latency's part | the model's |"
    )
    print("|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for k, latency in pairs:
        count, s3_wall, flight_wall, measured, model = difference(k, latency)
        part = ["", ""]
        if latency and (k, 0.0) in pairs:
            _, _, _, measured_0, model_0 = difference(k, 0.0)
            part = [f"{measured - measured_0:.1f} s", f"{model - model_0:.2f} s"]
        print(
            f"| {k} | {latency:g} ms | {count} | {s3_wall:.1f} s | "
            f"{flight_wall:.1f} s | {measured:.1f} s | {model:.2f} s | "
            f"{part[0]} | {part[1]} |"
        )


def per_query(paths: list[Path]) -> None:
    """Each query's wall under `object_store` and under `local`, side by side.

    For every k, latency and scale run under both: the ratio S3 / Flight
    per query, and its geometric mean over the queries with an exchange
    (a stage reading another's maps). Runs of one setting pair up in the
    order recorded (the first `object_store` with the first `local`...),
    and a query's ratio is the median of its pairs'; S3 / `both` likewise
    where `both` was run.
    """
    groups: dict[tuple, dict[str, list[dict]]] = {}
    for settings, queries in runs_of(paths):
        key = (
            settings["workers"],
            settings["s3_latency_ms"],
            settings.get("node_latency_ms", 0.0),
            settings["scale"],
        )
        by_query = {q["query"]: q for q in queries}
        groups.setdefault(key, {}).setdefault(settings["durability"], []).append(by_query)
    for (k, latency, node_latency, scale), runs in sorted(groups.items()):
        s3_runs, flight_runs = runs.get("object_store", []), runs.get("local", [])
        if s3_runs and flight_runs:
            print_pairs(
                f"Scale {scale:g}, k = {k}, S3 at {latency:g} ms, nodes {node_latency:g} ms apart",
                s3_runs,
                flight_runs,
                runs.get("both", []),
            )


def print_pairs(
    title: str, s3_runs: list[dict], flight_runs: list[dict], both_runs: list[dict]
) -> None:
    """One setting's table of :func:`per_query`."""

    def ratios(query: str, others: list[dict]) -> list[float]:
        return [
            s3[query]["wall_s"] / other[query]["wall_s"]
            for s3, other in zip(s3_runs, others)
            if query in s3 and query in other
        ]

    print(
        f"\n#### {title}: {len(s3_runs)} object_store, {len(flight_runs)} local, "
        f"{len(both_runs)} both\n"
    )
    print(
        "| query | exchanges | object_store, run 1 | local, run 1 "
        "| S3 / Flight, each pair | median | S3 / both |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|")
    medians, both_medians = [], []
    first_s3, first_flight = s3_runs[0], flight_runs[0]
    for query in sorted(first_s3, key=lambda q: int(q[1:])):
        pairs = ratios(query, flight_runs)
        if not pairs:
            continue
        exchanges = sum(len(stage["deps"]) for stage in first_s3[query]["stages"])
        median = statistics.median(pairs)
        both = ratios(query, both_runs)
        both_text = f"{statistics.median(both):.2f}" if both else ""
        if exchanges:
            medians.append(median)
            if both:
                both_medians.append(statistics.median(both))
        print(
            f"| {query} | {exchanges} | {first_s3[query]['wall_s']:.2f} s "
            f"| {first_flight[query]['wall_s']:.2f} s "
            f"| {', '.join(f'{r:.2f}' for r in pairs)} | {median:.2f} | {both_text} |"
        )
    if medians:
        both_text = (
            f"; S3 / both {statistics.geometric_mean(both_medians):.2f}" if both_medians else ""
        )
        print(
            f"\n{sum(r > 1 for r in medians)} of {len(medians)} queries with an exchange "
            f"faster over Flight (median of pairs); geometric mean S3 / Flight "
            f"{statistics.geometric_mean(medians):.2f}, least {min(medians):.2f}{both_text}"
        )
