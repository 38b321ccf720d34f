#!/usr/bin/env python3
"""How far dfx scales, on paper: TPC-H wall time on k machines of c cores.

    scripts/scaling-model.py model [FILE] [--cores C] [--ray-task-ms MS] [--parse-mb-s R]
    scripts/scaling-model.py check
    scripts/scaling-model.py cluster [--per-query] RECORD...
    scripts/scaling-model.py measure --dfx DIR/dfx --data D/sf0.1-p2 D/sf1-p2 ...
        [--runs 5] [--overhead] [--shuffle-dir s3://B/P --suffix=-s3
        --request-log MOTO_LOG] [--out FILE]
    python/.venv/bin/python scripts/scaling-model.py measure-s3 [--out FILE]

`measure` runs each TPC-H query with `dfx run --analyze-json` over each
data set in turn and keeps every stage (maps, buckets, deps) with its
tasks' times, rows and bytes, the final read and the wall time;
`measure-s3` times an S3 endpoint (boto3); `model` reads the figures back
(FILE: scripts/scaling-measurements.json by default) and prints the check
against the measured runs and the predictions for k machines; `cluster`
sets the requests and bytes the simulated cluster counted (the files
`python/bench/cluster.sh tpch --record` appends to) beside the model's. `model`
needs only the standard library. docs/SCALING.md explains the model.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scaling_model.cluster import cluster_check, per_query
from scaling_model.costs import PARSE_MB_S, RAY_TASK_MS
from scaling_model.measure import measure, measure_s3
from scaling_model.predictions import Options
from scaling_model.profile import DEFAULT_FILE
from scaling_model.report import model
from scaling_model.selfcheck import self_check


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
    c = sub.add_parser(
        "cluster", help="the simulated cluster's counts beside the model's"
    )
    c.add_argument(
        "records", nargs="+", type=Path, help="cluster_tpch.py --record files"
    )
    c.add_argument(
        "--per-query",
        action="store_true",
        help="each query's wall under object_store and local instead",
    )
    args = parser.parse_args()
    if args.command == "check":
        self_check()
    elif args.command == "cluster" and args.per_query:
        per_query(args.records)
    elif args.command == "cluster":
        cluster_check(args.records)
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
