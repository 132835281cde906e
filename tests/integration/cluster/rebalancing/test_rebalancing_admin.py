"""GetClusterBalance / TriggerRebalance / GetRebalancingHistory on a grpc.aio admin server, through the CLI."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import grpc
import pytest

from danube.cli.main import main
from danube.cluster.rebalancing import Rebalancer, RebalancingConfig
from danube.metadata import keys
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.server.admin import add_to_server
from tests.unit.cluster.rebalancing.test_rebalancing_loop import Assigner, Clock, Reports, setup  # noqa: F401


@pytest.fixture
async def admin(tmp_path):
    store = EmbeddedMetadataStore(":memory:")
    clock = Clock()
    await setup(store, {"a": 12, "b": 0, "c": 1})
    reports = Reports(store, clock)
    await reports.refresh()
    cfg = RebalancingConfig.from_dict({"enabled": False, "min_topic_age_seconds": 0}, strategy="fair")
    rebalancer = Rebalancer(
        store, cfg, clock=clock, reports=reports, executor=Assigner(store, clock), reassignment_timeout_s=0.0
    )
    broker = SimpleNamespace(
        broker_id="a",
        broker_url="http://127.0.0.1:1",
        metadata=store,
        topics={},
        rebalancer=rebalancer,
        cluster=None,
        schema_gate=None,
        storage_factory=None,
        metrics_url=None,
    )
    server = grpc.aio.server()
    add_to_server(server, broker)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield SimpleNamespace(endpoint=f"http://127.0.0.1:{port}", broker=broker, store=store, rebalancer=rebalancer)
    await server.stop(None)
    await store.close()


async def cli(env, *argv):
    return await asyncio.to_thread(main, ["admin", "--endpoint", env.endpoint, *argv])


async def test_balance_dry_run_rebalance_and_history(admin, capsys):
    assert await cli(admin, "brokers", "balance", "-o", "json") == 0
    balance = json.loads(capsys.readouterr().out)
    assert balance["active_brokers"] == 3 and balance["cv_threshold"] == 0.3 and balance["strategy"] == "fair"
    assert [(b["broker_id"], b["topic_count"]) for b in balance["brokers"]] == [("a", 12), ("c", 1), ("b", 0)]
    assert balance["overloaded"] == ["a"] and balance["coefficient_of_variation"] > 1.0

    assert await cli(admin, "brokers", "balance") == 0
    assert "overloaded" in capsys.readouterr().out

    assert await cli(admin, "-o", "json", "brokers", "rebalance", "--dry-run", "--max-moves", "3") == 0
    dry = json.loads(capsys.readouterr().out)
    assert len(dry["proposed_moves"]) == 3 and dry["moves_executed"] == 0
    assert all(m["from_broker"] == "a" for m in dry["proposed_moves"])
    assert dry["cv_after_estimated"] < dry["cv_before"]
    assert len(await admin.store.get_prefix(f"{keys.cluster_brokers_prefix()}a/")) == 12  # nothing moved

    # a real rebalance on the leader, although automated rebalancing is disabled
    assert await cli(admin, "brokers", "rebalance", "--max-moves", "2", "-o", "json") == 0
    done = json.loads(capsys.readouterr().out)
    assert done["moves_executed"] == 1 and "cooldown" in done["message"]  # the second waits for the cooldown
    assert len(await admin.store.get_prefix(f"{keys.cluster_brokers_prefix()}a/")) == 11

    assert await cli(admin, "brokers", "rebalance-history", "-o", "json") == 0
    [move] = json.loads(capsys.readouterr().out)
    assert move["from_broker"] == "a" and move["outcome"] == "moved" and move["topic_name"].startswith("/default/a-")
    assert await cli(admin, "brokers", "rebalance-history") == 0
    assert "1 moves" in capsys.readouterr().out


async def test_not_leader_and_no_rebalancer(admin, capsys):
    admin.rebalancer.is_leader = lambda: False
    assert await cli(admin, "brokers", "rebalance") == 1
    assert "failed_precondition" in capsys.readouterr().err
    assert await cli(admin, "brokers", "rebalance", "--dry-run") == 0  # any broker can plan
    capsys.readouterr()
    admin.broker.rebalancer = None
    assert await cli(admin, "brokers", "balance") == 1
    assert "unimplemented" in capsys.readouterr().err
