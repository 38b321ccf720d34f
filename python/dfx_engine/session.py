"""One session factory for the driver and every worker.

A :class:`SessionSpec` says everything a session depends on: the tables (a
location of Parquet files, or a :class:`Table` of any of DataFusion's file
formats, local or on S3), the shuffle location, the partition count, where
plans are cut, how stage output is compressed and how an ``s3://`` location
is reached. It travels to every worker inside the task envelope, and
:func:`build_session` turns it into the same session on both sides, so a
worker decodes a stage with exactly the codecs and functions the driver
encoded it with.

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
  messages): long join chains. A distributed plan's stages do not add up:
  each reader carries the stage it reads as bytes, and each stage is
  decoded on its own, so only a single stage that deep is refused. The
  Rust host's prost has no such limit.
- a scan of a table the format does not carry, a table function such as
  ``generate_series``: datafusion-python cannot encode the logical plan.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import datafusion
from datafusion import SessionConfig, SessionContext
from datafusion.expr import EmptyRelation, TableScan
from datafusion.object_store import AmazonS3

from dfx_engine import _internal

if TYPE_CHECKING:
    from collections.abc import Iterator

    from datafusion import DataFrame
    from datafusion.plan import LogicalPlan

__all__ = [
    "SPLIT_MODES",
    "STORE_OPTION_KEYS",
    "TABLE_FORMATS",
    "UNSUPPORTED_REASONS",
    "SessionSpec",
    "Table",
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


TABLE_FORMATS: tuple[str, ...] = ("parquet", "csv", "json", "arrow")
"""The formats a :class:`Table` may be stored as (``json``: one object a line)."""


@dataclass(frozen=True)
class Table:
    """A table as DataFusion's ``CREATE EXTERNAL TABLE`` defines one.

    Both hosts register it by the statement the runtime writes for it, so a
    definition reads alike in the Rust host, in Python and in every worker.

    Attributes:
        location: A local path, ``file://...`` or ``s3://bucket/prefix``: a
            directory or one file. A glob is refused: DataFusion's plan format
            drops it, and a stage would read every file of its directory.
        format: One of :data:`TABLE_FORMATS`.
        options: Format options as ``OPTIONS`` takes them, such as
            ``{"format.has_header": "true", "format.delimiter": ";"}``.
        columns: The files' columns as ``(name, SQL type)``, when declared
            rather than inferred (a CSV file without a header row).
        partition_columns: Hive partition columns (``year=2024/...``),
            outermost first, as ``(name, SQL type)``, or ``(name, None)`` to
            read the values as strings. A typed one needs ``columns``.
    """

    location: str
    format: str = "parquet"
    options: dict[str, str] = field(default_factory=dict)
    columns: list[tuple[str, str]] = field(default_factory=list)
    partition_columns: list[tuple[str, str | None]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The definition as a spec's JSON holds it."""
        data: dict[str, Any] = {"location": self.location, "format": self.format}
        if self.options:
            data["options"] = dict(self.options)
        if self.columns:
            data["columns"] = [{"name": n, "type": t} for n, t in self.columns]
        if self.partition_columns:
            data["partition_columns"] = [
                {"name": n} if t is None else {"name": n, "type": t}
                for n, t in self.partition_columns
            ]
        return data

    @classmethod
    def from_json(cls, data: str | dict[str, Any]) -> Table:
        """A definition from a spec's JSON: a location (Parquet) or an object."""
        if isinstance(data, str):
            return cls(location=data)
        return cls(
            location=data["location"],
            format=data.get("format", "parquet"),
            options=dict(data.get("options", {})),
            columns=[(c["name"], c["type"]) for c in data.get("columns", [])],
            partition_columns=[
                (c["name"], c.get("type")) for c in data.get("partition_columns", [])
            ],
        )


