"""The driver: cut a query into stages, run them in workers, finish it here.

The plan is made once. Its stages are the ``ShuffleWriterExec`` nodes in it
(they nest: a stage reads the stages below it through ``ShuffleReaderExec``
nodes, whose only child is the upstream writer). The driver runs every stage
in worker processes, wave by wave, and then executes the root of the same
plan, whose readers find the published files::

    plan = ctx.sql(sql).execution_plan()            planned ONCE
    writers in pre-order ──► stage_id(n), to_bytes(ctx), StageInfo of the bytes
    wave 1: stages with no deps    ─► one worker per (stage, map)
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
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor, wait
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
    "Stage",
    "dataframe_for",
    "default_max_workers",
    "execute_plan",
    "find_stage",
    "find_stages",
    "plan_stages",
    "python_worker",
    "require_empty_shuffle",
    "run_distributed",
    "run_local",
    "waves_of",
]

Task = tuple[int, int]
"""``(stage_id, map)``: one unit of work, run by one worker process."""


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
        tasks: Every ``(stage_id, map)`` dispatched, one worker each, in
            dispatch order. Keyed by stage as well as map because a plan
            holds several stages, each with its own map 0.
        task_rows: Rows each task's worker reported (the rows its map
            published over all buckets), keyed as ``tasks``.
        stages: Every stage, in pre-order (the order of their ids).
        waves: The stage ids of each wave, in the order the waves ran.
    """

    def __init__(
        self,
        batches: list[pa.RecordBatch],
        tasks: list[Task],
        task_rows: dict[Task, int],
        stages: list[_internal.StageInfo],
        waves: list[list[int]],
    ) -> None:
        """Bundle a run's batches with its stages, tasks and their row counts."""
        self.batches = batches
        self.tasks = tasks
        self.task_rows = task_rows
        self.stages = stages
        self.waves = waves

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


def require_empty_shuffle(shuffle_dir: pathlib.Path) -> None:
    """Refuse a directory that already holds stage output.

    Stage ids start again at ``stage_id(0)`` for every plan, and a reader
    trusts any published map it finds. A second query in the same directory
    would therefore find the first query's files and return their contents
    as its own answer, silently if the schemas agree. One shuffle directory
    per query is the rule, and only the driver can enforce it: it knows it
    has not dispatched anything yet.

    Only stage output counts (the plugin's ``partition_glob``); the driver's
    own scratch lives in ``tasks/`` and other files are the caller's.

    Raises:
        RuntimeError: If any stage output entry is present.
    """
    stale = sorted(p.name for p in shuffle_dir.glob(_internal.partition_glob()))
    if stale:
        message = (
            f"shuffle directory {shuffle_dir} already holds stage output "
            f"{stale}: readers would take those files for this query's, "
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


def _rows_reported(task: Task, stdout: str) -> int:
    """The row count on a worker's last non-empty line of stdout.

    The last line only: anything loaded into the worker may print, and
    parsing the whole stream would turn one stray line into a confusing
    JSON error.

    Raises:
        RuntimeError: If there is no report, or it is not the expected JSON.
    """
    stage, map_index = task
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        message = f"stage {stage} map {map_index}: the worker printed no report"
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
            f"stage {stage} map {map_index}: unreadable worker report {lines[-1]!r}"
        )
        raise RuntimeError(message) from err
    return rows


def default_max_workers() -> int:
    """How many workers run at once unless told: the machine's cores."""
    return os.cpu_count() or 1


