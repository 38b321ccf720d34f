"""The driver: plan a query with the user's session, run its stages, read its root.

Everything that needs the user's datafusion-python session stays here:
planning, encoding each stage with that session (its codecs, its Python
UDFs, cloudpickled into the plan) and executing the root of the same plan.
Everything else is the runtime's, the one the Rust host links (through
``dfx_engine._internal``): the claim on the shuffle location, the stage
graph and its waves, the executors, attempts, timeouts and the reruns of
lost output::

    ClaimedLocation(spec)                      lock / probe the location
    df = ctx.sql(sql), or the caller's DataFrame
    plan = df.execution_plan()                 planned ONCE, with the session
    plan.to_bytes(ctx) ─► plan_stages          encoded with the same session,
                                               cut into its stages by the plugin
    _internal.prepare(encoded)                 described by the plugin, each
                                               cut for its maps (a task
                                               carries its own files): the
                                               runtime's step, as the Rust host's
    Scheduler(executor).run(spec, stages)      waves, attempts, reruns
    run.read_root(location, read)              the root of the same plan, its
                                               readers handed the last stages'
                                               ranges; read again after lost
                                               maps reran

Tasks run on long-lived workers (:class:`WorkerPool`) by default, on one
process per task with ``worker_mode="process"``, or on a foreign executor
such as :class:`dfx_engine.ray.RayExecutor`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from datafusion import DataFrame
from datafusion.plan import ExecutionPlan

from dfx_engine import _internal
from dfx_engine.dataframes import (
    driven_by_its_own_session,
    drives,
    memory_table_limit_of,
    not_a_dfx_dataframe,
    plain_memory_table_errors,
    session_of,
    set_memory_table_limit,
)
from dfx_engine.executors import (
    WORKER_MODES,
    Executor,
    WorkerPool,
    durability_for,
    executor_for,
    python_worker,
    stderr_is_terminal,
    temporary_root,
)
from dfx_engine.session import (
    SessionSpec,
    build_session,
    effective_target_partitions,
    plain_planning_errors,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    import pyarrow as pa
    from datafusion import SessionContext
    from datafusion.user_defined import AggregateUDF, ScalarUDF

__all__ = [
    "WORKER_MODES",
    "DistributedResult",
    "Executor",
    "TaskReport",
    "WorkerPool",
    "dataframe_for",
    "encode_stages",
    "execute_plan",
    "find_stage",
    "find_stages",
    "python_worker",
    "run_distributed",
    "run_local",
]

Task = tuple[int, int]
"""``(stage_id, map)``: one unit of work, run by one worker at a time."""


@dataclass(frozen=True)
class TaskReport:
    """What one task reported, and how the driver saw it.

    Attributes:
        rows: Rows the map published, over all its buckets.
        bytes: Bytes it published, or ``None`` if its worker did not say.
        elapsed_ms: The task's time inside the worker, or ``None`` likewise.
        wall_ms: The driver's time for it, from dispatch to report.
        worker: The pid of the worker process that ran it, when known.
        attempt: The attempt that succeeded (0: the first).
    """

    rows: int
    bytes: int | None = None
    elapsed_ms: float | None = None
    wall_ms: float | None = None
    worker: int | None = None
    attempt: int = 0


class DistributedResult:
    """The answer of a distributed run and the work that produced it.

    Attributes:
        batches: The query's result.
        tasks: Every ``(stage_id, map)`` dispatched, in dispatch order.
        task_rows: Rows each task's worker reported, keyed as ``tasks``.
        stages: Every stage, in pre-order (the order of their ids).
        waves: The stage ids of each wave, in the order the waves ran.
        reports: Each task's whole report, keyed as ``tasks``.
        attempts: Attempts made per task (1: no retry), reruns of a map
            whose output was lost included.
        retries: Why each retry or rerun happened, naming stage, map and
            attempt; empty when every task succeeded first time.
        decisions: The adaptive decisions made as stages became ready, in
            order: dicts of ``stage_id``, ``planned_tasks``, ``tasks`` and
            ``reason`` (coalescing a stage's small partitions into fewer
            tasks; ``engine_options={"coalesce": "off"}`` turns it off).
    """

    def __init__(self, batches: list[pa.RecordBatch], run: _internal.QueryRun) -> None:
        """The run's batches, and what the scheduler says of its tasks."""
        self.batches = batches
        self.tasks: list[Task] = run.tasks
        self.reports = {task: TaskReport(**r) for task, r in run.reports.items()}
        self.task_rows = {task: report.rows for task, report in self.reports.items()}
        self.stages = run.stages
        self.waves = run.waves
        self.attempts = run.attempts
        self.retries = run.retries
        self.decisions: list[dict[str, Any]] = run.decisions

    def __repr__(self) -> str:
        """Summarise without printing the batches."""
        rows = sum(batch.num_rows for batch in self.batches)
        return (
            f"DistributedResult(rows={rows}, stages={len(self.stages)}, "
            f"waves={self.waves}, tasks={len(self.tasks)})"
        )


