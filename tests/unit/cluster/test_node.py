"""ClusterNode with a real BrokerService on the embedded store (one process, no etcd)."""

import asyncio
import json

import pytest

from danube import message_codec
from danube.broker import BrokerService
from danube.cluster.node import ClusterNode
from danube.errors import NotServedHereError, TopicSealedError
from danube.metadata import keys
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.storage.config import StorageConfig
from danube.storage.factory import StorageFactory
from danube.wal import Wal
from tests.support.waiting import async_wait_until


def batch(payloads, producer_id):
    return bytearray(message_codec.encode_payloads([p.encode() for p in payloads], producer_id=producer_id))


@pytest.fixture
async def node(tmp_path):
    store = EmbeddedMetadataStore(str(tmp_path / "meta.db"))
    factory = StorageFactory(
        StorageConfig.from_dict({"wal": {"sync": "never"}}, data_dir=str(tmp_path)), store, broker_id="b1"
    )
    broker = BrokerService(store, factory, broker_url="http://b1:6650", broker_id="b1")
    await broker.start()
    n = ClusterNode(
        store,
        broker,
        broker_id="b1",
        broker_url="http://b1:6650",
        lease_ttl_s=3,
        load_report_interval_s=0.2,
        lookup_timeout_s=5,
    )
    broker.cluster = n
    await n.start()
    for _ in range(100):
        if n.election.is_leader:
            break
        await asyncio.sleep(0.02)
    yield n
    await broker.stop()
    await n.stop()
    await store.close()


async def test_lookup_places_a_new_topic_here_and_publishes_work(node):
    broker = node.broker
    result = await broker.lookup("/default/a")
    assert (result.kind, result.broker_url) == ("connect", "http://b1:6650")
    assert await node.store.get(keys.broker_topic("b1", "/default/a")) is not None
    pid = await broker.create_producer("/default/a", "p", reliable=True)
    assert await broker.publish(pid, batch(["x"], pid)) == (0, 0)


async def test_a_fenced_broker_refuses_publishes_and_new_topics(node):
    broker = node.broker
    await broker.lookup("/default/f")
    pid = await broker.create_producer("/default/f", "p", reliable=True)
    broker.refuse_writes("test")
    node.membership.fenced = True
    with pytest.raises(NotServedHereError, match="b1 cannot reach the metadata store .*writes to /default/f are"):
        await broker.publish(pid, batch(["x"], pid))
    await broker.lookup("/default/g")
    with pytest.raises(NotServedHereError, match="cannot reach the metadata store .*writes to /default/g are"):
        await broker.create_producer("/default/g", "p", reliable=True)
    broker.allow_writes()
    node.membership.fenced = False
    assert await broker.publish(pid, batch(["y"], pid)) == (0, 0)


async def test_a_fenced_broker_answers_a_partitions_read_it_cannot_make_with_the_reason(node, monkeypatch):
    from danube.broker import service

    broker = node.broker
    broker.refuse_writes("test")
    node.membership.fenced = True
    assert await broker.partitions("/default/pp") == ["/default/pp"]  # the store answers: as usual

    async def unreachable(key):
        await asyncio.sleep(3600)

    monkeypatch.setattr(broker.metadata, "get_json", unreachable)
    monkeypatch.setattr(service, "REFUSED_WRITES_READ_TIMEOUT_S", 0.2)
    with pytest.raises(
        NotServedHereError,
        match="broker b1 cannot reach the metadata store \\(etcd\\) for \\d+ s "
        ".*: the partitions of /default/pp cannot be read until it is back",
    ):
        await asyncio.wait_for(broker.partitions("/default/pp"), 5)
    broker.allow_writes()
    node.membership.fenced = False


async def _cut_off_past_the_ttl(node, topic):
    """What a broker cut off from etcd goes through: no renewal (the keepalive stopped), fenced, and
    one ttl after the last renewal its topics turn read-only."""
    m = node.membership
    await m.stop(revoke=False)
    m.last_ok_sent -= m.lease_ttl_s  # the renewal was a ttl ago: no waiting in the test
    m._set_fenced("test: no lease renewal")
    await async_wait_until(lambda: node.broker.topics[topic].read_only, 5)


