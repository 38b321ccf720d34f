"""A Ray cluster whose worker nodes share nothing with the driver, losing one.

``python/bench/cluster.py`` starts a head (no CPUs) and two worker nodes of
one CPU each, every node a ``ray start`` in a mount namespace of its own,
each worker node in a network namespace of its own on a bridge, a round
trip into it 1 ms longer (``NODE_LATENCY_MS``); a worker
node has a private /tmp and cannot see the repository, the driver's
scratch or the build tree, only the installed wheel and the S3 server,
which the cluster relays onto the bridge. The table (conftest's
``lineitem``, four files of two rows) and the shuffle are on conftest's S3
server; envelopes, plans and the UDF reach the
nodes by value, the keys through the tasks' ``runtime_env``.

A node is lost as a machine is: every process in its namespace (raylet,
agents, Ray workers, ``ray start``) killed at once, while a map it runs is
inside a UDF, and its link is taken down. The UDF asks the test, over a
socket on the bridge's address, whether to
go on: the test answers ``go`` to each node's first map and ``hang`` to the
first second map of a node (its first map has published), then kills that
node. With one CPU a node, the first two maps run one on each node, so the
third map is some node's second::

    node A: map a (published) ─► map c: "hang" ─► killed
    node B: map b (published) ─► map d ─► map c again (attempt 1) ─► ...

Needs root, unshare(1) and ip(8) to make mount and network namespaces;
skipped, saying so, only where they cannot be made.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import BUCKET, S3_CREDENTIALS, S3Server, as_rows, split_map_file

from dfx_engine import _internal
from dfx_engine.driver import DistributedResult, run_distributed
from dfx_engine.session import SessionSpec

ray = pytest.importorskip("ray")

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import cluster as ray_cluster  # noqa: E402 - python/bench is on the path now

from dfx_engine.ray import RayExecutor  # noqa: E402 - only once Ray is importable

if TYPE_CHECKING:
    from collections.abc import Iterator

TABLE_BUCKET = "dfx-cluster-tables"
"""Where the lineitem fixture is copied: the nodes read it from there."""

QTY_SQL = """
SELECT l_returnflag AS flag, sum(py_check(l_quantity)) AS q
FROM lineitem GROUP BY l_returnflag ORDER BY flag
"""
EXPECTED = [{"flag": "A", "q": 90}, {"flag": "B", "q": 130}, {"flag": "R", "q": 140}]
"""Worked out in conftest's table: the quantities per flag."""

FAST_NODE_DEATH = {
    # The GCS declares a node dead after 3 missed checks 0.5 s apart, not
    # after Ray's default of about 15 s: the test's time.
    "RAY_health_check_initial_delay_ms": "0",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "500",
    "RAY_health_check_failure_threshold": "3",
}

NOT_POSSIBLE = ray_cluster.can_make_namespaces()
pytestmark = pytest.mark.skipif(
    NOT_POSSIBLE is not None, reason=f"no multi-node cluster here: {NOT_POSSIBLE}"
)


@pytest.fixture(scope="module")
def lineitem_on_s3(s3: S3Server, lineitem: pathlib.Path) -> str:
    """Conftest's lineitem files copied to a bucket: their ``s3://`` location."""
    client = s3.client()
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=TABLE_BUCKET)
    for path in sorted(lineitem.glob("*.parquet")):
        client.upload_file(str(path), TABLE_BUCKET, f"lineitem/{path.name}")
    return f"s3://{TABLE_BUCKET}/lineitem"


class Gate:
    """The test's side of the UDF's question: a socket server on ``host``.

    Each call of the UDF sends its node's name and its quantities, and reads
    ``go`` or ``hang``. The first call from a node that already had a ``go``
    hangs (that node is :attr:`victim`); every other call goes on.
    """

    def __init__(self, host: str, *, hang: bool = True) -> None:
        """Listening on a free port of ``host``, answering in its own thread.

        With ``hang`` false every call goes on.
        """
        self.hang = hang
        self.host = host
        self.server = socket.create_server((host, 0))
        self.port = self.server.getsockname()[1]
        self.calls: list[tuple[str, str, str]] = []
        self.victim: str | None = None
        self.hanging = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                connection, _ = self.server.accept()
                with connection:
                    node, _, values = connection.recv(1024).decode().partition(" ")
                    seen = {call[0] for call in self.calls if call[2] == "go"}
                    answer = "go"
                    if self.hang and self.victim is None and node in seen:
                        answer = "hang"
                        self.victim = node
                    self.calls.append((node, values, answer))
                    connection.sendall(answer.encode())
                    if answer == "hang":
                        self.hanging.set()

    def close(self) -> None:
        """Stop listening."""
        self.server.close()


