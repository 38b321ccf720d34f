"""The driver: cut a query into stages, run them in workers, finish it here.

The plan is made once. Its stages are the ``ShuffleWriterExec`` nodes in it
(they nest: a stage reads the stages below it through ``ShuffleReaderExec``
nodes, whose only child is the upstream writer). The driver runs every stage
in worker processes, wave by wave, and then executes the root of the same
plan, whose readers find the published files::

    plan = ctx.sql(sql).execution_plan()            planned ONCE
    writers in pre-order ──► stage_id(n), to_bytes(ctx), StageInfo of the bytes
    wave 1: stages with no deps    ─► one task per (stage, map), on a worker
    wave 2: stages whose deps are done ...
    execute every partition of ``plan`` here (readers only read)

What the driver must get right, each a way a deployment goes wrong (the six
rules of docs/DESIGN):

1. Encode each stage *with its session* (``stage.to_bytes(ctx)``): the
   session holds the codec that can write a ``ShuffleWriterExec``; without it
   only DataFusion's own nodes survive.
2. Ship the codec ids, so a worker refuses a plan it would misread before
   decoding it.
3. Keep the shuffle directory in the session config: it then travels inside
   the encoded stage and driver and worker cannot disagree about it.
4. Run a stage only once every stage it reads is published (waves); the
   root runs last. A reader never computes: a missing file is an error.
5. Ship every stage: a union of two aggregates holds two independent stages,
   so tasks are keyed by ``(stage_id, map)``.
6. Refuse a shuffle directory that already holds stage output.

The shuffle location is a local directory (a path or ``file://``) or an
``s3://bucket/prefix`` URL; the plugin reads and writes either, and the
driver only checks it up front (:func:`local_shuffle_dir`). Envelopes and
encoded stages go into ``<dir>/tasks/`` for a local location, and for an S3
one into a local scratch directory removed when the query ends: they are
read by workers of this machine, or shipped by value (Ray).

Tasks run on long-lived workers (:class:`WorkerPool`) unless told to start a
process per task; a task whose worker died, hung or found an upstream map's
output lost runs again (see :func:`run_distributed`).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Protocol

from dfx_engine import _internal
from dfx_engine.session import SessionSpec, build_session
from dfx_engine.worker import SERVE_FLAG

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from types import TracebackType

    import pyarrow as pa
    from datafusion import DataFrame, SessionContext
    from datafusion.plan import ExecutionPlan
    from datafusion.user_defined import AggregateUDF, ScalarUDF

__all__ = [
    "WORKER_MODES",
    "DistributedResult",
    "Executor",
    "Stage",
    "TaskAbandoned",
    "TaskFailed",
    "TaskReport",
    "WorkerPool",
    "dataframe_for",
    "default_max_workers",
    "execute_plan",
    "find_stage",
    "find_stages",
    "local_shuffle_dir",
    "plan_stages",
    "python_worker",
    "report_of",
    "reported_failure",
    "run_distributed",
    "run_local",
    "waves_of",
]

Task = tuple[int, int]
"""``(stage_id, map)``: one unit of work, run by one worker at a time."""

WORKER_MODES = ("pool", "process")
"""How tasks reach workers, default first.

``pool``: long-lived workers (``<worker command> --serve``), each running
task after task, so the interpreter, DataFusion and the plugin load once per
worker rather than once per task (see :class:`WorkerPool`). ``process``: one
``<worker command> ENVELOPE`` process per task.
"""

S3_SCHEME = "s3://"
"""The scheme of a shuffle location in an S3 bucket."""

FILE_SCHEME = "file://"
"""The scheme of a local shuffle location written as a URL."""

STDERR_TAIL = 16_384
"""Bytes of a worker's stderr attached to its task's failure, at most."""


@dataclass(frozen=True)
class TaskReport:
    """What a worker reported for one task.

    Attributes:
        rows: Rows the map published, over all its buckets.
        bytes: Bytes it published, or ``None`` if the worker did not say
            (reports written before the field existed).
        elapsed_ms: The task's time inside the worker, or ``None`` likewise.
    """

    rows: int
    bytes: int | None = None
    elapsed_ms: float | None = None


LOST_OUTPUT = re.compile(r"dfx stage (\d+) map (\d+)(?: bucket \d+)?: lost output")
"""The plugin's reader error for an upstream map whose published output is gone.

The wording is the plugin's (``exchange/marker.rs``, ``exchange/reader.rs``):
the map named must be run again before the task that read it can succeed.
"""


class TaskFailed(Exception):
    """One task failed; the message names its stage and map.

    Attributes:
        retryable: Whether another attempt may succeed: the worker died, was
            killed, timed out or answered nonsense, or an upstream map's
            output was lost. An error the worker reports about the plan, its
            decoding, the SQL or schemas would recur, and is final.
        lost: The upstream ``(stage_id, map)`` whose output the task found
            missing, to rerun before retrying.
    """

    def __init__(
        self, message: str, *, retryable: bool = False, lost: Task | None = None
    ) -> None:
        """A failure, classified where it is made."""
        super().__init__(message)
        self.retryable = retryable
        self.lost = lost

    def reason(self, task: Task) -> str:
        """One line saying why: the lost output named, or the first line."""
        text = str(self)
        found = LOST_OUTPUT.search(text) if self.lost is not None else None
        line = found.group(0) if found else text.splitlines()[0]
        return line.removeprefix(f"stage {task[0]} map {task[1]}: ")


IO_FAILURE = "I/O failure"
"""Words the plugin puts in every error of shuffle storage failing under a
task (a full disk, a dropped connection): such a task is worth another
attempt (the Rust driver reads the same words, ``dfx_abi::IO_FAILURE``)."""


def reported_failure(message: str) -> TaskFailed:
    """A failure the worker reported: final, unless it lost upstream output.

    A failure of shuffle storage under the task (:data:`IO_FAILURE`) is
    retried too.
    """
    found = LOST_OUTPUT.search(message)
    if found is None:
        return TaskFailed(message, retryable=IO_FAILURE in message)
    lost = (int(found.group(1)), int(found.group(2)))
    return TaskFailed(message, retryable=True, lost=lost)


class Stage:
    """One stage of a planned query, encoded and described, ready to ship.

    Attributes:
        info: What the plugin read from the encoded bytes: id, shuffle
            directory, maps, buckets, deps, partitioning.
        plan_bytes: The writer encoded with the driver's session.
    """

    def __init__(self, info: _internal.StageInfo, plan_bytes: bytes) -> None:
        """Bundle a stage's description with its encoded bytes."""
        self.info = info
        self.plan_bytes = plan_bytes

    @property
    def stage_id(self) -> int:
        """The stage's id."""
        return self.info.stage_id

    def __repr__(self) -> str:
        """The description, without the bytes."""
        return f"Stage({self.info!r})"


