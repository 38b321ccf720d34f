"""Map files kept on the disks of the pooled Python workers that wrote them.

With ``shuffle_durability="local"``, each worker's map server (the runtime's,
over Arrow Flight) serves the files it wrote, and readers stream their
inputs from there. A worker lost mid-query takes its maps with it: those,
and only those, run again. Real pooled workers, the real plugin file.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import TYPE_CHECKING

import pytest
from conftest import REVENUE_SQL, as_rows, assert_revenue
from test_retries import stage_infos

from dfx_engine.driver import run_distributed

if TYPE_CHECKING:
    import pathlib
    from collections.abc import Callable

    from dfx_engine.session import SessionSpec

DYING_WORKER = """
import json, os, pathlib, signal, sys
from dfx_engine import worker

rules = json.loads(pathlib.Path(sys.argv.pop(1)).read_text())
run_task = worker.run_task
ran = []


def dying(task):
    if task.stage_id == rules["reader"] and ran:
        try:
            claim = os.open(rules["died"], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            os.write(claim, json.dumps(ran).encode())
            os.close(claim)
            os.kill(os.getpid(), signal.SIGKILL)
    published = run_task(task)
    if task.stage_id == rules["upstream"]:
        ran.append(task.map)
    return published


worker.run_task = dying
sys.exit(worker.main())
"""
"""A Python worker that, handed a task of the ``reader`` stage after it ran
maps of the ``upstream`` stage, writes those maps down and dies (once, in
the first worker to get there)."""


def served(spec: SessionSpec, durability: str = "local") -> SessionSpec:
    """``spec`` with its map files on the disks of the workers that wrote them."""
    return dataclasses.replace(spec, shuffle_durability=durability)


@pytest.mark.parametrize("durability", ["local", "both"])
def test_a_query_answers_with_its_maps_served_by_the_workers_that_wrote_them(
    make_spec: Callable[..., SessionSpec], durability: str
) -> None:
    spec = served(make_spec(), durability)
    assert spec.to_json()["shuffle_durability"] == durability
    result = run_distributed(REVENUE_SQL, spec, max_workers=2)
    assert_revenue(as_rows(result.batches))
    assert result.retries == []


def test_a_lost_worker_has_its_maps_and_only_those_run_again(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    spec = served(make_spec())
    infos = stage_infos(spec, REVENUE_SQL)
    reader = next(info for info in infos if info.deps)
    upstream = reader.deps[0]
    rules = tmp_path / "rules.json"
    died = tmp_path / "died"
    rules.write_text(
        json.dumps({"reader": reader.stage_id, "upstream": upstream, "died": str(died)})
    )
    script = tmp_path / "dying_worker.py"
    script.write_text(DYING_WORKER)
    result = run_distributed(
        REVENUE_SQL,
        spec,
        worker_command=[sys.executable, str(script), str(rules)],
        max_workers=2,
        max_attempts=5,
    )
    assert_revenue(as_rows(result.batches))
    lost = set(json.loads(died.read_text()))
    assert lost
    rerun = {
        task[1]
        for task, made in result.attempts.items()
        if task[0] == upstream and made > 1
    }
    assert rerun == lost, result.retries
    for map_index in lost:
        expected = f"stage {upstream} map {map_index} attempt 1: run again"
        assert any(r.startswith(expected) for r in result.retries), result.retries


@pytest.mark.parametrize("spec_change", ["process", "s3"])
def test_maps_on_worker_disks_need_pooled_workers_and_a_directory(
    make_spec: Callable[..., SessionSpec], spec_change: str
) -> None:
    if spec_change == "s3":
        with pytest.raises(ValueError, match="not a local directory"):
            served(dataclasses.replace(make_spec(), shuffle_dir="s3://bucket/q"))
        return
    with pytest.raises(Exception, match="do not outlive their tasks"):
        run_distributed(REVENUE_SQL, served(make_spec()), worker_mode="process")