async def test_past_the_ttl_topics_stay_readable_and_reopen_when_the_lease_is_renewed(node):
    store, broker, topic = node.store, node.broker, "/default/ro"
    await broker.lookup(topic)
    pid = await broker.create_producer(topic, "p", reliable=True)
    cid = await broker.subscribe(topic, "s", "c", initial_position="earliest")
    await broker.publish(pid, batch([f"m{i}" for i in range(10)], pid))
    first = await broker.receive(cid, max_messages=3, max_bytes=1 << 20)
    await broker.ack(cid, range(3))
    await broker.flush_cursors()
    assert await store.get_json(keys.subscription_cursor(topic, "s")) == 2
    t = broker.topics[topic]
    await _cut_off_past_the_ttl(node, topic)

    # the WAL (its lock) is free for a next owner, the storage refuses appends with the reason
    Wal.open(t.storage.wal_dir, sync="never").close()
    with pytest.raises(TopicSealedError, match="read-only on this broker: broker b1 cannot reach the metadata store"):
        t.storage.append_frames(batch(["zombie"], pid))
    # publishes, new subscriptions and producers: UNAVAILABLE saying why
    with pytest.raises(
        NotServedHereError,
        match=f"broker b1 cannot reach the metadata store \\(etcd\\) for \\d+ s"
        f".*writes to {topic} are refused until it is back",
    ) as info:
        await broker.publish(pid, batch(["x"], pid))
    assert info.value.retriable
    with pytest.raises(NotServedHereError, match=f"writes to {topic} are refused"):
        await broker.subscribe(topic, "s2", "c2")
    with pytest.raises(NotServedHereError, match=f"writes to {topic} are refused"):
        await broker.create_producer(topic, "p2", reliable=True)
    # the attached consumer reads every stored message and its acks are accepted (in memory)
    assert [r.payload for r in message_codec.iter_records(first.frames)] == [b"m0", b"m1", b"m2"]
    rest = await broker.receive(cid, max_messages=100, max_bytes=1 << 20)
    assert [r.offset for r in message_codec.iter_records(rest.frames)] == list(range(3, 10))
    assert [r.payload for r in message_codec.iter_records(rest.frames)] == [f"m{i}".encode() for i in range(3, 10)]
    await broker.ack(cid, range(3, 10))
    await broker.flush_cursors(force=True)
    assert await store.get_json(keys.subscription_cursor(topic, "s")) == 2  # not written while read-only
    # the same producer name gets its id back without the metadata store
    assert await broker.create_producer(topic, "p", reliable=True) == pid

    # the lease is renewed: writable again by itself, offsets continue, the acks are persisted
    node.membership.last_ok_sent = node.membership._clock()
    node.membership._clear_fence()
    await async_wait_until(lambda: not t.read_only, 5)
    assert broker.topics[topic] is t and not t.storage.read_only
    assert await broker.publish(pid, batch(["n10"], pid)) == (10, 10)
    after = await broker.receive(cid, max_messages=100, max_bytes=1 << 20)
    assert [(r.offset, r.payload) for r in message_codec.iter_records(after.frames)] == [(10, b"n10")]
    assert await store.get_json(keys.subscription_cursor(topic, "s")) == 9


async def test_past_the_ttl_a_lost_lease_closes_the_read_only_topics_without_writing_cursors(node):
    store, broker, topic = node.store, node.broker, "/default/lost"
    await broker.lookup(topic)
    pid = await broker.create_producer(topic, "p", reliable=True)
    cid = await broker.subscribe(topic, "s", "c", initial_position="earliest")
    await broker.publish(pid, batch(["a", "b"], pid))
    await broker.flush_cursors(force=True)
    await _cut_off_past_the_ttl(node, topic)
    await broker.receive(cid, max_messages=100, max_bytes=1 << 20)
    await broker.ack(cid, [0, 1])
    await node._lease_lost()
    assert topic not in broker.topics
    assert await store.get_json(keys.subscription_cursor(topic, "s")) == -1  # the next owner's to move


async def test_a_topic_owned_elsewhere_redirects_and_is_refused_here(node):
    store, broker = node.store, node.broker
    await store.put(keys.broker_register("b2"), json.dumps({"broker_url": "http://b2:6650"}).encode())
    await store.put(keys.broker_topic("b2", "/default/theirs"), b"null")
    await node.view.wait_for(lambda: node.view.owner("/default/theirs") == "b2", 5)
    result = await broker.lookup("/default/theirs")
    # proxy mode: the client keeps talking to the broker it asked, which forwards to the owner
    assert (result.kind, result.broker_url, result.connect_url, result.proxy) == (
        "redirect",
        "http://b2:6650",
        node.broker_url,
        True,
    )
    with pytest.raises(NotServedHereError) as info:
        await broker.create_producer("/default/theirs", "p", reliable=True)
    assert info.value.owner_url == "http://b2:6650"


