"""A worker: run one map of one stage and report the rows it published.

Usage: ``python -m dfx_engine.worker ENVELOPE``, where ENVELOPE is the JSON
file the driver wrote (``spec``, ``plan``, ``stage_id``, ``partition``, the
map index, and ``attempt``, absent for the first), or
``python -m dfx_engine.worker --serve``: a long-lived worker that runs one
task per request (see :func:`serve`).

The steps, in the order that keeps a bad task from doing harm:

1. read the envelope and build the session its spec describes (without
   registering its tables: a stage carries its scans whole);
2. compare the envelope's codec ids with this session's, *before decoding*:
   a plan written by a codec this session lacks would be misread;
3. read what the encoded stage says about itself (the plugin reads its own
   payload out of the bytes, without decoding): its id must be the
   envelope's, its shuffle directory the spec's (a plan must not make a
   worker write outside its query's directory), and the map must exist;
4. decode the stage with the session's codecs; its root must be a writer;
5. execute the map and drain it: the writer publishes
   ``stage-<S>/map-<M>.arrow`` (every bucket, as segments, closed by the
   commit marker), and yields one summary row per bucket;
6. print ``{"stage_id", "partition", "rows", "bytes", "elapsed_ms"}`` as the
   last line of stdout, ``rows`` and ``bytes`` being the summary's columns
   summed over the buckets, ``elapsed_ms`` the task's time in this process.

Every refusal exits with status 1 and one line on stderr naming the stage,
the map and the envelope.

The serve protocol, which the Rust host's ``dfx worker --serve`` speaks too:
one request per line on stdin, ``{"envelope": "<path>"}`` or, carrying the
envelope itself (the Rust driver's pool), ``{"task": {...}}``; for each, exactly
one response line on stdout, either the report above or
``{"stage_id": S, "partition": M, "error": "<message>"}`` (both ids ``null``
when the envelope could not be read). A failed task does not end the
worker; end of input does, with status 0.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import pathlib
import sys
import time
import traceback
from typing import IO, TYPE_CHECKING, Any

from datafusion.plan import ExecutionPlan

from dfx_engine import _internal
from dfx_engine.session import SessionSpec, build_worker_session, codec_ids_of

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from datafusion import SessionContext
    from datafusion.record_batch import RecordBatch

__all__ = ["SessionCache", "TaskError", "main", "run_task", "serve"]

SERVE_FLAG = "--serve"
"""The argument that makes the worker long-lived (see :func:`serve`)."""


class TaskError(Exception):
    """A task the worker refuses or cannot run; the message names it.

    Attributes:
        stage_id: The envelope's stage id, or ``None`` if it was unreadable.
        partition: The envelope's map index, or ``None`` likewise.
    """

    def __init__(
        self, message: str, stage_id: object = None, partition: object = None
    ) -> None:
        """A refusal, with the task's ids when the envelope gave them."""
        super().__init__(message)
        self.stage_id = stage_id
        self.partition = partition


