"""Run a query's tasks as Ray tasks: ``run_distributed(..., executor=RayExecutor())``.

Each attempt of a ``(stage, map)`` task is one Ray task, in a Ray worker
process on any node of the cluster. The runtime's scheduler hands the
executor the task's envelope and encoded stage by value; the Ray task runs
them with ``_internal.run_task_value`` (the worker code of ``python -m
dfx_engine.worker``, without any file) and returns the worker's response
line. What moves where::

    what              from                through               to
    ----              ----                -------               --
    envelope (JSON),  the driver          Ray task arguments    the Ray worker's
    encoded stage                         (object store)        memory
    shuffle data      the Ray worker      never Ray             the shuffle location
                                                                (S3, or a directory
                                                                every node mounts)
    response          the Ray worker      the task's result     the driver's scheduler

Install the same ``dfx-engine`` wheel on every node: each Ray worker loads
the plugin bundled in it. Credentials come from each process's environment,
e.g. ``RayExecutor(options={"runtime_env": {"env_vars": {...}}})``.

Each completed attempt is recorded as a :class:`Placement` (stage, map,
attempt, the Ray node it ran on) in ``RayExecutor.placements``, the newest
:data:`PLACEMENTS_KEPT` of them: where a query's tasks ran.

With ``serve_maps=True``, the executor instead places long-lived dfx
worker actors on every node (``workers_per_node`` each) and runs each task
on one of them: a query of ``shuffle_durability`` ``local`` or ``both``
keeps each map file on the disk of the actor that wrote it, served by the
actor's map server over Arrow Flight, and the task goes to the least busy
actor, of those the one holding most of its input. An actor that dies, or
runs a task past its timeout (it is killed), is a lost worker; its maps
are run again under ``local``, and read from the location under ``both``.
Each actor's map server binds the node's address
(``ray.util.get_node_ip_address()``) unless the spec's ``map_server_bind``
says where.

Ray's own retries are off: the runtime classes a failure as it does any
worker's. A failure the worker reports comes back in its response, classed
where it was made; a Ray worker process or node that died, and an attempt
past its timeout (cancelled, its worker killed), are a lost worker, tried
again; Ray failing to run the task at all is final.
"""

from __future__ import annotations

import collections
import itertools
import re
import shutil
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray
import ray.exceptions
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from dfx_engine import _internal
from dfx_engine.worker import run_task

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "PLACEMENTS_KEPT",
    "PLACE_WAIT",
    "NodeWorker",
    "Placement",
    "RayExecutor",
    "run_in_ray_worker",
]

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
"""The colour codes Ray puts in a remote traceback, dropped from messages."""

CANCEL_GRACE = 10.0
"""Seconds to wait for a cancelled Ray task to be gone before moving on."""

PLACEMENTS_KEPT = 10_000

PLACE_WAIT = 60.0
"""Seconds a new actor may take to start on its node before it is given up."""
"""Placements an executor keeps, the newest: it may serve query after query."""


@dataclass(frozen=True)
class Placement:
    """Where one attempt of a task ran, as its Ray task answered.

    Attributes:
        stage_id: The task's stage.
        map: The map it ran.
        attempt: The attempt (0: the first).
        node_id: The Ray node it ran on (``ray.get_runtime_context().get_node_id()``
            there, as ``ray.nodes()`` names it).
    """

    stage_id: int
    map: int
    attempt: int
    node_id: str


def run_in_ray_worker(envelope_json: str, plan: bytes) -> str:
    """The body of every Ray task: the response line of the task's worker code.

    Ray reuses a worker process for task after task, so a query's later
    tasks find their session built, as in a pooled worker.
    """
    return _internal.run_task_value(envelope_json, plan, run_task)


def _run_and_place(envelope_json: str, plan: bytes) -> tuple[str, str]:
    """:func:`run_in_ray_worker`, and the Ray node it ran on."""
    line = run_in_ray_worker(envelope_json, plan)
    return line, ray.get_runtime_context().get_node_id()