_ROOT_NODE_NAME = _internal.ROOT_NODE_NAME
"""The node a driving session puts on its plans; it displays as its wrapper."""


def _has_readers(plan: ExecutionPlan) -> bool:
    """Whether ``plan`` reads any stage.

    A reader is found by its display *containing* the node name: across the
    FFI boundary it displays as its wrapper, and Python cannot downcast it.
    """
    name = _internal.reader_node_name()
    if name is None:
        return False
    pending = [plan]
    while pending:
        node = pending.pop()
        if name in node.display():
            return True
        pending.extend(node.children())
    return False


def encode_stages(ctx: SessionContext, plan: ExecutionPlan) -> list[bytes]:
    """Every stage of ``plan``, in pre-order, encoded with ``ctx``.

    The planner hands each reader back carrying the stage it reads, so no
    stage nests in another: the plan is encoded with its session (the
    session holds the codec that can write the plugin's nodes and the
    Python UDFs the plan calls, pickled by value) and the plugin cuts the
    bytes into its stages, each holding its own nodes only. The n-th has id
    ``_internal.stage_id(n)``.
    """
    if not _has_readers(plan):
        return []
    return _internal.plan_stages(plan.to_bytes(ctx))


def find_stages(ctx: SessionContext, plan: ExecutionPlan) -> list[ExecutionPlan]:
    """Every stage of ``plan`` (its writer), in pre-order, decoded with ``ctx``.

    Each holds its own nodes only: its readers carry no stage.
    """
    return [ExecutionPlan.from_bytes(ctx, stage) for stage in encode_stages(ctx, plan)]


def find_stage(ctx: SessionContext, plan: ExecutionPlan) -> ExecutionPlan | None:
    """The first stage of ``plan`` in pre-order, or ``None`` if it has none."""
    stages = find_stages(ctx, plan)
    return stages[0] if stages else None


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


def read_head(
    ctx: SessionContext, plan: ExecutionPlan, ranges: str | None
) -> list[pa.RecordBatch]:
    """:func:`execute_plan` of the query's head, its readers handed ``ranges``.

    ``ranges`` is the plugin's ``shuffle_ranges`` setting the runtime gives
    a root read (where each bucket of the last stages lies), so the readers
    read no marker; ``None`` leaves them reading the markers.
    """
    if ranges is None:
        return execute_plan(ctx, plan)
    key = f"{_internal.config_prefix()}.{_internal.SHUFFLE_RANGES}"
    quoted = ranges.replace("'", "''")
    ctx.sql(f"SET {key} = '{quoted}'")
    try:
        return execute_plan(ctx, plan)
    finally:
        # The next query of the session reads stages of its own.
        ctx.sql(f"SET {key} = ''")


