"""One session factory for the driver and every worker.

A :class:`SessionSpec` says everything a session depends on: the tables, the
shuffle directory and the partition count. The driver ships it to every
worker inside the task envelope, and :func:`build_session` turns it into the
same session on both sides, so a worker decodes a stage with exactly the
codecs and functions the driver encoded it with.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass, field
from typing import Any

from datafusion import SessionConfig, SessionContext

from dfx_engine import _internal

__all__ = [
    "SPLIT_MODES",
    "SessionSpec",
    "build_session",
    "effective_target_partitions",
    "expected_codec_ids",
]

WORK_STEALING = "datafusion.execution.enable_file_stream_work_stealing"
"""DataFusion 55's run-time rebalancing of files between sibling partitions."""

SPLIT_MODES = ("exchange", "aggregate")
"""Where the planner cuts a plan into stages (``dfx_engine.split``), default first.

``exchange`` cuts at every exchange (hash repartition, merge, broadcast build);
``aggregate`` is round 1's rule: each topmost partial aggregate is a stage.
"""


def expected_codec_ids() -> list[str]:
    """The physical codec ids a correctly built session carries, in order.

    datafusion-python tags every payload an installed codec writes with the
    codec's id and decodes a payload only with the codec of that id, so two
    sessions can exchange plans only if these lists agree.
    """
    return [_internal.physical_codec_id()]


