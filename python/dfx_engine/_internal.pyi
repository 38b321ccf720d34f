"""Type stubs of the native module (python/src/lib.rs)."""

from collections.abc import Callable
from typing import Any, TypeVar

from datafusion.extensions import SessionExtensionComponents

_T = TypeVar("_T")
_P = TypeVar("_P", bound="WorkerPool")

__version__: str

class DfxEngineExtension:
    """Installs dfx's codec and planner through ``with_extensions``."""

    def __init__(self, driver: SessionDriver | None = None) -> None: ...
    @property
    def driver(self) -> SessionDriver | None: ...
    def __datafusion_session_components__(
        self, ctx: object
    ) -> SessionExtensionComponents: ...
    def __datafusion_session_planner__(
        self, ctx: object, fallback: object
    ) -> object: ...
    def plan_calls(self) -> int: ...
    def stages_inserted(self) -> int: ...
    def encode_calls(self) -> int: ...
    def decode_calls(self) -> int: ...
    def live_objects(self) -> int: ...
    def physical_codec_id(self) -> str: ...

class DfxLogicalCodec:
    """The plugin's logical codec bound to one session: carries in-memory tables."""

    @property
    def __datafusion_codec_id__(self) -> str: ...
    def __datafusion_logical_extension_codec__(
        self, session: object | None = None
    ) -> object: ...

class DfxRootCodec:
    """A driving session's root codec: a plan's root as a handle."""

    @property
    def __datafusion_codec_id__(self) -> str: ...
    def __datafusion_physical_extension_codec__(
        self, session: object | None = None
    ) -> object: ...

class DfxPhysicalCodec:
    """The plugin's physical codec bound to one session."""

    @property
    def __datafusion_codec_id__(self) -> str: ...
    def __datafusion_physical_extension_codec__(
        self, session: object | None = None
    ) -> object: ...

class DfxEngineConfig:
    """The plugin's config extension (``dfx_engine.shuffle_dir``, ``.split``)."""

    def __init__(self, shuffle_dir: str = "", split: str | None = None) -> None: ...
    @property
    def shuffle_dir(self) -> str: ...
    @property
    def split(self) -> str | None: ...
    def __datafusion_extension_options__(self) -> object: ...

class DfxScalarFunction:
    """One of the plugin's scalar functions, for ``datafusion.udf``."""

    @property
    def name(self) -> str: ...
    def __datafusion_scalar_udf__(self) -> object: ...

class DfxAggregateFunction:
    """One of the plugin's aggregate functions, for ``datafusion.udaf``."""

    @property
    def name(self) -> str: ...
    def __datafusion_aggregate_udf__(self) -> object: ...

def scalar_functions() -> list[DfxScalarFunction]: ...
def aggregate_functions() -> list[DfxAggregateFunction]: ...
def plugin_path() -> str: ...
def plugin_name() -> str: ...
def plugin_version() -> str: ...
def abi_version() -> int: ...
def datafusion_ffi_major() -> int: ...
def host_datafusion_ffi_major() -> int: ...
def stage_node_name() -> str: ...
def reader_node_name() -> str | None: ...
def config_prefix() -> str: ...
def physical_codec_id() -> str: ...
def map_footer() -> tuple[bytes, int]: ...
def stage_id(index: int = 0) -> int: ...
def map_path(dir: str, stage: int, map: int) -> str:
    """The map's one file (``stage-S/K-map-M.arrow``), there once it is published."""

def marker_path(dir: str, stage: int, map: int) -> str:
    """The map's file, as ``map_path``."""

def bucket_path(dir: str, stage: int, map: int, bucket: int) -> str:
    """The map's file, as ``map_path``: every bucket of a map is in it."""

def partition_glob() -> str: ...
def counters() -> dict[str, int]: ...
def take_failures(location: str) -> str:
    """The failure classes recorded for ``location`` since the last take, as JSON.

    A JSON array of ``"final"``, ``"io"`` or ``{"lost": [stage, map]}``;
    taking them forgets them.
    """

