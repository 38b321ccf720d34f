"""One session factory for the driver and every worker.

A :class:`SessionSpec` says everything a session depends on: the tables, the
shuffle location, the partition count, where plans are cut, how stage output
is compressed and how an ``s3://`` location is reached. It travels to every
worker inside the task envelope, and :func:`build_session` turns it into the
same session on both sides, so a worker decodes a stage with exactly the
codecs and functions the driver encoded it with.

The spec's rules (what each field may hold, what its JSON leaves out) are
the runtime's ``SessionSpec``, the type the Rust host uses too: this module
validates and serializes every spec through it.

What such a session cannot plan: its planner is the plugin's, behind
datafusion-python's planner boundary, which moves plans as DataFusion's
protobuf plan format both ways::

    datafusion-python                          the plugin (dfx's prost)
    optimized logical plan ──► bytes ──────►   decoded, planned, cut
    physical plan ◄─ decoded with ◄─ bytes ◄─  encoded
                     datafusion-python's prost

Two kinds of query fail on that path, in DataFusion's words naming
neither dfx nor the cause; :func:`plain_planning_errors` says them as
:class:`UnsupportedQueryError`:

- a plan nesting deeper than datafusion-python's prost decodes (100
  messages): long join chains; a distributed plan's stage nodes add depth,
  so some (thirty scalar subqueries) fail only distributed. The Rust host's
  prost has no such limit.
- a scan of a table the format does not carry, a table function such as
  ``generate_series``: datafusion-python cannot encode the logical plan.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import datafusion
from datafusion import SessionConfig, SessionContext
from datafusion.expr import TableScan

from dfx_engine import _internal

if TYPE_CHECKING:
    from collections.abc import Iterator

    from datafusion import DataFrame
    from datafusion.plan import LogicalPlan

__all__ = [
    "SPLIT_MODES",
    "STORE_OPTION_KEYS",
    "UNSUPPORTED_REASONS",
    "SessionSpec",
    "UnsupportedQueryError",
    "build_session",
    "build_worker_session",
    "effective_target_partitions",
    "expected_codec_ids",
    "plain_planning_errors",
]

SPLIT_MODES: tuple[str, ...] = tuple(_internal.SPLIT_MODES)
"""Where the planner cuts a plan into stages (``dfx_engine.split``), default first.

``exchange`` cuts at every exchange (hash repartition, merge, broadcast build);
``aggregate`` is the aggregate split: each topmost partial aggregate is a stage.
"""

STORE_OPTION_KEYS: tuple[str, ...] = tuple(_internal.STORE_OPTION_KEYS)
"""The keys of :attr:`SessionSpec.store_options`, each set as ``dfx_engine.<key>``.

