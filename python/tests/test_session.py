"""SessionSpec and the one session factory."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING

import pytest
from datafusion import SessionConfig, SessionContext
from datafusion.extensions import SessionComponentsExportable, SessionPlannerExportable
from datafusion.plan import ExecutionPlan

from dfx_engine import DfxEngineConfig, DfxEngineExtension, _internal
from dfx_engine.driver import find_stage, find_stages
from dfx_engine.session import (
    SessionSpec,
    build_session,
    build_worker_session,
    expected_codec_ids,
)

if TYPE_CHECKING:
    import pathlib
    from collections.abc import Callable


def test_spec_round_trips_and_carries_codec_ids() -> None:
    spec = SessionSpec(tables={"t": "/data/t"}, shuffle_dir="/s", target_partitions=3)
    data = spec.to_json()
    assert data == {
        "tables": {"t": "/data/t"},
        "shuffle_dir": "/s",
        "target_partitions": 3,
        "split": "exchange",
        "codec_ids": ["dfx_engine.physical.v5"],
    }
    assert SessionSpec.from_json(data) == spec
    assert SessionSpec.from_json(json.dumps(data)) == spec
    assert data["codec_ids"] == expected_codec_ids()
    assert SessionSpec().target_partitions == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.shuffle_dir = "/elsewhere"  # type: ignore[misc]


def test_split_defaults_to_exchange_and_round_trips() -> None:
    # A spec written before split modes existed (or by a host that omits
    # the default) reads as exchange.
    assert SessionSpec.from_json({"tables": {}, "shuffle_dir": "/s"}).split == (
        "exchange"
    )
    spec = SessionSpec(shuffle_dir="/s", split="aggregate")
    assert spec.to_json()["split"] == "aggregate"
    assert SessionSpec.from_json(spec.to_json()) == spec
    with pytest.raises(ValueError, match="split"):
        SessionSpec(split="everywhere")


def test_the_split_mode_reaches_the_planner(
    make_spec: Callable[..., SessionSpec],
) -> None:
    sql = "SELECT l_returnflag, sum(l_quantity) FROM lineitem GROUP BY 1 ORDER BY 1"
    counts = {}
    for split in ("exchange", "aggregate"):
        ctx, _engine = build_session(make_spec(split=split))
        counts[split] = len(find_stages(ctx, ctx.sql(sql).execution_plan()))
    assert counts["aggregate"] == 1
    assert counts["exchange"] >= 2
    assert DfxEngineConfig(shuffle_dir="/s", split="aggregate").split == "aggregate"
    assert DfxEngineConfig(shuffle_dir="/s").split is None


def test_store_options_round_trip_under_the_rust_hosts_key() -> None:
    # The JSON a Rust host writes: `store_options` holds the `s3_*` keys.
    data = {
        "tables": {},
        "shuffle_dir": "s3://bucket/q1",
        "target_partitions": 2,
        "codec_ids": [],
        "split": "exchange",
        "store_options": {
            "s3_endpoint": "http://127.0.0.1:9000",
            "s3_region": "us-east-1",
            "s3_allow_http": "true",
        },
    }
    spec = SessionSpec.from_json(data)
    assert spec.store_options == data["store_options"]
    assert spec.to_json()["store_options"] == data["store_options"]
    assert SessionSpec.from_json(spec.to_json()) == spec
    # Left out when empty, as the Rust host leaves it out; absent reads empty.
    assert "store_options" not in SessionSpec(shuffle_dir="/s").to_json()
    assert (
        SessionSpec.from_json({"tables": {}, "shuffle_dir": "/s"}).store_options == {}
    )


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"aws_secret_access_key": "x"}, "store_options has unknown keys"),
        ({"s3_endpoint": 9000}, "spec"),
        ({"s3_allow_http": "sometimes"}, "store_options s3_allow_http"),
    ],
)
def test_store_options_take_only_the_plugins_s3_keys(
    options: object, named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        SessionSpec(store_options=options)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=named):
        SessionSpec.from_json(
            {"tables": {}, "shuffle_dir": "", "store_options": options}
        )


def test_the_new_fields_round_trip_and_are_left_out_at_their_defaults() -> None:
    spec = SessionSpec(
        shuffle_dir="/s", shuffle_compression="lz4", memory_limit=1 << 20
    )
    data = spec.to_json()
    assert (data["shuffle_compression"], data["memory_limit"]) == ("lz4", 1 << 20)
    assert SessionSpec.from_json(data) == spec
    # The runtime's spelling: defaults are left out, as the Rust host writes.
    plain = SessionSpec(shuffle_dir="/s").to_json()
    assert "shuffle_compression" not in plain
    assert "memory_limit" not in plain
    assert SessionSpec.from_json(plain).shuffle_compression == "auto"
    # A spec of tables alone is whole: every other field has its default.
    assert SessionSpec.from_json({"tables": {}}) == SessionSpec()
    # No pool holds nothing: a limit of 0 is refused, not read as none.
    with pytest.raises(ValueError, match="memory_limit is 0"):
        SessionSpec(memory_limit=0)
    with pytest.raises(ValueError, match="spec"):
        SessionSpec(shuffle_compression="zstd")


def test_datafusion_options_reach_the_session_and_never_replace_dfx_settings() -> None:
    key = "datafusion.optimizer.hash_join_single_partition_threshold"
    spec = SessionSpec(
        datafusion_options={key: "7", "datafusion.catalog.information_schema": "true"}
    )
    assert SessionSpec.from_json(spec.to_json()) == spec
    ctx, _ = build_session(spec)
    shown = ctx.sql(f"SHOW {key}").to_pydict()
    assert shown["value"] == ["7"], shown
    # dfx sets this one for each stage to run alone.
    owned = "datafusion.optimizer.repartition_file_scans"
    with pytest.raises(ValueError, match=f'{owned} to "true", but dfx sets it'):
        build_session(SessionSpec(datafusion_options={owned: "true"}))
    with pytest.raises(ValueError, match="not a DataFusion setting"):
        SessionSpec(datafusion_options={"join_filters": "off"})


def test_the_defaults_and_modes_are_the_runtimes() -> None:
    runtime = json.loads(_internal.normalize_spec("{}"))
    spec = SessionSpec()
    assert spec.target_partitions == runtime["target_partitions"]
    assert spec.split == runtime["split"] == _internal.SPLIT_MODES[0]
    assert list(_internal.SPLIT_MODES) == ["exchange", "aggregate"]
    assert list(_internal.STORE_OPTION_KEYS) == [
        "s3_endpoint",
        "s3_region",
        "s3_allow_http",
    ]


@pytest.mark.parametrize(
    "data",
    [
        {"tables": {}, "shuffle_dir": "/s", "store_options": ["s3_region"]},
        {"tables": ["t"], "shuffle_dir": "/s"},
        {"tables": {}, "shuffle_dir": 7},
        {"tables": {}, "shuffle_dir": "/s", "target_partitions": 0},
        {"tables": {}, "shuffle_dir": "/s", "target_partitions": "4"},
        {"tables": {}, "shuffle_dir": "/s", "split": 2},
        {"tables": {}, "shuffle_dir": "/s", "split": "nowhere"},
        "[1, 2]",
    ],
)
def test_spec_refuses_what_it_cannot_read(data: object) -> None:
    with pytest.raises(ValueError, match="spec"):
        SessionSpec.from_json(data)  # type: ignore[arg-type]


def test_missing_table_directory_is_named(tmp_path: pathlib.Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ValueError, match=r"table t .*nope does not exist"):
        build_session(SessionSpec(tables={"t": str(missing)}))


def test_a_worker_session_has_no_table_and_decodes_the_drivers_stage(
    make_spec: Callable[..., SessionSpec],
) -> None:
    spec = make_spec()
    driver, _ = build_session(spec)
    worker, _ = build_worker_session(spec)
    assert driver.table_exist("lineitem")
    assert not worker.table_exist("lineitem")
    assert worker.physical_extension_codec_ids() == expected_codec_ids()
    plan = driver.sql("SELECT sum(l_quantity) FROM lineitem").execution_plan()
    stage = find_stage(driver, plan)
    assert stage is not None
    # The scan travels whole inside the stage: no catalog lookup is needed.
    decoded = ExecutionPlan.from_bytes(worker, stage.to_bytes(driver))
    assert decoded.display() == stage.display()
    # A worker lists no table (the driver ships the partitions it planned
    # for), so a location only the driver could reach does not stop it.
    missing = SessionSpec(tables={"t": str(spec.shuffle_dir) + "/nope"})
    build_worker_session(missing)
    with pytest.raises(ValueError, match="nope does not exist"):
        build_session(missing)


def test_the_extension_speaks_both_bundle_hooks() -> None:
    engine = DfxEngineExtension()
    assert isinstance(engine, SessionComponentsExportable)
    assert isinstance(engine, SessionPlannerExportable)
    assert DfxEngineConfig(shuffle_dir="/s").shuffle_dir == "/s"


def test_by_hand_installation_plans_stages(
    make_spec: Callable[..., SessionSpec],
) -> None:
    spec = make_spec()
    config = SessionConfig().with_extension(DfxEngineConfig(spec.shuffle_dir))
    ctx = SessionContext(config).with_extensions(DfxEngineExtension())
    ctx.register_parquet("lineitem", spec.tables["lineitem"])
    plan = ctx.sql("SELECT sum(l_quantity) FROM lineitem").execution_plan()
    assert find_stage(ctx, plan) is not None
    assert ctx.physical_extension_codec_ids() == [_internal.physical_codec_id()]
    # The config extension is what switches distribution on.
    bare = SessionContext().with_extensions(DfxEngineExtension())
    bare.register_parquet("lineitem", spec.tables["lineitem"])
    assert find_stage(bare, bare.sql("SELECT 1").execution_plan()) is None


def test_a_users_own_session_has_the_plugins_functions() -> None:
    # Built as a new user would, without build_session: the extension alone
    # must register what plans name, or `dfx_net_revenue` is "Invalid function".
    config = SessionConfig().with_extension(DfxEngineConfig())
    ctx = SessionContext(config).with_extensions(DfxEngineExtension())
    net = ctx.sql("SELECT dfx_net_revenue(1.0, 0.1, 0.2) AS net").collect()
    assert net[0].column(0).to_pylist() == [pytest.approx(1.08)]
    weighted = ctx.sql(
        "SELECT dfx_weighted_avg(price, qty) AS w "
        "FROM (VALUES (100.0, 1.0), (300.0, 3.0)) AS t(price, qty)"
    ).collect()
    assert weighted[0].column(0).to_pylist() == [pytest.approx(1000.0 / 4.0)]
