"""One session factory for the driver and every worker.

A :class:`SessionSpec` says everything a session depends on: the tables, the
shuffle location, the partition count and how an ``s3://`` location is
reached. The driver ships it to every
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
    "STORE_OPTION_KEYS",
    "SessionSpec",
    "build_session",
    "build_worker_session",
    "effective_target_partitions",
    "expected_codec_ids",
]

WORK_STEALING = "datafusion.execution.enable_file_stream_work_stealing"
"""DataFusion 55's run-time rebalancing of files between sibling partitions."""

REPARTITION_FILE_SCANS = "datafusion.optimizer.repartition_file_scans"
"""DataFusion's splitting of files into byte ranges across partitions."""

PARQUET_METADATA_SIZE_HINT = "datafusion.execution.parquet.metadata_size_hint"
"""How many bytes from a Parquet file's end DataFusion reads for its footer."""

SPLIT_MODES = ("exchange", "aggregate")
"""Where the planner cuts a plan into stages (``dfx_engine.split``), default first.

``exchange`` cuts at every exchange (hash repartition, merge, broadcast build);
``aggregate`` is round 1's rule: each topmost partial aggregate is a stage.
"""


STORE_OPTION_KEYS = ("s3_endpoint", "s3_region", "s3_allow_http")
"""The keys of :attr:`SessionSpec.store_options`, each set as ``dfx_engine.<key>``.

``s3_endpoint`` (e.g. ``http://127.0.0.1:9000``), ``s3_region`` and
``s3_allow_http`` (``true`` or ``false``: plain http, for local endpoints)
win over the ``AWS_*`` environment variables. Credentials are not among them:
the spec is written into every task envelope, so they come from each
process's environment.
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
        store_options: How an ``s3://`` shuffle location is reached: keys of
            :data:`STORE_OPTION_KEYS` to their values, set as the plugin's
            ``dfx_engine.<key>`` (only with a shuffle directory). Never
            credentials. Written as JSON ``store_options``, as the Rust
            host's spec writes it, and left out when empty.
    """

    tables: dict[str, str] = field(default_factory=dict)
    shuffle_dir: str = ""
    target_partitions: int = 2
    split: str = SPLIT_MODES[0]
    store_options: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Refuse a partition count no session can plan with, an unknown split.

        Or a store option the plugin does not take.

        Raises:
            ValueError: If ``target_partitions`` is not a whole number of at
                least 1 (zero is a mistake to report, not to round up),
                ``split`` is not one of :data:`SPLIT_MODES`, or
                ``store_options`` holds a key not in
                :data:`STORE_OPTION_KEYS`, a value that is not a string, or
                an ``s3_allow_http`` other than ``true`` or ``false``.
        """
        _check_store_options(self.store_options)
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
        data: dict[str, Any] = {
            "tables": dict(self.tables),
            "shuffle_dir": self.shuffle_dir,
            "target_partitions": self.target_partitions,
            "split": self.split,
            "codec_ids": expected_codec_ids(),
        }
        # Left out when empty, as the Rust host leaves it out.
        if self.store_options:
            data["store_options"] = dict(sorted(self.store_options.items()))
        return data

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
            # Absent when empty.
            store_options = obj.get("store_options", {})
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
        _check_store_options(store_options)
        return cls(
            tables=dict(tables),
            shuffle_dir=shuffle_dir,
            target_partitions=target_partitions,
            split=split,
            store_options=dict(store_options),
        )


def _check_store_options(options: object) -> None:
    """Refuse store options the plugin would not take, naming the culprit.

    The plugin checks a value only when a query is planned; checked here, a
    bad spec fails where it is made.

    Raises:
        ValueError: If ``options`` is not a dict of strings to strings over
            :data:`STORE_OPTION_KEYS`, or ``s3_allow_http`` is not ``true``
            or ``false``.
    """
    if not isinstance(options, dict):
        message = f"session spec store_options must be a dict, got {options!r}"
        raise ValueError(message)
    unknown = sorted(str(key) for key in options if key not in STORE_OPTION_KEYS)
    if unknown:
        message = (
            f"session spec store_options has unknown keys {unknown}; the keys are "
            f"{list(STORE_OPTION_KEYS)} (credentials come from the environment, "
            "never from the spec)"
        )
        raise ValueError(message)
    for key, value in options.items():
        if not isinstance(value, str):
            message = (
                f"session spec store_options {key} must be a string, got {value!r}"
            )
            raise ValueError(message)
    allow_http = options.get("s3_allow_http")
    if allow_http is not None and allow_http.strip().lower() not in ("true", "false"):
        message = (
            f"session spec store_options s3_allow_http must be 'true' or 'false', "
            f"got {allow_http!r}"
        )
        raise ValueError(message)


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
    *,
    register_tables: bool = True,
) -> tuple[SessionContext, _internal.DfxEngineExtension]:
    """A session with dfx installed, the plugin's functions and the spec's tables.

    In this order, each for a reason:

    1. The config extension goes on the :class:`~datafusion.SessionConfig`
       before the context exists, so the planner sees the shuffle directory
       (and the split mode and store options, set only with a directory)
       from the first query on: a stage decoded in a worker and the root
       read in the driver reach an ``s3://`` location with the spec's
       endpoint.
    2. ``with_extensions`` is called once, installing the plugin's codec and
       then its planner on the session's final codec chain, and registering
       the plugin's functions (they travel in a plan by name, so every
       session that decodes a plan needs them; the extension does it, so a
       user's own session has them too).
    3. Each table is registered as Parquet over its directory, unless
       ``register_tables`` is false (see :func:`build_worker_session`).
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
        # Off: one partition per file is a table's contract here (a task per
        # file, as in the Rust host). Split into byte ranges, a range holding
        # no row group's start reads nothing, and a file's neighbour range
        # reads it whole: at TPC-H scale 0.1 one map of each scan stage read
        # every row while its sibling read none.
        .set(REPARTITION_FILE_SCANS, "false")
        # The Rust host's footer read size for local tables, not DataFusion's
        # object-store default (`PARQUET_FOOTER_HINT` in dfx-abi says why).
        .set(PARQUET_METADATA_SIZE_HINT, str(_internal.parquet_footer_hint()))
        .with_extension(
            _internal.DfxEngineConfig(shuffle_dir=spec.shuffle_dir, split=split)
        )
    )
    if spec.shuffle_dir:
        prefix = _internal.config_prefix()
        for key, value in sorted(spec.store_options.items()):
            # Onto the extension just added: keys under the plugin's prefix
            # go to its options (checked by the plugin when it plans).
            config = config.set(f"{prefix}.{key}", value)
    engine = _internal.DfxEngineExtension()
    ctx = SessionContext(config).with_extensions(engine)

    if register_tables:
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


def build_worker_session(
    spec: SessionSpec,
) -> tuple[SessionContext, _internal.DfxEngineExtension]:
    """:func:`build_session` for a worker: the same session, without the tables.

    An encoded stage carries its scans whole (files, schema, statistics), so
    decoding and running it never looks a table up, while registering one
    lists its directory and reads every file's footer. The tables still bound
    what a stage may read (the vet takes them from the spec) and still set
    the session's partitions.
    """
    return build_session(spec, register_tables=False)
