"""An ``s3://`` shuffle location through the Python driver and its workers.

The S3 endpoint is conftest's ``moto_server`` (one for the session, with the
bucket :data:`conftest.BUCKET`). The driver and its worker processes reach it
through the spec's ``store_options`` (endpoint, region, plain http) and the
keys in their environment; the plugin reads and writes the objects itself,
and the driver probes the location before anything runs.
"""

from __future__ import annotations

import pathlib
import tempfile
import time
from typing import TYPE_CHECKING

import pytest
from conftest import (
    BUCKET,
    DFX,
    QUERIES,
    SQL_ONLY,
    S3Server,
    as_rows,
    assert_same,
    assert_same_columns,
    assert_same_rows,
    free_port,
    require_dfx,
    s3_server,
    tpch_rows,
)

from dfx_engine import _internal
from dfx_engine.driver import run_distributed, run_local
from dfx_engine.session import SessionSpec

if TYPE_CHECKING:
    from collections.abc import Callable

LOCK_OBJECT = "_dfx-driver.lock"
"""The object a driver's probe creates in the prefix it claims."""


@pytest.fixture
def scratch_root(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> pathlib.Path:
    """Where this process's temporary directories go during the test."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    # The runtime's scratch directory (an S3 query's plans) follows TMPDIR.
    monkeypatch.setenv("TMPDIR", str(root))
    return root


@pytest.mark.parametrize("number", [1, 3, 9, 18], ids=lambda n: f"q{n}")
def test_tpch_through_s3_gives_the_local_answer_and_lands_as_objects(
    s3: S3Server,
    tpch_tables: dict[str, str],
    scratch_root: pathlib.Path,
    number: int,
) -> None:
    sql = (QUERIES / f"q{number}.sql").read_text()
    prefix = f"python/tpch-q{number}"
    spec = SessionSpec(
        tables=dict(tpch_tables),
        shuffle_dir=f"s3://{BUCKET}/{prefix}",
        target_partitions=2,
        store_options=s3.store_options,
    )
    result = run_distributed(sql, spec)
    local = run_local(sql, spec)
    assert_same_columns(result.batches, local, f"q{number}")
    assert_same_rows(tpch_rows(result.batches), tpch_rows(local), f"q{number}")

    keys = s3.keys(BUCKET, f"{prefix}/")
    # Every map published its one object, closed by its marker.
    for stage, map_index in result.tasks:
        published = _internal.map_path(prefix, stage, map_index)
        assert published in keys, f"{published} missing in {keys}"
    # Only stage output and the driver's lock: envelopes and plans stayed on
    # this machine, in a scratch directory that is gone, and nothing
    # half-written remains.
    assert all(
        (key.startswith(f"{prefix}/stage-") and ".tmp" not in key)
        or key == f"{prefix}/{LOCK_OBJECT}"
        for key in keys
    ), keys
    assert list(scratch_root.iterdir()) == []


def test_a_prefix_holding_stage_output_is_refused_before_anything_runs(
    s3: S3Server, tpch_tables: dict[str, str], tmp_path: pathlib.Path
) -> None:
    url = f"s3://{BUCKET}/python/reused"
    spec = SessionSpec(
        tables={"nation": tpch_tables["nation"]},
        shuffle_dir=url,
        store_options=s3.store_options,
    )
    sql = "SELECT n_regionkey, count(*) AS n FROM nation GROUP BY 1 ORDER BY 1"
    first = run_distributed(sql, spec)
    assert as_rows(first.batches) == as_rows(run_local(sql, spec))
    trace = tmp_path / "a-worker-started"
    with pytest.raises(ValueError, match="already holds stage output") as info:
        run_distributed(sql, spec, **trap(trace))
    assert url in str(info.value)
    assert not trace.exists()


def test_rust_workers_reach_s3_through_the_python_drivers_store_options(
    s3: S3Server, lineitem: pathlib.Path
) -> None:
    require_dfx()
    # The Rust worker reads `store_options` from the Python driver's envelope:
    # without them it would not know the endpoint (none is in the environment).
    prefix = "python/rust-workers"
    spec = SessionSpec(
        tables={"lineitem": str(lineitem)},
        shuffle_dir=f"s3://{BUCKET}/{prefix}",
        target_partitions=4,
        store_options=s3.store_options,
    )
    result = run_distributed(
        SQL_ONLY, spec, worker_command=[str(DFX), "worker"], worker_mode="process"
    )
    assert_same(as_rows(result.batches), as_rows(run_local(SQL_ONLY, spec)))
    keys = s3.keys(BUCKET, f"{prefix}/")
    for stage, map_index in result.tasks:
        assert _internal.map_path(prefix, stage, map_index) in keys, keys


def test_a_file_url_is_a_local_directory(
    make_spec: Callable[..., SessionSpec],
) -> None:
    spec = make_spec()
    url = SessionSpec(
        tables=spec.tables,
        shuffle_dir=f"file://{spec.shuffle_dir}",
        target_partitions=spec.target_partitions,
    )
    result = run_distributed(SQL_ONLY, url, worker_mode="process")
    assert_same(as_rows(result.batches), as_rows(run_local(SQL_ONLY, spec)))
    directory = pathlib.Path(spec.shuffle_dir)
    assert (directory / "tasks").is_dir()
    assert list(directory.glob(_internal.partition_glob()))
    # Reused, it is refused as a local directory is.
    with pytest.raises(ValueError, match="already holds stage output"):
        run_distributed(SQL_ONLY, url)


@pytest.mark.parametrize("location", ["gs://bucket/q", "s3://", "s3:///q"])
def test_a_location_of_another_scheme_or_without_bucket_is_refused(
    make_spec: Callable[..., SessionSpec], location: str
) -> None:
    spec = make_spec()
    # Refused when the spec is made: the runtime checks every spec it reads.
    with pytest.raises(ValueError, match=r"shuffle location") as info:
        run_distributed(SQL_ONLY, SessionSpec(tables=spec.tables, shuffle_dir=location))
    assert location in str(info.value)


def trap(trace: pathlib.Path) -> dict[str, object]:
    """Worker settings that leave ``trace`` behind if any worker ever starts."""
    script = 'touch "$0"; exec sleep 600'
    return {
        "worker_mode": "process",
        "worker_command": ["/bin/sh", "-c", script, str(trace)],
    }


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line holds ``text``."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if text.encode() in cmdline:
            found.append(int(entry.name))
    return found


def assert_refused_before_any_task(
    spec: SessionSpec, tmp_path: pathlib.Path, reason: str
) -> None:
    """``spec``'s location fails once, naming its URL and ``reason``; no task ran."""
    trace = tmp_path / "a-worker-started"
    started = time.monotonic()
    with pytest.raises(ValueError, match=reason) as info:
        run_distributed(SQL_ONLY, spec, **trap(trace))
    message = str(info.value)
    assert spec.shuffle_dir in message
    # One error for the location, not one per task.
    assert "map 0" not in message
    assert not trace.exists()
    assert processes_mentioning(str(trace)) == []
    assert time.monotonic() - started < 60


def test_an_unreachable_endpoint_fails_before_any_task(
    s3: S3Server, lineitem: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    spec = SessionSpec(
        tables={"lineitem": str(lineitem)},
        shuffle_dir="s3://nowhere/q",
        store_options={
            **s3.store_options,
            "s3_endpoint": f"http://127.0.0.1:{free_port()}",
        },
    )
    assert_refused_before_any_task(spec, tmp_path, "reach")


def test_a_missing_bucket_fails_before_any_task(
    s3: S3Server, lineitem: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    spec = SessionSpec(
        tables={"lineitem": str(lineitem)},
        shuffle_dir="s3://no-such-bucket/q",
        store_options=s3.store_options,
    )
    assert_refused_before_any_task(spec, tmp_path, "bucket")


def test_refused_credentials_fail_before_any_task(
    s3: S3Server, lineitem: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    # A server that knows no keys refuses the session's.
    with s3_server(check_keys=True) as strict:
        spec = SessionSpec(
            tables={"lineitem": str(lineitem)},
            shuffle_dir=f"s3://{BUCKET}/q",
            store_options=strict.store_options,
        )
        assert_refused_before_any_task(spec, tmp_path, "credentials")
