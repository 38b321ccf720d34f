"""dfx for datafusion-python: a distributed query engine in one plugin file.

The native module :mod:`dfx_engine._internal` loads the dfx plugin file (the
copy bundled beside this package, or the file ``DFX_PLUGIN`` names) and hands
its planner, codec, config and functions to datafusion-python::

    from datafusion import SessionConfig, SessionContext
    from dfx_engine import DfxEngineConfig, DfxEngineExtension

    config = SessionConfig().with_extension(DfxEngineConfig(shuffle_dir="/tmp/q1"))
    ctx = SessionContext(config).with_extensions(DfxEngineExtension())

:mod:`dfx_engine.session` builds such sessions from a :class:`SessionSpec`,
:mod:`dfx_engine.driver` runs a query over worker processes, and
:mod:`dfx_engine.worker` is the worker.

Glossary: a *stage* is a subtree the planner wrapped in a ``ShuffleStageExec``
node; a *task* is one ``(stage_id, partition)`` of it, run by one worker
process; the *shuffle directory* is where workers publish a task's output as
``stage-<id>-part-<p>.arrow`` and where the driver reads it back.
"""

from dfx_engine._internal import (
    DfxEngineConfig,
    DfxEngineExtension,
    partition_glob,
    partition_path,
    physical_codec_id,
    plugin_path,
    plugin_version,
    stage_id,
)
from dfx_engine.session import SessionSpec, build_session, expected_codec_ids

__all__ = [
    "DfxEngineConfig",
    "DfxEngineExtension",
    "SessionSpec",
    "build_session",
    "expected_codec_ids",
    "partition_glob",
    "partition_path",
    "physical_codec_id",
    "plugin_path",
    "plugin_version",
    "stage_id",
]
