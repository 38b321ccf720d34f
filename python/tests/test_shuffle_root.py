"""A shuffle root: each query of a session in a fresh location under it.

The location is removed once the answer is read, locally and on S3 (moto),
kept and named when the query fails or when the spec keeps it; a spec with
neither a location nor a root runs under a temporary root of the process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import socket
import subprocess

import pytest
from conftest import (
    BUCKET,
    DFX,
    S3_CREDENTIALS,
    SQL_ONLY,
    S3Server,
    as_rows,
    assert_same,
    require_dfx,
)

from dfx_engine import _internal, session_for
from dfx_engine.driver import WorkerPool, run_distributed, run_local
from dfx_engine.session import SessionSpec

MARKER = "_dfx-shuffle-root"
"""What a root holds once a query ran under it (the runtime's ROOT_MARKER)."""

FAILS = "SELECT CAST(l_returnflag AS INT) AS n, count(*) AS c FROM lineitem GROUP BY 1"
"""Fails in the workers: a flag is no number."""


def test_twenty_queries_under_one_local_root_leave_only_its_marker(
    lineitem: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    root = tmp_path / "root"
    spec = SessionSpec(tables={"lineitem": str(lineitem)}, shuffle_root=str(root))
    expected = as_rows(run_local(SQL_ONLY, spec))
    with WorkerPool(max_workers=2) as pool:
        for _ in range(20):
            result = run_distributed(SQL_ONLY, spec, pool=pool)
            assert_same(as_rows(result.batches), expected)
            assert len(result.tasks) > 1
    assert [p.name for p in root.iterdir()] == [MARKER]


def test_twenty_queries_under_one_s3_root_leave_only_its_marker(
    s3: S3Server, lineitem: pathlib.Path
) -> None:
    prefix = "python/root-twenty"
    spec = SessionSpec(
        tables={"lineitem": str(lineitem)},
        shuffle_root=f"s3://{BUCKET}/{prefix}",
        store_options=s3.store_options,
    )
    expected = as_rows(run_local(SQL_ONLY, spec))
    with WorkerPool(max_workers=2) as pool:
        for _ in range(20):
            result = run_distributed(SQL_ONLY, spec, pool=pool)
            assert_same(as_rows(result.batches), expected)
    assert s3.keys(BUCKET, f"{prefix}/") == [f"{prefix}/{MARKER}"]


def test_a_failed_query_keeps_its_location_and_names_it(
    lineitem: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    root = tmp_path / "root"
    spec = SessionSpec(tables={"lineitem": str(lineitem)}, shuffle_root=str(root))
    with pytest.raises(RuntimeError, match="kept for inspection") as info:
        run_distributed(FAILS, spec)
    kept = [p for p in root.iterdir() if p.name != MARKER]
    assert len(kept) == 1
    assert str(kept[0]) in str(info.value)
    assert (kept[0] / "tasks").is_dir()
    # Kept when asked, after an answer too.
    keep = dataclasses.replace(spec, keep_shuffle=True)
    run_distributed(SQL_ONLY, keep)
    assert len([p for p in root.iterdir() if p.name != MARKER]) == 2


def test_a_shuffle_dir_is_still_one_querys_and_never_beside_a_root(
    lineitem: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    spec = SessionSpec(
        tables={"lineitem": str(lineitem)}, shuffle_dir=str(tmp_path / "mine")
    )
    run_distributed(SQL_ONLY, spec)
    with pytest.raises(ValueError, match="already holds stage output"):
        run_distributed(SQL_ONLY, spec)
    with pytest.raises(ValueError, match="sets both shuffle_dir"):
        dataclasses.replace(spec, shuffle_root=str(tmp_path / "root"))


def test_a_spec_without_a_location_runs_any_number_of_queries(
    lineitem: pathlib.Path,
) -> None:
    spec = SessionSpec(tables={"lineitem": str(lineitem)})
    expected = as_rows(run_local(SQL_ONLY, spec))
    ctx = session_for(spec)
    for _ in range(3):
        result = run_distributed(SQL_ONLY, spec)
        assert_same(as_rows(result.batches), expected)
    # A DataFrame of its session, planned again in the query's location.
    frame = ctx.sql(SQL_ONLY)
    assert_same(as_rows(run_distributed(frame, spec).batches), expected)
    temporary = pathlib.Path(_internal.temporary_root())
    assert [p.name for p in temporary.iterdir()] == [MARKER]


def test_dfx_gc_removes_a_crashed_drivers_s3_location_and_keeps_a_live_ones(
    s3: S3Server,
) -> None:
    require_dfx()
    prefix = "python/root-gc"
    client = s3.client()
    client.put_object(Bucket=BUCKET, Key=f"{prefix}/{MARKER}", Body=b"")
    crashed = f"{prefix}/q-1000-00aa"
    client.put_object(
        Bucket=BUCKET, Key=f"{crashed}/stage-1/0-map-0.arrow", Body=b"x" * 10
    )
    # This process stands for a live driver on this machine.
    live = f"{prefix}/q-2000-00bb"
    holder = {"driver_pid": os.getpid(), "host": socket.gethostname()}
    body = json.dumps(holder).encode()
    client.put_object(Bucket=BUCKET, Key=f"{live}/_dfx-driver.lock", Body=body)
    env = (
        os.environ
        | S3_CREDENTIALS
        | {
            "AWS_ENDPOINT_URL": s3.endpoint,
            "AWS_ALLOW_HTTP": "true",
        }
    )
    out = subprocess.run(
        [str(DFX), "gc", f"s3://{BUCKET}/{prefix}", "--older-than", "0s"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert f"removed s3://{BUCKET}/{crashed} (10 bytes)" in out.stdout, out.stdout
    assert s3.keys(BUCKET, f"{prefix}/") == [
        f"{prefix}/{MARKER}",
        f"{live}/_dfx-driver.lock",
    ]
