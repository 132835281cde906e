"""Load manager placement, membership fencing and leader election on the embedded store (no etcd)."""

import asyncio
import json

import pytest

from danube.cluster.leader import LeaderElection
from danube.cluster.load_manager import LoadManager
from danube.cluster.load_report import LoadReport, SystemLoad
from danube.cluster.membership import Membership
from danube.cluster.view import ClusterView
from danube.errors import MetadataError
from danube.metadata import keys
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.metadata.store import Compare


class Leader:
    is_leader = True

    def guard(self):
        return []


class CountingStore(EmbeddedMetadataStore):
    def __init__(self, path):
        super().__init__(path)
        self.txns = 0

    async def txn(self, compare, success=(), failure=()):
        self.txns += 1
        return await super().txn(compare, success, failure)


@pytest.fixture
async def store(tmp_path):
    s = CountingStore(str(tmp_path / "meta.db"))
    yield s
    await s.close()


async def register(store, *brokers):
    for b in brokers:
        await store.put(keys.broker_register(b), json.dumps({"broker_url": f"http://{b}"}).encode())


async def started_view(store):
    view = ClusterView(store)
    await view.start()
    return view


async def counts(store):
    result = {}
    for kv in await store.get_prefix("/cluster/brokers/"):
        broker = kv.key.split("/")[3]
        result[broker] = result.get(broker, 0) + 1
    return result


async def test_fair_placement_of_30_topics_is_even_and_batched(store):
    await register(store, "b1", "b2", "b3")
    for i in range(30):
        await store.put(keys.unassigned(f"/default/t{i}"), b"null")
    view = await started_view(store)
    manager = LoadManager(store, view, Leader(), batch_size=60)
    try:
        assert await manager.assign_pending() == 30
        assert store.txns == 1  # one transaction for all 30
        c = await counts(store)
        assert sorted(c.values()) == [10, 10, 10]
        assert await store.get_prefix("/cluster/unassigned/") == []
        # the in-memory usage already counts them: the next topic goes to a broker with 10
        await store.put(keys.unassigned("/default/next"), b"null")
        await view.wait_for(lambda: "/default/next" in view.unassigned, 5)
        await manager.assign_pending()
        assert sorted((await counts(store)).values()) == [10, 10, 11]
    finally:
        await view.stop()


async def test_1000_topics_take_a_few_transactions(store):
    await register(store, "b1", "b2", "b3")
    from danube.metadata.store import Op

    await store.txn([], [Op.put(keys.unassigned(f"/bulk/t{i}"), b"null") for i in range(1000)])
    view = await started_view(store)
    manager = LoadManager(store, view, Leader(), batch_size=60)
    store.txns = 0
    try:
        assert await manager.assign_pending() == 1000
        assert store.txns == 17  # ceil(1000 / 60)
        c = await counts(store)
        assert max(c.values()) - min(c.values()) <= 1
    finally:
        await view.stop()


async def test_hints_exclusions_and_stale_markers(store):
    await register(store, "b1", "b2", "b3")
    await store.put(
        keys.unassigned("/ns/hinted"),
        json.dumps(
            {"reason": "rebalance", "from_broker": "b1", "to_broker": "b3", "timestamp": 1, "sealed": True}
        ).encode(),
    )
    await store.put(
        keys.unassigned("/ns/moved"), json.dumps({"reason": "unload", "from_broker": "b1", "sealed": True}).encode()
    )
    await store.put(keys.broker_topic("b2", "/ns/owned"), b"null")
    await store.put(keys.unassigned("/ns/owned"), b"null")  # a lookup raced an assignment: stale marker
    view = await started_view(store)
    manager = LoadManager(store, view, Leader())
    try:
        await manager.assign_pending()
        state = {kv.key for kv in await store.get_prefix("/cluster/brokers/")}
        assert keys.broker_topic("b3", "/ns/hinted") in state
        assert keys.broker_topic("b1", "/ns/moved") not in state
        assert keys.broker_topic("b2", "/ns/owned") in state and len(state) == 3
        assert await store.get_prefix("/cluster/unassigned/") == []
    finally:
        await view.stop()