def gated_udf(
    gate: Gate, kind: pa.DataType | None = None, pause: float = 0.0
) -> object:
    """``py_check``: its argument unchanged, once ``gate`` says go.

    Each call asks the gate, then sleeps ``pause`` seconds; ``kind`` is the
    argument's type (int64 unless given). Pickled by value into the plan:
    it uses nothing but the standard library and its arguments, since a
    node cannot import this module.
    """
    from datafusion import udf

    kind = kind or pa.int64()
    where = (gate.host, gate.port)

    def check(values: pa.Array) -> pa.Array:
        import os
        import socket
        import time

        node = os.environ.get("DFX_CLUSTER_NODE", "?")
        with socket.create_connection(where, timeout=30) as asking:
            asking.sendall(f"{node} {values.to_pylist()[:4]}".encode())
            answer = asking.recv(16).decode()
        if answer == "hang":
            time.sleep(600)
        time.sleep(pause)
        return values

    return udf(check, [kind], kind, "immutable", name="py_check")


def run_losing_the_victim(
    cluster: ray_cluster.Cluster,
    gate: Gate,
    spec: SessionSpec,
    executor: RayExecutor,
    max_attempts: int = 3,
) -> tuple[DistributedResult, list[int]]:
    """Run :data:`QTY_SQL` while the node the gate hangs is killed.

    Returns the result and what :meth:`Cluster.kill` answered for the
    victim (empty when none hung).
    """
    nodes = {node.name: node for node in cluster.workers}
    killed: list[int] = []

    def kill_the_victim() -> None:
        if gate.hanging.wait(timeout=120) and gate.victim:
            killed.append(cluster.kill(nodes[gate.victim]))

    killer = threading.Thread(target=kill_the_victim, daemon=True)
    killer.start()
    try:
        result = run_distributed(
            QTY_SQL,
            spec,
            [gated_udf(gate)],
            executor=executor,
            task_timeout=60,
            max_attempts=max_attempts,
        )
    finally:
        gate.hanging.set()
        killer.join(timeout=60)
        gate.close()
    return result, killed


NODE_LATENCY_MS = 1.0
"""Added to each round trip into a worker node: every connection between the
nodes, Ray's and the Flight streams, crosses a relay as it would a network."""


@pytest.fixture
def cluster() -> Iterator[ray_cluster.Cluster]:
    """A head and two one-CPU worker nodes, killed after the test."""
    with ray_cluster.Cluster(
        workers=2, head_env=FAST_NODE_DEATH, node_latency_ms=NODE_LATENCY_MS
    ) as started:
        yield started


def store_options(cluster: ray_cluster.Cluster, s3: S3Server) -> dict[str, str]:
    """``s3``'s options with its endpoint relayed onto the cluster's bridge.

    The nodes' network namespaces reach the bridge, not this machine's
    loopback.
    """
    return {**s3.store_options, "s3_endpoint": cluster.relay_url(s3.endpoint)}


def test_a_node_lost_mid_stage_has_its_running_map_rerun_on_the_other(
    cluster: ray_cluster.Cluster, s3: S3Server, lineitem_on_s3: str
) -> None:
    gate = Gate(cluster.head_ip)
    prefix = "cluster/node-lost"
    spec = SessionSpec(
        tables={"lineitem": lineitem_on_s3},
        shuffle_dir=f"s3://{BUCKET}/{prefix}",
        target_partitions=4,
        store_options=store_options(cluster, s3),
    )
    executor = RayExecutor(options={"runtime_env": {"env_vars": dict(S3_CREDENTIALS)}})
    assert executor.max_workers == 2
    nodes = {node.name: node for node in cluster.workers}
    started = time.monotonic()
    result, killed = run_losing_the_victim(cluster, gate, spec, executor)
    took = time.monotonic() - started

    # The answer worked out by hand.
    assert as_rows(result.batches) == EXPECTED

    # The node was lost while its second map hung; every process it had is gone.
    victim = nodes[gate.victim or "none"]
    assert killed, gate.calls
    assert killed[0] > 1, gate.calls
    assert victim.processes() == []
    survivor = next(node for node in cluster.workers if node is not victim)

    # Exactly one retry: the hung map, classed as a lost worker.
    assert len(result.retries) == 1, result.retries
    assert "Ray worker running it died" in result.retries[0], result.retries
    rerun = [task for task, attempts in result.attempts.items() if attempts > 1]
    assert len(rerun) == 1, result.attempts
    assert result.attempts[rerun[0]] == 2
    # Everything else ran once: the victim's published map was not rerun.
    assert all(n == 1 for task, n in result.attempts.items() if task != rerun[0])

    # Where the attempts that completed ran: the victim's first map, before
    # it was lost; the rerun on the survivor; nothing on the head.
    where = {
        (p.stage_id, p.map, p.attempt): cluster.name_of(p.node_id)
        for p in executor.placements
    }
    assert where[(*rerun[0], 1)] == survivor.name, where
    on_victim = [task for task, node in where.items() if node == victim.name]
    assert len(on_victim) == 1, where
    assert on_victim[0][2] == 0
    assert set(where.values()) <= {victim.name, survivor.name}, where

    # Published output stayed on S3, one whole object per map.
    keys = s3.keys(BUCKET, f"{prefix}/")
    maps = {key for key in keys if key.endswith(".arrow")}
    every_map = {
        _internal.map_path(prefix, stage.stage_id, m)
        for stage in result.stages
        for m in range(stage.maps)
    }
    assert maps == every_map, keys
    assert took < 60, f"took {took:.0f} s"