class NodeWorker:
    """A long-lived dfx worker on one node (``serve_maps=True``).

    Its map server starts with it, bound to ``bind``; its tasks' map files
    stay on its node, served from there for as long as it lives.
    """

    def __init__(self, bind: str) -> None:
        """Start the process's map server on ``bind`` (``host:port``)."""
        self.bind = bind
        self.address = _internal.start_map_server(bind)
        self.node_id = ray.get_runtime_context().get_node_id()
        self.locations: set[str] = set()

    def where(self) -> tuple[str, str]:
        """Its map server's address and its Ray node."""
        return self.address, self.node_id

    def counts(self) -> tuple[int, int, int]:
        """What its map server sent: streams, bytes, tickets refused."""
        return _internal.map_server_counts() or (0, 0, 0)

    def run(self, envelope_json: str, plan: bytes, location: str) -> tuple[str, str]:
        """One task, its map file served here: its response line, and the node.

        ``location`` is the task's shuffle location, as the driver read it
        from the envelope, so the envelope is parsed once here, to run.
        """
        if location:
            self.locations.add(location)
        line = _internal.run_task_value(envelope_json, plan, run_task, self.bind)
        return line, self.node_id

    def forget(self, location: str) -> bool:
        """Remove this node's directory of ``location``, once its query is done.

        Only a location some task here wrote under, and only a directory
        (an object store's copy is the driver's to remove): whether one was
        removed.
        """
        if location not in self.locations:
            return False
        self.locations.discard(location)
        scheme, found, rest = location.partition("://")
        if found and scheme != "file":
            return False
        path = rest if found else location
        shutil.rmtree(path, ignore_errors=True)
        return True


_LOST = (
    ray.exceptions.WorkerCrashedError,
    ray.exceptions.NodeDiedError,
    ray.exceptions.LocalRayletDiedError,
    ray.exceptions.ObjectLostError,
    ray.exceptions.OutOfMemoryError,
    ray.exceptions.TaskCancelledError,
    ray.exceptions.ActorDiedError,
    ray.exceptions.ActorUnavailableError,
)
"""Ray's failures of the process or node under a task: another may not fail."""

_FINAL = (
    ray.exceptions.RayTaskError,
    ray.exceptions.RuntimeEnvSetupError,
    ray.exceptions.TaskUnschedulableError,
)
"""Failures to run the task's code at all: the next attempt would fail alike."""


