"""A Ray cluster of several nodes on one machine, each node a world of its own.

A head node and ``--workers`` worker nodes, each a ``ray start --block`` in
a mount namespace of its own (``unshare --mount --propagation private``),
and each worker node in a network namespace of its own too (:mod:`network`;
run as root)::

    node      address     CPUs  sees
    ----      -------     ----  ----
    head      10.213.X.1  0     the driver's filesystem and network (no
                                task runs on it)
    worker-1  10.213.X.2  1     a private empty /tmp; the repository, the
    worker-2  10.213.X.3  1     driver's scratch and the build tree hidden
    ...                         (tmpfs over each); the Python environment
                                read-only at /srv/dfx-venv; its own
                                network stack, one link to the bridge

A worker node reaches only what a node of a real cluster has: the
installed ``dfx-engine`` wheel (in the Python environment), what Ray ships,
and the network: the other nodes, and the services the driver relays to
it (:meth:`Cluster.relay`, an S3 endpoint say, with the latency of a
distant one). Each node's link is capped (``--link-rate``, 1 Gbit/s by
default) in each direction. The Python environment is the
driver's own (``sys.prefix``), bind-mounted read-only at a path outside
everything hidden, rather than a second environment built for the nodes: a
Ray node must run the driver's Python and Ray versions, and the bind costs
nothing where installing Ray anew costs a minute. It is the same files the
driver imports, so a node's ``dfx_engine`` is the wheel installed there,
never the source tree (which it cannot see).

Each node's processes are found by its mount namespace, never by name: a
node is killed (:meth:`Cluster.kill`), as a machine is lost, by SIGKILL to
every process in its namespace, and its link is taken down, so its
address answers nothing more. :meth:`Cluster.stop` kills each node and
relay and removes the network, so nothing of the cluster outlives it. The
head's namespace hides nothing; it is there to name the head's processes.

The nodes and the driver share a token of their own (``RAY_AUTH_TOKEN``),
and a node's environment is only ``PATH``, ``HOME``, the locale, the token
and ``DFX_CLUSTER_NODE`` (its name): the driver's ``AWS_*`` keys reach tasks
through a task's ``runtime_env``, as on a real cluster.

``python python/bench/cluster.py show`` starts a cluster, prints what each
node sees, and stops it (``python/bench/cluster.sh`` is the one command);
``python python/bench/cluster.py stop STATE`` kills what a state file names
(the shell script's trap). :mod:`cluster_tpch` runs TPC-H through one, and
``python/tests/test_cluster.py`` loses a node mid-query.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any

from network import Network, can_make_networks, remove_recorded

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

ROOT = pathlib.Path(__file__).resolve().parents[2]
"""The repository, hidden from every worker node."""

VENV_MOUNT = "/srv/dfx-venv"
"""Where a worker node sees the Python environment (read-only)."""

NODE_MOUNTS = """
set -eu
venv="$1"; shift
count="$1"; shift
# The environment first, while its own path is still visible: it may lie
# inside a directory hidden below (python/.venv in the repository).
mount -t tmpfs -o size=1m,mode=755 dfx-node /srv
mkdir /srv/dfx-venv
mount --bind "$venv" /srv/dfx-venv
mount -o remount,bind,ro /srv/dfx-venv
i=0
while [ "$i" -lt "$count" ]; do
    mount -t tmpfs -o size=64m dfx-hidden "$1"
    shift
    i=$((i + 1))
done
mount -t tmpfs -o mode=1777 dfx-tmp /tmp
cd /
exec "$@"
"""
"""A worker node's shell: ``venv count hidden... command...``; it makes the
node's mounts in its fresh namespace, then becomes ``command``."""

UNSHARE = shutil.which("unshare") or "unshare"
"""util-linux's unshare(1), by its whole path where there is one."""

RELAY = pathlib.Path(__file__).resolve().with_name("relay.py")
"""The relay that brings a service of this machine to the nodes' network."""

SHOWN_IN_TMP = 8
"""Entries of a node's /tmp printed; the head's is the driver's, and long."""

START_TIMEOUT = 90.0
"""Seconds for the whole cluster to come up before giving up."""


