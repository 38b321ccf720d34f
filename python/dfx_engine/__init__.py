"""dfx for datafusion-python: a distributed query engine in one plugin file.

The native module :mod:`dfx_engine._internal` loads the dfx plugin file (the
copy bundled beside this package, or the file ``DFX_PLUGIN`` names) and hands
its planner, codec, config and functions to datafusion-python::

    from datafusion import SessionConfig, SessionContext
    from dfx_engine import DfxEngineConfig, DfxEngineExtension

    config = SessionConfig().with_extension(DfxEngineConfig(shuffle_dir="/tmp/q1"))
    ctx = SessionContext(config).with_extensions(DfxEngineExtension())

:mod:`dfx_engine.session` builds such sessions from a :class:`SessionSpec`;
on a session from :func:`session_for`, every DataFrame action
(``collect()``, ``to_pandas()``, a write) runs the query over worker
processes, and :mod:`dfx_engine.driver` runs one query (SQL or a DataFrame)
and says what its tasks did,
:mod:`dfx_engine.worker` is the worker, and :mod:`dfx_engine.ray` (the
``ray`` extra) runs the same worker code as Ray tasks.

Glossary: a *stage* is a subtree the planner rooted at a ``ShuffleWriterExec``
node; a consumer reads an upstream stage through a ``ShuffleReaderExec``,
which carries that stage as bytes (so stages do not nest as protobuf
messages, and each decodes on its own). A *map* is one
partition of a stage's input, run by one worker (a *task* is a
``(stage_id, map)``); it splits its rows into *buckets*. The *shuffle
directory* is where a map publishes ``stage-<S>/<K>-map-<M>.arrow``: every
bucket, as segments, closed by its commit marker, which indexes the segments
by bucket. Readers (in later stages and in the driver) find them there.
"""

from dfx_engine._internal import (
    DfxEngineConfig,
    DfxEngineExtension,
    StageInfo,
    bucket_path,
    encoded_stage_info,
    marker_path,
    partition_glob,
    physical_codec_id,
    plugin_path,
    plugin_version,
    reader_node_name,
    stage_id,
    stage_node_name,
)
from dfx_engine.dataframes import MemoryTableTooLargeError, last_run, session_for
from dfx_engine.session import (
    SessionSpec,
    Table,
    UnsupportedQueryError,
    build_session,
    build_worker_session,
    expected_codec_ids,
)

__all__ = [
    "DfxEngineConfig",
    "DfxEngineExtension",
    "MemoryTableTooLargeError",
    "SessionSpec",
    "StageInfo",
    "Table",
    "UnsupportedQueryError",
    "bucket_path",
    "build_session",
    "build_worker_session",
    "encoded_stage_info",
    "expected_codec_ids",
    "last_run",
    "marker_path",
    "partition_glob",
    "physical_codec_id",
    "plugin_path",
    "plugin_version",
    "reader_node_name",
    "session_for",
    "stage_id",
    "stage_node_name",
]