class DistributedResult:
    """The answer of a distributed run and the work that produced it.

    Attributes:
        batches: The query's result.
        tasks: Every ``(stage_id, map)`` dispatched, each run by a worker,
            in dispatch order. Keyed by stage as well as map because a plan
            holds several stages, each with its own map 0.
        task_rows: Rows each task's worker reported (the rows its map
            published over all buckets), keyed as ``tasks``.
        stages: Every stage, in pre-order (the order of their ids).
        waves: The stage ids of each wave, in the order the waves ran.
        reports: Each task's whole report (rows, bytes, time), keyed as
            ``tasks``.
        attempts: Attempts made per task (1: no retry), reruns of a map
            whose output was lost included.
        retries: Why each retry or rerun happened, naming stage, map and
            attempt; empty when every task succeeded first time.
    """

    def __init__(
        self,
        batches: list[pa.RecordBatch],
        tasks: list[Task],
        reports: dict[Task, TaskReport],
        stages: list[_internal.StageInfo],
        waves: list[list[int]],
        *,
        attempts: dict[Task, int] | None = None,
        retries: list[str] | None = None,
    ) -> None:
        """Bundle a run's batches with its stages, tasks and their reports."""
        self.batches = batches
        self.tasks = tasks
        self.reports = reports
        self.task_rows = {task: report.rows for task, report in reports.items()}
        self.stages = stages
        self.waves = waves
        self.attempts = attempts if attempts is not None else dict.fromkeys(tasks, 1)
        self.retries = retries or []

    def __repr__(self) -> str:
        """Summarise without printing the batches."""
        rows = sum(batch.num_rows for batch in self.batches)
        return (
            f"DistributedResult(rows={rows}, stages={len(self.stages)}, "
            f"waves={self.waves}, tasks={len(self.tasks)})"
        )


def find_stages(plan: ExecutionPlan) -> list[ExecutionPlan]:
    """Every stage root (writer) in ``plan``, in pre-order, nested ones too.

    A writer is found by its display *containing* the node name: across the
    FFI boundary it displays as its wrapper (``FFI_ExecutionPlan:
    ShuffleWriterExec, ...``) and Python cannot downcast it. The walk
    descends into writers, because stages nest: a stage's input holds the
    readers of the stages it depends on, each with that stage's writer as
    its only child. Pre-order is the planner's numbering walk, so the n-th
    writer has id ``_internal.stage_id(n)``.
    """
    name = _internal.stage_node_name()
    found: list[ExecutionPlan] = []
    pending = [plan]
    while pending:
        node = pending.pop()
        if name in node.display():
            found.append(node)
        # Reversed so the leftmost child is popped (visited) first.
        pending.extend(reversed(node.children()))
    return found


def find_stage(plan: ExecutionPlan) -> ExecutionPlan | None:
    """The first stage of ``plan`` in pre-order, or ``None`` if it has none."""
    stages = find_stages(plan)
    return stages[0] if stages else None


def plan_stages(ctx: SessionContext, plan: ExecutionPlan) -> list[Stage]:
    """Encode every stage of ``plan`` with ``ctx`` and describe it.

    The description comes from the plugin, read out of the encoded bytes
    (a foreign node's display carries only its name): the same bytes the
    workers will run, so what is scheduled is what is shipped.

    Raises:
        RuntimeError: If the plugin's id for a writer is not the one its
            pre-order position gives (the planner and this walk disagree,
            and tasks would run under the wrong stage's name), or its map
            count is not the writer's partition count.
    """
    stages: list[Stage] = []
    for index, writer in enumerate(find_stages(plan)):
        expected = _internal.stage_id(index)
        plan_bytes = writer.to_bytes(ctx)
        try:
            info = _internal.encoded_stage_info(plan_bytes)
        except ValueError as err:
            message = f"stage {expected} (writer {index} in pre-order): {err}"
            raise RuntimeError(message) from err
        if info.stage_id != expected:
            message = (
                f"writer {index} in pre-order should be stage {expected}, but the "
                f"plugin says it is stage {info.stage_id}: the planner's numbering "
                "and this walk disagree"
            )
            raise RuntimeError(message)
        if info.maps != writer.partition_count:
            message = (
                f"stage {info.stage_id}: the plugin reports {info.maps} maps but the "
                f"writer has {writer.partition_count} partitions"
            )
            raise RuntimeError(message)
        stages.append(Stage(info, plan_bytes))
    return stages


def waves_of(stages: Sequence[_internal.StageInfo]) -> list[list[int]]:
    """Stage ids grouped into waves: a stage runs once all its deps have run.

    Each wave holds every stage whose deps are all in earlier waves, in id
    order, so independent stages (the two sides of a join) run together.

    Raises:
        RuntimeError: If a stage depends on a stage the plan does not hold,
            or the deps form a cycle (no wave could ever start them).
    """
    deps = {info.stage_id: set(info.deps) for info in stages}
    for stage_id, needs in sorted(deps.items()):
        unknown = sorted(needs - deps.keys())
        if unknown:
            message = (
                f"stage {stage_id} reads stages {unknown}, which the plan does not hold"
            )
            raise RuntimeError(message)
    done: set[int] = set()
    waves: list[list[int]] = []
    while len(done) < len(deps):
        wave = sorted(s for s, needs in deps.items() if s not in done and needs <= done)
        if not wave:
            stuck = sorted(deps.keys() - done)
            message = f"stages {stuck} depend on each other: no order can run them"
            raise RuntimeError(message)
        waves.append(wave)
        done.update(wave)
    return waves


def local_shuffle_dir(shuffle_dir: str) -> pathlib.Path | None:
    """The local directory ``shuffle_dir`` names, or ``None`` for an S3 location.

    A path or a ``file://`` URL is local; ``s3://bucket/prefix`` is not
    (the prefix may be empty). The location itself travels unchanged, as
    written, in the session config.

    Raises:
        ValueError: If it is an ``s3://`` URL without a bucket, or a URL of
            another scheme.
    """
    if shuffle_dir.startswith(S3_SCHEME):
        bucket = shuffle_dir.removeprefix(S3_SCHEME).split("/", 1)[0]
        if not bucket:
            message = f"shuffle location {shuffle_dir}: no bucket after {S3_SCHEME}"
            raise ValueError(message)
        return None
    if shuffle_dir.startswith(FILE_SCHEME):
        return pathlib.Path(shuffle_dir.removeprefix(FILE_SCHEME))
    scheme, found, _ = shuffle_dir.partition("://")
    if (
        found
        and scheme
        and all(c.isascii() and (c.isalnum() or c == "+") for c in scheme)
    ):
        message = (
            f"shuffle location {shuffle_dir}: unsupported scheme {scheme}://; use a "
            f"local path, {FILE_SCHEME} or {S3_SCHEME}bucket/prefix"
        )
        raise ValueError(message)
    return pathlib.Path(shuffle_dir)