class SessionCache:
    """The sessions of the last few specs, keyed by the spec's JSON text.

    Building a session (plugin extension, functions, table listings) is most
    of a small task's cost, and every task of one query carries the same
    spec. Only the newest ``size`` are kept: a long-lived worker serves many
    queries, each with its own shuffle directory and so its own spec, and an
    unbounded cache would hold every one of them.
    """

    def __init__(self, size: int = 2) -> None:
        """An empty cache holding at most ``size`` sessions."""
        self.size = size
        self._sessions: collections.OrderedDict[str, SessionContext] = (
            collections.OrderedDict()
        )
        self._kept: _KeptStage | None = None

    def get(self, spec_json: dict[str, Any], spec: SessionSpec) -> SessionContext:
        """The session of ``spec`` (whose JSON is ``spec_json``), built if new."""
        key = json.dumps(spec_json, sort_keys=True)
        ctx = self._sessions.get(key)
        if ctx is None:
            ctx, _engine = build_worker_session(spec)
            self._sessions[key] = ctx
            while len(self._sessions) > self.size:
                _, dropped = self._sessions.popitem(last=False)
                # A kept stage must not keep a dropped session alive.
                if self._kept is not None and self._kept.ctx is dropped:
                    self._kept = None
        else:
            self._sessions.move_to_end(key)
        return ctx

    def kept_stage(
        self, ctx: SessionContext, plan: _PlanFile, map_index: int
    ) -> ExecutionPlan | None:
        """The stage decoded for the previous task, to run map ``map_index``.

        Returned when that task ran the same encoded stage from the same
        plan file (bytes and the time it was written: a later query reusing
        the shuffle directory writes the same bytes anew, and what the kept
        plan built from its upstream output belongs to the earlier query) in
        the same session, and this map has not run from it yet; ``None``
        otherwise.
        The Rust worker keeps its last stage by the same rule (a plan runs
        each of its partitions from one instance, so the next map skips the
        decode and shares what the plan built once, such as a broadcast
        join's build side; no map runs twice from one instance).
        """
        kept = self._kept
        if (
            kept is None
            or kept.ctx is not ctx
            or kept.plan_file != plan
            or map_index in kept.maps_run
        ):
            return None
        kept.maps_run.add(map_index)
        return kept.plan

    def keep_stage(
        self,
        ctx: SessionContext,
        plan_file: _PlanFile,
        map_index: int,
        plan: ExecutionPlan,
    ) -> None:
        """Keep ``plan``, just decoded to run ``map_index``, in place of any other."""
        self._kept = _KeptStage(ctx, plan_file, plan, {map_index})

    def forget_stage(self) -> None:
        """Let go of the kept stage: a failed task's plan serves no retry."""
        self._kept = None


@dataclasses.dataclass
class _KeptStage:
    """A decoded stage a serving worker keeps for its next map."""

    ctx: SessionContext
    plan_file: _PlanFile
    plan: ExecutionPlan
    maps_run: set[int]


@dataclasses.dataclass(frozen=True)
class _PlanFile:
    """An encoded stage as read, and when the driver wrote its file."""

    written_ns: int
    plan_bytes: bytes


def _source_name(source: pathlib.Path | dict[str, Any]) -> str:
    """How messages name a task's envelope: its file, or the request's."""
    return "inline envelope" if isinstance(source, dict) else str(source)


def _read_envelope(source: pathlib.Path | dict[str, Any]) -> dict[str, Any]:
    """The envelope in the file ``source``, or ``source`` itself, checked.

    ``source`` is a dict when a serve request carries the envelope.
    """
    if isinstance(source, dict):
        envelope: Any = source
        where = "the request's envelope"
    else:
        try:
            envelope = json.loads(source.read_text())
        except (OSError, ValueError) as err:
            message = f"cannot read task envelope {source}: {err}"
            raise TaskError(message) from err
        where = f"task envelope {source}"
    if not isinstance(envelope, dict):
        message = f"{where} is not a JSON object: {envelope!r:.80}"
        raise TaskError(message)
    missing = [
        k for k in ("spec", "plan", "stage_id", "partition") if k not in envelope
    ]
    if missing:
        message = f"{where} lacks {missing}"
        raise TaskError(message)
    return envelope


