"""`check`: the model's request count against one worked by hand, and its
copies of the plugin's constants against the plugin's source."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .costs import (
    KEY_PREFIXES,
    MAX_PARTS_IN_FLIGHT,
    PART_SIZE,
    S3_TYPICAL,
    TAIL_GUESS,
    Costs,
    marker_index_bytes,
)
from .designs import Design, Target, predict
from .fit import StageFit
from .profile import Stage


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


TINY_GETS_AS_BUILT = 38
TINY_GETS_MACHINE_SIZED = 14


def self_check() -> None:
    """The model's counts of `tiny_query`'s shuffle GETs against these,
    worked by hand, and a marker's size against serde_json's layout
    written out whole. Fails (exit 1) on any difference.

    As built (`TINY_GETS_AS_BUILT`), on one machine of two cores:

        J's 2 tasks, each: B's 2 markers (a tail each, the index
          inside it), its bucket's segment in B's 2 maps, the same of F   2 x 8 = 16
        F's 2 tasks, each: for B's 2 maps, the marker and the key
          summary                                                         2 x 4 =  8
        the driver's adaptive step for J (a join of two hash reads):
          the switch reads B's and F's markers (4), the skew split F's
          (2: the probe, more rows), coalescing B's and F's (4); F scans
          a table partition by partition, so none for it                          10
        the final read: J's 2 maps, a marker and a segment each          2 x 2 =  4
                                                                                  38

    Machine-sized (`TINY_GETS_MACHINE_SIZED`), on two machines of one core
    (T = 2 tasks a stage):

        J's 2 tasks, each: one range from each of B's and F's 2 tasks    2 x 4 =  8
        F's 2 tasks, each: a summary from each of B's 2 tasks            2 x 2 =  4
        the driver: no marker; the final read: J's 2 tasks' ranges                 2
                                                                                  14
    """
    costs = Costs(
        task_fixed_ms=1.0, dispatch_ms=0.0, driver_ms=0.0, driver_per_stage_ms=0.0
    )
    failures = []
    cases = [
        ("as built", Design(), 1, 2, TINY_GETS_AS_BUILT),
        ("machine-sized", Design(machine_tasks=True), 2, 1, TINY_GETS_MACHINE_SIZED),
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
        if round(got) != expected:
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
    failures += plugin_constants_differ()
    if failures:
        raise SystemExit(f"check failed: {', '.join(failures)}")
    print("check passed")


# Each constant the model copies, with the plugin's file defining it.
PLUGIN_CONSTANTS = {
    "KEY_PREFIXES": ("plugin/src/paths.rs", KEY_PREFIXES),
    "MAX_PARTS_IN_FLIGHT": ("plugin/src/exchange/store.rs", MAX_PARTS_IN_FLIGHT),
    "PART_SIZE": ("plugin/src/exchange/store.rs", PART_SIZE),
    "TAIL_GUESS": ("plugin/src/exchange/marker.rs", TAIL_GUESS),
}


def plugin_constants_differ() -> list[str]:
    """The model's copies of the plugin's constants that differ from the
    plugin's source (`pub const NAME: type = a * b * ...;`)."""
    root = Path(__file__).resolve().parents[2]
    differ = []
    for name, (file, ours) in PLUGIN_CONSTANTS.items():
        text = (root / file).read_text()
        found = re.search(rf"pub const {name}: \w+ = ([\d_ *]+);", text)
        theirs = None
        if found:
            theirs = 1
            for factor in found.group(1).split("*"):
                theirs *= int(factor.strip().replace("_", ""))
        print(f"{name}: the model's {ours}, {file}'s {theirs}")
        if theirs != ours:
            differ.append(name)
    return differ
