"""The leader-only Rebalancer on a real embedded metadata store: one cycle at a time, virtual clock."""

from __future__ import annotations

import json

import pytest
from prometheus_client import generate_latest

from danube.cluster.load_report import LoadReport, SystemLoad, TopicLoad
from danube.cluster.rebalancing import MetadataMoveExecutor, Rebalancer, RebalancingConfig, RebalancingMetrics
from danube.cluster.rebalancing.history import MoveRecord, RebalancingHistory
from danube.cluster.rebalancing.metrics import METRIC_NAMES
from danube.metadata import keys
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.metadata.store import Compare, Op

T0 = 1_700_000_000.0


class Clock:
    def __init__(self, t=T0):
        self.t = t

    def now(self):
        return self.t


class Reports:
    """Reports built from the store's assignments when refresh() is called (fair strategy: counts)."""

    def __init__(self, store, clock):
        self.store, self.clock, self.reports = store, clock, {}

    async def refresh(self):
        self.reports = {}
        for kv in await self.store.get_prefix(keys.cluster_register_prefix()):
            broker = kv.key.rsplit("/", 1)[1]
            topics = []
            for a in await self.store.get_prefix(f"{keys.cluster_brokers_prefix()}{broker}/"):
                parts = a.key.split("/")
                if len(parts) == 6:
                    topics.append(TopicLoad(topic_name=f"/{parts[4]}/{parts[5]}", producer_count=1))
            self.reports[broker] = LoadReport(
                resources_usage=[SystemLoad("CPU", 0.0)],
                topics=topics,
                timestamp=int(self.clock.now()),
                broker_id=broker,
            )

    async def latest_reports(self):
        return dict(self.reports)


class Assigner:
    """Wraps the real executor; the load manager stand-in honours the to_broker hint."""

    def __init__(self, store, clock, *, hint=True, fail=False):
        self.inner = MetadataMoveExecutor(store, clock)
        self.store, self.hint, self.fail, self.markers = store, hint, fail, []

    async def move(self, topic, from_broker, to_broker):
        if self.fail:
            raise RuntimeError("boom")
        await self.inner.move(topic, from_broker, to_broker)
        marker = await self.store.get_json(keys.unassigned(topic))
        self.markers.append(marker)
        if self.hint:
            await self.store.put(keys.broker_topic(marker["to_broker"], topic), b"null")
            await self.store.delete(keys.unassigned(topic))


@pytest.fixture
async def cluster():
    store = EmbeddedMetadataStore(":memory:")
    yield store
    await store.close()


async def setup(store, layout, states=None):
    for broker, count in layout.items():
        await store.put_json(keys.broker_register(broker), {"broker_id": broker})
        if states and broker in states:
            await store.put_json(keys.broker_state(broker), states[broker])
        for i in range(count):
            await store.put(keys.broker_topic(broker, f"/default/{broker}-t{i}"), b"null")


def make(store, clock, reports, executor=None, **section):
    cfg = RebalancingConfig.from_dict(
        {"enabled": True, "aggressiveness": "aggressive", "min_topic_age_seconds": 0, **section}, strategy="fair"
    )
    metrics = RebalancingMetrics()
    reb = Rebalancer(
        store,
        cfg,
        clock=clock,
        reports=reports,
        executor=executor or Assigner(store, clock),
        metrics=metrics,
        reassignment_timeout_s=0.0,
    )
    return reb, metrics


async def test_a_move_writes_the_marker_deletes_the_source_and_records_history(cluster):
    clock = Clock()
    await setup(cluster, {"a": 6, "b": 0})
    reports = Reports(cluster, clock)
    await reports.refresh()
    executor = Assigner(cluster, clock)
    reb, metrics = make(cluster, clock, reports, executor)
    result = await reb.run_cycle()
    assert result.status == "moved", result
    move = result.move
    assert (move.from_broker, move.to_broker, move.planned_to_broker, move.outcome) == ("a", "b", "b", "moved")
    assert executor.markers == [{"reason": "rebalance", "from_broker": "a", "to_broker": "b", "timestamp": int(T0)}]
    assert await cluster.get(keys.broker_topic("a", move.topic)) is None
    assert await cluster.get(keys.broker_topic("b", move.topic)) is not None
    [record] = await RebalancingHistory(cluster).records()
    assert record == move and record.reason == "LoadImbalance" and record.cv_before == pytest.approx(1.0)
    [kv] = await cluster.get_prefix(keys.rebalancing_history_prefix())
    assert kv.key == keys.rebalancing_history(int(T0 * 1000))
    assert json.loads(kv.value)["estimated_load"] == 1.0
    text = generate_latest(metrics.registry).decode()
    for name in METRIC_NAMES:
        assert name in text, name
    assert 'danube_topic_assignments_total{action="unassign",broker_id="a"} 1.0' in text
    assert 'danube_topic_assignments_total{action="assign",broker_id="b"} 1.0' in text
    assert "danube_rebalancing_moves_total 1.0" in text and "danube_cluster_balance_cv 1.0" in text
    assert 'danube_broker_topics_owned{broker_id="a"} 6.0' in text