def run_task(
    source: pathlib.Path | dict[str, Any], sessions: SessionCache | None = None
) -> dict[str, Any]:
    """Run the task ``source`` describes; its report.

    ``source`` is an envelope file, or the envelope itself as a serve request
    carries it.

    ``sessions`` lets a long-lived worker reuse the session of an earlier
    task with the same spec; without it every call builds its own.

    Raises:
        TaskError: For every refusal and failure, naming stage and map.
    """
    started = time.perf_counter()
    envelope = _read_envelope(source)
    where = _source_name(source)
    stage_id, map_index = envelope["stage_id"], envelope["partition"]

    def fail(reason: str) -> TaskError:
        return TaskError(
            f"stage {stage_id} map {map_index} ({where}): {reason}",
            stage_id,
            map_index,
        )

    if not all(
        isinstance(v, int) and not isinstance(v, bool) for v in (stage_id, map_index)
    ):
        raise fail("stage_id and partition must be integers")
    # Absent in envelopes written before retries existed: the first attempt.
    attempt = envelope.get("attempt", 0)
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 0:
        raise fail(f"attempt must be a whole number, got {attempt!r}")

    try:
        spec = SessionSpec.from_json(envelope["spec"])
    except ValueError as err:
        raise fail(str(err)) from err
    # A limit this worker cannot enforce is refused, not ignored: every task
    # context crossing into the plugin loses its memory pool, and only the
    # Rust worker can put the pool back below the plugin's writer.
    shipped_spec = envelope["spec"]
    if isinstance(shipped_spec, dict) and shipped_spec.get("memory_limit") is not None:
        reason = (
            "the spec sets memory_limit, which only `dfx worker` (the Rust host) "
            "enforces; run this query's tasks on dfx workers, or without a limit"
        )
        raise fail(reason)
    if sessions is None:
        ctx, _engine = build_worker_session(spec)
    else:
        ctx = sessions.get(envelope["spec"], spec)

    shipped = codec_ids_of(envelope["spec"])
    carried = ctx.physical_extension_codec_ids()
    if shipped != carried:
        reason = (
            f"the plan was encoded with codecs {shipped} but this worker's session "
            f"carries {carried}; refusing to decode a plan it would misread"
        )
        raise fail(reason)

    plan_path = pathlib.Path(envelope["plan"])
    try:
        with plan_path.open("rb") as plan_file_handle:
            written_ns = os.fstat(plan_file_handle.fileno()).st_mtime_ns
            plan_bytes = plan_file_handle.read()
    except OSError as err:
        raise fail(f"cannot read the encoded stage: {err}") from err

    # What the stage says about itself, before anything is built from it.
    try:
        info = _internal.encoded_stage_info(plan_bytes)
    except ValueError as err:
        raise fail(str(err)) from err
    if info.stage_id != stage_id:
        reason = f"{plan_path} holds stage {info.stage_id}, not stage {stage_id}"
        raise fail(reason)
    # The stage carries its own shuffle directory (rule 3); it must be the
    # one this task was given, or the plan could make the worker write
    # anywhere.
    if info.shuffle_dir != spec.shuffle_dir:
        reason = (
            f"the encoded stage publishes into {info.shuffle_dir!r} but the spec's "
            f"shuffle directory is {spec.shuffle_dir!r}; refusing to write "
            "outside this query's directory"
        )
        raise fail(reason)
    if not 0 <= map_index < info.maps:
        reason = f"the stage has {info.maps} maps, so map {map_index} does not exist"
        raise fail(reason)
    # A kept stage came from these very bytes in this session, so it was
    # vetted and checked when it was decoded.
    plan_file = _PlanFile(written_ns, plan_bytes)
    stage = None if sessions is None else sessions.kept_stage(ctx, plan_file, map_index)
    if stage is None:
        stage = _decode_stage(ctx, spec, plan_path, plan_bytes, fail)
        if sessions is not None:
            sessions.keep_stage(ctx, plan_file, map_index, stage)

    try:
        rows, size = _published(ctx.execute(stage, map_index))
    except TaskError as err:
        raise fail(str(err)) from err
    except Exception as err:
        raise fail(f"execution failed: {err}") from err
    return {
        "stage_id": stage_id,
        "partition": map_index,
        "rows": rows,
        "bytes": size,
        "elapsed_ms": (time.perf_counter() - started) * 1000.0,
    }


def _decode_stage(
    ctx: SessionContext,
    spec: SessionSpec,
    plan_path: pathlib.Path,
    plan_bytes: bytes,
    fail: Callable[[str], TaskError],
) -> ExecutionPlan:
    """Vet the encoded stage, decode it and check its root is a writer."""
    # An envelope is code: the plugin checks the stage reads only the spec's
    # tables and shuffle location and writes only through its writer.
    try:
        _internal.vet_stage(plan_bytes, list(spec.tables.values()), spec.shuffle_dir)
    except ValueError as err:
        raise fail(str(err)) from err
    try:
        stage = ExecutionPlan.from_bytes(ctx, plan_bytes)
    except Exception as err:
        raise fail(f"cannot decode {plan_path}: {err}") from err
    writer = _internal.stage_node_name()
    if writer not in stage.display():
        reason = f"the decoded plan's root is {stage.display()!r}, not a {writer}"
        raise fail(reason)
    return stage