@dataclass(frozen=True)
class SessionSpec:
    """What a session is built from; travels to workers as JSON.

    Attributes:
        tables: Table name to a directory of Parquet files.
        shuffle_dir: Where stages publish their partitions. Empty means "do
            not distribute": the planner inserts no stage.
        target_partitions: Pinned rather than the core count, so the driver
            and a worker on another machine plan the same partitions.
        split: Where the planner cuts stages, one of :data:`SPLIT_MODES`.
            Only planning reads it (a worker decodes stages already cut), and
            only with a shuffle directory.
    """

    tables: dict[str, str] = field(default_factory=dict)
    shuffle_dir: str = ""
    target_partitions: int = 2
    split: str = SPLIT_MODES[0]

    def __post_init__(self) -> None:
        """Refuse a partition count no session can plan with, or an unknown split.

        Raises:
            ValueError: If ``target_partitions`` is not a whole number of at
                least 1 (zero is a mistake to report, not to round up), or
                ``split`` is not one of :data:`SPLIT_MODES`.
        """
        if self.split not in SPLIT_MODES:
            message = (
                f"session spec split must be one of {list(SPLIT_MODES)}, "
                f"got {self.split!r}"
            )
            raise ValueError(message)
        partitions = self.target_partitions
        if isinstance(partitions, bool) or not isinstance(partitions, int):
            message = (
                f"session spec target_partitions must be an int, got {partitions!r}"
            )
            raise ValueError(message)
        if partitions < 1:
            message = (
                f"session spec target_partitions must be at least 1, got {partitions}"
            )
            raise ValueError(message)

    def to_json(self) -> dict[str, Any]:
        """The spec as a JSON object, with the codec ids this session carries.

        ``codec_ids`` is what the worker compares with its own session before
        decoding anything: a plan written through a codec the worker lacks
        would be misread, not merely rejected.
        """
        return {
            "tables": dict(self.tables),
            "shuffle_dir": self.shuffle_dir,
            "target_partitions": self.target_partitions,
            "split": self.split,
            "codec_ids": expected_codec_ids(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | str) -> SessionSpec:
        """Read a spec written by :meth:`to_json` (a dict or its JSON text).

        ``codec_ids`` is not part of the spec itself; read it with
        :func:`codec_ids_of`.

        Raises:
            ValueError: If a field is missing or has the wrong type.
        """
        obj = json.loads(data) if isinstance(data, str) else data
        try:
            tables = obj["tables"]
            shuffle_dir = obj["shuffle_dir"]
            target_partitions = obj.get("target_partitions", 2)
            # Absent in specs written before split modes existed.
            split = obj.get("split", SPLIT_MODES[0])
        except (KeyError, TypeError) as err:
            message = f"not a dfx session spec: {obj!r} (missing {err})"
            raise ValueError(message) from err
        if not isinstance(tables, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in tables.items()
        ):
            message = f"session spec tables must map names to paths, got {tables!r}"
            raise ValueError(message)
        if (
            not isinstance(shuffle_dir, str)
            or not isinstance(target_partitions, int)
            or not isinstance(split, str)
        ):
            message = (
                f"session spec has shuffle_dir={shuffle_dir!r}, "
                f"target_partitions={target_partitions!r}, split={split!r}"
            )
            raise ValueError(message)
        return cls(
            tables=dict(tables),
            shuffle_dir=shuffle_dir,
            target_partitions=target_partitions,
            split=split,
        )


def codec_ids_of(data: dict[str, Any] | str) -> list[str] | None:
    """The ``codec_ids`` a spec's JSON carries, or ``None`` if it has none."""
    obj = json.loads(data) if isinstance(data, str) else data
    ids = obj.get("codec_ids") if isinstance(obj, dict) else None
    return list(ids) if isinstance(ids, list) else None


def effective_target_partitions(spec: SessionSpec) -> int:
    """``spec.target_partitions``, raised to the file count of its largest table.

    A task is one partition of a stage and the unit of work over a table is a
    file, so a table of N Parquet files scans as N partitions. DataFusion
    groups a table's files into ``target_partitions`` groups, and only the
    session config reaches the plugin's planner, so the floor is raised here.
    The Rust host applies the same rule, so one spec plans alike in both.

    Raises:
        FileNotFoundError: If a table's directory does not exist or holds no
            Parquet file.
    """
    partitions = spec.target_partitions
    for name, directory in sorted(spec.tables.items()):
        path = pathlib.Path(directory)
        if not path.is_dir():
            message = f"table {name!r}: {directory} is not a directory"
            raise FileNotFoundError(message)
        files = [f for f in path.iterdir() if f.suffix == ".parquet" and f.is_file()]
        if not files:
            message = f"table {name!r}: no .parquet files in {directory}"
            raise FileNotFoundError(message)
        partitions = max(partitions, len(files))
    return partitions


def build_session(
    spec: SessionSpec,
) -> tuple[SessionContext, _internal.DfxEngineExtension]:
    """A session with dfx installed, the plugin's functions and the spec's tables.

    In this order, each for a reason:

    1. The config extension goes on the :class:`~datafusion.SessionConfig`
       before the context exists, so the planner sees the shuffle directory
       (and the split mode, set only with a directory) from the first query
       on.
    2. ``with_extensions`` is called once, installing the plugin's codec and
       then its planner on the session's final codec chain, and registering
       the plugin's functions (they travel in a plan by name, so every
       session that decodes a plan needs them; the extension does it, so a
       user's own session has them too).
    3. Each table is registered as Parquet over its directory.
    4. The session's codec ids are checked against :func:`expected_codec_ids`.

    Returns:
        The context and the installed extension (whose counters show what
        the planner and codec did).

    Raises:
        RuntimeError: If the session did not end up with the expected codecs.
        FileNotFoundError: If a table's directory does not exist.
    """
    # The split mode means nothing without a shuffle directory; leaving it
    # unset then keeps a local session's config the plugin's default.
    split = spec.split if spec.shuffle_dir else None
    config = (
        SessionConfig()
        .with_target_partitions(effective_target_partitions(spec))
        # Off, or a worker running partition 0 alone would steal every file of
        # its sibling partitions (which no process polls) and the answer would
        # count those rows once per worker.
        .set(WORK_STEALING, "false")
        .with_extension(
            _internal.DfxEngineConfig(shuffle_dir=spec.shuffle_dir, split=split)
        )
    )
    engine = _internal.DfxEngineExtension()
    ctx = SessionContext(config).with_extensions(engine)

    for name, directory in sorted(spec.tables.items()):
        ctx.register_parquet(name, directory)

    found = ctx.physical_extension_codec_ids()
    expected = expected_codec_ids()
    if found != expected:
        message = (
            f"the session carries physical codecs {found}, expected {expected}; "
            "the dfx extension was not installed as build_session installs it"
        )
        raise RuntimeError(message)
    return ctx, engine