def _run_workers(
    envelopes: dict[Task, pathlib.Path],
    worker_command: Sequence[str] | None = None,
    *,
    max_workers: int | None = None,
) -> dict[Task, int]:
    """Run every task's worker, at most ``max_workers`` at once; rows per task.

    Every failure (a worker that cannot start, a non-zero exit with its
    stderr, an unreadable report) is collected, and all are raised together
    once every task has finished.

    Each task is started and awaited from a helper thread, because Python
    raises ``KeyboardInterrupt`` only in the main thread: started from the
    main thread, a Ctrl-C landing after a child's exec but before ``Popen``
    returns would lose the child's handle, and that worker would outlive the
    driver. On any early exit (an interrupt, an unexpected error) the
    ``finally`` stops further starts and kills every started worker: a worker
    left behind would keep writing into a directory its caller believes is
    settled.

    Raises:
        RuntimeError: Naming every failed task's stage and map.
    """
    command = list(worker_command or python_worker())
    bound = max_workers or default_max_workers()
    if bound < 1:
        message = f"max_workers must be at least 1, got {bound}"
        raise ValueError(message)
    running: dict[Task, subprocess.Popen[str]] = {}
    rows: dict[Task, int] = {}
    failures: dict[Task, str] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def run_one(task: Task, envelope: pathlib.Path) -> None:
        stage, map_index = task
        if stop.is_set():
            return
        try:
            worker = subprocess.Popen(  # noqa: S603 - the caller's worker command
                [*command, str(envelope)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=_worker_env(),
            )
        except OSError as err:
            failures[task] = (
                f"stage {stage} map {map_index}: could not start worker "
                f"{command[0]!r}: {err}"
            )
            return
        with lock:
            running[task] = worker
            # The main thread may have swept `running` while this worker was
            # starting: then nobody else will kill it.
            if stop.is_set():
                worker.kill()
        stdout, stderr = worker.communicate()
        if stop.is_set():
            return
        if worker.returncode != 0:
            failures[task] = (
                f"stage {stage} map {map_index}: worker exited with status "
                f"{worker.returncode}:\n{stderr.strip()}"
            )
            return
        try:
            rows[task] = _rows_reported(task, stdout)
        except RuntimeError as err:
            failures[task] = str(err)

    pool = ThreadPoolExecutor(
        max_workers=min(bound, max(len(envelopes), 1)), thread_name_prefix="dfx-task"
    )
    try:
        futures = [pool.submit(run_one, t, p) for t, p in envelopes.items()]
        wait(futures)
        for future in futures:
            # An unexpected error in a helper thread surfaces here.
            future.result()
    finally:
        stop.set()
        with lock:
            for worker in running.values():
                if worker.poll() is None:
                    worker.kill()
        pool.shutdown(wait=True, cancel_futures=True)
        for worker in running.values():
            if worker.poll() is None:
                worker.kill()
            worker.wait()
    if failures:
        report = [failures[task] for task in envelopes if task in failures]
        raise RuntimeError(
            f"{len(failures)} of {len(envelopes)} dfx tasks failed:\n"
            + "\n".join(report)
        )
    return rows


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
) -> DistributedResult:
    """Run ``sql`` with every map of every stage in its own worker process.

    ``spec.shuffle_dir`` is required (without it no stage is planned) and
    must hold no stage output yet. ``extra_udfs`` are Python functions
    registered on the driver only: encoding a stage cloudpickles them into
    the plan, so they reach the workers by value, unlike the plugin's
    functions, which travel by name and are registered on every session.

    ``worker_command`` starts a worker when the envelope path is appended
    (default: :func:`python_worker`). Any dfx host's worker reads the same
    envelope, e.g. ``["dfx", "worker"]`` for the Rust host. ``max_workers``
    bounds the workers running at once (default: the machine's cores).

    Raises:
        ValueError: If ``spec`` has no shuffle directory.
        RuntimeError: If the directory holds stage output, the plan has no
            stage or stages the plugin describes inconsistently, any worker
            of a wave failed (every failure of that wave is reported, and no
            later wave runs), or executing the root failed.
    """
    if not spec.shuffle_dir:
        message = "run_distributed needs a spec with a shuffle_dir"
        raise ValueError(message)
    shuffle_dir = pathlib.Path(spec.shuffle_dir)
    # First, so a reused directory is refused before anything is built.
    require_empty_shuffle(shuffle_dir)

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

    # Scratch goes under tasks/, never beside the stage output the plugin owns.
    envelopes = _write_tasks(stages, spec, shuffle_dir / "tasks")
    tasks: list[Task] = []
    task_rows: dict[Task, int] = {}
    for wave in waves:
        wave_envelopes = {
            task: path
            for stage_id in wave
            for task, path in envelopes[stage_id].items()
        }
        tasks.extend(wave_envelopes)
        task_rows.update(
            _run_workers(wave_envelopes, worker_command, max_workers=max_workers)
        )

    # Every stage is published: the root's readers find their files, and
    # only what lies above the last exchanges runs here.
    batches = execute_plan(ctx, plan)
    return DistributedResult(
        batches, tasks, task_rows, [stage.info for stage in stages], waves
    )


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
