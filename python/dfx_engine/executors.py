"""What runs a query's tasks, and where a query without a location goes.

A pool of serving workers, a process per task, or a foreign executor; and
the process's temporary shuffle root. Both ways of running a query take
them from here: :func:`dfx_engine.driver.run_distributed` for one query,
and a session from :func:`dfx_engine.session_for`, whose every query runs
distributed when it is executed (``collect()``, ``to_pandas()``, a write).
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import TYPE_CHECKING, Any, Protocol

from dfx_engine import _internal

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "WORKER_MODES",
    "Executor",
    "WorkerPool",
    "executor_for",
    "python_worker",
    "temporary_root",
]

WORKER_MODES = ("pool", "process")
"""How tasks reach worker processes, default first.

``pool``: long-lived workers (``<worker command> --serve``), each running
task after task; ``process``: one ``<worker command> ENVELOPE`` per task.
"""


class Executor(Protocol):
    """A foreign executor: runs one attempt of a task somewhere else.

    ``run`` is given the task's envelope (JSON) and encoded stage by value,
    and the attempt's timeout in seconds; it returns the worker's response
    line (what ``_internal.run_task_value`` returns). It raises
    ``_internal.WorkerLost`` when the worker, its process or its node was
    lost or the attempt timed out (the task is tried again); any other
    exception fails the task for good. The scheduler owns the rest.

    Attributes:
        max_workers: The most attempts it runs at once.
    """

    max_workers: int

    def run(self, envelope_json: str, plan: bytes, timeout: float | None) -> str:
        """One attempt's response line."""
        ...


def durability_for(executor: object, location: str) -> str:
    """The shuffle durability of a spec naming none, run on ``executor``.

    An executor may choose by its ``default_durability(location)`` (the Ray
    executor on serving actors does); any other runs under the runtime's
    default, ``object_store``: on one machine the location is a local
    directory every worker reads.
    """
    choose = getattr(executor, "default_durability", None)
    if choose is None:
        return _internal.DEFAULT_SHUFFLE_DURABILITY
    chosen: str = choose(location)
    return chosen


def python_worker() -> list[str]:
    """The command of a Python worker, to which the envelope path is appended.

    ``sys.executable`` rather than ``python``: a cloudpickled inline UDF
    loads only on the Python minor it was pickled on.
    """
    return [sys.executable, "-m", "dfx_engine.worker"]


class WorkerPool(_internal.WorkerPool):
    """Long-lived workers that run task after task, at most ``max_workers``.

    A worker is ``<worker_command> --serve`` (default: :func:`python_worker`),
    started when a task needs one and none is idle. Reuse a pool across
    queries, and close it (or use it as a context manager) when done::

        with WorkerPool(max_workers=4) as pool:
            for sql in queries:
                run_distributed(sql, spec_for(sql), pool=pool)

    Without one, :func:`dfx_engine.driver.run_distributed` makes a pool for
    the call and closes it before returning; :func:`dfx_engine.session_for`
    makes one for the session, which ends with it.
    """

    def __new__(
        cls, max_workers: int | None = None, worker_command: Sequence[str] | None = None
    ) -> WorkerPool:
        """A pool of at most ``max_workers`` (default: the cores); none started.

        Raises:
            ValueError: If ``max_workers`` is less than 1.
        """
        command = list(worker_command or python_worker())
        return super().__new__(cls, command, max_workers)


def executor_for(
    worker_command: Sequence[str] | None,
    max_workers: int | None,
    worker_mode: str,
    pool: WorkerPool | None,
    executor: Executor | None,
) -> tuple[object | None, dict[str, Any]]:
    """What runs the tasks, and the scheduler's options for it.

    ``None`` for a pool the caller does not hold: one is made for the call.

    Raises:
        ValueError: An unknown mode, or a pool or executor with settings of
            the worker processes, which it would ignore.
    """
    if worker_mode not in WORKER_MODES:
        message = (
            f"worker_mode must be one of {list(WORKER_MODES)}, got {worker_mode!r}"
        )
        raise ValueError(message)
    if executor is not None:
        ignored = {
            "pool": pool,
            "worker_command": worker_command,
            "max_workers": max_workers,
            "worker_mode": None if worker_mode == WORKER_MODES[0] else worker_mode,
        }
        given = sorted(name for name, value in ignored.items() if value is not None)
        if given:
            message = (
                f"an executor runs the tasks itself; {given} would be ignored "
                "beside it (they configure the worker processes)"
            )
            raise ValueError(message)
        return executor, {"max_workers": executor.max_workers}
    if pool is not None:
        if worker_mode != WORKER_MODES[0]:
            message = f"a worker pool was given with worker_mode={worker_mode!r}"
            raise ValueError(message)
        if worker_command is not None or max_workers is not None:
            message = (
                "a worker pool has its own worker_command and max_workers; "
                "give them to WorkerPool, not beside it"
            )
            raise ValueError(message)
        return pool, {}
    if worker_mode == "process":
        command = list(worker_command or python_worker())
        return "process", {"command": command, "max_workers": max_workers}
    return None, {}


def temporary_root() -> str:
    """The process's temporary shuffle root, removed when the process exits."""
    if not _TEMPORARY_ROOT_REMOVAL:
        _TEMPORARY_ROOT_REMOVAL.append(atexit.register(_internal.remove_temporary_root))
    return _internal.temporary_root()


_TEMPORARY_ROOT_REMOVAL: list[object] = []
"""Holds the exit hook once registered, so it is registered once."""


def stderr_is_terminal() -> bool:
    """Whether stderr is a terminal: the live line's only place (fd 2)."""
    try:
        return sys.stderr.fileno() == 2 and os.isatty(2)
    except (AttributeError, OSError, ValueError):
        return False