def _register(
    ctx: SessionContext, functions: list[ScalarUDF | AggregateUDF] | None
) -> None:
    """Register caller-supplied Python functions on the driver's session."""
    from datafusion.user_defined import AggregateUDF

    for function in functions or []:
        if isinstance(function, AggregateUDF):
            ctx.register_udaf(function)
        else:
            ctx.register_udf(function)


def _worker_env() -> dict[str, str]:
    """The driver's environment, pinned to the plugin file the driver loaded.

    A worker that loaded a different build would encode and decode with a
    different codec; naming the file removes the question.
    """
    env = dict(os.environ)
    env["DFX_PLUGIN"] = _internal.plugin_path()
    return env


MALLOC_TUNABLES_VAR = "GLIBC_TUNABLES"
"""The variable glibc reads its malloc settings from at process start."""

SERVING_MALLOC_TUNABLES = (
    "glibc.malloc.mmap_threshold=4194304:glibc.malloc.trim_threshold=33554432"
)
"""The malloc settings a serving worker starts with, as the Rust host's pool.

Unless the driver's environment sets :data:`MALLOC_TUNABLES_VAR` itself
(other C libraries ignore it). A serving worker runs task after task; with
glibc's adaptive mmap threshold and heap trimming, the large blocks one task
frees go back to the kernel and the next task faults them in again, zeroed.
Fixed thresholds keep that memory between tasks.
"""


def _serving_worker_env() -> dict[str, str]:
    """:func:`_worker_env`, with :data:`SERVING_MALLOC_TUNABLES` unless set."""
    env = _worker_env()
    env.setdefault(MALLOC_TUNABLES_VAR, SERVING_MALLOC_TUNABLES)
    return env


def python_worker() -> list[str]:
    """The command of a Python worker, to which the envelope path is appended.

    ``sys.executable`` rather than ``python``: a cloudpickled inline UDF
    loads only on the Python minor it was pickled on, and a worker started
    from another interpreter fails far from the cause.
    """
    return [sys.executable, "-m", "dfx_engine.worker"]


def report_of(task: Task, report: object, line: str) -> TaskReport:
    """The :class:`TaskReport` in ``report``, a worker's parsed success line.

    Raises:
        TaskFailed: If it is for another task or its fields have the wrong
            types.
    """
    stage, map_index = task
    unreadable = TaskFailed(
        f"stage {stage} map {map_index}: unreadable worker report {line!r}",
        retryable=True,
    )
    if not isinstance(report, dict):
        raise unreadable
    rows, size, elapsed = (report.get(k) for k in ("rows", "bytes", "elapsed_ms"))
    if (
        (report.get("stage_id"), report.get("partition")) != task
        or not isinstance(rows, int)
        or isinstance(rows, bool)
        or not (size is None or (isinstance(size, int) and not isinstance(size, bool)))
        or not (
            elapsed is None
            or (isinstance(elapsed, int | float) and not isinstance(elapsed, bool))
        )
    ):
        raise unreadable
    return TaskReport(rows, size, None if elapsed is None else float(elapsed))


def _process_report(task: Task, stdout: str) -> TaskReport:
    """The report on a one-shot worker's last non-empty line of stdout.

    The last line only: anything loaded into the worker may print, and
    parsing the whole stream would turn one stray line into a confusing
    JSON error.

    Raises:
        TaskFailed: If there is no report, or it is not the expected JSON.
    """
    stage, map_index = task
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        message = f"stage {stage} map {map_index}: the worker printed no report"
        raise TaskFailed(message, retryable=True)
    try:
        report = json.loads(lines[-1])
    except ValueError as err:
        message = (
            f"stage {stage} map {map_index}: unreadable worker report {lines[-1]!r}"
        )
        raise TaskFailed(message, retryable=True) from err
    return report_of(task, report, lines[-1])


def _exit_status(returncode: int) -> str:
    """``status 3``, or ``status -9 (killed by SIGKILL)`` for a signal."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"status {returncode} (killed by {name})"
    return f"status {returncode}"


def default_max_workers() -> int:
    """How many workers run at once unless told: the machine's cores."""
    return os.cpu_count() or 1


def _bound(max_workers: int | None) -> int:
    bound = max_workers or default_max_workers()
    if bound < 1:
        message = f"max_workers must be at least 1, got {bound}"
        raise ValueError(message)
    return bound


class TaskAbandoned(Exception):
    """The run a task belonged to is being abandoned; nothing to report."""


class _PooledWorker:
    """One long-lived worker process and the file its stderr goes to.

    The stderr is a file, not a pipe: a worker writes (and flushes) its
    stderr before its response, and data written to a file is there to read
    as soon as the write returns, while a pipe's would race with the
    response on the other pipe. The file is opened for appending and emptied
    after each answered task, so it holds the current task's stderr only.
    """

    def __init__(self, command: list[str]) -> None:
        """Start ``command``; raises ``OSError`` if it cannot start."""
        self.stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        fd = self.stderr.fileno()
        # Appending: the driver empties the file under a writer that keeps
        # its own offset, which would otherwise leave a hole of NULs.
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
        try:
            self.process = subprocess.Popen(  # noqa: S603 - the caller's worker command
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.stderr,
                env=_serving_worker_env(),
            )
        except OSError:
            self.stderr.close()
            raise
        self.timed_out = False

    def stderr_tail(self) -> str:
        """The end of what the worker wrote to stderr since its last answer."""
        fd = self.stderr.fileno()
        size = os.fstat(fd).st_size
        tail = os.pread(fd, STDERR_TAIL, max(0, size - STDERR_TAIL))
        text = tail.decode("utf-8", errors="replace").strip()
        return f"[...]\n{text}" if size > STDERR_TAIL else text

    def forget_stderr(self) -> None:
        """Empty the stderr file: the next task starts with none."""
        os.ftruncate(self.stderr.fileno(), 0)

    def kill(self) -> None:
        """Kill the process if it still runs (it is reaped by :meth:`close`)."""
        if self.process.poll() is None:
            self.process.kill()

    def expire(self) -> None:
        """Kill the worker whose task ran out of time, saying so."""
        self.timed_out = True
        self.kill()

    def close(self) -> None:
        """Kill, reap, and release the pipes and the stderr file."""
        self.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                # A pipe to a dead worker may fail to flush; it is gone.
                with contextlib.suppress(OSError):
                    stream.close()
        self.stderr.close()


_live_pools: weakref.WeakSet[WorkerPool] = weakref.WeakSet()


