"""The driver: split a query into tasks, run each in a worker, finish it here.

What the driver must get right, each a way a deployment goes wrong (the six
rules of docs/DESIGN):

1. Encode each stage *with its session* (``stage.to_bytes(ctx)``): the
   session holds the codec that can write a ``ShuffleStageExec``; without it
   only DataFusion's own nodes survive.
2. Ship the codec ids, so a worker refuses a plan it would misread before
   decoding it.
3. Keep the shuffle directory in the session config: it then travels inside
   the encoded stage and driver and worker cannot disagree about it.
4. Wait for every worker before reading: a stage node decides between
   reading and recomputing by looking at the filesystem.
5. Ship every stage: a union of two aggregates holds two independent stages.
6. Refuse a shuffle directory that already holds stage output.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from dfx_engine import _internal
from dfx_engine.session import SessionSpec, build_session

if TYPE_CHECKING:
    from collections.abc import Sequence

    import pyarrow as pa
    from datafusion import DataFrame, SessionContext
    from datafusion.plan import ExecutionPlan
    from datafusion.user_defined import AggregateUDF, ScalarUDF

__all__ = [
    "DistributedResult",
    "dataframe_for",
    "find_stage",
    "find_stages",
    "python_worker",
    "require_empty_shuffle",
    "run_distributed",
    "run_local",
]

Task = tuple[int, int]
"""``(stage_id, partition)``: one unit of work, run by one worker process."""


class DistributedResult:
    """The answer of a distributed run and the work that produced it.

    Attributes:
        batches: The query's result.
        tasks: Every ``(stage_id, partition)`` dispatched, one worker each, in
            dispatch order. Keyed by stage as well as partition because a
            plan may hold several stages, each with its own partition 0.
        task_rows: Rows each task's worker reported, keyed as ``tasks``.
    """

    def __init__(
        self,
        batches: list[pa.RecordBatch],
        tasks: list[Task],
        task_rows: dict[Task, int],
    ) -> None:
        """Bundle a run's batches with its tasks and their row counts."""
        self.batches = batches
        self.tasks = tasks
        self.task_rows = task_rows

    def __repr__(self) -> str:
        """Summarise without printing the batches."""
        rows = sum(batch.num_rows for batch in self.batches)
        return f"DistributedResult(rows={rows}, tasks={self.tasks})"


def find_stages(plan: ExecutionPlan) -> list[ExecutionPlan]:
    """Every stage node in ``plan``, in pre-order.

    A stage is found by its display *containing* the node name: across the
    FFI boundary it displays as its wrapper (``FFI_ExecutionPlan:
    ShuffleStageExec, ...``) and Python cannot downcast it. The walk does not
    descend into a stage, because the planner never nests them. Pre-order is
    the planner's numbering walk, so the n-th stage has id
    ``_internal.stage_id(n)``.
    """
    name = _internal.stage_node_name()
    found: list[ExecutionPlan] = []
    pending = [plan]
    while pending:
        node = pending.pop()
        if name in node.display():
            found.append(node)
            continue
        # Reversed so the leftmost child is popped (visited) first.
        pending.extend(reversed(node.children()))
    return found


def find_stage(plan: ExecutionPlan) -> ExecutionPlan | None:
    """The first stage of ``plan`` in pre-order, or ``None`` if it has none."""
    stages = find_stages(plan)
    return stages[0] if stages else None


def require_empty_shuffle(shuffle_dir: pathlib.Path) -> None:
    """Refuse a directory that already holds stage output.

    A stage node streams a partition's file when it exists and computes the
    partition otherwise, and stage ids start again at ``stage_id(0)`` for
    every plan. A second query in the same directory would therefore find
    the first query's files and return their contents as its own answer,
    silently if the schemas agree. One shuffle directory per query is the
    rule, and only the driver can enforce it: it knows it has not dispatched
    anything yet.

    Only stage output counts (the plugin's ``partition_glob``); the driver's
    own scratch lives in ``tasks/`` and other files are the caller's.

    Raises:
        RuntimeError: If any stage output file is present.
    """
    stale = sorted(p.name for p in shuffle_dir.glob(_internal.partition_glob()))
    if stale:
        message = (
            f"shuffle directory {shuffle_dir} already holds stage output "
            f"{stale}: stage nodes would read those files instead of computing, "
            "and the query would return the previous query's answer. "
            "Use a fresh shuffle directory for every query."
        )
        raise RuntimeError(message)


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