async def test_skips(cluster):
    clock = Clock()
    await setup(cluster, {"a": 6, "b": 0})
    reports = Reports(cluster, clock)
    await reports.refresh()
    reb, metrics = make(cluster, clock, reports)
    reb.is_leader = lambda: False
    assert (await reb.run_cycle()).reason == "not leader"
    reb.is_leader = lambda: True
    reb.config = reb.config.with_overrides(enabled=False)
    assert (await reb.run_cycle()).reason == "disabled"
    reb.config = reb.config.with_overrides(enabled=True, min_brokers_for_rebalance=3)
    assert (await reb.run_cycle()).reason == "too few brokers"
    assert await RebalancingHistory(cluster).records() == []
    assert "danube_rebalancing_checks_total 1.0" in generate_latest(metrics.registry).decode()


async def test_draining_brokers_are_excluded(cluster):
    clock = Clock()
    await setup(cluster, {"a": 6, "b": 0, "c": 0}, states={"b": "draining", "c": {"state": "drained"}})
    reports = Reports(cluster, clock)
    await reports.refresh()
    reb, _ = make(cluster, clock, reports)
    result = await reb.run_cycle()
    assert result.reason == "too few brokers" and result.balance.active_brokers == 1
    await cluster.put_json(keys.broker_state("c"), "active")
    result = await reb.run_cycle()
    assert result.status == "moved" and result.move.to_broker == "c"


async def test_rate_limit_and_cooldown_come_from_the_history_and_survive_a_leader_change(cluster):
    clock = Clock()
    await setup(cluster, {"a": 40, "b": 0})
    reports = Reports(cluster, clock)
    reb, _ = make(cluster, clock, reports, max_moves_per_hour=3, cooldown_seconds=100)
    statuses = []
    for _ in range(6):
        await reports.refresh()
        statuses.append((await reb.run_cycle()).status)
        clock.t += 60
    assert statuses == ["moved", "cooldown", "moved", "cooldown", "moved", "rate_limited"]
    new_leader, _ = make(cluster, clock, reports, max_moves_per_hour=3, cooldown_seconds=100)
    assert (await new_leader.run_cycle()).status == "rate_limited"
    clock.t = T0 + 3600 + 1  # the first move leaves the window
    await reports.refresh()
    assert (await new_leader.run_cycle()).status == "moved"


async def test_a_failed_move_is_counted_and_changes_nothing(cluster):
    clock = Clock()
    await setup(cluster, {"a": 6, "b": 0})
    reports = Reports(cluster, clock)
    await reports.refresh()
    reb, metrics = make(cluster, clock, reports, Assigner(cluster, clock, fail=True))
    assert (await reb.run_cycle()).status == "failed"
    assert "danube_rebalancing_failures_total 1.0" in generate_latest(metrics.registry).decode()
    assert len(await cluster.get_prefix(f"{keys.cluster_brokers_prefix()}a/")) == 6
    assert await RebalancingHistory(cluster).records() == []


async def test_the_guard_rejects_a_deposed_leader(cluster):
    clock = Clock()
    await setup(cluster, {"a": 6, "b": 0})
    await cluster.put(keys.leader(), b"other")
    reports = Reports(cluster, clock)
    await reports.refresh()
    guard = lambda: [Compare.value(keys.leader(), "==", b"me")]  # noqa: E731
    reb, _ = make(cluster, clock, reports, MetadataMoveExecutor(cluster, clock, guard))
    assert (await reb.run_cycle()).status == "failed"
    assert await cluster.get_prefix(keys.unassigned_prefix()) == []
    assert await RebalancingHistory(cluster).append(MoveRecord("/d/t", "a", "b", T0), guard=guard()) is None


