"""`model`: the check on one machine, the check against moto, then the
predictions."""

from __future__ import annotations

import statistics
from pathlib import Path

from .costs import LOCAL, MB, MIB, PART_SIZE, Costs, Store, Terms
from .designs import Target, predict
from .fit import fit_driver, fits_for, typical_alpha
from .predictions import Options, predictions
from .profile import QUERIES, Profile, profiles, query_table_bytes, read


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
