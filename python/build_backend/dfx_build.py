"""The build backend of dfx-engine: maturin's, with the dfx plugin bundled.

maturin builds the extension module (``python/src``), which knows nothing of
the plugin it loads at run time: ``libdfx_plugin.so`` is another crate of the
workspace (``plugin/``). So before maturin builds a wheel, this backend
builds the plugin with cargo, in the profile maturin builds in, and copies it
beside the package (``dfx_engine/libdfx_plugin.so``), where
``[tool.maturin] include`` puts it in the wheel::

    pip install ./python ──► dfx_build.build_wheel
        cargo build -p dfx-plugin --profile P ──► .../libdfx_plugin.so
        copy ──► python/dfx_engine/libdfx_plugin.so
        maturin build-wheel --profile P ──► wheel: _internal + plugin + package

The profile is maturin's: ``release`` unless ``MATURIN_PEP517_ARGS`` (or the
``build-args`` config setting) says ``--profile``. Where no plugin can be
built (no cargo, or no workspace around this directory, as in an sdist), the
build fails before maturin runs, saying what to run instead.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import maturin

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_wheel",
]

PACKAGE = pathlib.Path(__file__).resolve().parents[1]
"""``python/``: this backend's project directory."""

PLUGIN_CRATE = "dfx-plugin"
PLUGIN_TARGET = "dfx_plugin"
"""The plugin's package and library target names in the workspace."""

BUNDLED = PACKAGE / "dfx_engine" / "libdfx_plugin.so"
"""Where the wheel carries the plugin; pyproject.toml includes this path."""

HOW_TO_BUILD = (
    "Build dfx-engine from a clone of the dfx repository, with cargo on PATH: "
    "`pip install ./python` at its root installs it, and `python/build-wheel.sh` "
    "builds a release wheel with the plugin inside (install that wheel anywhere)."
)


class PluginBuildError(RuntimeError):
    """No plugin could be built to bundle; the message says what to run."""


def _profile(config_settings: Mapping[str, Any] | None) -> str:
    """The cargo profile maturin will build in (its default: ``release``)."""
    args = [str(arg) for arg in maturin.get_maturin_pep517_args(config_settings)]
    for index, arg in enumerate(args):
        if arg == "--profile" and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith("--profile="):
            return arg.split("=", 1)[1]
    return "release"


def _workspace() -> pathlib.Path:
    """The workspace root around ``python/``, which holds the plugin crate.

    Raises:
        PluginBuildError: If there is none (a copy of ``python/`` alone, or
            an sdist).
    """
    root = PACKAGE.parent
    manifest = root / "plugin" / "Cargo.toml"
    if not manifest.is_file() or not (root / "Cargo.toml").is_file():
        message = (
            f"dfx-engine bundles the dfx plugin, built from the workspace around "
            f"{PACKAGE}, but {manifest} does not exist. {HOW_TO_BUILD}"
        )
        raise PluginBuildError(message)
    return root


def _cargo() -> str:
    """The cargo to build with (``CARGO``, else the one on PATH).

    Raises:
        PluginBuildError: If there is none. Checked before maturin runs,
            which would otherwise try to download a Rust toolchain.
    """
    cargo = os.environ.get("CARGO") or shutil.which("cargo")
    if not cargo:
        message = (
            "dfx-engine is built from source with cargo (Rust 1.94 or later), "
            "and cargo is not on PATH. Install Rust with rustup, then run the "
            f"same command again. {HOW_TO_BUILD}"
        )
        raise PluginBuildError(message)
    return cargo


def _built_plugin(stdout: str) -> pathlib.Path | None:
    """The plugin file among the artifacts cargo reported (JSON, one a line)."""
    for line in stdout.splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if not isinstance(message, dict) or message.get("reason") != (
            "compiler-artifact"
        ):
            continue
        target = message.get("target") or {}
        if target.get("name") != PLUGIN_TARGET or "cdylib" not in target.get(
            "crate_types", []
        ):
            continue
        for filename in message.get("filenames", []):
            if pathlib.Path(filename).suffix in (".so", ".dylib", ".dll"):
                return pathlib.Path(filename)
    return None


