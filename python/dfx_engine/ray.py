"""Run a query's tasks as Ray tasks: ``run_distributed(..., executor=RayExecutor())``.

Each ``(stage, map)`` task is one Ray task, in a Ray worker process on any
node of the cluster. The driver reads the task's envelope and encoded stage
from its own disk and passes both to the Ray task as arguments; the task
writes them into a temporary directory of its node and runs
:func:`dfx_engine.worker.run_task`, the code of ``python -m
dfx_engine.worker``, on them. The worker process loads the plugin from the
``dfx-engine`` wheel installed on its node (install the same wheel on every
node: ``pip install dfx-engine[ray]`` from ``python/build-wheel.sh``'s
wheel). What moves where::

    what              from                   through               to
    ----              ----                   -------               --
    envelope (JSON),  the driver's disk,     Ray task arguments    a temp dir of the
    encoded stage     read per attempt       (object store)        Ray worker; run_task
    shuffle data      the Ray worker         never Ray             the shuffle location
                      (a map's output)                             (S3, or a directory
                                                                   every node mounts),
                                                                   read back by later
                                                                   stages and the driver
    report            the Ray worker         the task's result     the driver: a
                      (rows, bytes, time)    or its error          TaskReport

Only those small values pass through Ray; shuffle data goes between the
workers and the shuffle location, which this module never looks at. On a
cluster that is an ``s3://bucket/prefix`` location (or a directory mounted
on every node), which the driver's final read reaches too. The spec's
``store_options`` say how S3 is reached; credentials come from each
process's environment, e.g. ``RayExecutor(options={"runtime_env":
{"env_vars": {...}}})`` for the workers.

Ray's own task retries are off: a failure is classified as the driver's
other executors classify it, and the driver's policy retries. An exception
the task raised (a refusal or error of the worker code) comes back with its
remote traceback and is final, unless it reports an upstream map's output
lost; a worker process or node that died, and a task past its timeout
(cancelled, its worker killed), may succeed on another attempt.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import tempfile
import threading
from typing import TYPE_CHECKING, Any

import ray
import ray.exceptions

from dfx_engine.driver import (
    TaskAbandoned,
    TaskFailed,
    TaskReport,
    report_of,
    reported_failure,
)
from dfx_engine.worker import SessionCache, run_task

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["RayExecutor", "run_in_ray_worker"]

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
"""The colour codes Ray puts in a remote traceback, dropped from messages."""

CANCEL_GRACE = 10.0
"""Seconds to wait for a cancelled Ray task to be gone before moving on."""

_SESSIONS = SessionCache()
"""In each Ray worker process: the sessions of the specs it ran lately.

