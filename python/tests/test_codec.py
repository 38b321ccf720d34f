"""Encoding stages: the session's codecs, and the counters that show it."""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

import pytest
from conftest import REVENUE_SQL, as_rows, assert_revenue
from datafusion.plan import ExecutionPlan

from dfx_engine import _internal
from dfx_engine.driver import dataframe_for, execute_plan, find_stage, find_stages
from dfx_engine.session import build_session, expected_codec_ids

if TYPE_CHECKING:
    from collections.abc import Callable

    from dfx_engine.session import SessionSpec


def test_session_carries_the_plugin_codec(
    make_spec: Callable[..., SessionSpec],
) -> None:
    ctx, engine = build_session(make_spec())
    assert ctx.physical_extension_codec_ids() == ["dfx_engine.physical.v5"]
    assert expected_codec_ids() == ["dfx_engine.physical.v5"]
    assert engine.physical_codec_id() == _internal.physical_codec_id()


def test_stage_without_the_session_cannot_be_encoded(
    make_spec: Callable[..., SessionSpec],
) -> None:
    ctx, df = dataframe_for(REVENUE_SQL, make_spec())
    stage = find_stage(ctx, df.execution_plan())
    assert stage is not None
    with pytest.raises(Exception, match="PhysicalExtensionCodec is not provided"):
        stage.to_bytes()
    encoded = _internal.counters()["stages_encoded"]
    data = stage.to_bytes(ctx)
    # The stage alone: the stages it reads are cut out of the plan apart.
    assert _internal.counters()["stages_encoded"] == encoded + 1
    assert data


def test_counters_show_planning_and_encoding(
    make_spec: Callable[..., SessionSpec],
) -> None:
    # The aggregate split: one stage, and no reader for the codec to count.
    ctx, engine = build_session(make_spec(split="aggregate"))
    start = (
        engine.plan_calls(),
        engine.stages_inserted(),
        engine.encode_calls(),
        engine.decode_calls(),
    )
    plan = ctx.sql(REVENUE_SQL).execution_plan()
    stages = find_stages(ctx, plan)
    assert len(stages) == 1
    # Planning: one planner call and one stage inserted; the planned plan
    # crosses from the plugin to the session as bytes through the session's
    # codec chain, which is one encode and one decode of the stage.
    assert engine.plan_calls() == start[0] + 1
    assert engine.stages_inserted() == start[1] + 1
    assert engine.encode_calls() == start[2] + 1
    assert engine.decode_calls() == start[3] + 1
    # Each to_bytes(ctx) is one more encode, and decodes nothing.
    for extra in (1, 2):
        stages[0].to_bytes(ctx)
        assert engine.encode_calls() == start[2] + 1 + extra
    assert engine.decode_calls() == start[3] + 1


def test_exchange_planning_counts_every_writer(
    make_spec: Callable[..., SessionSpec],
) -> None:
    ctx, engine = build_session(make_spec())
    start = (engine.plan_calls(), engine.stages_inserted())
    stages = find_stages(ctx, ctx.sql(REVENUE_SQL).execution_plan())
    assert len(stages) >= 2
    assert engine.plan_calls() == start[0] + 1
    assert engine.stages_inserted() == start[1] + len(stages)


def test_stage_round_trips_through_the_session(
    make_spec: Callable[..., SessionSpec],
) -> None:
    distributed = make_spec()
    ctx, engine = build_session(distributed)
    plan = ctx.sql(REVENUE_SQL).execution_plan()
    stage = find_stage(ctx, plan)
    assert stage is not None
    data = stage.to_bytes(ctx)
    decoded_before = engine.decode_calls()
    decoded = ExecutionPlan.from_bytes(ctx, data)
    assert engine.decode_calls() > decoded_before
    assert _internal.stage_node_name() in decoded.display()
    assert decoded.partition_count == stage.partition_count
    info = _internal.encoded_stage_info(data)
    assert (info.stage_id, info.shuffle_dir) == (1, distributed.shuffle_dir)
    assert info.maps == stage.partition_count
    assert info.buckets >= 1
    assert info.deps == sorted(info.deps)
    assert info.partitioning
    # The description is read from the bytes, so the decoded stage's
    # re-encoding describes the same stage.
    assert _internal.encoded_stage_info(decoded.to_bytes(ctx)) == info
    # The round trip changes nothing about the answer: only decoded stages
    # compute (every map of each, the stages it reads first), and the plan's
    # root reads what they published.
    for writer in reversed(find_stages(ctx, plan)):
        round_tripped = ExecutionPlan.from_bytes(ctx, writer.to_bytes(ctx))
        for map_index in range(round_tripped.partition_count):
            list(ctx.execute(round_tripped, map_index))
    assert_revenue(as_rows(execute_plan(ctx, plan)))


def test_encoded_stage_info_refuses_other_bytes() -> None:
    with pytest.raises(ValueError, match="encoded stage"):
        _internal.encoded_stage_info(b"\x00\x01garbage")


def test_every_writer_describes_itself_in_pre_order(
    make_spec: Callable[..., SessionSpec],
) -> None:
    sql = "SELECT l_returnflag, count(*) FROM lineitem GROUP BY 1 ORDER BY 1"
    spec = make_spec()
    ctx, _engine = build_session(spec)
    writers = find_stages(ctx, ctx.sql(sql).execution_plan())
    infos = [_internal.encoded_stage_info(w.to_bytes(ctx)) for w in writers]
    assert [i.stage_id for i in infos] == [
        _internal.stage_id(n) for n in range(len(infos))
    ]
    ids = {i.stage_id for i in infos}
    for i in infos:
        # A stage reads only stages below it, which pre-order numbers later.
        assert all(dep in ids and dep > i.stage_id for dep in i.deps)
        assert set(i.aligned_deps) <= set(i.deps), i
        assert i.partitions_per_map >= 1, i
    assert infos[-1].deps == []
    # The final aggregate reads the partial aggregates' hash exchange bucket
    # by partition.
    assert infos[0].aligned_deps == infos[0].deps == [infos[1].stage_id], infos


def test_prepare_describes_each_stage_as_the_plugin_does_and_refuses_them_reordered(
    make_spec: Callable[..., SessionSpec],
) -> None:
    sql = "SELECT l_returnflag, count(*) FROM lineitem GROUP BY 1 ORDER BY 1"
    ctx, _engine = build_session(make_spec())
    encoded = [w.to_bytes(ctx) for w in find_stages(ctx, ctx.sql(sql).execution_plan())]
    assert len(encoded) > 1
    prepared = _internal.prepare(encoded)
    assert len(prepared) == len(encoded)
    assert prepared.stages == [_internal.encoded_stage_info(e) for e in encoded]
    # The runtime's numbering check: the first writer is not stage 2.
    with pytest.raises(ValueError, match="stage numbering disagrees"):
        _internal.prepare(list(reversed(encoded)))
    with pytest.raises(ValueError, match="cannot describe stage"):
        _internal.prepare([b"\x00\x01garbage"])


def test_plugin_objects_are_released_with_the_session(
    make_spec: Callable[..., SessionSpec],
) -> None:
    # Sessions an earlier test left in reference cycles go first, so the
    # baseline counts only what outlives every collection.
    gc.collect()
    baseline = _internal.counters()["live_objects"]

    def plan_once() -> int:
        ctx, _engine = build_session(make_spec())
        assert find_stage(ctx, ctx.sql(REVENUE_SQL).execution_plan()) is not None
        return _internal.counters()["live_objects"]

    # While the session lives, its planner and codec live on the plugin side.
    assert plan_once() > baseline
    gc.collect()
    assert _internal.counters()["live_objects"] == baseline