def run_distributed(
    query: str | DataFrame,
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
    speculate: float | None = None,
    progress: bool = True,
) -> DistributedResult:
    """Run ``query`` with every map of every stage on a worker.

    A plan dfx's planner keeps whole (no wider than a task's partitions and
    than this machine's cores, ``dfx_engine.collapse_stages``) has no stage:
    it runs here, and no task runs.

    ``query`` is SQL, or a DataFrame built on a dfx session of ``spec``
    (:func:`dfx_engine.session_for`); SQL becomes that session's DataFrame,
    and both take one path from there. A table the DataFrame holds in
    memory (``from_arrow``, ``register_record_batches``) is written once into
    the shuffle location for the workers (:mod:`dfx_engine.dataframes`).

    The query runs in ``spec.shuffle_dir``, which must hold no stage output
    yet, or in a fresh location under ``spec.shuffle_root`` (under a
    temporary root of the process when the spec names neither), removed
    once the answer is read unless ``spec.keep_shuffle``, and kept after a
    failure, the error naming it. Either is a local directory (a path or
    ``file://``) or ``s3://bucket/prefix``, reached with the spec's
    ``store_options`` and the ``AWS_*`` variables of each process's
    environment. ``extra_udfs`` are Python functions
    registered on the driver only: encoding a stage pickles them into the
    plan, so they reach the workers by value.

    ``worker_command`` starts a worker (default: :func:`python_worker`; any
    dfx host's worker reads the same envelopes, e.g. ``["dfx", "worker"]``);
    ``max_workers`` bounds the workers running at once (default: the
    cores). ``worker_mode`` is one of :data:`WORKER_MODES`: ``pool`` runs
    the tasks on ``pool`` if given (its own command and bound then apply),
    else on a pool made for this call; ``process`` starts a process per
    task. ``executor`` runs the tasks elsewhere instead (:class:`Executor`).

    A task is tried up to ``max_attempts`` times when its worker died, was
    killed, ran past ``task_timeout`` seconds, left no readable report, or
    reported a storage failure; an error the worker reports about the task
    would recur and is final. A task (or the root) that finds an upstream
    map's output lost has that map run again first. With ``speculate`` (a
    factor above 1), once half of a stage's tasks have finished, a task
    running that many times their median gets a second attempt on an idle
    slot; the first to publish is the task's, and the other is stopped.

    A query whose tasks run past about a second shows one live line on
    stderr while they run (stages and tasks done, tasks running, bytes
    published, retries; the same line as ``dfx run``'s), redrawn in place
    and erased when they end; only when stderr is a terminal, and never
    with ``progress=False``.

    Raises:
        ValueError: Settings that contradict each other (a location and
            a root), a location of another scheme, one in use
            or holding stage output, or an S3 location failing its probe.
        UnsupportedQueryError: A query datafusion-python's planner boundary
            refuses (:mod:`dfx_engine.session` says which), in plain words.
        MemoryTableTooLargeError: An in-memory table over
            ``dfx_engine.memory_table_limit``, naming its size and the limit.
        RuntimeError: If any task of a wave failed
            for good (every failure of that wave is reported, and no later
            wave runs), or reading the root failed.
    """
    if not spec.shuffle_dir and not spec.shuffle_root:
        spec = dataclasses.replace(spec, shuffle_root=temporary_root())
    executor_of, options = executor_for(
        worker_command, max_workers, worker_mode, pool, executor
    )
    if spec.shuffle_durability is None:
        durability = durability_for(executor_of, spec.shuffle_dir or spec.shuffle_root)
        spec = dataclasses.replace(spec, shuffle_durability=durability)
    own_pool = None
    if executor_of is None:
        executor_of = own_pool = WorkerPool(max_workers, worker_command)
    try:
        scheduler = _internal.Scheduler(
            executor_of,
            max_attempts=max_attempts,
            task_timeout=task_timeout,
            speculate=speculate,
            progress=progress and stderr_is_terminal(),
            **options,
        )
        # First, so a used or busy location is refused before anything is
        # built; under a root, a fresh location is made and claimed.
        with _internal.ClaimedLocation(spec.to_json_text()) as claim:
            try:
                result = _run_claimed(
                    query, spec, claim, scheduler, executor_of, extra_udfs
                )
            except BaseException as err:
                # Kept, and named, when the workers left something in it.
                kept = claim.finish(answered=False)
                if kept is not None:
                    _name_kept(err, kept)
                raise
            # The answer is read: a location made under a root goes, on
            # the driver's machine and on the nodes of an executor whose
            # workers kept their maps there.
            location = json.loads(claim.query_spec_json)["shuffle_dir"]
            if claim.finish(answered=True) is None and spec.shuffle_root:
                forget = getattr(executor_of, "forget_location", None)
                if forget is not None and not spec.keep_shuffle:
                    forget(location)
        return result
    finally:
        if own_pool is not None:
            own_pool.close()