def _table_json(table: str | Table) -> str | dict[str, Any]:
    """A spec's table as JSON: a location as written, a :class:`Table` as an object."""
    return table if isinstance(table, str) else table.to_json()


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
        tables: Table name to a location of Parquet files (a directory or one
            file; local or ``s3://``), or to a :class:`Table` of
            another format, options or partition columns.
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
        shuffle_durability: ``object_store`` (map files in the location),
            ``local`` (each on its writer's disk, streamed over Arrow
            Flight; needs a directory) or ``both`` (also in the location);
            ``None``: :func:`dfx_engine.executors.durability_for` chooses.
        map_server_bind: Where map servers listen, ``host:port`` (port 0:
            any). ``None``: ``127.0.0.1:0``, this host only.
        memory_limit: The most memory, in bytes, each map task's operators
            may hold, in every worker: sorts and aggregations spill past it,
            other operators fail with "Resources exhausted".
        engine_options: Other ``dfx_engine.<key>`` settings of every session
            of the query, the driver's and each worker's: the plugin's
            decisions to tune or turn off (``{"join_filters": "off"}``).
        stage_options: ``dfx_engine.<key>`` settings the scheduler gives the
            tasks of one stage (an adaptive decision's); a worker reads them
            from its task's spec. Never set by a user: a driver refuses a
            spec carrying them.
        datafusion_options: DataFusion settings (``datafusion.<key>``) of
            every session of the query, the driver's and each worker's. A
            key dfx sets itself so that each stage runs alone is refused.
        shuffle_root: A root (a path, ``file://`` or ``s3://bucket/prefix``)
            each query gets a fresh location under, ``<root>/<query id>/``,
            removed once its answer is read and kept (and named in the
            error) when it fails. Not beside ``shuffle_dir``; with neither,
            a query runs under a temporary root of the process.
        keep_shuffle: Keep each query's location under ``shuffle_root``.
    """

    tables: dict[str, str | Table] = field(default_factory=dict)
    shuffle_dir: str = ""
    target_partitions: int = _internal.DEFAULT_TARGET_PARTITIONS
    split: str = _internal.DEFAULT_SPLIT
    store_options: dict[str, str] = field(default_factory=dict)
    shuffle_compression: str = _internal.DEFAULT_SHUFFLE_COMPRESSION
    shuffle_durability: str | None = None
    map_server_bind: str | None = None
    memory_limit: int | None = None
    engine_options: dict[str, str] = field(default_factory=dict)
    stage_options: dict[str, str] = field(default_factory=dict)
    datafusion_options: dict[str, str] = field(default_factory=dict)
    shuffle_root: str = ""
    keep_shuffle: bool = False

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
        if fields["shuffle_durability"] is None:  # the executor chooses later
            del fields["shuffle_durability"]
        fields["tables"] = {
            name: _table_json(table) for name, table in self.tables.items()
        }
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
        fields["tables"] = {
            name: table if isinstance(table, str) else Table.from_json(table)
            for name, table in fields.get("tables", {}).items()
        }
        return cls(**fields)

    def with_tables_from_sql(self, sql: str) -> SessionSpec:
        """This spec with the tables ``CREATE EXTERNAL TABLE`` statements define.

        ``sql`` holds only such statements, separated by ``;``, as
        datafusion-cli reads them: a user's DDL becomes definitions every
        worker is given.

        Raises:
            ValueError: SQL that does not parse, a statement that is not
                ``CREATE EXTERNAL TABLE``, or a table defined twice.
        """
        statements = sql.rstrip().rstrip(";")
        tables_text, queries = _internal.parse_script(f"{statements};\nSELECT 1")
        if queries != ["SELECT 1"]:
            message = "with_tables_from_sql takes CREATE EXTERNAL TABLE statements only"
            raise ValueError(message)
        added = {
            name: Table.from_json(table)
            for name, table in json.loads(tables_text).items()
        }
        twice = sorted(set(added) & set(self.tables))
        if twice:
            message = f"tables defined twice: {', '.join(twice)}"
            raise ValueError(message)
        return dataclasses.replace(self, tables={**self.tables, **added})


def effective_target_partitions(spec: SessionSpec) -> int:
    """``spec.target_partitions``, raised to the file count of its largest table.

    A task is one partition of a stage and the unit of work over a table is a
    file, so a table of N files scans as N partitions. The files are listed
    as DataFusion lists them, by the runtime the Rust host applies too, so
    one spec plans alike in both.

    Raises:
        ValueError: If a table's location cannot be listed or holds no file
            of its format.
    """
    return _internal.effective_target_partitions(spec.to_json_text())


def build_session(
    spec: SessionSpec,
    *,
    register_tables: bool = True,
    driver: _internal.SessionDriver | None = None,
) -> tuple[SessionContext, _internal.DfxEngineExtension]:
    """A session with dfx installed, the plugin's functions and the spec's tables.

    1. The settings every dfx session needs (``_internal.session_settings``),
       then the spec's own DataFusion settings, and the config extension go
       on the config before the context exists, so the planner sees the
       shuffle location (and split, compression and store options, set only
       with one) from the first query on.
    2. ``with_extensions`` installs the plugin's codec and planner and
       registers its functions (plans name them). With ``driver``, the
       planner is the driving one (:func:`dfx_engine.session_for`): every
       plan with stages runs them when it is executed.
    3. Each table is registered by the statement the runtime writes for it
       (``CREATE EXTERNAL TABLE``), after the S3 client of its bucket, unless
       ``register_tables`` is false (see :func:`build_worker_session`).

    Returns:
        The context and the installed extension (whose counters show what
        the planner and codec did).

    Raises:
        RuntimeError: If the session did not end up with the expected codecs.
        ValueError: If a table cannot be listed or registered, or a partition
            column is also a column of its files.
    """
    split = spec.split if spec.shuffle_dir else None
    # A worker runs stages whose partitions are fixed: only a session that
    # plans lists its tables for the partition floor.
    partitions = (
        effective_target_partitions(spec) if register_tables else spec.target_partitions
    )
    config = SessionConfig().with_target_partitions(partitions)
    for key, value in _internal.session_settings(spec.to_json_text()):
        config = config.set(key, value)
    config = config.with_extension(
        _internal.DfxEngineConfig(shuffle_dir=spec.shuffle_dir, split=split)
    )
    prefix = _internal.config_prefix()
    # The rest the runtime says every session sets (compression, store and
    # engine options), exactly as the Rust host sets them.
    for key, value in _internal.plugin_settings(spec.to_json_text()):
        # Onto the extension just added: keys under the plugin's prefix
        # go to its options (checked by the plugin when it plans).
        config = config.set(f"{prefix}.{key}", value)
    engine = _internal.DfxEngineExtension(driver)
    ctx = SessionContext(config).with_extensions(engine)

    if register_tables:
        for name, table in sorted(spec.tables.items()):
            _register_table(ctx, name, table, spec.store_options)

    found = ctx.physical_extension_codec_ids()
    # A driving session's plans carry their root in a codec of its own,
    # which no stage uses: the ids shipped to workers stay the plugin's.
    expected = expected_codec_ids() + ([_internal.ROOT_CODEC_ID] if driver else [])
    if found != expected:
        message = (
            f"the session carries physical codecs {found}, expected {expected}; "
            "the dfx extension was not installed as build_session installs it"
        )
        raise RuntimeError(message)
    return ctx, engine


def _register_table(
    ctx: SessionContext, name: str, table: str | Table, store_options: dict[str, str]
) -> None:
    """Register ``table`` as ``name`` in ``ctx`` by the runtime's statement.

    Raises:
        ValueError: A table DataFusion cannot list or read, naming it, or a
            partition column that is also a column of its files.
    """
    definition = table if isinstance(table, Table) else Table(location=table)
    if definition.location.startswith("s3://"):
        bucket = definition.location.removeprefix("s3://").split("/", 1)[0]
        endpoint = store_options.get("s3_endpoint") or None
        allow_http = store_options.get("s3_allow_http", "").strip().lower() == "true"
        region = store_options.get("s3_region") or None
        store = AmazonS3(
            bucket_name=bucket,
            region=region,
            endpoint=endpoint,
            allow_http=allow_http,
        )
        # datafusion-python keys the store by scheme and host, the host
        # defaulting to the store's bucket: "s3://" names this bucket.
        ctx.register_object_store("s3://", store)
    table_json = json.dumps(_table_json(table))
    statement = _internal.table_statement(name, table_json)
    try:
        # Run by ``sql`` itself: the empty frame it answers is not collected.
        ctx.sql(statement)
    except Exception as err:
        # Which file, when one is to blame: DataFusion names the location.
        file = _internal.unreadable_file(name, table_json, store_options)
        message = (
            f"cannot register {file}"
            if file is not None
            else f"cannot register table {name} over {definition.location}: {err}"
        )
        raise ValueError(message) from err
    partitions = [column for column, _ in definition.partition_columns]
    if not partitions:
        return
    try:
        fields = ctx.table(name).schema().names
    except Exception as err:
        # DataFusion refuses the table's schema when a partition column
        # repeats a file column: said as the clash it is.
        repeated = [column for column in partitions if column in str(err)]
        clash = _internal.partition_clash(name, table_json, repeated)
        message = clash or f"table {name} ({definition.location}): {err}"
        raise ValueError(message) from err
    files = fields[: len(fields) - len(partitions)]
    clash = _internal.partition_clash(name, table_json, files)
    if clash is not None:
        raise ValueError(clash)


def build_worker_session(
    spec: SessionSpec,
) -> tuple[SessionContext, _internal.DfxEngineExtension]:
    """:func:`build_session` for a worker: the same session, without the tables.

    An encoded stage carries its scans whole, so decoding and running it
    never looks a table up, while registering one lists its directory and
    reads every file's footer.
    """
    return build_session(spec, register_tables=False)


UNSUPPORTED_REASONS = ("deep_plan", "table_function", "empty_relation")
"""Why a session cannot plan a query (:attr:`UnsupportedQueryError.reason`).

``deep_plan``: the plan, or one stage of it, nests deeper than
datafusion-python decodes;
``table_function``: it reads a table the plan format cannot carry;
``empty_relation``: the optimizer proved part of it empty (``WHERE false``),
and the plan format carries an empty relation without its columns.
"""

# DataFusion's words for the two refusals, matched once, to reword them for
# the user and never to decide a retry: datafusion-python raises a bare
# Exception, so its text is all that tells them apart.
_PROST_DECODE = "failed to decode Protobuf message"
_PROST_DEPTH = "recursion limit reached"
_UNENCODED_TABLE = "Error serializing custom table"
_NO_FIELD = "No field named"


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
            f"dfx cannot plan this query in Python: its plan, or one stage of "
            f"it, nests deeper than datafusion-python {major} decodes (prost's "
            "limit of 100 nested messages), and datafusion-python decodes the "
            "plan dfx's planner hands back to it and each stage cut from it "
            "whole; the Rust host (`dfx run`) runs it. "
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
    if _NO_FIELD in text and _has_empty_relation(df):
        message = (
            "dfx cannot plan this query in Python: DataFusion's optimizer proved "
            "part of it empty (an always-false filter such as WHERE false or "
            "1 = 0), and datafusion-python hands dfx's planner that empty "
            "relation in DataFusion's plan format, which keeps no columns, so "
            "the operators above it cannot find theirs. Drop the always-false "
            "condition, or run the query with the Rust host (`dfx run`), which "
            "hands over the empty relation with its columns. "
            f"DataFusion said: {text.splitlines()[0]}"
        )
        return UnsupportedQueryError(message, "empty_relation")
    return None


def _has_empty_relation(df: DataFrame) -> bool:
    """Whether ``df``'s optimized plan holds an empty relation with columns."""
    try:
        plan = df.optimized_logical_plan()
    except Exception:
        return False
    pending: list[LogicalPlan] = [plan]
    while pending:
        node = pending.pop()
        if isinstance(node.to_variant(), EmptyRelation):
            return True
        pending.extend(node.inputs())
    return False


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
