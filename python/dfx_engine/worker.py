"""A worker: run one map of one stage and report the rows it published.

Usage: ``python -m dfx_engine.worker ENVELOPE``, where ENVELOPE is the JSON
file the driver wrote (``spec``, ``plan``, ``stage_id``, ``partition``; the
partition is the map index).

The steps, in the order that keeps a bad task from doing harm:

1. read the envelope and build the session its spec describes;
2. compare the envelope's codec ids with this session's, *before decoding*:
   a plan written by a codec this session lacks would be misread;
3. read what the encoded stage says about itself (the plugin reads its own
   payload out of the bytes, without decoding): its id must be the
   envelope's, its shuffle directory the spec's (a plan must not make a
   worker write outside its query's directory), and the map must exist;
4. decode the stage with the session's codecs; its root must be a writer;
5. execute the map and drain it: the writer publishes
   ``stage-<S>/map-<M>/bucket-<B>.arrow`` and then the marker
   ``stage-<S>/map-<M>.json``, and yields one summary row per bucket;
6. print ``{"stage_id", "partition", "rows"}`` as the last line of stdout,
   ``rows`` being the summary's rows summed over the buckets.

Every refusal exits with status 1 and one line on stderr naming the stage,
the map and the envelope.
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import TYPE_CHECKING, Any

from datafusion.plan import ExecutionPlan

from dfx_engine import _internal
from dfx_engine.session import SessionSpec, build_session, codec_ids_of

if TYPE_CHECKING:
    from collections.abc import Iterable

    from datafusion.record_batch import RecordBatch

__all__ = ["TaskError", "main", "run_task"]


class TaskError(Exception):
    """A task the worker refuses or cannot run; the message names it."""


def _read_envelope(path: pathlib.Path) -> dict[str, Any]:
    try:
        envelope = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        message = f"cannot read task envelope {path}: {err}"
        raise TaskError(message) from err
    if not isinstance(envelope, dict):
        message = f"task envelope {path} is not a JSON object: {envelope!r:.80}"
        raise TaskError(message)
    missing = [
        k for k in ("spec", "plan", "stage_id", "partition") if k not in envelope
    ]
    if missing:
        message = f"task envelope {path} lacks {missing}"
        raise TaskError(message)
    return envelope


def run_task(envelope_path: pathlib.Path) -> dict[str, int]:
    """Run the task ``envelope_path`` describes; its report.

    Raises:
        TaskError: For every refusal and failure, naming stage and map.
    """
    envelope = _read_envelope(envelope_path)
    stage_id, map_index = envelope["stage_id"], envelope["partition"]

    def fail(reason: str) -> TaskError:
        return TaskError(
            f"stage {stage_id} map {map_index} ({envelope_path}): {reason}"
        )

    if not all(
        isinstance(v, int) and not isinstance(v, bool) for v in (stage_id, map_index)
    ):
        raise fail("stage_id and partition must be integers")

    try:
        spec = SessionSpec.from_json(envelope["spec"])
    except ValueError as err:
        raise fail(str(err)) from err
    ctx, _engine = build_session(spec)

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
        plan_bytes = plan_path.read_bytes()
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

    try:
        stage = ExecutionPlan.from_bytes(ctx, plan_bytes)
    except Exception as err:
        raise fail(f"cannot decode {plan_path}: {err}") from err
    writer = _internal.stage_node_name()
    if writer not in stage.display():
        reason = f"the decoded plan's root is {stage.display()!r}, not a {writer}"
        raise fail(reason)

    try:
        rows = _published_rows(ctx.execute(stage, map_index))
    except TaskError as err:
        raise fail(str(err)) from err
    except Exception as err:
        raise fail(f"execution failed: {err}") from err
    return {"stage_id": stage_id, "partition": map_index, "rows": rows}


def _published_rows(summary: Iterable[RecordBatch]) -> int:
    """Rows a map published: its summary's ``rows`` column, summed over buckets.

    Raises:
        TaskError: If a summary batch has no ``rows`` column (the stage is not
            a writer of this contract, and its output would be miscounted).
    """
    total = 0
    for batch in summary:
        table = batch.to_pyarrow()
        if "rows" not in table.schema.names:
            message = (
                f"the stage's summary has columns {table.schema.names}, "
                "not the writer's (bucket, rows, bytes)"
            )
            raise TaskError(message)
        total += sum(value or 0 for value in table.column("rows").to_pylist())
    return total


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m dfx_engine.worker ENVELOPE``; exit status."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m dfx_engine.worker ENVELOPE", file=sys.stderr)
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
