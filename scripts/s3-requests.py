#!/usr/bin/env python3
"""Requests TPC-H queries make of an S3 shuffle location, counted by moto.

    scripts/s3-requests.py [--dfx target/debug/dfx] [--moto-server PATH]
                           [--queries 5,9] [--partitions 8] [--scale 0.01]
                           [--partitions-per-task 1]

Starts ``moto_server`` (moto's S3 over HTTP; the host tests install it under
Cargo's target temp directory) on a free local port with its request log in a
file, runs ``dfx tpch`` once per query with the shuffle location in a bucket of
it and the tables on local disk, and prints, per query, the requests on the
stage objects (``stage-<S>/<K>-map-<M>.arrow``) by method: GETs are the reads of
every exchange (readers, the driver's adaptive step and its read of the last
stage), PUTs, POSTs and HEADs the maps' publishing. The data is generated on
first use under the target directory and reused.
"""

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

BUCKET = "dfx-requests"
LINE = re.compile(r'"(?:\x1b\[[0-9;]*m)*([A-Z]+) /([^ ?]*)')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    target = Path(os.environ.get("CARGO_TARGET_DIR", "target"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dfx", default=str(target / "debug" / "dfx"))
    parser.add_argument(
        "--moto-server",
        default=str(target / "tmp" / "moto-venv" / "bin" / "moto_server"),
    )
    parser.add_argument("--queries", default="5,9")
    parser.add_argument("--partitions", default="8")
    parser.add_argument(
        "--partitions-per-task",
        default="1",
        help="partitions each task runs (dfx tpch's own default is the cores)",
    )
    parser.add_argument("--scale", default="0.01")
    parser.add_argument("--data-dir", default=str(target / "tpch-data-requests"))
    args = parser.parse_args()

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log_dir = tempfile.TemporaryDirectory(prefix="dfx-moto-")
    log_path = Path(log_dir.name) / "requests.log"
    log = log_path.open("wb")
    server = subprocess.Popen(
        [args.moto_server, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        # The bucket made with boto3 from moto's own venv: moto refuses a
        # bare PUT. Retried until the server listens.
        python = str(Path(args.moto_server).parent / "python")
        create = (
            "import sys, boto3\n"
            "boto3.client('s3', endpoint_url=sys.argv[1], aws_access_key_id='test', "
            "aws_secret_access_key='test', region_name='us-east-1')"
            ".create_bucket(Bucket=sys.argv[2])"
        )
        deadline = time.time() + 60
        while (
            subprocess.run(
                [python, "-c", create, endpoint, BUCKET],
                capture_output=True,
                check=False,
            ).returncode
            != 0
        ):
            if time.time() > deadline or server.poll() is not None:
                print("moto_server did not start", file=sys.stderr)
                return 1
            time.sleep(0.5)
        env = dict(
            os.environ,
            AWS_ACCESS_KEY_ID="test",
            AWS_SECRET_ACCESS_KEY="test",
            AWS_REGION="us-east-1",
            AWS_ENDPOINT_URL=endpoint,
            AWS_ALLOW_HTTP="true",
        )
        print(
            "| query | partitions | per task | stage-object GETs | PUTs | POSTs | HEADs |"
        )
        print("|---|--:|--:|--:|--:|--:|--:|")
        for query in args.queries.split(","):
            before = log_path.read_text(errors="replace").count("\n")
            run = subprocess.run(
                [
                    args.dfx,
                    "tpch",
                    "--scale",
                    args.scale,
                    "--partitions",
                    args.partitions,
                    "--partitions-per-task",
                    args.partitions_per_task,
                    "--queries",
                    query,
                    "--runs",
                    "1",
                    "--no-progress",
                    "--data-dir",
                    args.data_dir,
                    "--shuffle-dir",
                    f"s3://{BUCKET}/q{query}",
                ],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if run.returncode != 0 or "cannot run" in run.stdout:
                print(run.stdout, run.stderr, file=sys.stderr)
                return 1
            lines = log_path.read_text(errors="replace").splitlines()[before:]
            counts: Counter[str] = Counter()
            for line in lines:
                found = LINE.search(line)
                if found and re.search(r"/stage-\d+/\d+-map-\d+\.arrow$", found.group(2)):
                    counts[found.group(1)] += 1
            print(
                f"| q{query} | {args.partitions} | {args.partitions_per_task} "
                f"| {counts['GET']} | {counts['PUT']} "
                f"| {counts['POST']} | {counts['HEAD']} |"
            )
    finally:
        server.kill()
        server.wait()
        log.close()
        log_dir.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