def bundle_plugin(profile: str) -> pathlib.Path:
    """Build the plugin in ``profile`` and copy it to :data:`BUNDLED`.

    The old copy is removed first, so a failed build cannot leave a stale
    plugin (of another profile or commit) to be bundled.

    Raises:
        PluginBuildError: If there is no workspace or cargo, or the build
            failed.
    """
    root = _workspace()
    cargo = _cargo()
    BUNDLED.unlink(missing_ok=True)
    command = [
        cargo,
        "build",
        "-p",
        PLUGIN_CRATE,
        "--profile",
        profile,
        # Artifacts as JSON on stdout (where the file went, whatever the
        # target directory); the compiler's messages rendered on stderr.
        "--message-format",
        "json-render-diagnostics",
    ]
    print(f"Building the dfx plugin: {' '.join(command[1:])}", file=sys.stderr)
    done = subprocess.run(  # noqa: S603 - cargo, with fixed arguments
        command, cwd=root, stdout=subprocess.PIPE, text=True, check=False
    )
    if done.returncode != 0:
        message = (
            f"`cargo {' '.join(command[1:5])} --profile {profile}` failed in {root} "
            f"with status {done.returncode} (its errors are above). {HOW_TO_BUILD}"
        )
        raise PluginBuildError(message)
    built = _built_plugin(done.stdout)
    if built is None or not built.is_file():
        message = (
            f"cargo built {PLUGIN_CRATE} in {root} but reported no plugin file "
            f"(found {built}); is its library still a cdylib?"
        )
        raise PluginBuildError(message)
    # A temp name, then rename: an interrupted copy is never taken for a plugin.
    partial = BUNDLED.with_name(BUNDLED.name + ".partial")
    shutil.copyfile(built, partial)
    partial.chmod(0o755)
    partial.replace(BUNDLED)
    print(f"Bundling {built} as {BUNDLED}", file=sys.stderr)
    return BUNDLED


def build_wheel(
    wheel_directory: str,
    config_settings: Mapping[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    """PEP 517: build the plugin, bundle it, then maturin's wheel."""
    bundle_plugin(_profile(config_settings))
    return str(
        maturin.build_wheel(wheel_directory, config_settings, metadata_directory)
    )


def build_editable(
    wheel_directory: str,
    config_settings: Mapping[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    """PEP 660: as :func:`build_wheel`; the package then loads the copy in place."""
    bundle_plugin(_profile(config_settings))
    return str(
        maturin.build_editable(wheel_directory, config_settings, metadata_directory)
    )


def prepare_metadata_for_build_wheel(
    metadata_directory: str, config_settings: Mapping[str, Any] | None = None
) -> str:
    """PEP 517: maturin's metadata, once the build is known to be possible."""
    _workspace()
    _cargo()
    return str(
        maturin.prepare_metadata_for_build_wheel(metadata_directory, config_settings)
    )


def build_sdist(
    sdist_directory: str, config_settings: Mapping[str, Any] | None = None
) -> str:
    """PEP 517: maturin's sdist (it cannot build a wheel: no plugin sources)."""
    return str(maturin.build_sdist(sdist_directory, config_settings))


def get_requires_for_build_wheel(
    config_settings: Mapping[str, Any] | None = None,
) -> list[str]:
    """PEP 517: maturin's build requirements."""
    return list(maturin.get_requires_for_build_wheel(config_settings))


get_requires_for_build_editable = get_requires_for_build_wheel


def get_requires_for_build_sdist(
    config_settings: Mapping[str, Any] | None = None,
) -> list[str]:
    """PEP 517: maturin's sdist requirements."""
    return list(maturin.get_requires_for_build_sdist(config_settings))