def python_worker() -> list[str]:
    """The command of a Python worker, to which the envelope path is appended.

    ``sys.executable`` rather than ``python``: a cloudpickled inline UDF
    loads only on the Python minor it was pickled on, and a worker started
    from another interpreter fails far from the cause.
    """
    return [sys.executable, "-m", "dfx_engine.worker"]


def _spawn(
    envelope_path: pathlib.Path, worker_command: Sequence[str]
) -> subprocess.Popen[str]:
    """Start the worker of one task: ``worker_command`` plus the envelope."""
    return subprocess.Popen(  # noqa: S603 - the caller's worker command
        [*worker_command, str(envelope_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_worker_env(),
    )


def _spawn_all(
    envelopes: dict[Task, pathlib.Path],
    worker_command: Sequence[str],
    running: dict[Task, subprocess.Popen[str]],
    failures: list[str],
) -> None:
    """Start every task's worker, recording each in ``running`` once it exists.

    A worker that cannot start (a missing or non-executable program) is a
    failure of its task, appended to ``failures``; the other tasks still run,
    so the caller reports every failure at once.

    The workers are started from a helper thread because Python raises
    ``KeyboardInterrupt`` only in the main thread. Started from the main
    thread, a Ctrl-C landing after a child's exec but before ``Popen``
    returns would lose the child's handle, and that worker would outlive the
    driver. Here an interrupt stops further spawning, waits for the spawn in
    progress, and leaves every started worker in ``running`` for the caller
    to kill.
    """
    stop = threading.Event()

    def spawn_every_task() -> None:
        for task, path in envelopes.items():
            if stop.is_set():
                return
            try:
                running[task] = _spawn(path, worker_command)
            except OSError as err:
                stage, partition = task
                failures.append(
                    f"stage {stage} partition {partition}: could not start "
                    f"worker {worker_command[0]!r}: {err}"
                )

    spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dfx-spawn")
    try:
        spawner.submit(spawn_every_task).result()
    finally:
        stop.set()
        spawner.shutdown(wait=True)


def _rows_reported(task: Task, stdout: str) -> int:
    """The row count on a worker's last non-empty line of stdout.

    The last line only: anything loaded into the worker may print, and
    parsing the whole stream would turn one stray line into a confusing
    JSON error.

    Raises:
        RuntimeError: If there is no report, or it is not the expected JSON.
    """
    stage, partition = task
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        message = f"stage {stage} partition {partition}: the worker printed no report"
        raise RuntimeError(message)
    try:
        report = json.loads(lines[-1])
        rows = report["rows"]
        if (report["stage_id"], report["partition"]) != task or not isinstance(
            rows, int
        ):
            raise ValueError(lines[-1])
    except (ValueError, KeyError, TypeError) as err:
        message = (
            f"stage {stage} partition {partition}: unreadable worker report "
            f"{lines[-1]!r}"
        )
        raise RuntimeError(message) from err
    return rows


def _run_workers(
    envelopes: dict[Task, pathlib.Path], worker_command: Sequence[str] | None = None
) -> dict[Task, int]:
    """Run every task's worker at once; rows per task.

    Every failure (a worker that cannot start, a non-zero exit with its
    stderr, an unreadable report) is collected, and all are raised together
    once every worker has finished. The ``finally`` kills and reaps whatever
    is still running when this returns early (an interrupt, an unexpected
    error): a worker left behind would keep writing into a directory its
    caller believes is settled.

    Raises:
        RuntimeError: Naming every failed task's stage and partition.
    """
    running: dict[Task, subprocess.Popen[str]] = {}
    rows: dict[Task, int] = {}
    failures: list[str] = []
    try:
        _spawn_all(envelopes, worker_command or python_worker(), running, failures)
        for task, worker in running.items():
            stdout, stderr = worker.communicate()
            stage, partition = task
            if worker.returncode != 0:
                failures.append(
                    f"stage {stage} partition {partition}: worker exited with "
                    f"status {worker.returncode}:\n{stderr.strip()}"
                )
                continue
            try:
                rows[task] = _rows_reported(task, stdout)
            except RuntimeError as err:
                failures.append(str(err))
    finally:
        for worker in running.values():
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    if failures:
        raise RuntimeError(
            f"{len(failures)} of {len(envelopes)} dfx tasks failed:\n"
            + "\n".join(failures)
        )
    return rows


def run_distributed(
    sql: str,
    spec: SessionSpec,
    extra_udfs: list[ScalarUDF | AggregateUDF] | None = None,
    *,
    worker_command: Sequence[str] | None = None,
) -> DistributedResult:
    """Run ``sql`` with every stage partition in its own worker process.

    ``spec.shuffle_dir`` is required (without it no stage is planned) and
    must hold no stage output yet. ``extra_udfs`` are Python functions
    registered on the driver only: encoding the stage cloudpickles them into
    the plan, so they reach the workers by value, unlike the plugin's
    functions, which travel by name and are registered on every session.

    ``worker_command`` starts a worker when the envelope path is appended
    (default: :func:`python_worker`). Any dfx host's worker reads the same
    envelope, e.g. ``["dfx", "worker"]`` for the Rust host.

    Raises:
        ValueError: If ``spec`` has no shuffle directory.
        RuntimeError: If the directory holds stage output, the plan has no
            stage, or any worker failed.
    """
    if not spec.shuffle_dir:
        message = "run_distributed needs a spec with a shuffle_dir"
        raise ValueError(message)
    shuffle_dir = pathlib.Path(spec.shuffle_dir)
    # First, so a reused directory is refused before anything is built.
    require_empty_shuffle(shuffle_dir)

    ctx, _engine = build_session(spec)
    _register(ctx, extra_udfs)
    stages = find_stages(ctx.sql(sql).execution_plan())
    if not stages:
        message = (
            f"the plan of {sql!r} has no {_internal.stage_node_name()}: the dfx "
            "planner did not run or saw no shuffle directory"
        )
        raise RuntimeError(message)

    # Scratch goes under tasks/, never beside the stage files the plugin owns.
    task_dir = shuffle_dir / "tasks"
    task_dir.mkdir(parents=True, exist_ok=True)
    spec_json: dict[str, Any] = spec.to_json()
    envelopes: dict[Task, pathlib.Path] = {}
    for index, stage in enumerate(stages):
        # The display of a foreign node carries no id; the planner numbered
        # stages in the same pre-order walk, so the id follows from the index.
        stage_id = _internal.stage_id(index)
        plan_path = task_dir / f"stage-{stage_id}.plan"
        plan_path.write_bytes(stage.to_bytes(ctx))
        for partition in range(stage.partition_count):
            task = (stage_id, partition)
            envelope = {
                "spec": spec_json,
                "plan": str(plan_path),
                "stage_id": stage_id,
                "partition": partition,
            }
            path = task_dir / f"task-{stage_id}-{partition}.json"
            path.write_text(json.dumps(envelope, indent=2))
            envelopes[task] = path

    task_rows = _run_workers(envelopes, worker_command)

    # Every stage partition now has its file: planning and running the query
    # again streams them, and only the final merge happens here.
    batches = ctx.sql(sql).collect()
    return DistributedResult(batches, list(envelopes), task_rows)


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