Ray reuses a worker process for task after task, so a query's later tasks
find the session built (plugin loaded, tables listed), as in a pooled worker.
"""


def run_in_ray_worker(
    envelope: dict[str, Any], plan: bytes, name: str
) -> dict[str, Any]:
    """The body of every Ray task: run the task of ``envelope``; its report.

    ``envelope`` is the driver's envelope and ``plan`` the encoded stage its
    ``plan`` names, both passed by value: this process may run on a node that
    cannot see the driver's disk. They are written into a temporary
    directory, the envelope's ``plan`` pointing at the copy, under the
    envelope's file name ``name`` (so errors name the task as the driver's
    file does), and removed when the task ends (or, if its process dies, by
    a later task: see :func:`_scratch_root`).

    Raises:
        dfx_engine.worker.TaskError: For every refusal and failure, naming
            stage and map; Ray carries it to the driver with its traceback.
    """
    with tempfile.TemporaryDirectory(prefix="task-", dir=_scratch_root()) as scratch:
        directory = pathlib.Path(scratch)
        plan_path = (
            directory / pathlib.Path(str(envelope.get("plan", "stage.plan"))).name
        )
        plan_path.write_bytes(plan)
        path = directory / pathlib.PurePath(name).name
        path.write_text(json.dumps({**envelope, "plan": str(plan_path)}))
        return run_task(path, _SESSIONS)


def _scratch_root() -> pathlib.Path:
    """This process's directory for its tasks' files, its dead siblings' swept.

    ``<tmp>/dfx-ray-tasks-<uid>/<pid>``: a task's own directory inside is
    removed when the task ends, but not when its process dies (a crash, a
    cancelled task's kill), so each task first removes the directories of
    processes that no longer exist.
    """
    root = pathlib.Path(tempfile.gettempdir()) / f"dfx-ray-tasks-{os.getuid()}"
    root.mkdir(mode=0o700, exist_ok=True)
    for entry in root.iterdir():
        if entry.name.isdigit() and not _alive(int(entry.name)):
            shutil.rmtree(entry, ignore_errors=True)
    mine = root / str(os.getpid())
    mine.mkdir(mode=0o700, exist_ok=True)
    return mine


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (this user's: the root is per user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _task_arguments(
    task: tuple[int, int], envelope: pathlib.Path
) -> tuple[dict[str, Any], bytes, str]:
    """The envelope of ``task`` and the encoded stage it names, read here.

    Raises:
        TaskFailed: Final, naming stage and map, if either cannot be read (a
            retry would read the same files).
    """
    stage, map_index = task
    try:
        parsed = json.loads(envelope.read_text())
        if not isinstance(parsed, dict) or not isinstance(parsed.get("plan"), str):
            message = "not an envelope with a plan"
            raise TypeError(message)
        plan = pathlib.Path(parsed["plan"]).read_bytes()
    except (OSError, ValueError, TypeError) as err:
        message = (
            f"stage {stage} map {map_index}: cannot read the task envelope "
            f"{envelope} or the stage it names: {err}"
        )
        raise TaskFailed(message) from err
    return parsed, plan, envelope.name


_RETRYABLE = (
    ray.exceptions.WorkerCrashedError,
    ray.exceptions.NodeDiedError,
    ray.exceptions.LocalRayletDiedError,
    ray.exceptions.ObjectLostError,
    ray.exceptions.OutOfMemoryError,
)
"""Ray's failures of the process or node under a task: another may not fail."""

_FINAL = (
    ray.exceptions.RuntimeEnvSetupError,
    ray.exceptions.TaskUnschedulableError,
)
"""Failures to start a task at all: the next attempt would fail alike."""


class RayExecutor:
    """An :class:`~dfx_engine.driver.Executor` whose workers are Ray tasks.

    Call ``ray.init(...)`` first (``ray.init(address="auto")`` on a node of
    an existing cluster); the executor holds no Ray resources between
    queries, so one may serve many::

        ray.init(address="auto")
        executor = RayExecutor()
        result = run_distributed(sql, spec, executor=executor)

    Attributes:
        max_workers: Ray tasks in flight at once, at most.
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
        ``max_retries``: retries are the driver's.

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
                "retried by the driver, with its own attempt and envelope"
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
        self._remote = ray.remote(run_in_ray_worker)
        self._lock = threading.Lock()
        self._running: set[ray.ObjectRef[dict[str, Any]]] = set()

    def __repr__(self) -> str:
        """The bound and the options, not the tasks."""
        return f"RayExecutor(max_workers={self.max_workers}, options={self.options})"

    def run(
        self,
        task: tuple[int, int],
        envelope: pathlib.Path,
        stop: threading.Event | None = None,
        timeout: float | None = None,
    ) -> TaskReport:
        """Run one attempt of ``task`` as a Ray task; the worker's report.

        Raises:
            TaskFailed: Naming stage and map, classified for the driver's
                retries: the task raised (with its remote traceback; final
                unless an upstream map's output was lost), its worker or node
                died, or it ran past ``timeout`` seconds.
            TaskAbandoned: If ``stop`` was set.
        """
        stage, map_index = task
        if stop is not None and stop.is_set():
            raise TaskAbandoned
        options = {
            **self.options,
            # Shown by Ray as the task's name, in its traceback and dashboard.
            "name": f"dfx stage {stage} map {map_index}",
            # Off, or Ray would rerun a crashed task itself, under the same
            # attempt number, behind the driver's back.
            "max_retries": 0,
        }
        # By value: a Ray worker need not see this machine's disk.
        arguments = _task_arguments(task, envelope)
        ref = self._remote.options(**options).remote(*arguments)
        with self._lock:
            self._running.add(ref)
            # kill_all may have swept `_running` while this task was being
            # submitted: then nobody else will cancel it.
            if stop is not None and stop.is_set():
                ray.cancel(ref, force=True)
        try:
            ready, _ = ray.wait([ref], timeout=timeout)
            if not ready:
                ray.cancel(ref, force=True)
                ray.wait([ref], timeout=CANCEL_GRACE)
                message = (
                    f"stage {stage} map {map_index}: timed out after {timeout:g} s, "
                    "so its Ray task was cancelled and its worker killed"
                )
                raise TaskFailed(message, retryable=True)
            response = self._get(task, ref, stop)
        finally:
            with self._lock:
                self._running.discard(ref)
        if stop is not None and stop.is_set():
            raise TaskAbandoned
        return report_of(task, response, repr(response))

    def _get(
        self,
        task: tuple[int, int],
        ref: ray.ObjectRef[dict[str, Any]],
        stop: threading.Event | None,
    ) -> object:
        """The finished task's return value, or its failure classified."""
        stage, map_index = task
        prefix = f"stage {stage} map {map_index}"
        try:
            return ray.get(ref)
        except ray.exceptions.TaskCancelledError as err:
            if stop is not None and stop.is_set():
                raise TaskAbandoned from err
            message = f"{prefix}: its Ray task was cancelled: {err}"
            raise TaskFailed(message, retryable=True) from err
        except ray.exceptions.RayTaskError as err:
            # str(err) is the remote traceback, ending with the worker's own
            # message (which names stage, map and envelope, and may report
            # an upstream map's output lost).
            remote = ANSI_ESCAPE.sub("", str(err))
            raise reported_failure(f"{prefix}: the Ray task failed:\n{remote}") from err
        except _RETRYABLE as err:
            message = f"{prefix}: the Ray worker running it died: {err}"
            raise TaskFailed(message, retryable=True) from err
        except _FINAL as err:
            message = f"{prefix}: Ray could not run the task: {err}"
            raise TaskFailed(message) from err
        except ray.exceptions.RayError as err:
            message = f"{prefix}: Ray failed the task: {type(err).__name__}: {err}"
            raise TaskFailed(message, retryable=True) from err

    def kill_all(self) -> None:
        """Cancel every task still running, killing its worker process.

        Each task's thread sees its cancellation and reports nothing.
        """
        with self._lock:
            running = list(self._running)
        for ref in running:
            ray.cancel(ref, force=True)
