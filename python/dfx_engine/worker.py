"""A worker: run one map of one stage with a datafusion-python session.

Usage: ``python -m dfx_engine.worker ENVELOPE`` (one task; its response is
the last line of stdout, and a failed task exits with status 1), or
``python -m dfx_engine.worker --serve`` (a long-lived worker: one request
per line of stdin, one response line per request). The protocol, the checks
before decoding and the classing of failures are the runtime's, the same as
the Rust host's ``dfx worker``; this module holds only what needs a
datafusion-python session: :func:`run_task`, the handler the runtime calls
for each task, with its caches of sessions and of the last decoded stage.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys
import traceback
from typing import TYPE_CHECKING

from datafusion.plan import ExecutionPlan

from dfx_engine import _internal
from dfx_engine.session import SessionSpec, build_worker_session

if TYPE_CHECKING:
    from collections.abc import Iterable

    from datafusion import SessionContext
    from datafusion.record_batch import RecordBatch

__all__ = ["SERVE_FLAG", "SessionCache", "TaskError", "main", "run_task"]

SERVE_FLAG = "--serve"
"""The argument that makes the worker long-lived."""


class TaskError(Exception):
    """A task the worker refuses or cannot run; the message names it."""


@dataclasses.dataclass
class _KeptStage:
    """A decoded stage a serving worker keeps for its next map."""

    ctx: SessionContext
    written_ns: int
    plan_bytes: bytes
    plan: ExecutionPlan
    maps_run: set[int]


class SessionCache:
    """The sessions of the last few specs, and the last decoded stage.

    Building a session is most of a small task's cost, and every task of one
    query carries the same spec; only the newest ``size`` are kept, since a
    long-lived worker serves many queries, each with its own location.
    """

    def __init__(self, size: int = 2) -> None:
        """An empty cache holding at most ``size`` sessions."""
        self.size = size
        self._sessions: collections.OrderedDict[str, SessionContext] = (
            collections.OrderedDict()
        )
        self._kept: _KeptStage | None = None

    def get(self, spec_json: str) -> SessionContext:
        """The session of the spec ``spec_json`` (the runtime's spelling)."""
        ctx = self._sessions.get(spec_json)
        if ctx is None:
            ctx, _engine = build_worker_session(SessionSpec.from_json(spec_json))
            self._sessions[spec_json] = ctx
            while len(self._sessions) > self.size:
                _, dropped = self._sessions.popitem(last=False)
                # A kept stage must not keep a dropped session alive.
                if self._kept is not None and self._kept.ctx is dropped:
                    self._kept = None
        else:
            self._sessions.move_to_end(spec_json)
        return ctx

    def kept_stage(
        self, ctx: SessionContext, written_ns: int | None, plan: bytes, map_index: int
    ) -> ExecutionPlan | None:
        """The stage decoded for an earlier task, to run map ``map_index``.

        Only for the same bytes from a plan file written at the same time (a
        later query reusing the location writes the same bytes anew, and
        what the kept plan built from its upstream output is the earlier
        query's), in the same session, for a map not run from it yet: a plan
        runs each partition once, and shares what it built once (a broadcast
        join's build side) among them. The Rust worker keeps its stage by
        the same rule. A plan handed over by value has no time, and is
        never reused.
        """
        kept = self._kept
        if (
            kept is None
            or written_ns is None
            or kept.ctx is not ctx
            or kept.written_ns != written_ns
            or kept.plan_bytes != plan
            or map_index in kept.maps_run
        ):
            return None
        kept.maps_run.add(map_index)
        return kept.plan

    def keep_stage(
        self,
        ctx: SessionContext,
        written_ns: int | None,
        plan_bytes: bytes,
        map_index: int,
        plan: ExecutionPlan,
    ) -> None:
        """Keep ``plan``, just decoded to run ``map_index``, in place of any other."""
        self._kept = None
        if written_ns is not None:
            self._kept = _KeptStage(ctx, written_ns, plan_bytes, plan, {map_index})

    def forget_stage(self) -> None:
        """Let go of the kept stage: a failed task's plan serves no retry."""
        self._kept = None


_SESSIONS = SessionCache()
"""This process's sessions: a serving worker's, or a Ray worker process's."""


def run_task(task: _internal.Task, sessions: SessionCache = _SESSIONS) -> Published:
    """Run ``task``: the rows, bytes and layout its map published.

    The runtime calls this for each task and makes the response of what it
    returns or raises (a failure is classed by what the plugin recorded
    while it ran, never by its message).

    Raises:
        ValueError: A check before decoding refused the task.
        TaskError: Any other failure, naming stage and map.
    """
    try:
        return _run(task, sessions)
    except (TaskError, ValueError):
        sessions.forget_stage()
        raise
    except Exception as err:
        # A bug rather than a refusal: its traceback goes to stderr, which
        # the driver attaches to the task's failure.
        sessions.forget_stage()
        traceback.print_exc()
        message = f"{task.name}: unexpected {type(err).__name__}: {err}"
        raise TaskError(message) from err


def _run(task: _internal.Task, sessions: SessionCache) -> Published:
    ctx = sessions.get(task.spec_json)
    plan = task.plan
    # Under a memory limit every task's pool must account for all its task
    # holds, so no task reuses a stage (and a build side another task's
    # pool reserved), as in the Rust worker.
    limited = SessionSpec.from_json(task.spec_json).memory_limit is not None
    stage = None
    if not limited:
        stage = sessions.kept_stage(ctx, task.written_ns, plan, task.map)
    # A kept stage came from these very bytes in this session: vetted when
    # it was decoded.
    task.check(ctx.physical_extension_codec_ids(), stage is None)
    if stage is None:
        # A memory pool given to this session's operators is lost when the
        # plugin's writer runs them (every task context crossing the
        # boundary is rebuilt with a default runtime), so under a limit the
        # plugin runs the stage's operators itself, with the spec's pool.
        # A map running a slice runs its partitions at once on the plugin's
        # runtime, where only the plugin's own operators may run: the
        # plugin decodes the stage's input itself there too.
        sealed = limited or task.runs_slices()
        decoded = task.sealed_plan() if sealed else plan
        try:
            stage = ExecutionPlan.from_bytes(ctx, decoded)
        except Exception as err:
            message = f"{task.name}: cannot decode the encoded stage: {err}"
            raise TaskError(message) from err
        if not limited:
            sessions.keep_stage(ctx, task.written_ns, plan, task.map, stage)
    try:
        return _published(ctx.execute(stage, task.map))
    except Exception as err:
        message = f"{task.name}: execution failed: {err}"
        raise TaskError(message) from err


Layout = tuple[list[int], list[int], list[int], int, str | None, tuple[int, int] | None]
"""Where each bucket of a map's file lies: offsets, lengths and rows per
bucket, the file's size, its entity tag and where its key summary lies (the
runtime's ``MapLayout``)."""

Published = tuple[int, int, Layout | None]
"""What a map published: rows, bytes, and its layout when the summary has
one."""


def _published(summary: Iterable[RecordBatch]) -> Published:
    """Rows and bytes a map published, summed over buckets, and its layout.

    Raises:
        TaskError: If a summary batch lacks the ``rows`` or ``bytes`` column
            (the stage is not a writer of this contract).
    """
    rows = size = 0
    offsets: list[int] = []
    lengths: list[int] = []
    counts: list[int] = []
    file_bytes = 0
    e_tag: str | None = None
    keys: tuple[int, int] | None = None
    laid_out = True
    for batch in summary:
        table = batch.to_pyarrow()
        names = set(table.schema.names)
        if not {"rows", "bytes"} <= names:
            message = (
                f"the stage's summary has columns {table.schema.names}, "
                "not the writer's (bucket, rows, bytes)"
            )
            raise TaskError(message)
        bucket_rows = [value or 0 for value in table.column("rows").to_pylist()]
        bucket_bytes = [value or 0 for value in table.column("bytes").to_pylist()]
        rows += sum(bucket_rows)
        size += sum(bucket_bytes)
        laid_out = laid_out and {"offset", "file_bytes", "e_tag"} <= names
        if laid_out:
            offsets += table.column("offset").to_pylist()
            lengths += bucket_bytes
            counts += bucket_rows
            for value, tag in zip(
                table.column("file_bytes").to_pylist(),
                table.column("e_tag").to_pylist(),
                strict=True,
            ):
                file_bytes, e_tag = value, tag
            if {"keys_offset", "keys_bytes"} <= names:
                for start, length in zip(
                    table.column("keys_offset").to_pylist(),
                    table.column("keys_bytes").to_pylist(),
                    strict=True,
                ):
                    keys = None if start is None or length is None else (start, length)
    layout = (offsets, lengths, counts, file_bytes, e_tag, keys) if laid_out else None
    return rows, size, layout


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m dfx_engine.worker ENVELOPE|--serve``; status."""
    args = sys.argv[1:] if argv is None else argv
    if args == [SERVE_FLAG]:
        # The real stdout is kept for responses; fd 1 and sys.stdout go to
        # stderr, so a UDF or a library that prints cannot put a line into
        # the protocol.
        sys.stdout.flush()
        responses = os.dup(1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        return _internal.serve(run_task, responses)
    if len(args) != 1 or args[0].startswith("--"):
        print(
            f"usage: python -m dfx_engine.worker ENVELOPE | {SERVE_FLAG}",
            file=sys.stderr,
        )
        return 2
    return _internal.run_task_file(args[0], run_task)


if __name__ == "__main__":
    sys.exit(main())
