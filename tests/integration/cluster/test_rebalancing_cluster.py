"""Automated rebalancing on a real loopback cluster (docs/rebalancing.md): 3 brokers serve 30 topics
that danube.client producers keep publishing to (and consumers keep reading) while 2 brokers join
(`danube broker --cluster --etcd URL --config FILE`, the file every broker got); the leader's
rebalancer moves topics to them with aggressive settings and short intervals until the CV is under
the threshold.  Nothing is lost or skipped while moving (every topic read to its end, offsets
0..N-1), and the history and the leader's metrics on its Prometheus port show every move."""

from __future__ import annotations

import asyncio
import collections
import re
import statistics
import time
import urllib.request

import pytest

from danube.client import DanubeClient, SubType
from tests.support.cluster import local_cluster, state
from tests.support.etcd import requires_etcd
from tests.support.waiting import async_wait_until

pytestmark = [requires_etcd, pytest.mark.timeout(240)]

TOPICS = [f"/default/rebal-{i:02d}" for i in range(30)]
THRESHOLD = 0.20  # aggressive
TARGET = 0.9 * THRESHOLD  # where a rebalancing episode ends (hysteresis): no move after that
CONFIG = """\
load_manager:
  assignment_strategy: fair
  rebalancing:
    enabled: true
    aggressiveness: aggressive
    check_interval_seconds: 1
    cooldown_seconds: 0.5
    max_moves_per_hour: 1000
    min_topic_age_seconds: 0
"""
SEND_INTERVAL_S = 0.2  # per topic: 150 messages/s over the 30 topics


def scrape(url: str) -> dict[str, float]:
    """``name{labels}`` → value of a metrics page (comments dropped)."""
    body = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def counts_cv(counts: dict[str, int], brokers: list[str]) -> float:
    loads = [counts.get(b, 0) for b in brokers]
    return statistics.pstdev(loads) / statistics.mean(loads)


async def assignment_puts(etcd_url: str) -> list[tuple[str, str]]:
    """Every assignment ever written, (topic, broker) in store order: etcd's history replayed."""
    from danube.metadata.etcd import EtcdMetadataStore

    store = EtcdMetadataStore(etcd_url, retry_timeout=5)
    puts = []
    events = store.watch("/cluster/brokers/", start_revision=1)
    try:
        while True:
            try:
                event = await asyncio.wait_for(events.__anext__(), 2.0)
            except (asyncio.TimeoutError, StopAsyncIteration):
                break  # the replay is over
            parts = event.key.split("/")
            if event.kind == "put" and len(parts) == 6:
                puts.append((f"/{parts[4]}/{parts[5]}", parts[3]))
    finally:
        await events.aclose()
        await store.close()
    return puts


async def history(etcd_url: str):
    from danube.cluster.rebalancing import RebalancingHistory
    from danube.metadata.etcd import EtcdMetadataStore

    store = EtcdMetadataStore(etcd_url, retry_timeout=5)
    try:
        return await RebalancingHistory(store).records()
    finally:
        await store.close()


def test_joining_brokers_get_topics_while_clients_produce_and_nothing_is_lost(tmp_path):
    started = time.monotonic()
    config = tmp_path / "danube_broker.yml"
    config.write_text(CONFIG)
    with local_cluster(
        str(tmp_path / "c"), brokers=3, lease_ttl=6, storage="shared_fs", config=str(config), metrics=True
    ) as cluster:
        leader = cluster.wait_ready()
        for p in cluster.procs:  # the file reached every broker (with the storage of --storage)
            assert "--config" in p.cmd and "--cluster" in p.cmd
        asyncio.run(scenario(cluster, leader))
    print(f"rebalancing cluster test: {time.monotonic() - started:.1f} s in all")