@atexit.register
def _close_live_pools() -> None:
    """Close every pool still open at exit: its workers must not outlive us."""
    for pool in list(_live_pools):
        pool.close()


class WorkerPool:
    """Long-lived workers that run task after task, at most ``max_workers``.

    A worker is ``<worker_command> --serve`` (default: :func:`python_worker`),
    started when a task needs it and no started one is idle; it reads one
    request line per task and answers with one line (the protocol is in
    :mod:`dfx_engine.worker`). Its session stays built between tasks of the
    same query. A worker that dies fails its task, with its exit status and
    stderr, and is replaced by the next task that needs one.

    Reuse a pool across queries by passing it to :func:`run_distributed`,
    and close it (or use it as a context manager) when done::

        with WorkerPool(max_workers=4) as pool:
            for sql in queries:
                run_distributed(sql, spec_for(sql), pool=pool)

    Without one, :func:`run_distributed` makes a pool for the call and closes
    it before returning. Closing kills the workers: between tasks they hold
    nothing (a map's output is published before its answer). A pool left
    open is closed at interpreter exit, and a worker whose driver vanished
    sees the end of its input and exits.
    """

    def __init__(
        self,
        max_workers: int | None = None,
        worker_command: Sequence[str] | None = None,
    ) -> None:
        """A pool of at most ``max_workers`` (default: the cores); none started.

        Raises:
            ValueError: If ``max_workers`` is less than 1.
        """
        self.max_workers = _bound(max_workers)
        self.command = [*(worker_command or python_worker()), SERVE_FLAG]
        self._cond = threading.Condition()
        self._workers: list[_PooledWorker] = []
        self._idle: list[_PooledWorker] = []
        self._starting = 0
        self._closed = False
        _live_pools.add(self)

    def __enter__(self) -> WorkerPool:
        """The pool itself."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the pool."""
        self.close()

    def pids(self) -> list[int]:
        """The process ids of the workers started and not yet retired."""
        with self._cond:
            return [worker.process.pid for worker in self._workers]

    def run(
        self,
        task: Task,
        envelope: pathlib.Path,
        stop: threading.Event | None = None,
        timeout: float | None = None,
    ) -> TaskReport:
        """Run ``task`` on an idle worker (started if none is); its report.

        Blocks until a worker is free. ``stop`` is the run's abandon signal:
        once set, no worker is handed out and one started meanwhile is
        killed. A task still running after ``timeout`` seconds has its worker
        killed.

        Raises:
            TaskFailed: Naming stage and map: the worker could not start,
                reported an error, died or answered nonsense.
            TaskAbandoned: If ``stop`` was set.
        """
        worker = self._checkout(task, stop)
        try:
            report = self._ask(worker, task, envelope, timeout)
        except TaskFailed:
            self._release(worker)
            raise
        except BaseException:
            self._retire(worker)
            raise
        self._release(worker)
        return report

    def kill_all(self) -> None:
        """Kill and reap every worker; the pool stays usable and starts anew.

        For an abandoned run: a worker still running a task would keep
        writing into a directory its caller believes settled. A busy worker
        is reaped by the thread that runs its task, which then sees the end
        of its output; an idle one here.
        """
        with self._cond:
            idle = self._idle
            for worker in self._workers:
                worker.kill()
            self._workers, self._idle = [], []
            self._cond.notify_all()
        for worker in idle:
            worker.close()

    def close(self) -> None:
        """Kill and reap every worker; the pool then refuses work."""
        with self._cond:
            self._closed = True
        self.kill_all()
        _live_pools.discard(self)

    def _checkout(self, task: Task, stop: threading.Event | None) -> _PooledWorker:
        with self._cond:
            while True:
                if self._closed:
                    message = "the worker pool is closed"
                    raise RuntimeError(message)
                if stop is not None and stop.is_set():
                    raise TaskAbandoned
                if self._idle:
                    return self._idle.pop()
                if len(self._workers) + self._starting < self.max_workers:
                    self._starting += 1
                    break
                self._cond.wait()
        # Started outside the lock: starting takes a while, and other tasks
        # may meanwhile take workers that come free.
        try:
            worker = _PooledWorker(self.command)
        except OSError as err:
            with self._cond:
                self._starting -= 1
                self._cond.notify()
            stage, map_index = task
            message = (
                f"stage {stage} map {map_index}: could not start worker "
                f"{self.command[0]!r}: {err}"
            )
            # The same command would fail the same way: not retried.
            raise TaskFailed(message) from err
        with self._cond:
            self._starting -= 1
            self._workers.append(worker)
            # kill_all may have swept the pool while this worker was
            # starting: then nobody else would kill it.
            abandoned = self._closed or (stop is not None and stop.is_set())
        if abandoned:
            self._retire(worker)
            raise TaskAbandoned
        return worker

    def _release(self, worker: _PooledWorker) -> None:
        """Back to idle if alive and still the pool's (not swept by kill_all)."""
        with self._cond:
            keep = worker in self._workers and worker.process.poll() is None
            if keep:
                worker.forget_stderr()
                self._idle.append(worker)
                self._cond.notify()
        if not keep:
            self._retire(worker)

    def _retire(self, worker: _PooledWorker) -> None:
        """Kill, reap and forget ``worker``; a later task starts another."""
        with self._cond:
            if worker in self._workers:
                self._workers.remove(worker)
            self._cond.notify()
        worker.close()

    def _ask(
        self,
        worker: _PooledWorker,
        task: Task,
        envelope: pathlib.Path,
        timeout: float | None,
    ) -> TaskReport:
        """Send ``task`` to ``worker`` and read lines until its response.

        Lines that are not a response object are skipped: the Python worker
        keeps stray prints off its protocol stream, but a worker of another
        host, or a native library, may not.
        """
        stage, map_index = task
        process = worker.process
        if process.stdin is None or process.stdout is None:
            message = "a pooled worker was started without its pipes"
            raise RuntimeError(message)
        timer = None
        if timeout is not None:
            timer = threading.Timer(timeout, worker.expire)
            timer.daemon = True
            timer.start()
        try:
            try:
                request = json.dumps({"envelope": str(envelope)}) + "\n"
                process.stdin.write(request.encode())
                process.stdin.flush()
            except OSError:
                # The worker died before or while reading: its exit says why.
                pass
            while True:
                line = process.stdout.readline()
                if not line:
                    raise self._died(worker, task, timeout)
                text = line.decode("utf-8", errors="replace").strip()
                try:
                    response = json.loads(text)
                except ValueError:
                    continue
                if (
                    isinstance(response, dict)
                    and "stage_id" in response
                    and "partition" in response
                    and ("rows" in response or "error" in response)
                ):
                    break
        finally:
            if timer is not None:
                timer.cancel()
        ids = (response["stage_id"], response["partition"])
        if "error" in response and ids in (task, (None, None)):
            message = f"stage {stage} map {map_index}: {response['error']}"
            stderr = worker.stderr_tail()
            raise reported_failure(f"{message}\n{stderr}" if stderr else message)
        try:
            return report_of(task, response, text)
        except TaskFailed:
            # Out of step with the protocol: its next answer cannot be trusted.
            worker.kill()
            raise

    def _died(
        self, worker: _PooledWorker, task: Task, timeout: float | None
    ) -> TaskFailed:
        """The failure of ``task`` whose worker closed its stdout (it died)."""
        stage, map_index = task
        process = worker.process
        try:
            # Its stdout closes as it exits; a worker that closed it and lives
            # on is out of the protocol and is killed.
            returncode = process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            returncode = process.wait()
        if worker.timed_out:
            message = (
                f"stage {stage} map {map_index}: timed out after {timeout:g} s, "
                f"so its worker (pid {process.pid}) was killed"
            )
        else:
            message = (
                f"stage {stage} map {map_index}: worker (pid {process.pid}) exited "
                f"with {_exit_status(returncode)} while running the task"
            )
        stderr = worker.stderr_tail()
        return TaskFailed(
            f"{message}:\n{stderr}" if stderr else message, retryable=True
        )