async def test_unassigned_topic_that_nobody_takes_is_a_timeout(cluster):
    clock = Clock()
    await setup(cluster, {"a": 6, "b": 0})
    reports = Reports(cluster, clock)
    await reports.refresh()
    reb, _ = make(cluster, clock, reports, Assigner(cluster, clock, hint=False))
    result = await reb.run_cycle()
    assert result.status == "failed" and result.move.outcome == "timeout"
    [record] = await RebalancingHistory(cluster).records()
    assert record.outcome == "timeout"  # counted toward the rate limit all the same


async def test_waits_for_the_reassignment_through_a_watch(cluster):
    import asyncio

    clock = Clock()
    await setup(cluster, {"a": 6, "b": 0})
    reports = Reports(cluster, clock)
    await reports.refresh()
    reb, _ = make(cluster, clock, reports, MetadataMoveExecutor(cluster, clock))
    reb.reassignment_timeout_s = 5.0

    async def load_manager():
        while True:
            markers = await cluster.get_prefix(keys.unassigned_prefix())
            if markers:
                marker = json.loads(markers[0].value)
                topic = "/" + markers[0].key[len(keys.unassigned_prefix()) :]
                await cluster.put(keys.broker_topic(marker["to_broker"], topic), b"null")
                await cluster.delete(markers[0].key)
                return
            await asyncio.sleep(0.01)

    task = asyncio.create_task(load_manager())
    result = await reb.run_cycle()
    await task
    assert result.status == "moved" and result.move.to_broker == "b"


async def test_dry_run_proposes_a_plan_without_writing(cluster):
    clock = Clock()
    await setup(cluster, {"a": 30, "b": 0, "c": 0})
    reports = Reports(cluster, clock)
    await reports.refresh()
    reb, _ = make(cluster, clock, reports)
    result = await reb.dry_run(max_moves=50)
    assert result.status == "planned" and result.plan
    assert result.plan[-1].cv_after < reb.config.target_cv
    assert len({m.topic for m in result.plan}) == len(result.plan)
    assert await RebalancingHistory(cluster).records() == []
    assert len(await cluster.get_prefix(f"{keys.cluster_brokers_prefix()}a/")) == 30
    assert len((await reb.dry_run(max_moves=2)).plan) == 2


async def test_with_the_cluster_view_and_reports_in_the_store(cluster):
    """The leader's wiring: ClusterView (one watch on /cluster/) as the source, reports at /cluster/load/{id}."""
    import asyncio

    from danube.cluster.view import ClusterView

    clock = Clock()
    await setup(cluster, {"a": 8, "b": 0}, states={"b": "active"})
    source = Reports(cluster, clock)
    await source.refresh()
    for broker, report in source.reports.items():
        await cluster.put(keys.load_report(broker), report.to_json())
    view = ClusterView(cluster)
    await view.start()
    try:
        cfg = RebalancingConfig.from_dict({"enabled": True, "min_topic_age_seconds": 0}, strategy="fair")
        reb = Rebalancer(cluster, cfg, clock=clock, view=view, reassignment_timeout_s=5.0)

        async def load_manager():
            await view.wait_for(lambda: view.unassigned, 5.0)
            [(topic, (marker, _rev))] = view.unassigned.items()
            await cluster.txn(
                [], [Op.put(keys.broker_topic(marker["to_broker"], topic), b"null"), Op.delete(keys.unassigned(topic))]
            )

        task = asyncio.create_task(load_manager())
        result = await reb.run_cycle()
        await task
        assert result.status == "moved" and result.move.to_broker == "b" and result.move.outcome == "moved"
        assert view.assignments[result.move.topic] == "b"
        assert result.balance.active_brokers == 2
    finally:
        await view.stop()


def test_a_record_from_a_leader_whose_clock_is_ahead_counts_toward_the_limit():
    from danube.cluster.rebalancing.history import in_cooldown, moves_in_window

    records = [MoveRecord("/d/t", "a", "b", T0 + 30)]
    assert moves_in_window(records, T0) == 1 and in_cooldown(records, T0, 10)