def test_every_node_sees_only_the_wheel_its_own_tmp_and_the_bridge(
    cluster: ray_cluster.Cluster, tmp_path: pathlib.Path
) -> None:
    (tmp_path / "driver-scratch").write_text("the driver's")
    watched = [str(ray_cluster.ROOT), str(tmp_path)]
    # A service of the driver's on this machine's loopback, and the same
    # relayed onto the bridge: only the relay reaches the worker nodes.
    with socket.create_server(("127.0.0.1", 0)) as service:
        service.listen(8)
        loopback = f"127.0.0.1:{service.getsockname()[1]}"
        relayed = cluster.relay(loopback)
        dialed = [loopback, relayed]
        found = ray_cluster.views(cluster, watched, dialed)
    views = {view["node"]: view for view in found}
    assert set(views) == {"head", "worker-1", "worker-2"}
    assert views["head"]["exists"][str(tmp_path)] == "1 entries"
    for name in ("worker-1", "worker-2"):
        view = views[name]
        # The repository is an empty tmpfs (or, for a checkout under /tmp,
        # gone with the driver's /tmp); the driver's scratch is not there.
        assert view["exists"][str(ray_cluster.ROOT)] in ("empty", "absent"), view
        assert view["exists"][str(tmp_path)] == "absent", view
        assert view["tmp"] == ["ray"], view
        assert view["dfx_engine"].startswith(ray_cluster.VENV_MOUNT), view
        assert view["aws_keys_in_environment"] == [], view
        # Its own network: its address on the bridge, the driver's loopback
        # out of reach, the relay on the bridge within it.
        assert view["ip"] == cluster.workers[int(name[-1]) - 1].ip, view
        assert view["reaches"] == {loopback: False, relayed: True}, view
    assert views["head"]["reaches"] == {loopback: True, relayed: True}
    namespaces = {view["namespace"] for view in views.values()}
    assert len(namespaces) == 3
    networks = {view["network"] for view in views.values()}
    assert len(networks) == 3, networks


BIG_ROWS = 240_000
"""Rows of 64 random bytes: about 15 MiB, which no codec shrinks, in one file."""

BIG_SQL = """
SELECT count(*) AS groups, sum(n) AS rows FROM (
    SELECT py_check(payload) AS p, count(*) AS n FROM big GROUP BY p
)
"""
"""Every payload is its own group: the map's output is the whole table."""


@pytest.fixture(scope="module")
def big_on_s3(s3: S3Server, tmp_path_factory: pytest.TempPathFactory) -> str:
    """One Parquet file of :data:`BIG_ROWS` random payloads, on S3."""
    path = tmp_path_factory.mktemp("big") / "part-0.parquet"
    payloads = [os.urandom(64) for _ in range(BIG_ROWS)]
    pq.write_table(pa.table({"payload": pa.array(payloads, pa.binary())}), path)
    client = s3.client()
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=TABLE_BUCKET)
    client.upload_file(str(path), TABLE_BUCKET, "big/part-0.parquet")
    return f"s3://{TABLE_BUCKET}/big"