class Executor(Protocol):
    """Where task attempts run: the driver's one interface to its workers.

    :class:`WorkerPool` (long-lived worker processes), one process per task
    (``worker_mode="process"``) and :class:`dfx_engine.ray.RayExecutor` (Ray
    tasks) implement it; :func:`run_distributed` takes one as ``executor``.
    An executor is handed the location of a task's envelope and returns the
    worker's small report: it never sees the data, nor where the shuffle
    lives. It does not retry either: it classifies each failure where it is
    made (:class:`TaskFailed`'s ``retryable`` and ``lost``; an error the
    worker reports goes through :func:`reported_failure`), and the driver's
    policy retries.

    Attributes:
        max_workers: The most attempts it runs at once; the driver hands it
            no more than that.
    """

    max_workers: int

    def run(
        self,
        task: Task,
        envelope: pathlib.Path,
        stop: threading.Event | None = None,
        timeout: float | None = None,
    ) -> TaskReport:
        """One attempt's report; raises ``TaskFailed`` or ``TaskAbandoned``."""
        ...

    def kill_all(self) -> None:
        """Stop every attempt still running; the executor stays usable.

        For an abandoned run: a worker left running would keep writing into
        a directory its caller believes settled.
        """
        ...


class _OneShot:
    """One ``<worker_command> ENVELOPE`` process per attempt."""

    def __init__(
        self, worker_command: Sequence[str] | None, max_workers: int | None = None
    ) -> None:
        """A runner of ``worker_command`` (default: :func:`python_worker`).

        Raises:
            ValueError: If ``max_workers`` is less than 1.
        """
        self.command = list(worker_command or python_worker())
        self.max_workers = _bound(max_workers)
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen[str]] = set()

    def run(
        self,
        task: Task,
        envelope: pathlib.Path,
        stop: threading.Event | None = None,
        timeout: float | None = None,
    ) -> TaskReport:
        """Start the worker, wait for it, read its report."""
        stage, map_index = task
        if stop is not None and stop.is_set():
            raise TaskAbandoned
        try:
            worker = subprocess.Popen(  # noqa: S603 - the caller's worker command
                [*self.command, str(envelope)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=_worker_env(),
            )
        except OSError as err:
            message = (
                f"stage {stage} map {map_index}: could not start worker "
                f"{self.command[0]!r}: {err}"
            )
            raise TaskFailed(message) from err
        with self._lock:
            self._running.add(worker)
            # kill_all may have swept `_running` while this worker was
            # starting: then nobody else will kill it.
            if stop is not None and stop.is_set():
                worker.kill()
        timed_out = False
        try:
            try:
                stdout, stderr = worker.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                worker.kill()
                stdout, stderr = worker.communicate()
        finally:
            with self._lock:
                self._running.discard(worker)
        if stop is not None and stop.is_set():
            raise TaskAbandoned
        if timed_out:
            message = (
                f"stage {stage} map {map_index}: timed out after {timeout:g} s, "
                f"so its worker was killed:\n{stderr.strip()}"
            )
            raise TaskFailed(message, retryable=True)
        if worker.returncode != 0:
            message = (
                f"stage {stage} map {map_index}: worker exited with "
                f"{_exit_status(worker.returncode)}:\n{stderr.strip()}"
            )
            if worker.returncode < 0:
                # Killed by a signal: another attempt may not be.
                raise TaskFailed(message, retryable=True)
            # It exited by itself: the error is its own report.
            raise reported_failure(message)
        return _process_report(task, stdout)

    def kill_all(self) -> None:
        """Kill every worker still running (each thread reaps its own)."""
        with self._lock:
            for worker in self._running:
                if worker.poll() is None:
                    worker.kill()


class _Attempts:
    """The attempts of one query's tasks: numbers, retries, upstream reruns.

    One per query, shared by its waves and their threads, so that attempt
    numbers never repeat: a rerun of an earlier wave's map is that map's
    next attempt.

    Attributes:
        made: Attempts started per task (1: it ran once).
        retries: Why each retry happened, naming stage, map and attempt.
    """

    def __init__(
        self,
        envelopes: dict[Task, pathlib.Path],
        max_attempts: int = 3,
        timeout: float | None = None,
    ) -> None:
        """Attempts of the tasks of ``envelopes`` (their attempt-0 files).

        Raises:
            ValueError: If ``max_attempts`` is less than 1 or ``timeout`` is
                not positive.
        """
        if max_attempts < 1:
            message = f"max_attempts must be at least 1, got {max_attempts}"
            raise ValueError(message)
        if timeout is not None and not timeout > 0:
            message = f"task_timeout must be positive, got {timeout}"
            raise ValueError(message)
        self.envelopes = dict(envelopes)
        self.max_attempts = max_attempts
        self.timeout = timeout
        self.made: dict[Task, int] = {}
        self.retries: list[str] = []
        self._lock = threading.Lock()
        self._rerun_locks: dict[Task, threading.Lock] = {}
        # A logical clock of finished reruns: a loss seen by an attempt that
        # began before a rerun of that map finished is already mended.
        self._clock = 0
        self._rerun_at: dict[Task, int] = {}

    def run(self, task: Task, runner: Executor, stop: threading.Event) -> TaskReport:
        """Run ``task`` until it succeeds, fails for good or runs out of attempts.

        Raises:
            TaskFailed: The final failure (after ``max_attempts``, the last
                one's message says how many were made).
            TaskAbandoned: If ``stop`` was set.
        """
        stage, map_index = task
        for tries in range(1, self.max_attempts + 1):
            if stop.is_set():
                raise TaskAbandoned
            attempt, envelope = self._next(task)
            with self._lock:
                began = self._clock
            try:
                return runner.run(task, envelope, stop, self.timeout)
            except TaskFailed as err:
                if not err.retryable or stop.is_set():
                    raise
                if tries == self.max_attempts:
                    if self.max_attempts == 1:
                        raise
                    message = (
                        f"stage {stage} map {map_index}: failed {tries} attempts, "
                        f"the last with: {err}"
                    )
                    raise TaskFailed(message) from err
                if err.lost is not None:
                    self._restore(err.lost, task, began, runner, stop)
                reason = err.reason(task)
                with self._lock:
                    self.retries.append(
                        f"stage {stage} map {map_index} attempt {attempt}: {reason}"
                    )
        message = "unreachable: every attempt returns or raises"
        raise AssertionError(message)

    def _next(self, task: Task) -> tuple[int, pathlib.Path]:
        """The next attempt number of ``task`` and its envelope file.

        Attempt 0 is the file the driver wrote; a later attempt gets a copy
        with its number in the ``attempt`` field, under its own name, so a
        worker still reading an earlier attempt's file is not disturbed.
        """
        with self._lock:
            attempt = self.made.get(task, 0)
            self.made[task] = attempt + 1
        first = self.envelopes[task]
        if attempt == 0:
            return 0, first
        path = first.with_name(f"{first.stem}.attempt-{attempt}.json")
        try:
            envelope = json.loads(first.read_text())
            envelope["attempt"] = attempt
            path.write_text(json.dumps(envelope, indent=2))
        except (OSError, ValueError, TypeError) as err:
            message = (
                f"stage {task[0]} map {task[1]}: cannot write the envelope of "
                f"attempt {attempt} from {first}: {err}"
            )
            raise TaskFailed(message) from err
        return attempt, path

    def _restore(
        self,
        lost: Task,
        task: Task,
        began: int,
        runner: Executor,
        stop: threading.Event,
    ) -> None:
        """Run the map whose output ``task`` found lost, unless already rerun.

        One rerun at a time per map: every task of a wave reading a lost map
        sees the loss, and one rerun mends it for all.

        Raises:
            TaskFailed: Final, if this query has no such map or its rerun
                failed.
        """
        stage, map_index = task
        lost_stage, lost_map = lost
        if lost not in self.envelopes:
            message = (
                f"stage {stage} map {map_index}: the output of stage {lost_stage} "
                f"map {lost_map} is lost, and this query has no such task to rerun"
            )
            raise TaskFailed(message)
        with self._lock:
            lock = self._rerun_locks.setdefault(lost, threading.Lock())
        with lock:
            with self._lock:
                if self._rerun_at.get(lost, 0) > began:
                    return
            try:
                self.run(lost, runner, stop)
            except TaskFailed as err:
                message = (
                    f"stage {stage} map {map_index}: the output of stage "
                    f"{lost_stage} map {lost_map} is lost, and running that map "
                    f"again failed: {err}"
                )
                raise TaskFailed(message) from err
            with self._lock:
                self._clock += 1
                self._rerun_at[lost] = self._clock
                self.retries.append(
                    f"stage {lost_stage} map {lost_map}: run again, its output "
                    f"being lost to stage {stage} map {map_index}"
                )


def _run_workers(
    envelopes: dict[Task, pathlib.Path],
    worker_command: Sequence[str] | None = None,
    *,
    max_workers: int | None = None,
    worker_mode: str = WORKER_MODES[0],
    pool: WorkerPool | None = None,
    attempts: _Attempts | None = None,
    executor: Executor | None = None,
) -> dict[Task, TaskReport]:
    """Run every task on a worker, at most ``max_workers`` at once; the reports.

    ``worker_mode`` is one of :data:`WORKER_MODES`. In ``pool`` mode the tasks
    run on ``pool`` (``worker_command`` and ``max_workers`` are then the
    pool's), or on a pool made for this call and closed after it. An
    ``executor`` replaces all of these: the tasks run on it, at most its
    ``max_workers`` at once.
    ``attempts`` holds the retry policy and the attempts made (default: up
    to 3 attempts of these tasks, no timeout).

    A task whose worker died, was killed, timed out or left an unreadable
    report is tried again; so is one that found an upstream map's output
    lost, after that map runs again. Every final failure (a worker that
    cannot start, an error the worker reports, the last of its attempts) is
    collected, and all are raised together once every task has finished.

    Each task is started and awaited from a helper thread, because Python
    raises ``KeyboardInterrupt`` only in the main thread: started from the
    main thread, a Ctrl-C landing after a child's exec but before ``Popen``
    returns would lose the child's handle, and that worker would outlive the
    driver. On any early exit (an interrupt, an unexpected error) the
    ``finally`` stops further starts and kills every started worker (every
    worker of the pool, too): a worker left behind would keep writing into a
    directory its caller believes is settled.

    Raises:
        RuntimeError: Naming every failed task's stage and map.
        ValueError: If ``worker_mode`` is unknown, or ``pool`` or
            ``executor`` comes with settings of the subprocess workers.
    """
    _check_mode(worker_mode, pool, worker_command, max_workers, executor)
    attempts = attempts or _Attempts(envelopes)
    if executor is not None:
        return _run_tasks(envelopes, executor, executor.max_workers, attempts)
    if worker_mode == WORKER_MODES[0]:
        if pool is not None:
            return _run_tasks(envelopes, pool, pool.max_workers, attempts)
        with WorkerPool(max_workers, worker_command) as own:
            return _run_tasks(envelopes, own, own.max_workers, attempts)
    one_shot = _OneShot(worker_command, max_workers)
    return _run_tasks(envelopes, one_shot, one_shot.max_workers, attempts)


def _check_mode(
    worker_mode: str,
    pool: WorkerPool | None,
    worker_command: Sequence[str] | None,
    max_workers: int | None,
    executor: Executor | None = None,
) -> None:
    """Refuse an unknown mode, and a pool or executor with settings it ignores."""
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
                "beside it (they configure the subprocess workers)"
            )
            raise ValueError(message)
        return
    if pool is None:
        return
    if worker_mode != WORKER_MODES[0]:
        message = f"a worker pool was given with worker_mode={worker_mode!r}"
        raise ValueError(message)
    if worker_command is not None or max_workers is not None:
        message = (
            "a worker pool has its own worker_command and max_workers; "
            "give them to WorkerPool, not beside it"
        )
        raise ValueError(message)


