"""The driver end to end: real worker processes, the real plugin file."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import sys
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import (
    FILES,
    REVENUE_SQL,
    SQL_ONLY,
    as_rows,
    assert_revenue,
    assert_same,
    assert_same_columns,
    published_files,
    read_marker,
    split_map_file,
)

from dfx_engine import _internal, session_for
from dfx_engine.driver import (
    dataframe_for,
    execute_plan,
    find_stage,
    find_stages,
    run_distributed,
    run_local,
)
from dfx_engine.session import SessionSpec, build_session

if TYPE_CHECKING:
    from collections.abc import Callable

    from dfx_engine.driver import DistributedResult


def stage_entries(shuffle_dir: str) -> list[str]:
    """Names of the stage output entries in ``shuffle_dir``."""
    return sorted(
        p.name for p in pathlib.Path(shuffle_dir).glob(_internal.partition_glob())
    )


def expected_files(spec: SessionSpec, result: DistributedResult) -> set[pathlib.Path]:
    """Every file the run should have published.

    One per map, shared by its buckets and closed by its marker.
    """
    files: set[pathlib.Path] = set()
    for stage, map_index in result.tasks:
        marker = pathlib.Path(_internal.marker_path(spec.shuffle_dir, stage, map_index))
        files.add(marker)
        for bucket in read_marker(spec.shuffle_dir, stage, map_index)["buckets"]:
            path = _internal.bucket_path(
                spec.shuffle_dir, stage, map_index, bucket["bucket"]
            )
            assert pathlib.Path(path) == marker
    return files


def assert_layout(spec: SessionSpec, result: DistributedResult) -> None:
    """One task per map of every stage, each published as its marker says."""
    assert sorted(result.tasks) == sorted(
        (info.stage_id, m) for info in result.stages for m in range(info.maps)
    )
    assert len(set(result.tasks)) == len(result.tasks)
    assert [info.stage_id for info in result.stages] == [
        _internal.stage_id(n) for n in range(len(result.stages))
    ]
    # Nothing else lies under the stage entries: no temp file was left.
    assert published_files(spec.shuffle_dir) == expected_files(spec, result)
    for (stage, map_index), rows in result.task_rows.items():
        marker = read_marker(spec.shuffle_dir, stage, map_index)
        assert (marker["stage_id"], marker["map"]) == (stage, map_index)
        assert sum(b["rows"] for b in marker["buckets"]) == rows
        path = pathlib.Path(_internal.marker_path(spec.shuffle_dir, stage, map_index))
        data, _ = split_map_file(path)
        assert len(data) == marker["bytes"]
        assert rows or not data
        read = 0
        for bucket in marker["buckets"]:
            for segment in bucket["segments"]:
                # pyarrow reads each segment of the plugin's file as it is:
                # a whole Arrow IPC stream.
                start = segment["offset"]
                stream = data[start : start + segment["bytes"]]
                table = pa.ipc.open_stream(stream).read_all()
                assert table.num_rows == segment["rows"]
                read += table.num_rows
        assert read == rows


def test_distributed_equals_local_equals_hand_answer(
    make_spec: Callable[..., SessionSpec],
) -> None:
    spec = make_spec()
    result = run_distributed(REVENUE_SQL, spec)
    assert_revenue(as_rows(result.batches))
    assert_revenue(as_rows(run_local(REVENUE_SQL, spec)))
    assert_layout(spec, result)
    # An aggregate with ORDER BY cuts at least at its hash repartition.
    assert len(result.stages) >= 2
    assert any(info.deps for info in result.stages)


def test_waves_run_every_stage_after_the_stages_it_reads(
    make_spec: Callable[..., SessionSpec],
) -> None:
    spec = make_spec()
    result = run_distributed(REVENUE_SQL, spec)
    position = {s: n for n, wave in enumerate(result.waves) for s in wave}
    assert sorted(position) == [info.stage_id for info in result.stages]
    for info in result.stages:
        assert all(position[dep] < position[info.stage_id] for dep in info.deps)
    # Tasks were dispatched wave by wave.
    dispatched = [position[stage] for stage, _map in result.tasks]
    assert dispatched == sorted(dispatched)


LOGGING_WORKER = """
import json, pathlib, subprocess, sys, time
log, envelope = pathlib.Path(sys.argv[1]), sys.argv[2]
task = json.loads(pathlib.Path(envelope).read_text())
key = f"{task['stage_id']} {task['partition']}"
with log.open("a") as out:
    out.write(f"start {key} {time.monotonic()}\\n")