_HANDED_OUT: set[int] = set()
"""Every port :func:`free_port` has answered in this process."""


def free_port() -> int:
    """A port of 127.0.0.1 nothing listens on now, never answered before.

    Each probe releases its port before a node binds it, so the kernel may
    offer the same one to the next probe: two components of one node were
    once given the same port. A port is therefore answered once per process.
    """
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port: int = probe.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def can_make_namespaces() -> str | None:
    """Why this machine cannot run the cluster, or ``None`` if it can.

    Tried, not guessed: a mount namespace with a tmpfs in it.
    """
    if os.geteuid() != 0:
        return "the cluster's nodes need root (mount namespaces, tmpfs mounts)"
    unshare = shutil.which("unshare")
    if unshare is None:
        return "the cluster's nodes need unshare(1) (util-linux)"
    probe = subprocess.run(  # noqa: S603 - a fixed command line
        [
            unshare,
            "--mount",
            "--propagation",
            "private",
            "--",
            "/bin/sh",
            "-c",
            "mount -t tmpfs dfx-probe /tmp",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return f"cannot make a mount namespace with a tmpfs: {probe.stderr.strip()}"
    return can_make_networks()


def namespace_of(pid: int | str) -> str | None:
    """The mount namespace of process ``pid`` (``mnt:[inode]``), if it lives."""
    try:
        return str(pathlib.Path(f"/proc/{pid}/ns/mnt").readlink())
    except OSError:
        return None


def processes_in(namespace: str) -> list[int]:
    """Every live process in mount namespace ``namespace``."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit() and namespace_of(entry.name) == namespace:
            found.append(int(entry.name))
    return sorted(found)


def kill_namespace(namespace: str, timeout: float = 20.0) -> int:
    """SIGKILL every process in ``namespace`` until none is left; how many.

    Again and again: a process may start another while its siblings die.
    """
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    while True:
        left = processes_in(namespace)
        if not left:
            return len(killed)
        if time.monotonic() > deadline:
            message = f"processes {left} of {namespace} outlived SIGKILL"
            raise RuntimeError(message)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        time.sleep(0.05)


def refresh_ray_auth() -> None:
    """Make this process's Ray read its token settings from the environment anew.

    Ray reads them once, when imported; a test process imported it long
    before the cluster's token existed. What Ray's own tests do between
    clusters (``ray._private.authentication_test_utils``).
    """
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def hidden_paths(extra: Sequence[str] = ()) -> list[str]:
    """What a worker node must not see: the repository, the driver's scratch.

    The repository, the temporary directory (``TMPDIR``, when not under /tmp,
    which every node has a private one of), the cargo target directory (the
    plugin as built, the cached TPC-H data), and ``extra``. Only existing
    directories, and none inside another (the tmpfs over the outer one
    already hides it, and leaves no place to mount on).
    """
    candidates = [
        str(ROOT),
        tempfile.gettempdir(),
        os.environ.get("CARGO_TARGET_DIR", ""),
        *extra,
    ]
    # Not /tmp itself: every worker node has a private one anyway.
    found = {str(pathlib.Path(p).resolve()) for p in candidates if p}
    found -= {"/", "/tmp"}  # noqa: S108
    paths = sorted(p for p in found if pathlib.Path(p).is_dir())
    return [
        path
        for path in paths
        if not any(path.startswith(outer.rstrip("/") + "/") for outer in paths)
    ]


@dataclasses.dataclass
class Node:
    """One ``ray start --block`` in a mount namespace of its own."""

    name: str
    ip: str
    process: subprocess.Popen[bytes]
    namespace: str
    log: pathlib.Path

    def processes(self) -> list[int]:
        """The node's live processes: ``ray start``, raylet, agents, workers."""
        return processes_in(self.namespace)


class Cluster:
    """A head node and ``workers`` worker nodes on this machine (module doc).

    Use as a context manager: it starts the nodes, connects this process as
    the driver (``ray.init``) once all are up, and on exit disconnects and
    kills every node::

        with Cluster(workers=2) as cluster:
            result = run_distributed(sql, spec, executor=RayExecutor(...))
            cluster.kill(cluster.workers[0])  # a machine lost

    ``state`` names a file the namespaces are written to, for a killer that
    outlives this process (``cluster.py stop STATE``).
    """

    def __init__(
        self,
        workers: int = 2,
        cpus_per_worker: int = 1,
        *,
        hide: Sequence[str] = (),
        object_store_bytes: int = 100 * 1024 * 1024,
        state: pathlib.Path | None = None,
        head_env: dict[str, str] | None = None,
        link_rate: str | None = "1gbit",
        node_latency_ms: float = 0.0,
    ) -> None:
        """A cluster not started yet; ``head_env`` adds to the head's settings.

        ``link_rate`` caps each worker node's link (a ``tc`` rate; ``None``:
        uncapped); ``node_latency_ms`` is added to the round trip of every
        connection into a worker node, from another or from the head
        (:class:`network.Network`).
        """
        if workers < 1:
            message = f"a cluster needs at least one worker node, got {workers}"
            raise ValueError(message)
        self.worker_count = workers
        self.cpus_per_worker = cpus_per_worker
        self.hidden = hidden_paths(hide)
        self.object_store_bytes = object_store_bytes
        self.state = state
        self.head_env = dict(head_env or {})
        self.venv = pathlib.Path(sys.prefix)
        self.token = secrets.token_hex(32)
        self.port = 0
        self.head: Node | None = None
        self.workers: list[Node] = []
        self.network = Network(workers, rate=link_rate, latency_ms=node_latency_ms)
        self.relays: list[subprocess.Popen[str]] = []
        self._scratch = pathlib.Path(tempfile.mkdtemp(prefix="dfx-ray-"))
        self._saved_env: dict[str, str | None] = {}
        self._connected = False

    @property
    def nodes(self) -> list[Node]:
        """The head, then the worker nodes, those started so far."""
        return ([self.head] if self.head else []) + self.workers

    @property
    def head_ip(self) -> str:
        """The head's address, the driver's, and its relays': the bridge's."""
        return self.network.host_ip

    @property
    def address(self) -> str:
        """The head's GCS address, what ``ray start --address`` takes."""
        return f"{self.head_ip}:{self.port}"

    @property
    def auth_env(self) -> dict[str, str]:
        """What every node and the driver need to reach the GCS."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token}

    def __enter__(self) -> Cluster:
        """Start every node and connect this process as the driver."""
        try:
            self.start()
            self.connect()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        """Disconnect, then kill every node."""
        self.stop()

    def _node_env(self, name: str) -> dict[str, str]:
        """A node's whole environment: nothing of the driver's but its basics."""
        env = {
            name: os.environ[name]
            for name in ("PATH", "HOME", "LANG", "LC_ALL")
            if name in os.environ
        }
        env.update(self.auth_env)
        env["DFX_CLUSTER_NODE"] = name
        # Ray's own temporary files, and those of whatever runs in a task.
        env["TMPDIR"] = "/tmp"  # noqa: S108 - the node's own private /tmp
        return env

    def _ray_start(self, python: str, name: str, ip: str) -> list[str]:
        """``ray start --block`` of one node, every port its own."""
        return [
            python,
            "-m",
            "ray.scripts.scripts",
            "start",
            "--block",
            "--disable-usage-stats",
            "--node-ip-address",
            ip,
            "--object-store-memory",
            str(self.object_store_bytes),
            "--dashboard-agent-listen-port",
            str(free_port()),
            "--metrics-export-port",
            str(free_port()),
            "--runtime-env-agent-port",
            str(free_port()),
            "--log-style",
            "record",
            "--log-color",
            "false",
        ]

    def _spawn(
        self,
        name: str,
        ip: str,
        shell: list[str],
        env: dict[str, str],
        enter: Sequence[str] = (),
    ) -> Node:
        """Start ``shell`` in a new mount namespace (and session) as node ``name``.

        ``enter`` prefixes the command: a network namespace to run it in.
        """
        log = self._scratch / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(  # noqa: S603 - our own command line
                [*enter, UNSHARE, "--mount", "--propagation", "private", "--", *shell],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        # unshare makes the namespace, then execs: wait until it has.
        ours = namespace_of("self")
        deadline = time.monotonic() + 10
        while (namespace := namespace_of(process.pid)) in (ours, None):
            if process.poll() is not None or time.monotonic() > deadline:
                message = f"node {name} did not start: {log.read_text()[-2000:]}"
                raise RuntimeError(message)
            time.sleep(0.01)
        node = Node(name, ip, process, namespace, log)
        self._record()
        return node

    def _record(self) -> None:
        """Write what :func:`stop_recorded` removes to the state file, if any.

        The nodes' namespaces, the relays and the network.
        """
        if self.state is not None:
            record = {
                "namespaces": [node.namespace for node in self.nodes],
                "relays": [relay.pid for relay in self.relays],
                "network": self.network.record(),
            }
            self.state.write_text(json.dumps(record) + "\n")

    def start(self) -> None:
        """Start the head, then the worker nodes; wait until Ray has them all."""
        python = str(self.venv / "bin" / "python")
        self.port = free_port()
        self.network.up()
        self._record()
        head_cmd = [
            *self._ray_start(python, "head", self.head_ip),
            "--head",
            "--port",
            str(self.port),
            "--num-cpus",
            "0",
            "--include-dashboard",
            "false",
            "--dashboard-port",
            str(free_port()),
            "--temp-dir",
            str(self._scratch / "ray"),
        ]
        head_env = {**self._node_env("head"), **self.head_env}
        self.head = self._spawn("head", self.head_ip, head_cmd, head_env)
        self._record()
        self._wait_for_port()
        for index in range(1, self.worker_count + 1):
            name = f"worker-{index}"
            ip = self.network.node_ip(index)
            command = [
                *self._ray_start(f"{VENV_MOUNT}/bin/python", name, ip),
                "--address",
                self.address,
                # Its own (private) /tmp, not the head's temporary directory,
                # which Ray would otherwise give every node.
                "--temp-dir",
                "/tmp/ray",  # noqa: S108 - the node's private /tmp
                "--num-cpus",
                str(self.cpus_per_worker),
                "--min-worker-port",
                str(10002 + 1000 * index),
                "--max-worker-port",
                str(10002 + 1000 * index + 999),
            ]
            shell = [
                "/bin/sh",
                "-c",
                NODE_MOUNTS,
                "node",
                str(self.venv),
                str(len(self.hidden)),
                *self.hidden,
                *command,
            ]
            enter = self.network.enter(index)
            node = self._spawn(name, ip, shell, self._node_env(name), enter)
            self.workers.append(node)
            self._record()

    def _wait_for_port(self) -> None:
        """Wait until the head's GCS listens."""
        head = self.head
        if head is None:
            message = "the head was not started"
            raise RuntimeError(message)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            with (
                contextlib.suppress(OSError),
                socket.create_connection((self.head_ip, self.port), timeout=1),
            ):
                return
            if head.process.poll() is not None or time.monotonic() > deadline:
                message = f"the head did not start:\n{self.logs(head)}"
                raise RuntimeError(message)
            time.sleep(0.1)

    def connect(self) -> None:
        """``ray.init`` this process to the head; wait until every node is alive."""
        import ray

        for name, value in self.auth_env.items():
            self._saved_env.setdefault(name, os.environ.get(name))
            os.environ[name] = value
        refresh_ray_auth()
        ray.init(
            address=self.address,
            _node_ip_address=self.head_ip,
            log_to_driver=False,
            logging_level="warning",
        )
        self._connected = True
        deadline = time.monotonic() + START_TIMEOUT
        while len(self.alive_nodes()) < 1 + self.worker_count:
            for node in self.workers:
                if node.process.poll() is not None:
                    message = f"{node.name} exited:\n{node.log.read_text()[-3000:]}"
                    raise RuntimeError(message)
            if time.monotonic() > deadline:
                message = f"only {len(self.alive_nodes())} nodes came up"
                raise RuntimeError(message)
            time.sleep(0.2)

    def alive_nodes(self) -> dict[str, str]:
        """Ray's node id of each live node, by its address."""
        import ray

        return {
            node["NodeManagerAddress"]: node["NodeID"]
            for node in ray.nodes()  # type: ignore[no-untyped-call]
            if node["Alive"]
        }

    def node_id(self, node: Node) -> str:
        """Ray's id of ``node`` (its raylet), by its address."""
        return self.alive_nodes()[node.ip]

    def name_of(self, node_id: str) -> str:
        """The name of the node whose Ray id is ``node_id`` (``?`` if none)."""
        import ray

        by_ip = {node.ip: node.name for node in self.nodes}
        for entry in ray.nodes():  # type: ignore[no-untyped-call]
            if entry["NodeID"] == node_id:
                return by_ip.get(entry["NodeManagerAddress"], "?")
        return "?"

    def kill(self, node: Node) -> int:
        """Lose ``node`` as a machine is lost: its processes, then its link.

        SIGKILL to every process of the node, then its link taken down.
        Returns how many processes were killed.
        """
        killed = kill_namespace(node.namespace)
        node.process.wait()
        self.network.cut(self.workers.index(node) + 1)
        return killed

    def relay(self, target: str, delay_ms: float = 0.0) -> str:
        """``host:port`` on the bridge that relays to ``target``.

        ``target`` is ``host:port`` of this machine; ``delay_ms`` is added to
        each round trip. The relay lives as long as the cluster. The nodes
        reach this machine's services so.
        """
        process = subprocess.Popen(  # noqa: S603 - our own relay
            [sys.executable, str(RELAY), self.head_ip, target, str(delay_ms)],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self.relays.append(process)
        self._record()
        line = process.stdout.readline() if process.stdout else ""
        if not line.startswith("ready "):
            message = f"the relay to {target} did not start: {line!r}"
            raise RuntimeError(message)
        return f"{self.head_ip}:{int(line.split()[1])}"

    def relay_url(self, url: str, delay_ms: float = 0.0) -> str:
        """``url`` (``http://host:port``) as the nodes reach it (:meth:`relay`)."""
        scheme, _, where = url.partition("://")
        return f"{scheme}://{self.relay(where.rstrip('/'), delay_ms)}"

    def stop(self) -> None:
        """Disconnect the driver, kill every node, forget the scratch."""
        if self._connected:
            import ray

            ray.shutdown()
            self._connected = False
        for node in reversed(self.nodes):
            kill_namespace(node.namespace)
            with contextlib.suppress(ProcessLookupError):
                node.process.wait(timeout=10)
        for relay in self.relays:
            relay.kill()
            relay.wait()
        self.relays.clear()
        self.network.down()
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved_env.clear()
        refresh_ray_auth()
        shutil.rmtree(self._scratch, ignore_errors=True)
        if self.state is not None:
            self.state.unlink(missing_ok=True)

    def logs(self, node: Node, tail: int = 3000) -> str:
        """The end of ``node``'s ``ray start`` output."""
        return node.log.read_text(errors="replace")[-tail:]


# --- What a node sees --------------------------------------------------------


def node_view(watched: list[str], dialed: Sequence[str] = ()) -> dict[str, Any]:
    """What the calling process sees: run as a Ray task on a node.

    Its node (Ray's id and ``DFX_CLUSTER_NODE``), mount and network
    namespaces, its address, the entries of /tmp, whether each of
    ``watched`` exists, whether it reaches each ``host:port`` of
    ``dialed``, and the ``dfx_engine`` it imports, with its plugin.
    """
    import ray

    import dfx_engine
    from dfx_engine import _internal

    return {
        "node": os.environ.get("DFX_CLUSTER_NODE", "driver"),
        "node_id": ray.get_runtime_context().get_node_id(),
        "namespace": namespace_of("self"),
        "network": str(pathlib.Path("/proc/self/ns/net").readlink()),
        "ip": ray.util.get_node_ip_address(),
        "reaches": {where: reaches(where) for where in dialed},
        "pid": os.getpid(),
        "tmp": sorted(p.name for p in pathlib.Path("/tmp").iterdir()),  # noqa: S108
        "exists": {path: seen(path) for path in watched},
        "dfx_engine": dfx_engine.__file__,
        "plugin": _internal.plugin_path(),
        "aws_keys_in_environment": sorted(
            k for k in os.environ if k.startswith("AWS_")
        ),
    }


def reaches(where: str) -> bool:
    """Whether a TCP connection to ``host:port`` is accepted within a second."""
    host, _, port = where.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def seen(path: str) -> str:
    """``absent``, ``empty``, or how many entries directory ``path`` holds."""
    try:
        entries = list(pathlib.Path(path).iterdir())
    except FileNotFoundError:
        return "absent"
    except NotADirectoryError:
        return "a file"
    return f"{len(entries)} entries" if entries else "empty"


def views(
    cluster: Cluster, watched: list[str], dialed: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """:func:`node_view` on each node in turn, pinned there (the head too)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # By value: a worker node cannot import this module, which it cannot see.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    probe = ray.remote(node_view)
    found = []
    for node in cluster.nodes:
        strategy = NodeAffinitySchedulingStrategy(cluster.node_id(node), soft=False)
        ref = probe.options(num_cpus=0, scheduling_strategy=strategy).remote(
            watched, dialed
        )
        found.append(ray.get(ref, timeout=120))
    return found


def print_views(cluster: Cluster, watched: list[str]) -> None:
    """Print what each node sees (:func:`views`), node by node."""
    print(f"Ray cluster at {cluster.address}: head + {len(cluster.workers)} workers")
    print(f"hidden on every worker node: {', '.join(cluster.hidden)}")
    print(f"Python environment: {cluster.venv} (read-only at {VENV_MOUNT} on workers)")
    for view in views(cluster, watched):
        print(
            f"-- {view['node']} at {view['ip']}: ray node {view['node_id'][:12]}, "
            f"{view['namespace']}, {view['network']}"
        )
        shown = " ".join(view["tmp"][:SHOWN_IN_TMP]) or "(nothing)"
        more = len(view["tmp"]) - SHOWN_IN_TMP
        print(f"   /tmp holds: {shown}{f' ... and {more} more' if more > 0 else ''}")
        for path, state in view["exists"].items():
            print(f"   {path}: {state}")
        print(f"   dfx_engine: {view['dfx_engine']}")
        print(f"   plugin:     {view['plugin']}")
        keys = view["aws_keys_in_environment"]
        print(f"   AWS_* in its environment: {' '.join(keys) or '(none)'}")


def watched_paths(extra: Sequence[str] = ()) -> list[str]:
    """Paths each node is asked about: the repository and the driver's scratch."""
    paths = [str(ROOT), str(ROOT / "python" / "dfx_engine"), *extra]
    target = os.environ.get("CARGO_TARGET_DIR")
    if target:
        paths.append(target)
    return list(dict.fromkeys(paths))


# --- The command line -------------------------------------------------------


@contextlib.contextmanager
def stopped_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP end this process as Ctrl-C does: ``finally`` runs."""

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {
        sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stop_recorded(state: pathlib.Path) -> None:
    """Kill what ``state`` names, and remove its network (a backstop).

    Every process in its namespaces, and its relays.
    """
    text = state.read_text() if state.is_file() else ""
    record = json.loads(text) if text.strip() else {}
    for namespace in record.get("namespaces", []):
        if namespace and namespace != namespace_of("self"):
            kill_namespace(namespace)
    for pid in record.get("relays", []):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    remove_recorded(record.get("network", {}))
    state.unlink(missing_ok=True)


def main() -> None:
    """``show``: start a cluster, print what each node sees, stop it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    show = commands.add_parser("show", help="start, print each node's view, stop")
    show.add_argument("--workers", type=int, default=2)
    show.add_argument("--state", type=pathlib.Path)
    stop = commands.add_parser("stop", help="kill what a state file names")
    stop.add_argument("state", type=pathlib.Path)
    args = parser.parse_args()
    if args.command == "stop":
        stop_recorded(args.state)
        return
    reason = can_make_namespaces()
    if reason:
        raise SystemExit(f"cluster.py: {reason}")
    with (
        stopped_on_signals(),
        tempfile.TemporaryDirectory(prefix="dfx-driver-") as scratch,
        Cluster(args.workers, state=args.state) as cluster,
    ):
        # A scratch directory of the driver's, as a query's would be.
        (pathlib.Path(scratch) / "envelope.json").write_text("{}")
        print_views(cluster, watched_paths([scratch]))


if __name__ == "__main__":
    main()