class StageInfo:
    """What a stage root carries, as the plugin reports it."""

    @property
    def stage_id(self) -> int: ...
    @property
    def shuffle_dir(self) -> str: ...
    @property
    def maps(self) -> int: ...
    @property
    def buckets(self) -> int: ...
    @property
    def partitions_per_map(self) -> int: ...
    @property
    def deps(self) -> list[int]: ...
    @property
    def aligned_deps(self) -> list[int]: ...
    @property
    def partitioning(self) -> str: ...

def encoded_stage_info(plan: bytes) -> StageInfo: ...
def probe_location(location: str, store_options: dict[str, str] | None = None) -> None:
    """Refuse a shuffle location holding stage output; probe and lock an S3 one."""

def vet_stage(plan: bytes, tables: list[str], shuffle_dir: str) -> None:
    """Refuse a stage with a sink, a file outside tables, or a foreign writer."""

def temporary_root() -> str:
    """The process's temporary shuffle root, made on first use."""

def remove_temporary_root() -> None:
    """Remove the process's temporary shuffle root, if one was made."""

class DriverLock:
    """An exclusive lock on a local shuffle directory, for one driver's run."""

    def __init__(self, directory: str) -> None: ...
    @property
    def path(self) -> str: ...
    @property
    def held(self) -> bool: ...
    def release(self) -> None: ...
    def __enter__(self) -> DriverLock: ...
    def __exit__(self, *args: object) -> bool: ...

# The session spec (the runtime's SessionSpec).
DEFAULT_TARGET_PARTITIONS: int
DEFAULT_SPLIT: str
DEFAULT_SHUFFLE_COMPRESSION: str
DEFAULT_SHUFFLE_DURABILITY: str
SPLIT_MODES: list[str]
STORE_OPTION_KEYS: list[str]
MEMORY_TABLE_LIMIT: str
"""The config key, under the plugin's prefix, bounding an in-memory table."""
MEMORY_TABLE_TOO_LARGE: str
"""The stable start of the plugin's error refusing an in-memory table."""

def normalize_spec(json: str) -> str:
    """The spec checked and written by the runtime; ValueError naming the fault."""

def serving_cluster_durability(location: str) -> str:
    """A spec's durability on serving workers of their own machines: local or both."""

def table_statement(name: str, json: str) -> str:
    """The CREATE EXTERNAL TABLE statement registering the table ``json`` defines."""

def effective_target_partitions(json: str) -> int:
    """The spec's partitions, raised to its largest table's file count."""

def unreadable_file(name: str, json: str, store_options: dict[str, str]) -> str | None:
    """Which file of the table cannot be registered, and why; or None."""

def partition_clash(name: str, json: str, file_columns: list[str]) -> str | None:
    """The refusal of a partition column among ``file_columns``, if one is."""

def plugin_settings(json: str) -> list[tuple[str, str]]:
    """The plugin's settings a session of the spec makes, keys without prefix."""

def parse_script(sql: str) -> tuple[str, list[str]]:
    """A script's tables (a JSON object of definitions) and its queries' texts."""

def session_settings(spec_json: str) -> list[tuple[str, str]]:
    """The DataFusion settings a session built from the spec makes, in order.

    The plugin's (what each stage needs to run alone), then the spec's
    ``datafusion_options``; a spec setting a key the plugin states is refused.
    """

# The runtime's scheduler.
MALLOC_TUNABLES_VAR: str
SERVING_MALLOC_TUNABLES: str

class WorkerLost(Exception):
    """A foreign executor's worker was lost: the task is tried again."""

class WorkerPool:
    """Long-lived serving workers (``command --serve``), reused across queries."""

    def __new__(
        cls: type[_P], command: list[str], max_workers: int | None = None
    ) -> _P: ...
    def pids(self) -> list[int]: ...
    @property
    def started(self) -> int: ...
    @property
    def max_workers(self) -> int | None: ...
    @property
    def command(self) -> list[str]: ...
    def close(self) -> None: ...
    def __enter__(self: _P) -> _P: ...
    def __exit__(self, *args: object) -> bool: ...