async def test_a_move_waits_for_its_source_to_confirm_the_seal(store):
    await register(store, "b1", "b2")
    unconfirmed = {"reason": "rebalance", "from_broker": "b1", "to_broker": "b2", "timestamp": 1}
    await store.put(keys.unassigned("/ns/m"), json.dumps(unconfirmed).encode())
    await store.put(keys.unassigned("/ns/gone"), json.dumps({"reason": "unload", "from_broker": "b9"}).encode())
    view = await started_view(store)
    manager = LoadManager(store, view, Leader(), handoff_timeout_s=0.5)
    try:
        assert await manager.assign_pending() == 1  # /ns/gone: its source is not registered, no wait
        assert await store.get(keys.broker_topic("b2", "/ns/m")) is None
        await store.put(keys.unassigned("/ns/m"), json.dumps(dict(unconfirmed, sealed=True)).encode())
        await view.wait_for(lambda: (view.unassigned.get("/ns/m") or ({},))[0].get("sealed"), 5)
        assert await manager.assign_pending() == 1
        assert await store.get(keys.broker_topic("b2", "/ns/m")) is not None
        # an unconfirmed move is placed anyway after the hand-over timeout
        await store.put(keys.unassigned("/ns/late"), json.dumps(dict(unconfirmed)).encode())
        await view.wait_for(lambda: "/ns/late" in view.unassigned, 5)
        assert await manager.assign_pending() == 0
        await asyncio.sleep(0.6)
        assert await manager.assign_pending() == 1
    finally:
        await view.stop()


def test_round_robin_among_brokers_within_ten_percent():
    manager = LoadManager.__new__(LoadManager)
    manager._last_selected = None
    ranked = [("b1", 10.0), ("b2", 10.5), ("b3", 12.0)]
    picks = [manager.select(ranked) for _ in range(4)]
    assert picks == ["b1", "b2", "b1", "b2"]  # b3 is more than 10% above the lowest
    assert manager.select(ranked, exclude=["b1", "b2"]) == "b3"
    assert manager.select(ranked, hint="b3") == "b3"
    assert manager.select(ranked, hint="b9") in ("b1", "b2")  # an unknown hint is ignored
    assert manager.select(ranked, exclude=["b1", "b2", "b3"]) is None


async def test_balanced_strategy_prefers_the_idle_broker(store):
    await register(store, "b1", "b2")
    busy = LoadReport(
        resources_usage=[SystemLoad("CPU", 90.0), SystemLoad("Memory", 80.0)], broker_id="b1", timestamp=1
    )
    idle = LoadReport(resources_usage=[SystemLoad("CPU", 5.0), SystemLoad("Memory", 10.0)], broker_id="b2", timestamp=1)
    await store.put(keys.load_report("b1"), busy.to_json())
    await store.put(keys.load_report("b2"), idle.to_json())
    for i in range(5):
        await store.put(keys.unassigned(f"/ns/t{i}"), b"null")
    view = await started_view(store)
    manager = LoadManager(store, view, Leader(), strategy="balanced")
    try:
        await manager.assign_pending()
        assert await counts(store) == {"b2": 5}
    finally:
        await view.stop()


async def test_dead_broker_topics_go_back_to_unassigned_and_are_placed_again(store):
    await register(store, "b1", "b2")
    for i in range(4):
        await store.put(keys.broker_topic("b3", f"/ns/t{i}"), b"null")  # b3 is not registered
    view = await started_view(store)
    manager = LoadManager(store, view, Leader(), orphan_grace_s=0.0)
    try:
        assert await manager.reassign_dead() == 4
        markers = await store.get_prefix("/cluster/unassigned/")
        assert len(markers) == 4 and json.loads(markers[0].value)["reason"] == "failover"
        assert await manager.assign_pending() == 4
        assert await counts(store) == {"b1": 2, "b2": 2}
        assert await manager.reassign_dead() == 0  # nothing twice
    finally:
        await view.stop()


