"""Finding, loading and refusing the plugin file."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

import dfx_engine
from dfx_engine import _internal

PROBE = "import dfx_engine._internal as i; print(i.plugin_path())"


def probe(plugin: str | None) -> subprocess.CompletedProcess[str]:
    """Load the plugin in a fresh interpreter with ``DFX_PLUGIN`` as given."""
    env = dict(os.environ)
    env.pop("DFX_PLUGIN", None)
    if plugin is not None:
        env["DFX_PLUGIN"] = plugin
    return subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def test_the_bundled_plugin_is_used_by_default() -> None:
    done = probe(None)
    assert done.returncode == 0, done.stderr
    bundled = pathlib.Path(dfx_engine.__file__).parent / "libdfx_plugin.so"
    assert done.stdout.strip() == str(bundled)


def test_dfx_plugin_overrides_the_bundled_file(tmp_path: pathlib.Path) -> None:
    bundled = pathlib.Path(dfx_engine.__file__).parent / "libdfx_plugin.so"
    copy = tmp_path / "libdfx_plugin.so"
    copy.symlink_to(bundled)
    done = probe(str(copy))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(copy)


def test_a_missing_plugin_says_where_it_looked(tmp_path: pathlib.Path) -> None:
    done = probe(str(tmp_path / "nowhere.so"))
    assert done.returncode != 0
    assert "DFX_PLUGIN" in done.stderr
    assert "nowhere.so" in done.stderr


def test_a_library_that_is_not_a_plugin_is_refused(tmp_path: pathlib.Path) -> None:
    fake = tmp_path / "libfake.so"
    fake.write_bytes(b"\x7fELF this is not a shared library")
    done = probe(str(fake))
    assert done.returncode != 0
    assert "dfx_engine cannot use the dfx plugin" in done.stderr
    assert str(fake) in done.stderr


def test_versions_and_contract_constants() -> None:
    assert _internal.plugin_name() == "dfx-plugin"
    assert _internal.plugin_version()
    assert _internal.datafusion_ffi_major() == _internal.host_datafusion_ffi_major()
    assert _internal.abi_version() == 3
    assert _internal.stage_node_name() == "ShuffleWriterExec"
    assert _internal.reader_node_name() == "ShuffleReaderExec"
    assert _internal.config_prefix() == "dfx_engine"
    assert _internal.physical_codec_id() == "dfx_engine.physical.v5"
    assert [_internal.stage_id(n) for n in range(3)] == [1, 2, 3]
    assert _internal.stage_id() == 1
    assert _internal.marker_path("/d", 2, 5) == "/d/stage-2/5-map-5.arrow"
    assert _internal.bucket_path("/d", 2, 5, 3) == "/d/stage-2/5-map-5.arrow"
    assert _internal.partition_glob() == "stage-*"


@pytest.mark.parametrize("name", ["dfx_net_revenue"])
def test_plugin_functions_are_registrable(name: str) -> None:
    from datafusion import SessionContext, udaf, udf

    ctx = SessionContext()
    for function in _internal.scalar_functions():
        ctx.register_udf(udf(function))
    for function in _internal.aggregate_functions():
        ctx.register_udaf(udaf(function))
    assert [f.name for f in _internal.scalar_functions()] == [name]
    assert [f.name for f in _internal.aggregate_functions()] == ["dfx_weighted_avg"]
    value = ctx.sql("SELECT dfx_net_revenue(100.0, 0.5, 0.5) AS v").collect()
    assert value[0].column(0).to_pylist() == [75.0]
