"""DataFrames for the driver: the session they are built on, and their tables.

A DataFrame is planned by the session it was built on, so
:func:`dfx_engine.driver.run_distributed` runs one only if that session is
a dfx session made for the run's spec: its planner cuts the plan into
stages aimed at the spec's shuffle location. :func:`session_for` makes one::

    ctx = session_for(spec)
    df = ctx.table("lineitem").filter(col("l_quantity") > lit(10))
    run_distributed(df, spec)

A table held in memory (``ctx.from_arrow``, ``ctx.from_pydict``,
``ctx.register_record_batches``) is not in DataFusion's plan format, which
carries tables over files. The plugin's logical codec carries it into the
planner by value, and the planner writes it once into the shuffle location
(``<location>/sources/<digest>/part-<p>.arrow``, one Arrow IPC file per
partition), where the workers read it as they read any table::

    driver: encode the plan ─► the codec scans the table, its rows as Arrow
            IPC (at most dfx_engine.memory_table_limit bytes, 64 MiB unless
            set) ─► the planner writes each partition once ─► the stages
            scan those files
    workers: read them like the spec's tables (the stage check allows the
             location's sources/)

A larger table is refused by :class:`MemoryTableTooLargeError`, naming its
size, the limit and the setting; :func:`session_for` takes the limit. Only a
local shuffle location can hold such tables.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from typing import TYPE_CHECKING

from dfx_engine import _internal
from dfx_engine.executors import (
    WORKER_MODES,
    WorkerPool,
    executor_for,
    stderr_is_terminal,
    temporary_root,
)
from dfx_engine.session import SessionSpec, build_session

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from datafusion import SessionContext

    from dfx_engine.executors import Executor

__all__ = [
    "MEMORY_TABLE_LIMIT_KEY",
    "MemoryTableTooLargeError",
    "drives",
    "last_run",
    "memory_table_limit_of",
    "plain_memory_table_errors",
    "session_for",
    "session_of",
    "set_memory_table_limit",
]

MEMORY_TABLE_LIMIT_KEY = f"{_internal.config_prefix()}.{_internal.MEMORY_TABLE_LIMIT}"
"""The setting bounding an in-memory table, in bytes of Arrow IPC (64 MiB)."""

# The last session made for each spec (by its JSON), while the caller holds
# it: the one a DataFrame of that spec is planned, encoded and read with.
_SESSIONS: weakref.WeakValueDictionary[str, SessionContext] = (
    weakref.WeakValueDictionary()
)

# Every spec session_for made a session for (by its JSON): a DataFrame
# outlives the Python object of its session, so this is no weak table.
_DRIVING: set[str] = set()

# The in-memory table limit session_for set for each spec (by its JSON).
_LIMITS: dict[str, int] = {}

# The driver of each session session_for made, while the caller holds it.
_DRIVERS: weakref.WeakKeyDictionary[SessionContext, _internal.SessionDriver] = (
    weakref.WeakKeyDictionary()
)


class MemoryTableTooLargeError(ValueError):
    """An in-memory table over the limit it may carry into a dfx plan.

    The message is the plugin's: the table, its size, the limit and the
    setting that raises it (:data:`MEMORY_TABLE_LIMIT_KEY`). The error the
    plugin's words came in is its ``__cause__``.

    Attributes:
        setting: :data:`MEMORY_TABLE_LIMIT_KEY`.
    """

    setting = MEMORY_TABLE_LIMIT_KEY


def session_for(
    spec: SessionSpec,
    *,
    memory_table_limit: int | None = None,
    executor: Executor | None = None,
    worker_mode: str = WORKER_MODES[0],
    pool: WorkerPool | None = None,
    worker_command: Sequence[str] | None = None,
    max_workers: int | None = None,
    max_attempts: int = 3,
    task_timeout: float | None = None,
    speculate: float | None = None,
    progress: bool = True,
) -> SessionContext:
    """A dfx session for ``spec`` whose queries run distributed.

    Every action on a DataFrame of the session (``collect()``, ``show()``,
    ``to_pandas()``, ``to_arrow_table()``, ``count()``, ``execute_stream()``)
    plans the query with a root node that, when
    executed, runs its stages on the session's executor (the runtime's
    scheduler, as :func:`dfx_engine.driver.run_distributed` does) and then
    reads its head here::

        ctx = session_for(SessionSpec(tables=..., shuffle_root="/tmp/dfx"))
        ctx.sql("SELECT count(*) FROM lineitem").to_pandas()

    Each query runs in ``spec.shuffle_dir``, which must hold no stage output
    yet (so once), or in a fresh location under ``spec.shuffle_root`` (under
    a temporary root of the process when the spec names neither), removed
    once its answer is read unless ``spec.keep_shuffle``, and kept after a
    failure, the error naming it.

    The executor's settings are :func:`dfx_engine.driver.run_distributed`'s;
    without ``pool`` or ``executor`` the session makes a pool of its own,
    which ends with the session. The session is also remembered (while the
    caller holds it) as the one ``run_distributed`` encodes and reads a
    DataFrame of ``spec`` with. ``memory_table_limit`` sets
    :data:`MEMORY_TABLE_LIMIT_KEY` on it. A query whose tasks run past
    about a second shows ``run_distributed``'s live line on stderr when it
    is a terminal, unless ``progress=False``. ``write_parquet()`` is not
    among the actions: datafusion-python's planner boundary cannot carry a
    write plan.

    Raises:
        ValueError: A negative ``memory_table_limit``, settings that
            contradict each other (see ``run_distributed``).
        FileNotFoundError: If a table's directory does not exist.
    """
    if not spec.shuffle_dir and not spec.shuffle_root:
        spec = dataclasses.replace(spec, shuffle_root=temporary_root())
    executor_of, options = executor_for(
        worker_command, max_workers, worker_mode, pool, executor
    )
    if executor_of is None:
        # The session's own: held by its planner, it ends with the session.
        executor_of = WorkerPool(max_workers, worker_command)
    scheduler = _internal.Scheduler(
        executor_of,
        max_attempts=max_attempts,
        task_timeout=task_timeout,
        speculate=speculate,
        progress=progress and stderr_is_terminal(),
        **options,
    )
    driver = _internal.SessionDriver(
        spec.to_json_text(), scheduler, envelope_files=executor_of == "process"
    )
    ctx, _engine = build_session(spec, driver=driver)
    if memory_table_limit is not None:
        set_memory_table_limit(ctx, memory_table_limit)
    _SESSIONS[spec.to_json_text()] = ctx
    _DRIVERS[ctx] = driver
    _DRIVING.add(spec.to_json_text())
    if memory_table_limit is None:
        _LIMITS.pop(spec.to_json_text(), None)
    else:
        _LIMITS[spec.to_json_text()] = memory_table_limit
    return ctx


def last_run(ctx: SessionContext) -> _internal.QueryRun | None:
    """What the scheduler did for the last query of ``ctx`` whose answer was read.

    ``ctx`` is a session from :func:`session_for`; ``None`` before its first
    distributed query, or for any other session. The run's ``tasks``,
    ``reports`` (each task's rows, bytes and worker pid), ``attempts``,
    ``retries`` and ``decisions`` are what ``run_distributed`` returns.
    """
    driver = _DRIVERS.get(ctx)
    return None if driver is None else driver.last_run


def memory_table_limit_of(spec: SessionSpec) -> int | None:
    """The ``memory_table_limit`` :func:`session_for` was given for ``spec``."""
    return _LIMITS.get(spec.to_json_text())


def drives(spec: SessionSpec) -> bool:
    """Whether :func:`session_for` made a session for ``spec``: it drives.

    Its planner claims a query's location itself, so a DataFrame of it is
    planned again by a plain session before ``run_distributed`` claims one.
    """
    return spec.to_json_text() in _DRIVING


def session_of(spec: SessionSpec) -> SessionContext:
    """The session :func:`session_for` last made for ``spec``, or a new one.

    A new one plans nothing here: a DataFrame is already planned by its own
    session, and any dfx session of the spec encodes its stages and reads
    its root alike (the same codecs, the same location).
    """
    ctx = _SESSIONS.get(spec.to_json_text())
    if ctx is None:
        ctx, _engine = build_session(spec)
    return ctx


def set_memory_table_limit(ctx: SessionContext, limit: int) -> None:
    """Set :data:`MEMORY_TABLE_LIMIT_KEY` to ``limit`` bytes on ``ctx``'s session.

    Raises:
        ValueError: A limit that is not a whole number of bytes, 0 or more.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        message = (
            f"{MEMORY_TABLE_LIMIT_KEY} is a number of bytes, 0 or more; got {limit!r}"
        )
        raise ValueError(message)
    # A statement takes effect as it is planned, before anything is collected.
    ctx.sql(f"SET {MEMORY_TABLE_LIMIT_KEY} = {limit}")


def not_a_dfx_dataframe(spec: SessionSpec) -> ValueError:
    """The error for a DataFrame whose plan has no stage to run."""
    message = (
        "the DataFrame's plan has no stage: it was built on a session without "
        "dfx's planner, without a shuffle location, or whose settings keep "
        "it whole for the driver (dfx_engine.collapse_stages) where the "
        "spec's would cut it. Build it on "
        f"dfx_engine.session_for(spec) for the spec of shuffle_dir "
        f"{spec.shuffle_dir!r}, the session run_distributed plans it with"
    )
    return ValueError(message)


def driven_by_its_own_session(spec: SessionSpec) -> ValueError:
    """The error for a DataFrame of a session that runs its own queries.

    Its plan was made by :func:`session_for` of another spec: it already
    claimed a location of its own, which ``run_distributed`` cannot read.
    """
    message = (
        "the DataFrame belongs to a session that runs its queries itself "
        "(dfx_engine.session_for of another spec): call its collect(), or "
        "build it on dfx_engine.session_for(spec) for the spec of shuffle_dir "
        f"{spec.shuffle_dir!r}, the session run_distributed plans it with"
    )
    return ValueError(message)


@contextlib.contextmanager
def plain_memory_table_errors() -> Iterator[None]:
    """Plan inside; the plugin's refusal of a table too large leaves alone.

    datafusion-python reports it inside its own words about a table that
    failed to encode, which would otherwise read as an unsupported query.

    Raises:
        MemoryTableTooLargeError: The plugin's sentence, from its stable
            start (``_internal.MEMORY_TABLE_TOO_LARGE``) to the end of its line.
    """
    try:
        yield
    except Exception as err:
        text = str(err)
        start = text.find(_internal.MEMORY_TABLE_TOO_LARGE)
        if start < 0:
            raise
        raise MemoryTableTooLargeError(text[start:].splitlines()[0]) from err