async def test_unload_seals_and_hands_the_topic_to_the_leader(node):
    store, broker = node.store, node.broker
    await broker.lookup("/default/m")
    pid = await broker.create_producer("/default/m", "p", reliable=True)
    await broker.publish(pid, batch(["a", "b"], pid))
    assert await broker.unload_topic("/default/m") == 1  # sealed at the last offset
    assert "/default/m" not in broker.topics
    # the only broker: the leader gives it back (excluding it would leave the topic nowhere)
    await node.view.wait_for(lambda: node.view.owner("/default/m") == "b1", 5)
    assert await store.get(keys.unassigned("/default/m")) is None
    pid = await broker.create_producer("/default/m", "p", reliable=True)
    assert await broker.publish(pid, batch(["c"], pid)) == (2, 2)  # resumed at last + 1


async def test_leave_hands_every_served_topic_over(node):
    store, broker = node.store, node.broker
    for name in ("/default/l1", "/default/l2"):
        await broker.lookup(name)
        pid = await broker.create_producer(name, "p", reliable=True)
        await broker.publish(pid, batch(["a"], pid))
    await node.load_manager.stop()  # nobody places them again: look at the markers
    assert await node.leave() == 2
    assert not [t for t in broker.topics if not t.startswith("/system/")]
    for name in ("/default/l1", "/default/l2"):
        marker = json.loads((await store.get(keys.unassigned(name))).value)
        assert marker == {"reason": "unload", "from_broker": "b1", "sealed": True, "last_offset": 0}
        state = await store.get_json(keys.storage_state("", name))
        assert state["sealed"] and state["last_committed_offset"] == 0 and state["broker_id"] == "b1"


async def test_load_reports_go_to_etcd_under_the_lease(node):
    for _ in range(100):
        kv = await node.store.get(keys.load_report("b1"))
        if kv is not None:
            break
        await asyncio.sleep(0.05)
    assert kv is not None and kv.lease == node.membership.lease_id
    assert json.loads(kv.value)["broker_id"] == "b1"


async def test_the_view_reloads_when_its_history_was_compacted(tmp_path, monkeypatch):
    import danube.metadata.embedded as embedded_mod
    from danube.cluster.view import ClusterView

    monkeypatch.setattr(embedded_mod, "HISTORY_REVISIONS", 5)
    store = EmbeddedMetadataStore(str(tmp_path / "c.db"))
    view = ClusterView(store)
    try:
        await view.start()
        await view.stop()  # the view falls behind ...
        await store.put(keys.broker_topic("b1", "/default/x"), b"null")
        for i in range(1100):  # ... further than the history the store keeps
            await store.put("/other", str(i).encode())
        view._task = asyncio.get_running_loop().create_task(view._follow(2))
        await view.wait_for(lambda: view.owner("/default/x") == "b1", 10)
    finally:
        await view.stop()
        await store.close()


async def test_a_rebalance_move_is_sealed_here_then_confirmed_then_placed(node):
    """What the rebalancer writes (marker with to_broker + delete of the source assignment, one
    transaction): this broker seals, confirms with "sealed": true, and only then does the leader place it."""
    from danube.metadata.store import Op

    store, broker = node.store, node.broker
    await store.put(keys.broker_register("b2"), json.dumps({"broker_url": "http://b2:6650"}).encode())
    await broker.lookup("/default/r")
    pid = await broker.create_producer("/default/r", "p", reliable=True)
    await broker.publish(pid, batch(["a", "b", "c"], pid))
    marker = {"reason": "rebalance", "from_broker": "b1", "to_broker": "b2", "timestamp": 1}
    await store.txn(
        [], [Op.put_json(keys.unassigned("/default/r"), marker), Op.delete(keys.broker_topic("b1", "/default/r"))]
    )
    await node.view.wait_for(lambda: node.view.owner("/default/r") == "b2", 10)
    assert "/default/r" not in broker.topics
    sealed = await store.get_json(keys.storage_state("", "/default/r"))
    assert sealed["sealed"] and sealed["last_committed_offset"] == 2


async def test_concurrent_lookups_of_new_topics_share_marker_transactions(node, monkeypatch):
    store = node.store
    calls = []
    original = store.txn

    async def counting(compare, success=(), failure=()):
        markers = [op for op in success if op.kind == "put" and op.key.startswith("/cluster/unassigned/")]
        if markers:  # a lookup's marker transaction (the leader's own only delete markers)
            calls.append(len(markers))
        return await original(compare, success, failure)

    monkeypatch.setattr(store, "txn", counting)
    results = await asyncio.gather(*(node.broker.lookup(f"/default/burst-{i}") for i in range(50)))
    assert {r.kind for r in results} == {"connect"}
    assert sum(calls) == 50 and len(calls) <= 5  # a handful of transactions, not one per topic