class RayExecutor:
    """A foreign executor whose workers are Ray tasks.

    Call ``ray.init(...)`` first; the executor holds no Ray resources
    between queries, so one may serve many::

        ray.init(address="auto")
        result = run_distributed(sql, spec, executor=RayExecutor())

    Attributes:
        max_workers: Ray tasks in flight at once, at most.
        placements: The node each completed attempt ran on, newest last
            (at most :data:`PLACEMENTS_KEPT`); clear it between queries to
            see one query's.
        options: What each task is submitted with (``num_cpus``,
            ``resources``, ``runtime_env``, ``scheduling_strategy``...), as
            given to ``ray.remote(...).options``; with ``serve_maps``, what
            each actor is created with (``runtime_env``).
        serves_map_files: Whether tasks run on long-lived actors that serve
            their map files (``serve_maps``): what ``shuffle_durability``
            ``local`` and ``both`` need.
    """

    def __init__(
        self,
        max_workers: int | None = None,
        options: Mapping[str, Any] | None = None,
        *,
        serve_maps: bool = False,
        workers_per_node: int = 1,
    ) -> None:
        """An executor of at most ``max_workers`` tasks at once.

        ``max_workers`` defaults to the cluster's CPUs divided by each task's
        ``num_cpus`` (1 unless ``options`` says). ``options`` may not set
        ``max_retries``: retries are the scheduler's.

        Raises:
            RuntimeError: If Ray is not initialized in this process.
            ValueError: If ``max_workers`` or ``workers_per_node`` is less
                than 1, or ``options`` sets ``max_retries``.
        """
        if not ray.is_initialized():
            message = (
                "RayExecutor needs Ray: call ray.init() first (ray.init(address=...) "
                "to join an existing cluster)"
            )
            raise RuntimeError(message)
        self.options = dict(options or {})
        if "max_retries" in self.options:
            message = (
                "RayExecutor options may not set max_retries: a failed task is "
                "retried by the scheduler, with its own attempt and envelope"
            )
            raise ValueError(message)
        if max_workers is None:
            # Ray declares no return type for it: a dict of resource amounts.
            resources = ray.cluster_resources()  # type: ignore[no-untyped-call]
            cpus = float(resources.get("CPU", 1.0))
            per_task = float(self.options.get("num_cpus", 1) or 1)
            max_workers = max(1, int(cpus // per_task))
        if max_workers < 1:
            message = f"max_workers must be at least 1, got {max_workers}"
            raise ValueError(message)
        if workers_per_node < 1:
            message = f"workers_per_node must be at least 1, got {workers_per_node}"
            raise ValueError(message)
        self.max_workers = max_workers
        self.placements: collections.deque[Placement] = collections.deque(
            maxlen=PLACEMENTS_KEPT
        )
        self._remote = ray.remote(_run_and_place)
        self.serves_map_files = serve_maps
        self.workers_per_node = workers_per_node
        self._lock = threading.Lock()
        # Map server address -> its actor and node, and the tasks each runs
        # now; whether an actor went since the last placement.
        self._actors: dict[str, tuple[Any, str]] = {}
        self._short = True
        self._busy: collections.Counter[str] = collections.Counter()
        self._turn = itertools.count()

    def __repr__(self) -> str:
        """The bound and the options."""
        return (
            f"RayExecutor(max_workers={self.max_workers}, options={self.options}, "
            f"serve_maps={self.serves_map_files})"
        )

    def actors(self) -> dict[str, Any]:
        """The live actors by map server address (``serve_maps=True``).

        ``workers_per_node`` on every alive node with CPUs, those missing
        placed first.
        """
        with self._lock:
            if self._short:
                self._short = False
                self._place_actors()
            return {address: actor for address, (actor, _) in self._actors.items()}

    def _place_actors(self) -> None:
        worker = ray.remote(NodeWorker)
        per_task = float(self.options.get("num_cpus", 1) or 1)
        placed = collections.Counter(node for _, node in self._actors.values())
        # Ray types an actor's methods as plain functions: not `.remote`.
        created: list[Any] = []
        for node in ray.nodes():  # type: ignore[no-untyped-call]
            cpus = float(node.get("Resources", {}).get("CPU", 0))
            if not node.get("Alive") or cpus <= 0:
                continue
            slots = max(1, int(cpus // per_task) // self.workers_per_node)
            bind = f"{node['NodeManagerAddress']}:0"
            for _ in range(self.workers_per_node - placed[node["NodeID"]]):
                created.append(
                    worker.options(
                        num_cpus=0,
                        max_concurrency=slots,
                        runtime_env=self.options.get("runtime_env"),
                        scheduling_strategy=NodeAffinitySchedulingStrategy(
                            node["NodeID"], soft=False
                        ),
                    ).remote(bind)
                )
        for actor in created:
            try:
                address, node_id = ray.get(actor.where.remote(), timeout=PLACE_WAIT)
            except ray.exceptions.RayError:
                # Its node died after Ray listed it alive: no actor there.
                ray.kill(actor)
                self._short = True
                continue
            self._actors[address] = (actor, node_id)

    def served(self) -> dict[str, int]:
        """What the live actors' map servers sent since they started.

        ``streams``, ``bytes`` and ``refused``, summed over the actors.
        """
        refs = [actor.counts.remote() for actor in self.actors().values()]
        total = collections.Counter[str]()
        for streams, sent, refused in ray.get(refs):
            total.update({"streams": streams, "bytes": sent, "refused": refused})
        return dict(total)

    def _choose(self, task: _internal.TaskPlacement) -> tuple[str, Any]:
        """The least busy actor, preferring the one holding the task's input.

        Of the least busy, the one holding most of the task's input (its
        maps on that node's disk), then each in turn. Load first: a task
        queued behind another on the node with its input waits while a node
        sits idle, which costs more than streaming it.
        """
        actors = self.actors()
        held = task.input_by_owner
        with self._lock:
            turn = next(self._turn)
            order = sorted(actors)
            address = min(
                order,
                key=lambda a: (
                    self._busy[a],
                    -held.get(a, 0),
                    (order.index(a) - turn) % len(order),
                ),
            )
            self._busy[address] += 1
            return address, actors[address]

    def _forget(self, address: str) -> None:
        """Drop a dead or killed actor: the next task places another."""
        with self._lock:
            gone = self._actors.pop(address, None)
            self._short = True
        if gone is not None:
            ray.kill(gone[0])

    def forget_location(self, location: str) -> int:
        """Remove each node's directory of ``location``: its query is done.

        The driver calls it once it has removed its own; under ``local`` a
        node's maps are only there. An actor lost meanwhile has nothing to
        remove. Returns how many nodes' directories went.
        """
        if not self.serves_map_files:
            return 0
        refs = [actor.forget.remote(location) for actor in self.actors().values()]
        removed = 0
        for ref in refs:
            try:
                removed += bool(ray.get(ref, timeout=PLACE_WAIT))
            except (*_LOST, ray.exceptions.GetTimeoutError):
                continue
        return removed

    def default_durability(self, location: str) -> str:
        """The shuffle durability of a spec naming none, under ``location``.

        On serving actors: ``local`` under a directory (each node keeps its
        maps; a lost node's run again), ``both`` under an object store URL
        (a lost node's are read from there). Ray tasks, whose processes do
        not outlive them: ``object_store``.
        """
        if not self.serves_map_files:
            return _internal.DEFAULT_SHUFFLE_DURABILITY
        return _internal.serving_cluster_durability(location)

    def _submit(
        self,
        envelope_json: str,
        plan: bytes,
        task: _internal.TaskPlacement,
        name: str,
    ) -> tuple[ray.ObjectRef[tuple[str, str]], str]:
        if not self.serves_map_files:
            options = {
                **self.options,
                # Shown by Ray as the task's name, in its dashboard.
                "name": name,
                # Off, or Ray would rerun a crashed task itself, under the
                # same attempt number, behind the scheduler's back.
                "max_retries": 0,
            }
            return self._remote.options(**options).remote(envelope_json, plan), ""
        address, actor = self._choose(task)
        ref = actor.run.options(name=name).remote(envelope_json, plan, task.location)
        return ref, address

    def run(self, envelope_json: str, plan: bytes, timeout: float | None) -> str:
        """Run one attempt as a Ray task; its worker's response line.

        Raises:
            _internal.WorkerLost: Its Ray worker or node died, or it ran past
                ``timeout`` seconds (cancelled, its worker killed).
            RuntimeError: Ray could not run the task's code at all.
        """
        task = _internal.task_placement(envelope_json)
        name = f"dfx stage {task.stage_id} map {task.map}"
        ref, address = self._submit(envelope_json, plan, task, name)
        try:
            return self._wait(task, ref, address, timeout)
        finally:
            if address:
                with self._lock:
                    self._busy[address] -= 1

    def _wait(
        self,
        task: _internal.TaskPlacement,
        ref: ray.ObjectRef[tuple[str, str]],
        address: str,
        timeout: float | None,
    ) -> str:
        ready, _ = ray.wait([ref], timeout=timeout)
        if not ready:
            if address:
                # An actor's task cannot be forced to stop: the actor goes,
                # and its map files with it.
                self._forget(address)
                what = "its actor was killed"
            else:
                ray.cancel(ref, force=True)
                what = "its Ray task was cancelled and its worker killed"
            ray.wait([ref], timeout=CANCEL_GRACE)
            message = f"timed out after {timeout:g} s; {what}"
            raise _internal.WorkerLost(message)
        try:
            line, node_id = ray.get(ref)
        except _LOST as err:
            if address:
                self._forget(address)
            message = f"the Ray worker running it died: {err}"
            raise _internal.WorkerLost(message) from err
        except _FINAL as err:
            message = f"Ray could not run the task: {ANSI_ESCAPE.sub('', str(err))}"
            raise RuntimeError(message) from err
        except ray.exceptions.RayError as err:
            message = f"Ray failed the task: {type(err).__name__}: {err}"
            raise _internal.WorkerLost(message) from err
        self.placements.append(
            Placement(
                task.stage_id,
                task.map,
                task.attempt,
                str(node_id),
            )
        )
        return str(line)