def _run_tasks(
    envelopes: dict[Task, pathlib.Path],
    runner: Executor,
    bound: int,
    attempts: _Attempts,
) -> dict[Task, TaskReport]:
    """:func:`_run_workers` with its runner chosen: threads, retries, cleanup."""
    reports: dict[Task, TaskReport] = {}
    failures: dict[Task, str] = {}
    stop = threading.Event()

    def run_one(task: Task) -> None:
        try:
            reports[task] = attempts.run(task, runner, stop)
        except TaskAbandoned:
            return
        except TaskFailed as err:
            if not stop.is_set():
                failures[task] = str(err)

    threads = ThreadPoolExecutor(
        max_workers=min(bound, max(len(envelopes), 1)), thread_name_prefix="dfx-task"
    )
    finished = False
    try:
        futures = [threads.submit(run_one, task) for task in envelopes]
        wait(futures)
        for future in futures:
            # An unexpected error in a helper thread surfaces here.
            future.result()
        finished = True
    finally:
        if not finished:
            stop.set()
            runner.kill_all()
        threads.shutdown(wait=True, cancel_futures=True)
        if not finished:
            # A worker started while the first sweep ran saw `stop` and was
            # killed by its thread; this sweep is for certainty.
            runner.kill_all()
    if failures:
        report = [failures[task] for task in envelopes if task in failures]
        raise RuntimeError(
            f"{len(failures)} of {len(envelopes)} dfx tasks failed:\n"
            + "\n".join(report)
        )
    return reports