Never credentials: the spec is written into every task envelope, so they
come from each process's environment.
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
        shuffle_dir: Where stages publish (a path, ``file://`` or
            ``s3://bucket/prefix``). Empty means "do not distribute": the
            planner inserts no stage.
        target_partitions: Pinned rather than the core count, so the driver
            and a worker on another machine plan the same partitions.
        split: Where the planner cuts stages, one of :data:`SPLIT_MODES`.
        store_options: How an ``s3://`` location is reached: keys of
            :data:`STORE_OPTION_KEYS` to their values. Never credentials.
        shuffle_compression: How workers compress the map files they
            publish: ``auto`` (none locally, LZ4 on S3), ``lz4`` or ``none``.
        memory_limit: The most memory, in bytes, each map task's operators
            may hold; only the Rust host's workers enforce it, and a Python
            worker refuses a task that sets one.
    """

    tables: dict[str, str] = field(default_factory=dict)
    shuffle_dir: str = ""
    target_partitions: int = _internal.DEFAULT_TARGET_PARTITIONS
    split: str = _internal.DEFAULT_SPLIT
    store_options: dict[str, str] = field(default_factory=dict)
    shuffle_compression: str = _internal.DEFAULT_SHUFFLE_COMPRESSION
    memory_limit: int | None = None

    def __post_init__(self) -> None:
        """Check the spec through the runtime.

        Raises:
            ValueError: Naming what no session can be built from.
        """
        self.to_json_text()

    def to_json_text(self) -> str:
        """The spec as the runtime writes it, with this build's codec ids.

        ``codec_ids`` is what a worker compares with its own session before
        decoding anything: a plan written through a codec the worker lacks
        would be misread, not merely rejected.

        Raises:
            ValueError: If the runtime refuses the spec.
        """
        fields = dataclasses.asdict(self) | {"codec_ids": expected_codec_ids()}
        try:
            text = json.dumps(fields)
        except (TypeError, ValueError) as err:
            message = f"not a dfx session spec: {err}"
            raise ValueError(message) from err
        return _internal.normalize_spec(text)

    def to_json(self) -> dict[str, Any]:
        """:meth:`to_json_text`, as a JSON object."""
        data: dict[str, Any] = json.loads(self.to_json_text())
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any] | str) -> SessionSpec:
        """Read a spec as any host writes it (a JSON object or its text).

        Raises:
            ValueError: If the runtime refuses it, naming what was wrong.
        """
        text = data if isinstance(data, str) else json.dumps(data)
        fields = json.loads(_internal.normalize_spec(text))
        # Not part of the spec itself: a session's, filled in when it ships.
        fields.pop("codec_ids", None)
        return cls(**fields)


def effective_target_partitions(spec: SessionSpec) -> int:
    """``spec.target_partitions``, raised to the file count of its largest table.

    A task is one partition of a stage and the unit of work over a table is a
    file, so a table of N Parquet files scans as N partitions. The Rust host
    applies the same rule, so one spec plans alike in both.

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

    1. The settings every dfx session needs (``_internal.session_settings``)
       and the config extension go on the config before the context exists,
       so the planner sees the shuffle location (and split, compression and
       store options, set only with one) from the first query on.
    2. ``with_extensions`` installs the plugin's codec and planner and
       registers its functions (plans name them).
    3. Each table is registered as Parquet over its directory, unless
       ``register_tables`` is false (see :func:`build_worker_session`).

    Returns:
        The context and the installed extension (whose counters show what
        the planner and codec did).

    Raises:
        RuntimeError: If the session did not end up with the expected codecs.
        FileNotFoundError: If a table's directory does not exist.
    """
    split = spec.split if spec.shuffle_dir else None
    config = SessionConfig().with_target_partitions(effective_target_partitions(spec))
    for key, value in sorted(_internal.session_settings().items()):
        config = config.set(key, value)
    config = config.with_extension(
        _internal.DfxEngineConfig(shuffle_dir=spec.shuffle_dir, split=split)
    )
    if spec.shuffle_dir:
        prefix = _internal.config_prefix()
        options = {"shuffle_compression": spec.shuffle_compression}
        for key, value in sorted((options | spec.store_options).items()):
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

    An encoded stage carries its scans whole, so decoding and running it
    never looks a table up, while registering one lists its directory and
    reads every file's footer.
    """
    return build_session(spec, register_tables=False)


UNSUPPORTED_REASONS = ("deep_plan", "table_function")
"""Why a session cannot plan a query (:attr:`UnsupportedQueryError.reason`).

``deep_plan``: the plan nests deeper than datafusion-python decodes;
``table_function``: it reads a table the plan format cannot carry.
"""

# DataFusion's words for the two refusals, matched once, to reword them for
# the user and never to decide a retry: datafusion-python raises a bare
# Exception, so its text is all that tells them apart.
_PROST_DECODE = "failed to decode Protobuf message"
_PROST_DEPTH = "recursion limit reached"
_UNENCODED_TABLE = "Error serializing custom table"


class UnsupportedQueryError(NotImplementedError):
    """A query a dfx session of datafusion-python cannot plan, in plain words.

    The original error is its ``__cause__``.

    Attributes:
        reason: One of :data:`UNSUPPORTED_REASONS`.
        tables: For ``table_function``, the tables the plan format cannot
            carry, named as the plan names them (``generate_series()``);
            empty when none could be found.
    """

    def __init__(self, message: str, reason: str, tables: tuple[str, ...] = ()) -> None:
        """The error, its reason and the tables it names."""
        super().__init__(message)
        self.reason = reason
        self.tables = tables


@contextlib.contextmanager
def plain_planning_errors(ctx: SessionContext, df: DataFrame) -> Iterator[None]:
    """Plan ``df`` of ``ctx`` inside, its refusals said in plain words.

    A refusal leaves as :class:`UnsupportedQueryError`; any other error
    leaves as it came.

    Raises:
        UnsupportedQueryError: If the plan nests deeper than datafusion-python
            decodes, or reads a table the plan format cannot carry.
    """
    try:
        yield
    except Exception as err:
        refusal = _unsupported(err, ctx, df)
        if refusal is None:
            raise
        raise refusal from err


def _unsupported(
    err: Exception, ctx: SessionContext, df: DataFrame
) -> UnsupportedQueryError | None:
    """The plain error for ``err`` planning ``df``, or ``None`` if it is no refusal."""
    text = str(err)
    if _PROST_DECODE in text and _PROST_DEPTH in text:
        major = datafusion.__version__.split(".")[0]
        first_line = text.splitlines()[0]
        message = (
            f"dfx cannot plan this query in Python: its plan nests deeper than "
            f"datafusion-python {major} decodes (prost's limit of 100 nested "
            "messages), and datafusion-python decodes the plan dfx's planner "
            "hands back to it; the Rust host (`dfx run`) runs it. "
            f"datafusion-python said: {first_line}"
        )
        return UnsupportedQueryError(message, "deep_plan")
    if _UNENCODED_TABLE in text:
        tables = _uncarried_tables(ctx, df)
        what = (
            ", ".join(tables)
            if tables
            else "a table DataFusion's plan format cannot carry"
        )
        message = (
            f"dfx cannot plan a query that reads {what}: a table function or an "
            "in-memory table is not supported distributed, nor by run_local, "
            "since both hand the plan to dfx's planner in DataFusion's plan "
            "format, which carries only tables read from files and views; "
            "register the data as a table instead"
        )
        return UnsupportedQueryError(message, "table_function", tables)
    return None


def _uncarried_tables(ctx: SessionContext, df: DataFrame) -> tuple[str, ...]:
    """The scans in ``df``'s plan of tables ``ctx`` does not hold, in plan order.

    A table function's scan is named ``<function>()`` and is in no catalog.
    The optimized plan, the one that crosses: its subqueries are joins by
    then, so a walk of the plan's inputs finds the scans inside them too.
    """
    try:
        plan = df.optimized_logical_plan()
    except Exception:
        # Wanted only for the names: the unoptimized plan will do.
        plan = df.logical_plan()
    names: list[str] = []
    pending: list[LogicalPlan] = [plan]
    while pending:
        node = pending.pop()
        variant = node.to_variant()
        if isinstance(variant, TableScan):
            name = variant.table_name()
            if not ctx.table_exist(name) and name not in names:
                names.append(name)
        # Reversed so the leftmost input is visited first.
        pending.extend(reversed(node.inputs()))
    return tuple(names)