def _published(summary: Iterable[RecordBatch]) -> tuple[int, int]:
    """Rows and bytes a map published: its summary's columns, summed over buckets.

    Raises:
        TaskError: If a summary batch lacks the ``rows`` or ``bytes`` column
            (the stage is not a writer of this contract, and its output would
            be miscounted).
    """
    rows = size = 0
    for batch in summary:
        table = batch.to_pyarrow()
        if not {"rows", "bytes"} <= set(table.schema.names):
            message = (
                f"the stage's summary has columns {table.schema.names}, "
                "not the writer's (bucket, rows, bytes)"
            )
            raise TaskError(message)
        rows += sum(value or 0 for value in table.column("rows").to_pylist())
        size += sum(value or 0 for value in table.column("bytes").to_pylist())
    return rows, size


def _answer(request: str, sessions: SessionCache) -> dict[str, Any]:
    """The response to one request line of the serve protocol."""
    source: pathlib.Path | dict[str, Any]
    try:
        parsed = json.loads(request)
        if isinstance(parsed, dict) and isinstance(parsed.get("task"), dict):
            source = parsed["task"]
        else:
            path = parsed["envelope"]
            if not isinstance(path, str):
                raise TypeError(path)
            source = pathlib.Path(path)
    except (ValueError, KeyError, TypeError):
        message = (
            'not a request (want {"envelope": "<path>"} or {"task": {<envelope>}}): '
            f"{request!r:.200}"
        )
        return {"stage_id": None, "partition": None, "error": message}
    try:
        return run_task(source, sessions)
    except Exception as err:
        # Whatever failed, the kept stage may hold what the failure left
        # behind (a build side that failed): no later task runs from it.
        sessions.forget_stage()
        if isinstance(err, TaskError):
            # In the response only: stderr is for what the response cannot say.
            return {
                "stage_id": err.stage_id,
                "partition": err.partition,
                "error": str(err),
            }
        # A bug, not a refusal: the traceback goes to stderr for the driver to
        # attach, and the worker stays up for the next task.
        traceback.print_exc()
        message = f"{_source_name(source)}: unexpected {type(err).__name__}: {err}"
        return {"stage_id": None, "partition": None, "error": message}


def serve(requests: IO[str], responses: IO[str]) -> int:
    """Answer every request line of ``requests`` on ``responses``; exit status.

    Each answer is one line, flushed, and stderr is flushed before it: a
    driver that attaches this task's stderr to an error reads it once the
    response has arrived.
    """
    sessions = SessionCache()
    for line in requests:
        if not line.strip():
            continue
        response = _answer(line, sessions)
        sys.stderr.flush()
        responses.write(json.dumps(response) + "\n")
        responses.flush()
    return 0


def _private_stdout() -> IO[str]:
    """The real stdout, kept for responses; fd 1 and ``sys.stdout`` go to stderr.

    A user's Python UDF that prints, or a library that writes to fd 1, would
    otherwise put its line on the protocol stream, and the driver would take
    it for (or glue it to) a response.
    """
    sys.stdout.flush()
    responses = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return responses


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m dfx_engine.worker ENVELOPE|--serve``; status."""
    args = sys.argv[1:] if argv is None else argv
    if args == [SERVE_FLAG]:
        return serve(sys.stdin, _private_stdout())
    if len(args) != 1 or args[0].startswith("--"):
        print(
            f"usage: python -m dfx_engine.worker ENVELOPE | {SERVE_FLAG}",
            file=sys.stderr,
        )
        return 2
    try:
        report = run_task(pathlib.Path(args[0]))
    except TaskError as err:
        print(f"dfx worker: {err}", file=sys.stderr)
        return 1
    # Flushed and last: the driver reads only the last non-empty line.
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