done = subprocess.run([sys.executable, "-m", "dfx_engine.worker", envelope])
with log.open("a") as out:
    out.write(f"end {key} {time.monotonic()}\\n")
sys.exit(done.returncode)
"""


def test_no_task_starts_before_every_map_it_reads_has_finished(
    make_spec: Callable[..., SessionSpec], tmp_path: pathlib.Path
) -> None:
    # Enough workers at once that only the waves keep a reading stage from
    # starting early (and then failing, or not, by the race's luck).
    script = tmp_path / "logging_worker.py"
    script.write_text(LOGGING_WORKER)
    log = tmp_path / "tasks.log"
    spec = make_spec()
    result = run_distributed(
        REVENUE_SQL,
        spec,
        worker_command=[sys.executable, str(script), str(log)],
        max_workers=16,
        worker_mode="process",
    )
    assert_revenue(as_rows(result.batches))
    started: dict[int, float] = {}
    ended: dict[int, float] = {}
    for line in log.read_text().splitlines():
        event, stage, _map, when = line.split()
        moment = float(when)
        if event == "start":
            started[int(stage)] = min(started.get(int(stage), moment), moment)
        else:
            ended[int(stage)] = max(ended.get(int(stage), moment), moment)
    assert sorted(started) == [info.stage_id for info in result.stages]
    for info in result.stages:
        for dep in info.deps:
            assert ended[dep] < started[info.stage_id], (info, started, ended)


def test_the_query_is_planned_once(make_spec: Callable[..., SessionSpec]) -> None:
    spec = make_spec()
    before = _internal.counters()["planner_calls"]
    run_distributed(REVENUE_SQL, spec)
    # The workers plan nothing (they decode), and the driver executes the
    # root of the plan it shipped the stages of.
    assert _internal.counters()["planner_calls"] == before + 1


def test_aggregate_split_makes_one_stage_per_topmost_partial_aggregate(
    make_spec: Callable[..., SessionSpec],
) -> None:
    spec = make_spec(split="aggregate")
    result = run_distributed(REVENUE_SQL, spec)
    assert_revenue(as_rows(result.batches))
    assert [info.stage_id for info in result.stages] == [1]
    assert result.stages[0].deps == []
    assert result.tasks == [(1, m) for m in range(FILES)]
    # Each task's partial aggregate: one row per flag present in its file.
    assert result.task_rows == dict.fromkeys(result.tasks, 2)
    assert_layout(spec, result)


def test_default_partitions_still_give_one_map_per_file(
    make_spec: Callable[..., SessionSpec],
) -> None:
    # target_partitions=2 over four files: the floor is the file count, as in
    # the Rust host, so one spec plans alike in both.
    spec = make_spec(target_partitions=2)
    result = run_distributed(SQL_ONLY, spec)
    leaves = [info for info in result.stages if not info.deps]
    assert leaves
    assert all(info.maps == FILES for info in leaves)
    local = run_local(SQL_ONLY, spec)
    assert_same_columns(result.batches, local)
    assert_same(as_rows(result.batches), as_rows(local))
    assert as_rows(result.batches) == [
        {"flag": "A", "n": 3, "qty": 90},
        {"flag": "B", "n": 3, "qty": 130},
        {"flag": "R", "n": 2, "qty": 140},
    ]


@pytest.mark.parametrize("split", ["exchange", "aggregate"])
def test_union_of_two_aggregates_ships_both_stages(
    make_spec: Callable[..., SessionSpec], split: str
) -> None:
    spec = make_spec(split=split)
    sql = """
        SELECT 'q' AS k, sum(l_quantity) AS v FROM lineitem
        UNION ALL
        SELECT 'n' AS k, CAST(sum(dfx_net_revenue(l_extendedprice, l_discount, l_tax))
                              AS BIGINT) AS v FROM lineitem
        ORDER BY k
    """
    ctx, df = dataframe_for(sql, spec)
    planned = len(find_stages(ctx, df.execution_plan()))
    assert planned >= 2

    result = run_distributed(sql, spec)
    assert as_rows(result.batches) == [{"k": "n", "v": 3150}, {"k": "q", "v": 360}]
    assert len(result.stages) == planned
    assert_layout(spec, result)
    if split == "aggregate":
        assert sorted(result.tasks) == [(s, m) for s in (1, 2) for m in range(FILES)]
        assert stage_entries(spec.shuffle_dir) == ["stage-1", "stage-2"]


def test_the_root_reads_the_published_files(
    make_spec: Callable[..., SessionSpec],
) -> None:
    spec = make_spec()
    result = run_distributed(REVENUE_SQL, spec)
    # A second session plans the same stages; its root finds every file
    # published and computes nothing below the readers.
    ctx, _engine = build_session(spec)
    plan = ctx.sql(REVENUE_SQL).execution_plan()
    assert as_rows(execute_plan(ctx, plan)) == as_rows(result.batches)
    # The root reads stage 1 (the first writer in pre-order).
    victims = sorted(
        path
        for path in published_files(spec.shuffle_dir)
        if path.suffix == ".arrow" and path.parent.name == "stage-1"
    )
    assert victims
    victims[0].write_bytes(b"not an arrow stream")
    with pytest.raises(RuntimeError, match=str(victims[0])):
        execute_plan(ctx, ctx.sql(REVENUE_SQL).execution_plan())


def test_a_reader_never_computes_a_missing_stage(
    make_spec: Callable[..., SessionSpec],
) -> None:
    spec = make_spec()
    ctx, _engine = build_session(spec)
    plan = ctx.sql(REVENUE_SQL).execution_plan()
    # No worker ran: the root must fail naming the stage, not recompute it.
    with pytest.raises(RuntimeError, match=r"stage[ =-]?1"):
        execute_plan(ctx, plan)
    assert stage_entries(spec.shuffle_dir) == []


def test_no_shuffle_dir_means_no_stage(make_spec: Callable[..., SessionSpec]) -> None:
    spec = make_spec(shuffle=False)
    ctx, df = dataframe_for(REVENUE_SQL, spec)
    assert find_stage(ctx, df.execution_plan()) is None
    assert_revenue(as_rows(df.collect()))
    # Distributed, it runs under the process's temporary root.
    assert_revenue(as_rows(run_distributed(REVENUE_SQL, spec).batches))


def test_reused_shuffle_dir_is_refused_before_anything_runs(
    make_spec: Callable[..., SessionSpec],
) -> None:
    spec = make_spec()
    run_distributed(SQL_ONLY, spec)
    before = _internal.counters()
    files = published_files(spec.shuffle_dir)
    with pytest.raises(ValueError, match="already holds stage output") as info:
        run_distributed(SQL_ONLY, spec)
    assert "previous query" in str(info.value)
    # Nothing was planned, encoded or written.
    assert _internal.counters()["planner_calls"] == before["planner_calls"]
    assert _internal.counters()["stages_encoded"] == before["stages_encoded"]
    assert published_files(spec.shuffle_dir) == files


def test_the_location_probe_ignores_other_files(tmp_path: pathlib.Path) -> None:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    _internal.probe_location(str(tmp_path))
    _internal.probe_location(str(tmp_path / "does-not-exist"))
    marker = pathlib.Path(_internal.marker_path(str(tmp_path), 1, 0))
    marker.parent.mkdir(parents=True)
    with pytest.raises(ValueError, match=r'\["stage-1"\]'):
        _internal.probe_location(str(tmp_path))


def test_a_second_driver_on_a_held_directory_is_refused(
    make_spec: Callable[..., SessionSpec],
) -> None:
    spec = make_spec()
    # Another driver holds the empty directory (the lock both hosts take):
    # no stage output yet, so only the lock tells the two apart.
    with _internal.DriverLock(spec.shuffle_dir) as other:
        with pytest.raises(ValueError, match="is in use") as info:
            run_distributed(SQL_ONLY, spec)
        assert f"pid {os.getpid()}" in str(info.value)
        assert other.held
    assert stage_entries(spec.shuffle_dir) == []
    # Released, the directory serves the query, as one process answers it.
    result = run_distributed(SQL_ONLY, spec)
    assert as_rows(result.batches) == as_rows(run_local(SQL_ONLY, spec))


def test_each_file_is_one_map_so_work_is_divided(tmp_path: pathlib.Path) -> None:
    # Two files of 300 000 keys (1.4 MB each: big enough that DataFusion
    # would split them into byte ranges, where a range holding no row group's
    # start reads nothing and its neighbour reads the file whole).
    table = tmp_path / "t"
    table.mkdir()
    for index in range(2):
        keys = pa.array(range(index * 300_000, (index + 1) * 300_000), pa.int64())
        pq.write_table(pa.table({"k": keys}), table / f"part-{index}.parquet")
    spec = SessionSpec(
        tables={"t": str(table)},
        shuffle_dir=str(tmp_path / "shuffle"),
        target_partitions=2,
    )
    sql = "SELECT count(*) AS n FROM t a JOIN t b ON a.k = b.k"
    result = run_distributed(sql, spec)
    assert as_rows(result.batches) == [{"n": 600_000}]
    # Both scan stages: one map per file, each reading its own 300 000 rows.
    scans = [s.stage_id for s in result.stages if not s.deps]
    assert len(scans) == 2
    for stage in scans:
        assert [result.task_rows[(stage, m)] for m in range(2)] == [300_000, 300_000]


def test_a_plan_no_wider_than_a_task_runs_whole_in_the_driver(
    tmp_path: pathlib.Path,
) -> None:
    # One file, one partition: no wider than a task or than any driver.
    table = tmp_path / "t"
    table.mkdir()
    keys = pa.array([1, 2, 2, 3, 3, 3], pa.int64())
    pq.write_table(pa.table({"k": keys}), table / "part-0.parquet")
    sql = "SELECT k, count(*) AS n FROM t GROUP BY k ORDER BY k"
    answer = [{"k": 1, "n": 1}, {"k": 2, "n": 2}, {"k": 3, "n": 3}]

    def spec(name: str, collapse: str) -> SessionSpec:
        return SessionSpec(
            tables={"t": str(table)},
            shuffle_dir=str(tmp_path / name),
            target_partitions=1,
            engine_options={"collapse_stages": collapse},
        )

    # Kept whole: no stage, no task, and nothing written to the location.
    whole = spec("whole", "auto")
    result = run_distributed(sql, whole)
    assert as_rows(result.batches) == answer
    assert (result.stages, result.tasks) == ([], [])
    assert published_files(whole.shuffle_dir) == set()
    # A DataFrame of a session made from the spec takes the same path.
    ctx = build_session(spec("frame", "auto"))[0]
    result = run_distributed(ctx.sql(sql), spec("frame", "auto"))
    assert as_rows(result.batches) == answer
    assert result.tasks == []
    # collect() on a session that drives its queries: the same, run here.
    driving = session_for(
        dataclasses.replace(whole, shuffle_dir="", shuffle_root=str(tmp_path / "root"))
    )
    assert as_rows(driving.sql(sql).collect()) == answer
    # `task`: one stage, its one task on a worker, the same answer.
    on_a_worker = spec("task", "task")
    result = run_distributed(sql, on_a_worker)
    assert as_rows(result.batches) == answer
    assert [s.stage_id for s in result.stages] == [_internal.stage_id(0)]
    assert len(result.tasks) == 1
    # A DataFrame its own session kept whole, under a spec that would cut
    # it: refused, naming that cause among the others.
    with pytest.raises(ValueError, match="keep it whole for the driver"):
        run_distributed(ctx.sql(sql), spec("again", "task"))


JOINED_SQL = (
    "SELECT a.l_returnflag, count(*) AS n FROM lineitem a JOIN "
    "(SELECT l_quantity FROM lineitem WHERE l_returnflag = 'R') b "
    "ON a.l_quantity = b.l_quantity GROUP BY a.l_returnflag ORDER BY 1"
)
"""The rows whose quantity an ``R`` row has: 60 and 80, both ``R`` rows."""


def test_engine_options_reach_every_session_of_the_query(
    make_spec: Callable[..., SessionSpec],
) -> None:
    for setting in ("on", "off"):
        spec = dataclasses.replace(
            make_spec(), engine_options={"join_filters": setting}
        )
        assert spec.to_json()["engine_options"] == {"join_filters": setting}
        result = run_distributed(JOINED_SQL, spec)
        assert as_rows(result.batches) == [{"l_returnflag": "R", "n": 2}], setting
    # The plugin reads the key: a value it does not take, or a key it does
    # not know, is refused naming it; a decision's value too, though the
    # adaptive step that reads it could keep its stage as planned.
    for options, named in (
        ({"join_filters": "sometimes"}, "sometimes"),
        ({"coalesce": "sometimes"}, re.escape('coalesce` is "sometimes"')),
        ({"skew_split": "sometimes"}, re.escape('skew_split` is "sometimes"')),
        ({"no_such_setting": "1"}, "no_such_setting` is not a dfx setting"),
    ):
        spec = dataclasses.replace(make_spec(), engine_options=options)
        with pytest.raises(Exception, match=named):
            run_distributed(JOINED_SQL, spec)
    # A key the spec holds as a field of its own is refused by the spec.
    with pytest.raises(ValueError, match="fields of their own"):
        dataclasses.replace(make_spec(), engine_options={"split": "aggregate"})


def test_small_partitions_run_as_one_task_and_every_map_is_published(
    make_spec: Callable[..., SessionSpec],
) -> None:
    # The fixture's aggregate publishes a few rows per bucket: far under the
    # smallest task, so the stage reading them runs its four partitions as
    # one task, which publishes the three others' maps empty.
    spec = make_spec(coalesce="auto")
    result = run_distributed(REVENUE_SQL, spec)
    assert_revenue(as_rows(result.batches))
    coalesced = [d for d in result.decisions if d["tasks"] < d["planned_tasks"]]
    assert coalesced, result.decisions
    for decision in coalesced:
        stage = decision["stage_id"]
        assert (decision["planned_tasks"], decision["tasks"]) == (FILES, 1)
        assert "coalesced 4 partitions into 1 task(s)" in decision["reason"]
        assert [m for s, m in result.tasks if s == stage] == [0]
        for map_index in range(1, FILES):
            marker = read_marker(spec.shuffle_dir, stage, map_index)
            assert marker["map"] == map_index
            assert sum(b["rows"] for b in marker["buckets"]) == 0
    # Turned off, every partition is a task of its own again.
    off = run_distributed(REVENUE_SQL, make_spec(coalesce="off"))
    assert_revenue(as_rows(off.batches))
    assert all(d["tasks"] == d["planned_tasks"] for d in off.decisions)
    assert sorted(off.tasks) == sorted(
        (info.stage_id, m) for info in off.stages for m in range(info.maps)
    )


SKEWED_JOIN_SQL = (
    "SELECT count(*) AS n, count(d.k) AS matched, sum(t.v) AS v "
    "FROM t LEFT JOIN d ON t.k = d.k"
)


def skewed_join_spec(
    tmp_path: pathlib.Path, *, t_files: int = 2, **engine_options: str
) -> SessionSpec:
    """A spec over two tables joined on ``k``, ``t`` skewed under key 0.

    t: key 0 in 360,000 rows, keys 1..=40,000 once, in ``t_files`` files
    of equal rows (the last holds the tail); d: every even key of
    0..=600,000, more rows than DataFusion broadcasts, so the join is
    partitioned with t probing.
    """
    keys = [0] * 360_000 + list(range(1, 40_001))
    rows = len(keys) // t_files
    t = [keys[i * rows : (i + 1) * rows] for i in range(t_files)]
    tables = {"t": t, "d": [list(range(0, 600_001, 2))]}
    for name, files in tables.items():
        (tmp_path / name).mkdir()
        for index, column in enumerate(files):
            table = pa.table(
                {"k": pa.array(column, pa.int64()), "v": [1] * len(column)}
            )
            pq.write_table(table, tmp_path / name / f"part-{index}.parquet")
    return SessionSpec(
        tables={name: str(tmp_path / name) for name in tables},
        shuffle_dir=str(tmp_path / "shuffle"),
        target_partitions=4,
        engine_options={"coalesce": "off", **engine_options},
    )


def test_a_skewed_partition_is_split_and_every_part_published(
    tmp_path: pathlib.Path,
) -> None:
    spec = skewed_join_spec(tmp_path, skew_split="on", broadcast_switch="off")
    result = run_distributed(SKEWED_JOIN_SQL, spec)
    # By hand: every row of t counts; key 0's rows and the tail's 20,000
    # even keys find their row of d.
    assert as_rows(result.batches) == [{"n": 400_000, "matched": 380_000, "v": 400_000}]
    split = [d for d in result.decisions if d["tasks"] > d["planned_tasks"]]
    assert len(split) == 1, result.decisions
    stage = split[0]["stage_id"]
    assert (split[0]["planned_tasks"], split[0]["tasks"]) == (4, 5)
    assert "into 2 tasks by its maps" in split[0]["reason"]
    assert sorted(m for s, m in result.tasks if s == stage) == [0, 1, 2, 3, 4]
    # The added map is published, and named by the one planned map it parts.
    naming = [
        m
        for m in range(4)
        if read_marker(spec.shuffle_dir, stage, m).get("companions") == [4]
    ]
    assert len(naming) == 1, naming
    assert read_marker(spec.shuffle_dir, stage, 4)["map"] == 4


def test_a_skewed_partition_of_a_slice_runs_as_parts_inside_its_task(
    tmp_path: pathlib.Path,
) -> None:
    # t in four files, so its stage in slices of two has two maps, both
    # holding key 0; the join's four partitions run as two tasks.
    spec = skewed_join_spec(
        tmp_path,
        t_files=4,
        skew_split="on",
        broadcast_switch="off",
        partitions_per_task="2",
    )
    result = run_distributed(SKEWED_JOIN_SQL, spec)
    assert as_rows(result.batches) == [{"n": 400_000, "matched": 380_000, "v": 400_000}]
    split = [d for d in result.decisions if "parts inside its task" in d["reason"]]
    assert len(split) == 1, result.decisions
    # No task is added: key 0's partition runs as two parts in its slice's.
    assert (split[0]["planned_tasks"], split[0]["tasks"]) == (2, 2)
    assert "into 2 parts inside its task by its maps" in split[0]["reason"]
    stage = split[0]["stage_id"]
    assert sorted(m for s, m in result.tasks if s == stage) == [0, 1]


def test_a_partitioned_join_switched_to_broadcast_divides_its_probe_maps(
    tmp_path: pathlib.Path,
) -> None:
    spec = skewed_join_spec(tmp_path, broadcast_switch="on", skew_split="off")
    joined = "SELECT t.k, t.v FROM t JOIN d ON t.k = d.k"
    result = run_distributed(joined, spec)
    keys = sorted(row["k"] for row in as_rows(result.batches))
    # By hand: key 0's 360,000 rows and the tail's 20,000 even keys.
    assert keys[:360_000] == [0] * 360_000
    assert keys[360_000:] == list(range(2, 40_001, 2))
    switched = [
        d for d in result.decisions if d["reason"].startswith("switched to broadcast")
    ]
    assert len(switched) == 1, result.decisions
    assert (switched[0]["planned_tasks"], switched[0]["tasks"]) == (4, 4)
    # Each task read d whole and its share of t's two maps whole: key 0's
    # rows are divided as t's files divide them.
    stage = switched[0]["stage_id"]
    published = [
        sum(b["rows"] for b in read_marker(spec.shuffle_dir, stage, m)["buckets"])
        for m in range(4)
    ]
    assert published == [0, 200_000, 0, 180_000]
