#!/usr/bin/env python3
"""Check that every cargo selection the test command builds resolves each
shared dependency with the same features.

Cargo unifies a dependency's features over the packages one command selects.
Where two selections (the plugin alone, the host with its tests, the Python
module) turn on different features of one crate, that crate and everything
above it compile once per selection. A crate as low as libc or tokio sits
under all of DataFusion, so one stray feature doubles a cold build. Such
features are pinned in `plugin/abi/Cargo.toml`, which every crate depends on;
this check names any crate that escapes the pin.

Only target units are compared: build scripts' and proc-macros' dependencies
are compiled for the host, apart, and may differ without cost to the stack.

    python3 scripts/check-features.py             check the selections
    python3 scripts/check-features.py --self-test check the parser first
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterable

# Each cargo command of scripts/test.sh, ffi-tests/build-plugins.sh and
# python/build-wheel.sh, as the packages it selects and the edges it builds
# (`--all-targets` and `cargo test` add dev-dependencies).
SELECTIONS: dict[str, list[str]] = {
    "the test-hooks plugin and the ABI suite": [
        "-e",
        "normal,build",
        "-p",
        "dfx-ffi-tests",
        "-p",
        "dfx-plugin",
        "--features",
        "dfx-plugin/test-hooks",
    ],
    "the ABI suite's plugins": [
        "-e",
        "normal,build",
        "-p",
        "dfx-ffi-tests",
        "-p",
        "dfx-plugin",
        "-p",
        "dfx-test-plugin-wrong-abi",
        "-p",
        "dfx-test-plugin-older-root",
    ],
    "the plugin and the host, all targets": [
        "-e",
        "normal,build,dev",
        "-p",
        "dfx-plugin",
        "-p",
        "dfx-host",
    ],
    "the workspace's tests": [
        "-e",
        "normal,build,dev",
        "--workspace",
        "--exclude",
        "dfx-ffi-tests",
    ],
    "the ABI suite's tests": ["-e", "normal,build,dev", "-p", "dfx-ffi-tests"],
    "the Python module": ["-e", "normal,build", "-p", "dfx-engine-python"],
}

LINE = re.compile(r"^(?P<prefix>[│├└─ ]*)(?P<body>.*)$")
PACKAGE = re.compile(r"^(?P<name>\S+) (?P<version>v\S+)(?P<rest>.*?)\[(?P<features>[^\]]*)\]$")


def target_units(tree: Iterable[str]) -> dict[tuple[str, str], set[str]]:
    """Each package compiled for the target in an indented `cargo tree`
    (format `{p} [{f}]`), with the feature sets it appears with. A package
    under a `[build-dependencies]` section or below a proc-macro is compiled
    for the host and left out."""
    units: dict[tuple[str, str], set[str]] = {}
    host_from: int | None = None  # the depth at which the host's subtree began
    for raw in tree:
        match = LINE.match(raw.rstrip("\n"))
        if match is None or not match["body"]:
            continue
        depth = len(match["prefix"]) // 4
        body = match["body"]
        if host_from is not None and depth <= host_from:
            host_from = None
        if body.startswith("[build-dependencies]"):
            if host_from is None:
                # The section's packages sit one level below its header.
                host_from = depth
            continue
        if body.startswith("[dev-dependencies]"):
            continue
        package = PACKAGE.match(body.replace(" (*)", ""))
        if package is None:
            continue
        if host_from is None and "(proc-macro)" in package["rest"]:
            host_from = depth
            continue
        if host_from is not None or package["rest"].strip().startswith("(/"):
            continue  # the host's, or a workspace crate (built once per selection anyway)
        units.setdefault((package["name"], package["version"]), set()).add(package["features"])
    return units


def tree_of(args: list[str]) -> list[str]:
    """`cargo tree` of one selection."""
    command = ["cargo", "tree", "--format", "{p} [{f}]", *args]
    out = subprocess.run(command, check=True, capture_output=True, text=True)
    return out.stdout.splitlines()


def divergences(
    selections: dict[str, dict[tuple[str, str], set[str]]],
) -> list[str]:
    """Each crate resolved with more than one feature set, within a selection
    or across two."""
    problems = []
    for name, units in selections.items():
        for (crate, version), sets in sorted(units.items()):
            if len(sets) > 1:
                problems.append(
                    f"{crate} {version}: {len(sets)} feature sets within {name}: {sorted(sets)}"
                )
    seen: dict[tuple[str, str], tuple[str, str]] = {}
    for name, units in selections.items():
        for key, sets in sorted(units.items()):
            features = min(sets)
            if key not in seen:
                seen[key] = (name, features)
            elif seen[key][1] != features:
                first, first_features = seen[key]
                problems.append(
                    f"{key[0]} {key[1]}: [{first_features}] in {first}, but [{features}] in {name}"
                )
    return problems


SAMPLE = """\
app v0.1.0 (/work/app) []
├── tokio v1.0.0 [default,rt]
│   ├── libc v0.2.0 [default,std]
│   └── tokio-macros v2.0.0 (proc-macro) []
│       └── syn v2.0.0 [full]
│   [build-dependencies]
│   └── cc v1.0.0 []
│       └── libc v0.2.0 [default]
└── serde v1.0.0 [std]
"""


def self_test() -> None:
    """The parser keeps target units and drops the host's."""
    units = target_units(SAMPLE.splitlines())
    expected = {
        ("tokio", "v1.0.0"): {"default,rt"},
        ("libc", "v0.2.0"): {"default,std"},
        ("serde", "v1.0.0"): {"std"},
    }
    assert units == expected, units
    other = dict(units)
    other[("libc", "v0.2.0")] = {"default,extra_traits,std"}
    found = divergences({"one": units, "two": other})
    assert len(found) == 1 and "libc" in found[0], found


def main() -> int:
    self_test()
    if sys.argv[1:] == ["--self-test"]:
        return 0
    selections = {name: target_units(tree_of(args)) for name, args in SELECTIONS.items()}
    problems = divergences(selections)
    for problem in problems:
        print(f"check-features: {problem}", file=sys.stderr)
    if problems:
        print(
            "check-features: pin the features in plugin/abi/Cargo.toml, so that "
            "DataFusion's stack compiles once",
            file=sys.stderr,
        )
        return 1
    print(f"check-features: {len(selections)} selections, one feature set per crate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