async def scenario(cluster, leader: str) -> None:
    client = (
        DanubeClient.builder()
        .service_url(cluster.procs[0].url)
        .with_health_check_interval(1.0)
        .with_retry(initial_backoff_s=0.05, max_backoff_s=0.5, give_up_after_s=60)
        .build()
    )
    producers = [client.new_producer().with_topic(t).with_name(f"p{i}").build() for i, t in enumerate(TOPICS)]
    await asyncio.gather(*(p.create() for p in producers))
    consumers = [
        client.new_consumer()
        .with_topic(t)
        .with_consumer_name(f"c{i}")
        .with_subscription("s")
        .with_subscription_type(SubType.Exclusive)
        .with_reliable(True)
        .build()
        for i, t in enumerate(TOPICS)
    ]
    await asyncio.gather(*(c.subscribe() for c in consumers))
    sent: list[list[asyncio.Future]] = [[] for _ in TOPICS]
    received: list[dict[int, bytes]] = [{} for _ in TOPICS]
    stop = asyncio.Event()

    async def publish(i: int) -> None:
        await asyncio.sleep(i * SEND_INTERVAL_S / len(TOPICS))
        while not stop.is_set():
            sent[i].append(await producers[i].send(f"{i}:{len(sent[i])}".encode()))
            await asyncio.sleep(SEND_INTERVAL_S)
        await producers[i].flush()

    async def consume(i: int) -> None:
        async for m in consumers[i]:
            previous = received[i].setdefault(m.offset, m.payload)
            assert previous == m.payload, (TOPICS[i], m.offset)
            await consumers[i].ack(m)

    publishers = [asyncio.ensure_future(publish(i)) for i in range(len(TOPICS))]
    readers = [asyncio.ensure_future(consume(i)) for i in range(len(TOPICS))]
    try:
        await asyncio.sleep(2.0)
        before = await asyncio.to_thread(state, cluster)
        initial = collections.Counter(before["assignments"][t] for t in TOPICS)
        assert sorted(initial) == ["broker-1", "broker-2", "broker-3"], initial
        joined = time.monotonic()
        # 2 brokers join: `danube broker --cluster --etcd URL --config FILE`, the same file
        new = [cluster.add_broker(4), cluster.add_broker(5)]
        await asyncio.gather(*(asyncio.to_thread(p.start) for p in new))
        brokers = [p.broker_id for p in cluster.procs]

        def balanced():
            s = state(cluster)
            counts = collections.Counter(s["assignments"][t] for t in TOPICS if t in s["assignments"])
            if sum(counts.values()) != len(TOPICS) or s["unassigned"]:
                return None  # a move is under way
            if all(counts[p.broker_id] for p in new) and counts_cv(counts, brokers) < TARGET:
                return counts
            return None

        counts = await async_wait_until(
            balanced, 75, "CV under the threshold with the new brokers owning topics", 0.3, in_thread=True
        )
        print(f"balanced {time.monotonic() - joined:.1f} s after the brokers joined: {dict(counts)}")
        await asyncio.sleep(1.5)  # a few more messages on the topics where they are now
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*publishers, return_exceptions=True), 60)

    try:
        offsets = [[await f for f in futures] for futures in sent]
        for i, topic_offsets in enumerate(offsets):  # acknowledged offsets 0..N-1 across every move
            assert topic_offsets == list(range(len(topic_offsets))), (TOPICS[i], topic_offsets)
            assert topic_offsets, TOPICS[i]

        def everything_read():
            return all(len(received[i]) >= len(sent[i]) for i in range(len(TOPICS)))

        await async_wait_until(everything_read, 30, "every topic read to its end", 0.3, in_thread=True)
        for i in range(len(TOPICS)):  # nothing lost, no offset gap, each message where it was acked
            assert sorted(received[i]) == list(range(len(sent[i]))), TOPICS[i]
            assert all(received[i][o] == f"{i}:{o}".encode() for o in received[i]), TOPICS[i]
    finally:
        for r in readers:
            r.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        await asyncio.gather(*(p.close() for p in producers), *(c.close() for c in consumers), return_exceptions=True)
        await client.close()

    # the history shows every move: each assignment after a topic's first one is a recorded move,
    # in order, from the broker that held it to the one that got it
    records = await history(cluster.etcd.url)
    puts = await assignment_puts(cluster.etcd.url)
    final = (await asyncio.to_thread(state, cluster))["assignments"]
    assert await asyncio.to_thread(cluster.wait_ready) == leader  # one leader all along: it counted everything
    by_topic = collections.defaultdict(list)
    for topic, broker in puts:
        by_topic[topic].append(broker)
    moved = [r for r in records if r.outcome == "moved"]
    assert moved and len(moved) == len(records), records
    for topic in TOPICS:
        owners = by_topic[topic]
        assert owners[-1] == final[topic]
        hops = [(r.from_broker, r.to_broker) for r in moved if r.topic == topic]
        assert hops == list(zip(owners, owners[1:])), (topic, owners, hops)
    assert {r.to_broker for r in moved} >= {"broker-4", "broker-5"}
    print(f"{len(moved)} moves; {sum(map(len, sent))} messages over {len(TOPICS)} topics, all read")
    assert all(r.reason == "LoadImbalance" and r.strategy == "fair" for r in moved)

    # the leader's metrics port shows them too
    leader_proc = next(p for p in cluster.procs if p.broker_id == leader)

    def settled():
        m = scrape(leader_proc.metrics_url)
        return m if m.get("danube_cluster_active_brokers") == 5 else None

    metrics = await async_wait_until(settled, 10, "the leader's gauges over 5 brokers", 0.3, in_thread=True)
    assert metrics["danube_rebalancing_moves_total"] == len(moved)
    assert metrics["danube_rebalancing_failures_total"] == 0
    assert metrics["danube_rebalancing_checks_total"] >= len(moved)
    assert metrics["danube_rebalancing_cycle_duration_seconds_count"] >= len(moved)
    assert metrics["danube_cluster_balance_cv"] < THRESHOLD
    assert (
        metrics["danube_cluster_balance_max_load"]
        >= metrics["danube_cluster_balance_mean_load"]
        >= metrics["danube_cluster_balance_min_load"]
        > 0
    )
    assert "danube_cluster_balance_std_dev" in metrics
    placed = collections.Counter(broker for _, broker in puts)
    unassigned = collections.Counter(r.from_broker for r in moved)
    for b in (p.broker_id for p in cluster.procs):
        assign = metrics.get(f'danube_topic_assignments_total{{action="assign",broker_id="{b}"}}', 0)
        unassign = metrics.get(f'danube_topic_assignments_total{{action="unassign",broker_id="{b}"}}', 0)
        assert (assign, unassign) == (placed[b], unassigned[b]), b
        assert metrics[f'danube_broker_topics_owned{{broker_id="{b}"}}'] >= (1 if b != leader else 0)
        for gauge in ("danube_broker_cpu_usage", "danube_broker_memory_usage", "danube_broker_throughput_mbps"):
            assert f'{gauge}{{broker_id="{b}"}}' in metrics, (gauge, b)
    # a follower exports its own count, labelled, next to the (unset) cluster families
    follower = scrape(cluster.procs[-1].metrics_url)
    assert follower['danube_broker_topics_owned{broker_id="broker-5"}'] >= 1
    assert not [k for k in follower if re.match(r'danube_broker_topics_owned\{broker_id="broker-[1-4]"', k)]
