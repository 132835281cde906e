"""Leader failover while topics are being assigned: 3 brokers on a real etcd, ~200 new topics
looked up concurrently through all three brokers, the leader killed (SIGKILL) in the middle of it, the
lookups go on.  Afterwards every topic has exactly one assignment key in etcd, on a live broker, no
marker is left in /cluster/unassigned, every live broker's lookup names the same owner, and producing
to a sample of the topics on their owner works."""

from __future__ import annotations

import asyncio
import collections
import random
import time

import grpc
import pytest

from danube.metadata.etcd import EtcdMetadataStore
from danube.proto.danube import DanubeApi_pb2 as pb
from danube.proto.danube import DanubeApi_pb2_grpc as pb_grpc
from tests.support.cluster import local_cluster, lookup, owners_seen_by_each_broker, state
from tests.support.etcd import requires_etcd

pytestmark = [requires_etcd, pytest.mark.timeout(120)]

TOPICS = [f"/default/assigning-{i}" for i in range(200)]
CONCURRENCY = 16
KILL_AFTER = 60  # lookups answered before the leader is killed


async def _etcd_keys(etcd_url: str) -> tuple[dict[str, list[str]], list[str]]:
    """(topic → every broker holding an assignment key for it, topics with an unassigned marker), read
    straight from etcd (not through read_state, whose dict would hide a second assignment)."""
    store = EtcdMetadataStore(etcd_url, retry_timeout=5)
    try:
        assigned = await store.get_prefix("/cluster/brokers/")
        markers = await store.get_prefix("/cluster/unassigned/")
    finally:
        await store.close()
    holders: dict[str, list[str]] = collections.defaultdict(list)
    for kv in assigned:
        parts = kv.key.split("/")  # "", cluster, brokers, id, ns, topic
        if len(parts) == 6:
            holders[f"/{parts[4]}/{parts[5]}"].append(parts[3])
    unassigned = [f"/{p[3]}/{p[4]}" for p in (kv.key.split("/") for kv in markers) if len(p) == 5]
    return dict(holders), unassigned


class Driver:
    """Looks every topic up once successfully, starting at broker ``i % 3`` and moving on to the next
    live broker after an error, a ``failed`` answer or an owner that is dead."""

    def __init__(self, cluster, dead_urls: set[str]) -> None:
        self.cluster = cluster
        self.dead_urls = dead_urls
        self.answered: dict[str, str] = {}
        self.retries = collections.Counter()
        self.done = 0

    async def one(self, index: int, topic: str, deadline: float) -> None:
        urls = [p.url for p in self.cluster.procs]
        attempt = 0
        while True:
            url = urls[(index + attempt) % len(urls)]
            attempt += 1
            if url in self.dead_urls:
                continue
            try:
                kind, owner = await lookup(url, topic, timeout=12)
            except grpc.aio.AioRpcError as exc:
                kind, owner = f"error {exc.code().name}", ""
            if kind in ("connect", "redirect") and owner not in self.dead_urls:
                self.answered[topic] = owner
                self.done += 1
                return
            self.retries[kind if kind != "redirect" else "redirect to the dead broker"] += 1
            assert time.monotonic() < deadline, f"{topic}: no live owner found; last answer {kind} {owner}"
            await asyncio.sleep(0.05)

    async def run(self, deadline: float) -> None:
        gate = asyncio.Semaphore(CONCURRENCY)

        async def guarded(i, topic):
            async with gate:
                await self.one(i, topic, deadline)

        await asyncio.gather(*(guarded(i, t) for i, t in enumerate(TOPICS)))


def test_leader_failover_while_topics_are_being_assigned(tmp_path):
    started = time.monotonic()
    with local_cluster(str(tmp_path / "assigning"), lease_ttl=3) as cluster:
        leader_id = state(cluster)["leader"]
        leader = next(p for p in cluster.procs if p.broker_id == leader_id)
        dead_urls: set[str] = set()
        driver = Driver(cluster, dead_urls)

        async def scenario():
            run = asyncio.ensure_future(driver.run(time.monotonic() + 30))
            while driver.done < KILL_AFTER:
                assert not run.done(), run.exception() if run.done() else None
                await asyncio.sleep(0.01)
            in_flight = len(TOPICS) - driver.done
            await asyncio.to_thread(leader.kill)  # SIGKILL: its lease has to expire
            dead_urls.add(leader.url)
            await run
            return in_flight

        in_flight = asyncio.run(scenario())
        assert in_flight > 100, "the leader died while most topics were still to be assigned"
        live = {p.broker_id: p for p in cluster.procs if p.alive()}
        assert len(live) == 2

        # etcd settles: every topic exactly once, on a live broker, no marker left (bounded wait: the
        # new leader may still be moving the dead broker's last assignments)
        deadline = time.monotonic() + 20
        while True:
            holders, unassigned = asyncio.run(_etcd_keys(cluster.etcd.url))
            problems = {t: holders.get(t) for t in TOPICS if len(holders.get(t, [])) != 1 or holders[t][0] not in live}
            stale = sorted(set(unassigned) & set(TOPICS))
            if not problems and not stale:
                break
            assert time.monotonic() < deadline, (
                f"{len(problems)} topic(s) not assigned exactly once to a live "
                f"broker: {dict(list(problems.items())[:5])}; markers left: "
                f"{stale[:5]}"
            )
            time.sleep(0.2)
        owner_of = {t: holders[t][0] for t in TOPICS}
        s = state(cluster)
        assert s["leader"] in live and leader_id not in s["registered"]
        # nothing else was assigned twice either, and nothing is left in /cluster/unassigned at all
        assert all(len(b) == 1 for b in holders.values()), {t: b for t, b in holders.items() if len(b) > 1}
        assert not unassigned, unassigned
        counts = collections.Counter(owner_of.values())
        assert set(counts) == set(live), counts  # both survivors got topics

        # every live broker's lookup names that owner
        seen = asyncio.run(owners_seen_by_each_broker(cluster, TOPICS))
        for topic, answers in seen.items():
            assert answers == [live[owner_of[topic]].url] * len(live), (topic, answers, owner_of[topic])

        # producing to a sample works on the owner
        for topic in random.Random(16).sample(TOPICS, 12):
            owner = live[owner_of[topic]]
            with grpc.insecure_channel(owner.url.split("//")[1]) as ch:
                producers = pb_grpc.ProducerServiceStub(ch)
                p = producers.CreateProducer(
                    pb.ProducerRequest(producer_name="p", topic_name=topic, dispatch_strategy=pb.Reliable), timeout=30
                )
                for i in range(3):
                    reply = producers.SendMessage(
                        pb.StreamMessage(
                            request_id=i,
                            msg_id=pb.MsgID(producer_id=p.producer_id, topic_name=topic),
                            payload=b"after failover %d" % i,
                            publish_time=1,
                            producer_name="p",
                        ),
                        timeout=30,
                    )
                    assert reply.request_id == i
        for p in live.values():
            assert "Traceback" not in p.log(), p.log()[-3000:]
        print(
            f"leader {leader_id} killed with {in_flight} of {len(TOPICS)} lookups to go; retries "
            f"{dict(driver.retries)}; placement {dict(counts)}; {time.monotonic() - started:.1f} s"
        )