def _write_tasks(
    stages: list[Stage], spec: SessionSpec, task_dir: pathlib.Path
) -> dict[int, dict[Task, pathlib.Path]]:
    """Write each stage's plan and one envelope per map; envelopes by stage."""
    task_dir.mkdir(parents=True, exist_ok=True)
    spec_json: dict[str, Any] = spec.to_json()
    envelopes: dict[int, dict[Task, pathlib.Path]] = {}
    for stage in stages:
        stage_id = stage.stage_id
        plan_path = task_dir / f"stage-{stage_id}.plan"
        plan_path.write_bytes(stage.plan_bytes)
        envelopes[stage_id] = {}
        for map_index in range(stage.info.maps):
            envelope = {
                "spec": spec_json,
                "plan": str(plan_path),
                "stage_id": stage_id,
                "partition": map_index,
                # A retry gets a copy with its own number (absent means 0).
                "attempt": 0,
            }
            path = task_dir / f"task-{stage_id}-{map_index}.json"
            path.write_text(json.dumps(envelope, indent=2))
            envelopes[stage_id][(stage_id, map_index)] = path
    return envelopes


def execute_plan(ctx: SessionContext, plan: ExecutionPlan) -> list[pa.RecordBatch]:
    """Every output partition of ``plan``, executed here, in partition order.

    Raises:
        RuntimeError: Naming the partition whose execution failed, with the
            reason (a reader's names stage, map, bucket and file).
    """
    batches: list[pa.RecordBatch] = []
    for partition in range(plan.partition_count):
        try:
            batches.extend(batch.to_pyarrow() for batch in ctx.execute(plan, partition))
        except Exception as err:
            message = f"executing partition {partition} of the query's root: {err}"
            raise RuntimeError(message) from err
    return batches


def run_distributed(
    sql: str,
    spec: SessionSpec,
    extra_udfs: list[ScalarUDF | AggregateUDF] | None = None,
    *,
    worker_command: Sequence[str] | None = None,
    max_workers: int | None = None,
    worker_mode: str = WORKER_MODES[0],
    pool: WorkerPool | None = None,
    max_attempts: int = 3,
    task_timeout: float | None = None,
    executor: Executor | None = None,
) -> DistributedResult:
    """Run ``sql`` with every map of every stage on a worker process.

    ``spec.shuffle_dir`` is required (without it no stage is planned) and
    must hold no stage output yet. It is a local directory (a path or
    ``file://``) or ``s3://bucket/prefix``, reached with the spec's
    ``store_options`` over the ``AWS_*`` environment variables (credentials
    come only from the environment, the driver's and its workers'). An S3
    location is probed before anything is built, and the envelopes and
    encoded stages then go into a local scratch directory, removed when the
    call returns. ``extra_udfs`` are Python functions
    registered on the driver only: encoding a stage cloudpickles them into
    the plan, so they reach the workers by value, unlike the plugin's
    functions, which travel by name and are registered on every session.

    ``worker_command`` starts a worker when the envelope path (or, for a
    long-lived one, ``--serve``) is appended (default: :func:`python_worker`).
    Any dfx host's worker reads the same envelope, e.g. ``["dfx", "worker"]``
    for the Rust host. ``max_workers`` bounds the workers running at once
    (default: the machine's cores).

    ``worker_mode`` is one of :data:`WORKER_MODES`: ``pool`` (the default)
    runs the tasks on long-lived workers, those of ``pool`` if given (its own
    command and bound then apply, and it stays open for the next query), or
    else of a pool made for this call and closed before it returns;
    ``process`` starts one worker process per task. These are the
    subprocess executors, the default; ``executor`` runs the tasks elsewhere
    instead (:class:`Executor`; e.g. :class:`dfx_engine.ray.RayExecutor`,
    Ray tasks), with the same envelopes, reports and retries.

    A task is tried up to ``max_attempts`` times when its worker died, was
    killed, ran longer than ``task_timeout`` seconds (default: no limit) or
    left an unreadable report; an error the worker reports (planning,
    decoding, SQL, schemas) would recur and is not retried. A task that
    finds an upstream map's output lost has that map run again first. Each
    attempt after the first gets its own envelope with its ``attempt``
    number; :attr:`DistributedResult.retries` says why each was made.

    Raises:
        ValueError: If ``spec`` has no shuffle directory, ``worker_mode`` is
            unknown, or ``pool`` comes with a ``worker_command`` or
            ``max_workers`` (the pool has its own), or without pool mode,
            or ``executor`` comes with any of those, or ``max_attempts`` or
            ``task_timeout`` is not positive; or if the shuffle location is
            a URL of another scheme, or an S3 location fails its probe
            (unreachable endpoint, missing bucket, refused credentials,
            stage output already there; the message names the URL).
        RuntimeError: If the directory holds stage output, the plan has no
            stage or stages the plugin describes inconsistently, any worker
            of a wave failed (every failure of that wave is reported, and no
            later wave runs), or executing the root failed.
    """
    if not spec.shuffle_dir:
        message = "run_distributed needs a spec with a shuffle_dir"
        raise ValueError(message)
    _check_mode(worker_mode, pool, worker_command, max_workers, executor)
    # Checked here too, so that bad settings fail before anything is built.
    _Attempts({}, max_attempts, task_timeout)
    local_dir = local_shuffle_dir(spec.shuffle_dir)
    run = functools.partial(
        _run_distributed,
        sql,
        spec,
        extra_udfs,
        worker_command=worker_command,
        max_workers=max_workers,
        worker_mode=worker_mode,
        pool=pool,
        max_attempts=max_attempts,
        task_timeout=task_timeout,
        executor=executor,
    )
    # First, so a reused or busy location is refused before anything is
    # built. The plugin's probe refuses one holding stage output (stage ids
    # restart for every plan and readers trust any published map, so a
    # second query would silently read the first one's files).
    if local_dir is not None:
        # One driver per directory, Rust or Python: a lock held for the run,
        # not a check two drivers starting together could both pass.
        with _internal.DriverLock(str(local_dir)):
            _internal.probe_location(str(local_dir), dict(spec.store_options))
            # Scratch goes under tasks/, never beside the stage output the
            # plugin owns.
            return run(local_dir / "tasks")
    # For S3 the probe also says, once and naming the URL, why the location
    # cannot be used (where every task would otherwise fail on its own), and
    # claims the prefix with a create-only lock object.
    _internal.probe_location(spec.shuffle_dir, dict(spec.store_options))
    with tempfile.TemporaryDirectory(prefix="dfx-tasks-") as scratch:
        return run(pathlib.Path(scratch) / "tasks")