class FenceRecorder:
    def __init__(self):
        self.calls = []

    def fence(self, reason):
        self.calls.append("fence")

    def unfence(self):
        self.calls.append("unfence")


class StallingStore(EmbeddedMetadataStore):
    """Keepalives hang while ``stalled`` is set (an unreachable etcd)."""

    stalled = False

    async def keepalive(self, lease_id):
        while self.stalled:
            await asyncio.sleep(0.05)
        return await super().keepalive(lease_id)


async def test_fence_before_the_lease_can_expire_and_unfence_after(tmp_path):
    store = StallingStore(str(tmp_path / "m.db"))
    fence = FenceRecorder()
    member = Membership(store, "b1", {"broker_url": "http://x"}, lease_ttl_s=3, fence=fence)
    try:
        await member.register()
        member.start()
        await asyncio.sleep(1.5)
        assert fence.calls == []
        store.stalled = True
        loop = asyncio.get_running_loop()
        stalled_at = loop.time()
        while not member.fenced:
            await asyncio.sleep(0.02)
        assert loop.time() - stalled_at < 3.0  # fenced while the lease is still alive
        assert await store.get(keys.broker_register("b1")) is not None
        store.stalled = False
        while member.fenced:
            await asyncio.sleep(0.02)
        assert fence.calls == ["fence", "unfence"]
    finally:
        await member.stop()
        await store.close()


async def test_a_lost_lease_fences_and_registers_again(tmp_path):
    store = EmbeddedMetadataStore(str(tmp_path / "m.db"))
    fence = FenceRecorder()
    lost = []

    async def on_lost():
        lost.append(True)

    member = Membership(store, "b1", {}, lease_ttl_s=3, fence=fence, on_lease_lost=on_lost)
    try:
        first = await member.register()
        member.start()
        await store.revoke_lease(first)
        while member.registrations < 2:
            await asyncio.sleep(0.05)
        assert lost == [True] and member.lease_id != first and not member.fenced
        assert (await store.get(keys.broker_register("b1"))).lease == member.lease_id
        with pytest.raises(MetadataError, match="already registered"):
            await Membership(store, "b1", {}, lease_ttl_s=3).register()
    finally:
        await member.stop()
        await store.close()


async def test_one_leader_and_failover_when_its_lease_ends(tmp_path):
    store = EmbeddedMetadataStore(str(tmp_path / "m.db"))
    members = [Membership(store, f"b{i}", {}, lease_ttl_s=2) for i in range(3)]
    elections = [LeaderElection(store, m.broker_id, m) for m in members]
    try:
        for m in members:
            await m.register()
            m.start()  # keepalives: only the leader's lease ends in this test
        for e in elections:
            e.start()
        for _ in range(100):
            if sum(e.is_leader for e in elections) == 1 and all(e.leader_id for e in elections):
                break
            await asyncio.sleep(0.05)
        leaders = [e for e in elections if e.is_leader]
        assert len(leaders) == 1 and {e.leader_id for e in elections} == {leaders[0].broker_id}
        old = leaders[0]
        guard = old.guard()
        await old.stop(resign=False)
        await old.membership.stop(revoke=True)  # the leader dies: its lease ends
        others = [e for e in elections if e is not old]
        for _ in range(100):
            if sum(e.is_leader for e in others) == 1:
                break
            await asyncio.sleep(0.05)
        assert sum(e.is_leader for e in others) == 1
        # the old leader's guard no longer holds: its late writes fail
        from danube.metadata.store import Op

        assert not (await store.txn(guard, [Op.put("/cluster/x", b"late")])).succeeded
        assert isinstance(guard[0], Compare)
    finally:
        for e in elections:
            await e.stop()
        for m in members:
            await m.stop()
        await store.close()
