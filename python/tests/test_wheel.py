"""The wheel as a user gets it: built by the package's backend, plugin inside.

``run-tests.sh`` builds the wheel with ``build-wheel.sh --dev`` (the debug
variant of the documented release command) and names it in ``DFX_WHEEL``;
here it is installed into a fresh virtual environment, with its dependencies
from the package index and without ``DFX_PLUGIN``, and runs queries. The
backend's refusals are checked in this process.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from types import ModuleType

PYTHON_DIR = pathlib.Path(__file__).resolve().parents[1]
BACKEND = PYTHON_DIR / "build_backend" / "dfx_build.py"
WHEEL = os.environ.get("DFX_WHEEL", "")

IN_FRESH_VENV = textwrap.dedent(
    """
    import json, pathlib, sys
    from datafusion import SessionConfig, SessionContext
    import dfx_engine
    from dfx_engine import DfxEngineConfig, DfxEngineExtension
    from dfx_engine.driver import run_distributed
    from dfx_engine.session import SessionSpec

    table, shuffle = sys.argv[1], sys.argv[2]
    config = SessionConfig().with_extension(DfxEngineConfig())
    ctx = SessionContext(config).with_extensions(DfxEngineExtension())
    net = ctx.sql("SELECT dfx_net_revenue(1.0, 0.1, 0.2) AS n").collect()
    spec = SessionSpec(tables={"lineitem": table}, shuffle_dir=shuffle)
    sql = "SELECT sum(dfx_net_revenue(l_extendedprice, l_discount, l_tax)) AS n "
    result = run_distributed(sql + "FROM lineitem", spec)
    print(json.dumps({
        "plugin": dfx_engine.plugin_path(),
        "package": str(pathlib.Path(dfx_engine.__file__).parent),
        "net": net[0].column(0).to_pylist(),
        "distributed": result.batches[0].column(0).to_pylist(),
        "tasks": len(result.tasks),
    }))
    """
)


def _backend() -> ModuleType:
    """The build backend, loaded from the source tree (it is not installed)."""
    spec = importlib.util.spec_from_file_location("dfx_build", BACKEND)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not WHEEL, reason="DFX_WHEEL (set by run-tests.sh) names no wheel")
def test_the_wheel_runs_queries_in_a_fresh_environment_with_its_own_plugin(
    lineitem: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    import json

    venv = tmp_path / "venv"
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = venv / "bin" / "python"
        env = {k: v for k, v in os.environ.items() if k != "DFX_PLUGIN"}
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", WHEEL],
            check=True,
            env=env,
        )
        done = subprocess.run(
            [str(python), "-c", IN_FRESH_VENV, str(lineitem), str(tmp_path / "s")],
            capture_output=True,
            text=True,
            check=False,
            env=env,
            # Not the source tree: the installed package must be the one used.
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout.splitlines()[-1])
    finally:
        # The debug plugin is hundreds of MB: not kept among pytest's temp dirs.
        shutil.rmtree(venv, ignore_errors=True)
    assert report["plugin"] == str(pathlib.Path(report["package"]) / "libdfx_plugin.so")
    assert report["plugin"].startswith(str(venv))
    assert report["net"] == [pytest.approx(1.08)]
    assert report["distributed"] == [pytest.approx(3150.0)]
    assert report["tasks"] >= 4


def test_a_build_without_cargo_fails_saying_what_to_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    backend = _backend()
    monkeypatch.delenv("CARGO", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(backend.PluginBuildError, match="cargo is not on PATH") as info:
        backend.build_wheel(str(tmp_path))
    assert "python/build-wheel.sh" in str(info.value)
    assert "pip install ./python" in str(info.value)


def test_a_build_outside_the_workspace_fails_saying_what_to_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    backend = _backend()
    monkeypatch.setattr(backend, "PACKAGE", tmp_path / "python")
    with pytest.raises(backend.PluginBuildError, match=r"plugin/Cargo\.toml") as info:
        backend.prepare_metadata_for_build_wheel(str(tmp_path))
    assert "python/build-wheel.sh" in str(info.value)


@pytest.mark.parametrize(
    ("args", "profile"),
    [("", "release"), ("--profile dev --strip", "dev"), ("--profile=ci", "ci")],
)
def test_the_plugin_is_built_in_the_profile_maturin_builds_in(
    monkeypatch: pytest.MonkeyPatch, args: str, profile: str
) -> None:
    monkeypatch.setenv("MATURIN_PEP517_ARGS", args)
    assert _backend()._profile(None) == profile
