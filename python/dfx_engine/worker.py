"""A worker: run one ``(stage, partition)`` task and report its row count.

Usage: ``python -m dfx_engine.worker ENVELOPE``, where ENVELOPE is the JSON
file the driver wrote (``spec``, ``plan``, ``stage_id``, ``partition``).

The steps, in the order that keeps a bad task from doing harm:

1. read the envelope and build the session its spec describes;
2. compare the envelope's codec ids with this session's, *before decoding*:
   a plan written by a codec this session lacks would be misread;
3. decode the stage with the session's codecs;
4. check the partition exists, and that the decoded stage publishes into
   the spec's shuffle directory (a plan must not make a worker write outside
   its query's directory);
5. execute the partition and drain it; the stage node writes
   ``stage-<id>-part-<p>.arrow`` as the batches pass;
6. print ``{"stage_id", "partition", "rows"}`` as the last line of stdout.

Every refusal exits with status 1 and one line on stderr naming the stage,
the partition and the envelope.
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

from datafusion.plan import ExecutionPlan

from dfx_engine import _internal
from dfx_engine.session import SessionSpec, build_session, codec_ids_of

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
        TaskError: For every refusal and failure, naming stage and partition.
    """
    envelope = _read_envelope(envelope_path)
    stage_id, partition = envelope["stage_id"], envelope["partition"]

    def fail(reason: str) -> TaskError:
        return TaskError(
            f"stage {stage_id} partition {partition} ({envelope_path}): {reason}"
        )

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
    try:
        stage = ExecutionPlan.from_bytes(ctx, plan_bytes)
    except Exception as err:
        raise fail(f"cannot decode {plan_path}: {err}") from err

    if not 0 <= partition < stage.partition_count:
        reason = (
            f"the stage has {stage.partition_count} partitions, "
            f"so partition {partition} does not exist"
        )
        raise fail(reason)

    # The stage carries its own shuffle directory (rule 3); it must be the
    # one this task was given, or the plan could make the worker write
    # anywhere.
    try:
        encoded_stage, encoded_dir = _internal.stage_payload(plan_bytes)
    except ValueError as err:
        raise fail(str(err)) from err
    if encoded_dir != spec.shuffle_dir:
        reason = (
            f"the decoded stage publishes into {encoded_dir!r} but the spec's "
            f"shuffle directory is {spec.shuffle_dir!r}; refusing to write "
            "outside this query's directory"
        )
        raise fail(reason)
    if encoded_stage != stage_id:
        reason = f"the encoded stage is stage {encoded_stage}, not {stage_id}"
        raise fail(reason)

    rows = 0
    try:
        for batch in ctx.execute(stage, partition):
            rows += batch.to_pyarrow().num_rows
    except Exception as err:
        raise fail(f"execution failed: {err}") from err
    return {"stage_id": stage_id, "partition": partition, "rows": rows}


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