def test_a_node_lost_mid_upload_publishes_no_partial_object(
    cluster: ray_cluster.Cluster,
    s3: S3Server,
    big_on_s3: str,
    tmp_path: pathlib.Path,
) -> None:
    gate = Gate(cluster.head_ip, hang=False)
    prefix = "cluster/mid-upload"
    spec = SessionSpec(
        tables={"big": big_on_s3},
        shuffle_dir=f"s3://{BUCKET}/{prefix}",
        target_partitions=2,
        store_options=store_options(cluster, s3),
    )
    executor = RayExecutor(options={"runtime_env": {"env_vars": dict(S3_CREDENTIALS)}})
    nodes = {node.name: node for node in cluster.workers}
    client = s3.client()
    seen: dict[str, object] = {}

    def kill_mid_upload() -> None:
        # The first map of the big scan opens a multipart upload once a part
        # is buffered; the node running it is the first to ask the gate.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            uploads = client.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix)
            pending = [u["Key"] for u in uploads.get("Uploads", [])]
            if pending and gate.calls:
                victim = nodes[gate.calls[0][0]]
                seen["victim"] = victim.name
                seen["uploading"] = pending[0]
                cluster.kill(victim)
                seen["after_kill"] = s3.keys(BUCKET, f"{prefix}/")
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_mid_upload, daemon=True)
    killer.start()
    try:
        result = run_distributed(
            BIG_SQL,
            spec,
            [gated_udf(gate, pa.binary_view(), pause=0.05)],
            executor=executor,
            task_timeout=60,
        )
    finally:
        killer.join(timeout=60)
        gate.close()

    assert as_rows(result.batches) == [{"groups": BIG_ROWS, "rows": BIG_ROWS}]
    assert "uploading" in seen, "no multipart upload was seen to kill"
    uploading = str(seen["uploading"])
    # Killed while its multipart upload was open: nothing at its key then.
    assert uploading not in seen["after_kill"], seen
    assert len(result.retries) == 1, result.retries
    assert "Ray worker running it died" in result.retries[0]
    # The rerun on the other node published it whole: its marker closes it.
    local = tmp_path / "map.arrow"
    client.download_file(BUCKET, uploading, str(local))
    _segments, marker = split_map_file(local)
    assert len(marker["buckets"]) == spec.target_partitions, marker


@pytest.mark.parametrize("durability", ["local", "both"])
def test_a_node_lost_with_its_maps_on_its_disk(
    cluster: ray_cluster.Cluster, s3: S3Server, lineitem_on_s3: str, durability: str
) -> None:
    """Map files on the nodes' own disks, streamed between them over Flight.

    Each node's dfx actor writes its maps into its private /tmp and serves
    them; the other node and the driver cannot see them there. The victim
    publishes its first map, hangs in its second, and is killed. Under
    ``local`` its published map is lost with it and runs again on the
    survivor; under ``both`` its readers read the S3 copy instead, and only
    the hung map runs again.
    """
    gate = Gate(cluster.head_ip)
    prefix = f"cluster/on-disk-{durability}"
    # Under local, a directory of /tmp, which each node has of its own.
    shuffle_dir = (
        f"/tmp/dfx-cluster-{durability}-{os.getpid()}"  # noqa: S108
        if durability == "local"
        else f"s3://{BUCKET}/{prefix}"
    )
    spec = SessionSpec(
        tables={"lineitem": lineitem_on_s3},
        shuffle_dir=shuffle_dir,
        target_partitions=4,
        store_options=store_options(cluster, s3),
        shuffle_durability=durability,
    )
    executor = RayExecutor(
        options={"runtime_env": {"env_vars": dict(S3_CREDENTIALS)}}, serve_maps=True
    )
    nodes = {node.name: node for node in cluster.workers}
    result, killed = run_losing_the_victim(
        cluster, gate, spec, executor, max_attempts=5
    )

    assert as_rows(result.batches) == EXPECTED
    assert killed, gate.calls
    # Two actors, one a node, each serving from its node's address.
    where = {
        (p.stage_id, p.map, p.attempt): cluster.name_of(p.node_id)
        for p in executor.placements
    }
    assert set(where.values()) <= set(nodes), where
    # The map the victim published first, before it hung in its second.
    victim = gate.victim
    published = [
        (stage, m)
        for (stage, m, attempt), node in where.items()
        if node == victim and attempt == 0
    ]
    assert len(published) == 1, where
    hung = [
        task for task, n in result.attempts.items() if n > 1 and task != published[0]
    ]
    leaf = published[0][0]
    rerun = {task for task, n in result.attempts.items() if n > 1 and task[0] == leaf}
    if durability == "local":
        # Its file went with its node: it ran again, as did the hung map.
        assert published[0] in rerun, result.retries
        lost = [r for r in result.retries if "its output was lost" in r]
        assert lost, result.retries
    else:
        # Read from S3 instead: only the hung map ran again.
        assert published[0] not in rerun, result.retries
        assert len(rerun) == 1, result.retries
        assert not [r for r in result.retries if "its output was lost" in r]
    assert hung, result.attempts
