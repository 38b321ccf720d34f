"""A panic inside the plugin is an error naming dfx; Python survives it.

``datafusion-ffi`` does not catch unwinds, so a panic in the plugin's code
would abort the interpreter unless the plugin catches it (it does, at every
door the host calls through). The panic comes from ``dfx_test_panic(x, at)``,
which only the plugin's ``test-hooks`` build registers: it panics on the row
where ``x = at``. That build is ``<target>/debug/test-hooks/libdfx_plugin.so``
(``ffi-tests/build-plugins.sh`` makes it) or the file
``DFX_PLUGIN_TEST_HOOKS`` names (:func:`conftest.hooks_plugin`); these tests
fail, never skip, without it.

Each test runs in a child interpreter with ``DFX_PLUGIN`` pointing at that
build (the module loads its plugin once per process), so an abort is seen as
the child's signal rather than killing pytest.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING

from conftest import hooks_plugin

if TYPE_CHECKING:
    import pathlib

# A row of the last fixture file has l_quantity 70: earlier files yield rows
# before the panic.
PANIC_SQL = """
SELECT l_returnflag AS flag, sum(dfx_test_panic(l_quantity, 70)) AS qty
FROM lineitem GROUP BY l_returnflag ORDER BY flag
"""
NEXT_SQL = """
SELECT l_returnflag AS flag, sum(l_quantity) AS qty
FROM lineitem GROUP BY l_returnflag ORDER BY flag
"""
NEXT_ANSWER = [
    {"flag": "A", "qty": 90},
    {"flag": "B", "qty": 130},
    {"flag": "R", "qty": 140},
]

CHILD = textwrap.dedent(
    """
    import json, sys
    import pyarrow as pa
    from dfx_engine.driver import run_distributed, run_local
    from dfx_engine.session import SessionSpec

    args = json.loads(sys.argv[1])

    def spec(shuffle_dir):
        return SessionSpec(
            tables={"lineitem": args["lineitem"]},
            shuffle_dir=shuffle_dir,
            target_partitions=4,
        )

    def rows(batches):
        return pa.Table.from_batches(batches).to_pylist() if batches else []

    out = {}
    for mode in ("local", "distributed"):
        shuffle = args[mode + "_shuffle"]
        run = (lambda sql, s: run_local(sql, s)) if mode == "local" else (
            lambda sql, s: run_distributed(sql, s).batches
        )
        try:
            run(args["panic_sql"], spec(shuffle[0]))
            out[mode + "_error"] = None
        except Exception as error:
            out[mode + "_error"] = str(error)
        out[mode + "_next"] = rows(run(args["next_sql"], spec(shuffle[1])))
    print(json.dumps(out))
    """
)


def test_a_panic_in_a_query_is_an_error_naming_dfx_and_the_next_query_runs(
    lineitem: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    args = {
        "lineitem": str(lineitem),
        "panic_sql": PANIC_SQL,
        "next_sql": NEXT_SQL,
        "local_shuffle": ["", ""],
        "distributed_shuffle": [
            str(tmp_path / "shuffle-panic"),
            str(tmp_path / "shuffle-next"),
        ],
    }
    env = dict(os.environ, DFX_PLUGIN=str(hooks_plugin()))
    child = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert child.returncode != -signal.SIGABRT, (
        f"the interpreter aborted: {child.stderr}"
    )
    assert child.returncode == 0, child.stderr
    report = json.loads(child.stdout.strip().splitlines()[-1])
    for mode in ("local", "distributed"):
        error = report[f"{mode}_error"]
        assert error is not None, f"{mode}: the panicking query did not fail"
        assert "dfx plugin panicked in" in error, f"{mode}: {error}"
        assert "dfx_test_panic met 70" in error, f"{mode}: {error}"
        # The same interpreter runs the next query.
        assert report[f"{mode}_next"] == NEXT_ANSWER, mode
