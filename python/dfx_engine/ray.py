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

Ray's own retries are off: the runtime classes a failure as it does any
worker's. A failure the worker reports comes back in its response, classed
where it was made; a Ray worker process or node that died, and an attempt
past its timeout (cancelled, its worker killed), are a lost worker, tried
again; Ray failing to run the task at all is final.
"""

from __future__ import annotations

import collections
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray
import ray.exceptions

from dfx_engine import _internal
from dfx_engine.worker import run_task

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["PLACEMENTS_KEPT", "Placement", "RayExecutor", "run_in_ray_worker"]

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
"""The colour codes Ray puts in a remote traceback, dropped from messages."""

CANCEL_GRACE = 10.0
"""Seconds to wait for a cancelled Ray task to be gone before moving on."""

PLACEMENTS_KEPT = 10_000
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


_LOST = (
    ray.exceptions.WorkerCrashedError,
    ray.exceptions.NodeDiedError,
    ray.exceptions.LocalRayletDiedError,
    ray.exceptions.ObjectLostError,
    ray.exceptions.OutOfMemoryError,
    ray.exceptions.TaskCancelledError,
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
            given to ``ray.remote(...).options``.
    """

    def __init__(
        self,
        max_workers: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        """An executor of at most ``max_workers`` tasks at once.

        ``max_workers`` defaults to the cluster's CPUs divided by each task's
        ``num_cpus`` (1 unless ``options`` says). ``options`` may not set
        ``max_retries``: retries are the scheduler's.

        Raises:
            RuntimeError: If Ray is not initialized in this process.
            ValueError: If ``max_workers`` is less than 1, or ``options`` sets
                ``max_retries``.
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
        self.max_workers = max_workers
        self.placements: collections.deque[Placement] = collections.deque(
            maxlen=PLACEMENTS_KEPT
        )
        self._remote = ray.remote(_run_and_place)

    def __repr__(self) -> str:
        """The bound and the options."""
        return f"RayExecutor(max_workers={self.max_workers}, options={self.options})"

    def run(self, envelope_json: str, plan: bytes, timeout: float | None) -> str:
        """Run one attempt as a Ray task; its worker's response line.

        Raises:
            _internal.WorkerLost: Its Ray worker or node died, or it ran past
                ``timeout`` seconds (cancelled, its worker killed).
            RuntimeError: Ray could not run the task's code at all.
        """
        task = json.loads(envelope_json)
        options = {
            **self.options,
            # Shown by Ray as the task's name, in its dashboard.
            "name": f"dfx stage {task.get('stage_id')} map {task.get('partition')}",
            # Off, or Ray would rerun a crashed task itself, under the same
            # attempt number, behind the scheduler's back.
            "max_retries": 0,
        }
        ref = self._remote.options(**options).remote(envelope_json, plan)
        ready, _ = ray.wait([ref], timeout=timeout)
        if not ready:
            ray.cancel(ref, force=True)
            ray.wait([ref], timeout=CANCEL_GRACE)
            message = (
                f"timed out after {timeout:g} s; its Ray task was cancelled and its "
                "worker killed"
            )
            raise _internal.WorkerLost(message)
        try:
            line, node_id = ray.get(ref)
        except _LOST as err:
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
                int(task.get("stage_id", -1)),
                int(task.get("partition", -1)),
                int(task.get("attempt", 0)),
                str(node_id),
            )
        )
        return str(line)