def _run_claimed(
    query: str | DataFrame,
    spec: SessionSpec,
    claim: _internal.ClaimedLocation,
    scheduler: _internal.Scheduler,
    executor_of: object,
    extra_udfs: list[ScalarUDF | AggregateUDF] | None,
) -> DistributedResult:
    """:func:`run_distributed` in the location ``claim`` holds."""
    query_spec = SessionSpec.from_json(claim.query_spec_json)
    given = isinstance(query, DataFrame)
    if isinstance(query, DataFrame) and (spec.shuffle_root or drives(spec)):
        # Its own session planned no stage (it had no location), or would
        # claim the location itself (a session that drives its queries):
        # planned again, from its logical plan, by a session of this query's
        # location.
        ctx = build_session(query_spec)[0]
        limit = memory_table_limit_of(spec)
        if limit is not None:
            set_memory_table_limit(ctx, limit)
        query = ctx.create_dataframe_from_logical_plan(query.logical_plan())
    else:
        # A DataFrame is planned by its own session, and encoded and read
        # with one of the spec (the same codecs and location).
        ctx = session_of(spec) if given else build_session(query_spec)[0]
    _register(ctx, extra_udfs)
    df = query if isinstance(query, DataFrame) else ctx.sql(query)
    # Planned once: the stages shipped and the root read below are parts of
    # this one plan, so they cannot disagree about a stage id or a cut. Also
    # where in-memory tables are written.
    with plain_planning_errors(ctx, df), plain_memory_table_errors():
        plan = df.execution_plan()
        if given and _ROOT_NODE_NAME in plan.display():
            raise driven_by_its_own_session(query_spec)
        encoded = encode_stages(ctx, plan)
        # Each stage decoded here as a worker will decode it: one nesting
        # deeper than datafusion-python decodes is refused before any task
        # runs, in the same plain words as a plan too deep to hand back.
        for stage in encoded:
            ExecutionPlan.from_bytes(ctx, stage)
    if not encoded and given and not kept_whole(query_spec, df):
        raise not_a_dfx_dataframe(query_spec)
    # Described and cut by the runtime, the step the Rust host takes.
    stages = _internal.prepare(encoded)
    # With the partitions the session planned for: a worker takes them as
    # they are, listing no table.
    shipped = dataclasses.replace(
        query_spec, target_partitions=effective_target_partitions(query_spec)
    )
    run = scheduler.run(
        shipped.to_json_text(),
        claim.task_dir,
        stages,
        envelope_files=executor_of == "process",
    )
    batches = run.read_root(
        claim.canonical, lambda ranges: read_head(ctx, plan, ranges)
    )
    return DistributedResult(batches, run)


def kept_whole(spec: SessionSpec, df: DataFrame) -> bool:
    """Whether dfx's planner, in a session of ``spec``, keeps ``df`` whole.

    A plan no wider than a task and than the driver's cores is not cut
    (``dfx_engine.collapse_stages``): it has no stage and runs in the
    driver. A DataFrame whose own session planned no stage is either that,
    or one of a session without dfx's planner; planning it again in a
    session that has the planner tells them apart.
    """
    ctx = build_session(spec)[0]
    again = ctx.create_dataframe_from_logical_plan(df.logical_plan())
    with plain_planning_errors(ctx, again):
        return not encode_stages(ctx, again.execution_plan())


def _name_kept(err: BaseException, location: str) -> None:
    """Name the kept ``location`` in ``err``'s message, keeping its type."""
    note = f"the query's shuffle location is kept for inspection: {location}"
    if err.args and isinstance(err.args[0], str):
        err.args = (f"{err.args[0]}\n{note}", *err.args[1:])
    else:
        err.args = (*err.args, note)


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


def run_local(
    sql: str,
    spec: SessionSpec,
    extra_udfs: list[ScalarUDF | AggregateUDF] | None = None,
) -> list[pa.RecordBatch]:
    """Run ``sql`` in this process through the same factory, undistributed.

    The spec's shuffle directory is dropped, so the planner inserts no stage;
    anything else differing from :func:`run_distributed` is a bug in the split.

    Raises:
        UnsupportedQueryError: A query datafusion-python's planner boundary
            refuses; it plans through the plugin's planner here too.
    """
    ctx, _engine = build_session(
        dataclasses.replace(spec, shuffle_dir="", shuffle_root="")
    )
    _register(ctx, extra_udfs)
    df = ctx.sql(sql)
    # collect plans before it reads a row: a refusal is met at planning.
    with plain_planning_errors(ctx, df):
        return df.collect()


def dataframe_for(sql: str, spec: SessionSpec) -> tuple[SessionContext, DataFrame]:
    """The session and the DataFrame of ``sql``, for inspecting a plan.

    The context is returned too because it must outlive the DataFrame: its
    codecs are what ``to_bytes(ctx)`` encodes a stage with.
    """
    ctx, _engine = build_session(spec)
    return ctx, ctx.sql(sql)