class QueryRun:
    """A query whose stages are all published."""

    def read_root(self, location: str, read: Callable[[str | None], _T]) -> _T: ...
    @property
    def stages(self) -> list[StageInfo]: ...
    @property
    def waves(self) -> list[list[int]]: ...
    @property
    def tasks(self) -> list[tuple[int, int]]: ...
    @property
    def reports(self) -> dict[tuple[int, int], dict[str, Any]]: ...
    @property
    def attempts(self) -> dict[tuple[int, int], int]: ...
    @property
    def retries(self) -> list[str]: ...
    @property
    def decisions(self) -> list[dict[str, Any]]: ...

class PreparedStages:
    """A query's stages, described by the plugin and cut for their maps."""

    @property
    def stages(self) -> list[StageInfo]: ...
    def __len__(self) -> int: ...

def prepare(encoded_stages: list[bytes]) -> PreparedStages:
    """Describe and cut a query's encoded stages (pre-order), as the runtime does."""

ROOT_CODEC_ID: str
ROOT_NODE_NAME: str
SHUFFLE_RANGES: str

class SessionDriver:
    """How a session drives its queries: its spec and its scheduler."""

    def __init__(
        self, spec_json: str, scheduler: Scheduler, envelope_files: bool = False
    ) -> None: ...
    @property
    def last_run(self) -> QueryRun | None: ...

def plan_stages(plan: bytes) -> list[bytes]:
    """The stages of an encoded plan, cut out by the plugin in pre-order."""

class Scheduler:
    """Runs queries' tasks on one executor."""

    def __init__(
        self,
        executor: object,
        *,
        command: list[str] | None = None,
        max_workers: int | None = None,
        max_attempts: int = 3,
        task_timeout: float | None = None,
        speculate: float | None = None,
        progress: bool = False,
    ) -> None: ...
    def run(
        self,
        spec_json: str,
        task_dir: str,
        stages: PreparedStages,
        envelope_files: bool = False,
    ) -> QueryRun: ...

class ClaimedLocation:
    """A driver's claim on a shuffle location for one query."""

    def __init__(self, spec_json: str) -> None: ...
    @property
    def task_dir(self) -> str: ...
    @property
    def canonical(self) -> str: ...
    @property
    def query_spec_json(self) -> str: ...
    @property
    def held(self) -> bool: ...
    def finish(self, answered: bool) -> str | None: ...
    def release(self) -> None: ...
    def __enter__(self) -> ClaimedLocation: ...
    def __exit__(self, *args: object) -> bool: ...

# The worker's side of the task protocol.
class Task:
    """One task as the worker's handler receives it."""

    @property
    def spec_json(self) -> str: ...
    @property
    def plan(self) -> bytes: ...
    @property
    def stage_id(self) -> int: ...
    @property
    def map(self) -> int: ...
    @property
    def attempt(self) -> int: ...
    @property
    def written_ns(self) -> int | None: ...
    @property
    def name(self) -> str: ...
    def check(self, codec_ids: list[str], vet: bool) -> None: ...
    def sealed_plan(self) -> bytes: ...
    def runs_slices(self) -> bool: ...

Layout = tuple[list[int], list[int], list[int], int, str | None, tuple[int, int] | None]
Handler = Callable[[Task], tuple[int, int | None, Layout | None]]

def serve(handler: Handler, responses_fd: int) -> int: ...
def run_task_file(path: str, handler: Handler) -> int: ...
def run_task_value(
    envelope_json: str, plan: bytes, handler: Handler, map_server: str | None = None
) -> str: ...
def start_map_server(bind: str) -> str: ...
def map_server_counts() -> tuple[int, int, int] | None: ...

class TaskPlacement:
    """Which task an envelope names, where it writes and its input lies."""

    @property
    def stage_id(self) -> int: ...
    @property
    def map(self) -> int: ...
    @property
    def attempt(self) -> int: ...
    @property
    def location(self) -> str: ...
    @property
    def input_by_owner(self) -> dict[str, int]: ...

def task_placement(envelope_json: str) -> TaskPlacement:
    """The placement of a task by its envelope; ValueError if it has none."""