def _run_distributed(
    sql: str,
    spec: SessionSpec,
    extra_udfs: list[ScalarUDF | AggregateUDF] | None,
    task_dir: pathlib.Path,
    *,
    worker_command: Sequence[str] | None,
    max_workers: int | None,
    worker_mode: str,
    pool: WorkerPool | None,
    max_attempts: int,
    task_timeout: float | None,
    executor: Executor | None,
) -> DistributedResult:
    """:func:`run_distributed` past its checks, writing envelopes into ``task_dir``."""
    ctx, _engine = build_session(spec)
    _register(ctx, extra_udfs)
    # Planned once: the stages shipped and the root executed below are parts
    # of this one plan, so they cannot disagree about a stage id or a cut.
    plan = ctx.sql(sql).execution_plan()
    stages = plan_stages(ctx, plan)
    if not stages:
        message = (
            f"the plan of {sql!r} has no {_internal.stage_node_name()}: the dfx "
            "planner did not run or saw no shuffle directory"
        )
        raise RuntimeError(message)
    for stage in stages:
        if stage.info.shuffle_dir != spec.shuffle_dir:
            message = (
                f"stage {stage.stage_id} publishes into {stage.info.shuffle_dir!r}, "
                f"not the spec's shuffle directory {spec.shuffle_dir!r}"
            )
            raise RuntimeError(message)
    waves = waves_of([stage.info for stage in stages])

    envelopes = _write_tasks(stages, spec, task_dir)
    # One for the whole query: a wave may rerun a map of an earlier one.
    attempts = _Attempts(
        {task: path for stage in envelopes.values() for task, path in stage.items()},
        max_attempts,
        task_timeout,
    )
    tasks: list[Task] = []
    reports: dict[Task, TaskReport] = {}
    # One pool for every wave: a worker that ran a map of one stage runs the
    # next stage's maps with its session already built.
    own_pool = None
    if executor is None and worker_mode == WORKER_MODES[0] and pool is None:
        pool = own_pool = WorkerPool(max_workers, worker_command)

    def run_tasks(envelopes: dict[Task, pathlib.Path]) -> dict[Task, TaskReport]:
        return _run_workers(
            envelopes,
            worker_command if pool is None else None,
            max_workers=max_workers if pool is None else None,
            worker_mode=worker_mode,
            pool=pool,
            attempts=attempts,
            executor=executor,
        )

    try:
        for wave in waves:
            wave_envelopes = {
                task: path
                for stage_id in wave
                for task, path in envelopes[stage_id].items()
            }
            tasks.extend(wave_envelopes)
            reports.update(run_tasks(wave_envelopes))
        # Every stage is published: the root's readers find their files, and
        # only what lies above the last exchanges runs here.
        batches = _read_root(ctx, plan, attempts, run_tasks)
    finally:
        if own_pool is not None:
            own_pool.close()
    return DistributedResult(
        batches,
        tasks,
        reports,
        [stage.info for stage in stages],
        waves,
        attempts=dict(attempts.made),
        retries=list(attempts.retries),
    )


def _read_root(
    ctx: SessionContext,
    plan: ExecutionPlan,
    attempts: _Attempts,
    run_tasks: Callable[[dict[Task, pathlib.Path]], object],
) -> list[pa.RecordBatch]:
    """Execute the root of ``plan``; a map whose output it finds lost runs again.

    The root still never computes a stage: the lost map runs on a worker
    (``run_tasks``, as its next attempt), and the root is executed again from
    the start, up to the query's ``max_attempts`` times.

    Raises:
        RuntimeError: If executing the root failed otherwise, named a map this
            query does not have, or kept losing output.
    """
    for tries in range(1, attempts.max_attempts + 1):
        try:
            return execute_plan(ctx, plan)
        except RuntimeError as err:
            found = LOST_OUTPUT.search(str(err))
            if found is None or tries == attempts.max_attempts:
                raise
            lost = (int(found.group(1)), int(found.group(2)))
            if lost not in attempts.envelopes:
                raise
            attempts.retries.append(
                f"stage {lost[0]} map {lost[1]}: run again, its output being lost "
                "to the query's root"
            )
            run_tasks({lost: attempts.envelopes[lost]})
    message = "unreachable: every attempt returns or raises"
    raise AssertionError(message)


def run_local(
    sql: str,
    spec: SessionSpec,
    extra_udfs: list[ScalarUDF | AggregateUDF] | None = None,
) -> list[pa.RecordBatch]:
    """Run ``sql`` in this process through the same factory, undistributed.

    The spec's shuffle directory is dropped, so the planner inserts no stage;
    anything else differing from :func:`run_distributed` is a bug in the split.
    """
    local = SessionSpec(
        tables=dict(spec.tables),
        shuffle_dir="",
        target_partitions=spec.target_partitions,
        split=spec.split,
        store_options=dict(spec.store_options),
    )
    ctx, _engine = build_session(local)
    _register(ctx, extra_udfs)
    return ctx.sql(sql).collect()


def dataframe_for(sql: str, spec: SessionSpec) -> tuple[SessionContext, DataFrame]:
    """The session and the DataFrame of ``sql``, for inspecting a plan.

    The context is returned too because it must outlive the DataFrame: its
    codecs are what ``to_bytes(ctx)`` encodes a stage with.
    """
    ctx, _engine = build_session(spec)
    return ctx, ctx.sql(sql)
