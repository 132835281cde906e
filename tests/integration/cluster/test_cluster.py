"""Cluster mode end to end: a real etcd and 3 broker subprocesses on loopback (tests/support/cluster.py)."""

from __future__ import annotations

import asyncio
import collections
import json
import subprocess
import sys
import time

import grpc
import pytest

from danube.proto.danube import DanubeApi_pb2 as pb
from danube.proto.danube import DanubeApi_pb2_grpc as pb_grpc
from danube.proto.danube_batch import batch_pb2 as batch_pb
from danube.proto.danube_batch import batch_pb2_grpc as batch_grpc
from tests.support.cluster import local_cluster, lookup, owners_seen_by_each_broker, state, wait_until
from tests.support.etcd import requires_etcd

pytestmark = [requires_etcd, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with local_cluster(str(tmp_path_factory.mktemp("cluster"))) as c:
        yield c


def test_fair_placement_of_30_topics_and_every_broker_agrees(cluster):
    topics = [f"/default/fair-{i}" for i in range(30)]
    seen = asyncio.run(owners_seen_by_each_broker(cluster, topics))
    for topic, answers in seen.items():
        assert len(set(answers)) == 1, (topic, answers)
    counts = collections.Counter(answers[0] for answers in seen.values())
    assert set(counts) == {p.url for p in cluster.procs}
    assert max(counts.values()) - min(counts.values()) <= 1, counts
    assignments = state(cluster)["assignments"]
    assert all(t in assignments for t in topics)
    wait_until(lambda: not state(cluster)["unassigned"], 10, "no marker left")


def test_lookup_answers_connect_on_the_owner_and_redirect_elsewhere(cluster):
    topic = "/default/kinds"
    answers = [asyncio.run(lookup(p.url, topic)) for p in cluster.procs]
    owner = answers[0][1]
    for p, (kind, url) in zip(cluster.procs, answers):
        assert url == owner
        assert kind == ("connect" if p.url == owner else "redirect")


def test_producer_on_the_owner_works_and_elsewhere_is_unavailable(cluster):
    topic = "/default/produced"
    _, owner = asyncio.run(lookup(cluster.procs[0].url, topic))
    other = next(p.url for p in cluster.procs if p.url != owner)
    with grpc.insecure_channel(other.split("//")[1]) as ch:
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.ProducerServiceStub(ch).CreateProducer(
                pb.ProducerRequest(producer_name="p", topic_name=topic, dispatch_strategy=pb.Reliable), timeout=30
            )
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert ("x-danube-broker-url", owner) in tuple(info.value.trailing_metadata())
        # the batch lane: the same answer, the owner in the trailing metadata
        with pytest.raises(grpc.RpcError) as info:
            batch_grpc.BatchLaneStub(ch).CreateProducer(
                batch_pb.ProducerSpec(topic=topic, producer_name="bp", reliable=True), timeout=30
            )
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert ("x-danube-broker-url", owner) in tuple(info.value.trailing_metadata())
    with grpc.insecure_channel(owner.split("//")[1]) as ch:
        producers = pb_grpc.ProducerServiceStub(ch)
        p = producers.CreateProducer(
            pb.ProducerRequest(producer_name="p", topic_name=topic, dispatch_strategy=pb.Reliable), timeout=30
        )
        sent = pb.StreamMessage(
            request_id=7,
            msg_id=pb.MsgID(producer_id=p.producer_id, topic_name=topic),
            payload=b"hello cluster",
            publish_time=1,
            producer_name="p",
        )
        assert producers.SendMessage(sent, timeout=30).request_id == 7


def test_etcd_restart_brokers_reconnect_and_nothing_is_reassigned(cluster):
    topics = [f"/default/restart-{i}" for i in range(9)]
    asyncio.run(owners_seen_by_each_broker(cluster, topics))
    before = state(cluster)
    cluster.etcd.restart()
    time.sleep(2 * cluster.lease_ttl)  # longer than a lease: a broker that lost its lease would show it
    after = state(cluster)
    assert set(after["registered"]) == {p.broker_id for p in cluster.procs}
    assert after["assignments"] == before["assignments"]
    assert not after["unassigned"]
    # registrations kept their leases (nobody re-registered), and placement still works
    for b, info in before["registered"].items():
        assert after["registered"][b]["registered_at"] == info["registered_at"]
    seen = asyncio.run(owners_seen_by_each_broker(cluster, ["/default/after-restart"]))
    assert len(set(seen["/default/after-restart"])) == 1
    for p in cluster.procs:
        assert "lost its cluster lease" not in p.log()


def test_leader_failover_reassigns_the_dead_brokers_topics(tmp_path):
    with local_cluster(str(tmp_path / "failover")) as cluster:
        topics = [f"/default/fo-{i}" for i in range(12)]
        asyncio.run(owners_seen_by_each_broker(cluster, topics))
        first = state(cluster)
        leader = first["leader"]
        dead = next(p for p in cluster.procs if p.broker_id == leader)
        dead_topics = {t for t, b in first["assignments"].items() if b == leader}
        assert dead_topics
        dead.kill()  # SIGKILL: no goodbye, the lease has to expire

        def new_leader():
            s = state(cluster)
            return s if s["leader"] not in (None, leader) and leader not in s["registered"] else None

        s = wait_until(new_leader, 20, "a new leader")
        s = wait_until(
            lambda: (
                lambda st: (
                    st if all(t in st["assignments"] and st["assignments"][t] != leader for t in dead_topics) else None
                )
            )(state(cluster)),
            20,
            "dead broker's topics reassigned",
        )
        survivors = {p.broker_id for p in cluster.procs if p.alive()}
        assert set(s["assignments"].values()) <= survivors
        for t in set(first["assignments"]) - dead_topics:
            assert s["assignments"][t] == first["assignments"][t]  # the others did not move
        seen = asyncio.run(owners_seen_by_each_broker(cluster, sorted(dead_topics)))
        assert all(len(set(answers)) == 1 and answers[0] != dead.url for answers in seen.values())
        # a follower dies too: the (new) leader moves its topics to the last broker
        new_leader_id = state(cluster)["leader"]
        follower = next(p for p in cluster.procs if p.alive() and p.broker_id != new_leader_id)
        follower.kill()
        wait_until(
            lambda: (
                set(state(cluster)["assignments"].values()) == {new_leader_id}
                and len(state(cluster)["assignments"]) == len(topics)
            ),
            20,
            "all topics on the last broker",
        )


def _admin_unload(admin_url: str, topic: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "danube.cli.main", "admin", "--endpoint", admin_url, "topics", "unload", topic],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _send(url: str, topic: str, payloads) -> None:
    with grpc.insecure_channel(url.split("//")[1]) as ch:
        producers = pb_grpc.ProducerServiceStub(ch)
        p = producers.CreateProducer(
            pb.ProducerRequest(producer_name="p", topic_name=topic, dispatch_strategy=pb.Reliable), timeout=30
        )
        for i, payload in enumerate(payloads):
            producers.SendMessage(
                pb.StreamMessage(
                    request_id=i,
                    msg_id=pb.MsgID(producer_id=p.producer_id, topic_name=topic),
                    payload=payload,
                    publish_time=1,
                    producer_name="p",
                ),
                timeout=30,
            )


def _receive(url: str, topic: str, count: int) -> list[tuple[int, bytes]]:
    """Subscribe (subscription "s"), take ``count`` messages and ack them."""
    got = []
    with grpc.insecure_channel(url.split("//")[1]) as ch:
        consumers = pb_grpc.ConsumerServiceStub(ch)
        c = consumers.Subscribe(pb.ConsumerRequest(topic_name=topic, consumer_name="c", subscription="s"), timeout=30)
        stream = consumers.ReceiveMessages(pb.ReceiveRequest(consumer_id=c.consumer_id), timeout=30)
        for msg in stream:
            got.append((msg.msg_id.topic_offset, msg.payload))
            consumers.Ack(
                pb.AckRequest(request_id=msg.request_id, msg_id=msg.msg_id, subscription_name="s"), timeout=30
            )
            if len(got) == count:
                break
        stream.cancel()
    return got


def test_admin_unload_moves_a_topic_and_offsets_continue(tmp_path):
    topic = "/default/moving"
    with local_cluster(str(tmp_path / "moves"), storage="shared_fs") as cluster:
        _, first_owner = asyncio.run(lookup(cluster.procs[0].url, topic))
        source = next(p for p in cluster.procs if p.url == first_owner)
        _send(source.url, topic, [])  # the producer creates the topic
        with grpc.insecure_channel(source.url.split("//")[1]) as ch:  # the subscription exists before data
            pb_grpc.ConsumerServiceStub(ch).Subscribe(
                pb.ConsumerRequest(topic_name=topic, consumer_name="c", subscription="s"), timeout=30
            )
        _send(source.url, topic, [b"m0", b"m1", b"m2"])
        assert [o for o, _ in _receive(source.url, topic, 3)] == [0, 1, 2]
        # sent to a broker that does not own the topic: forwarded to the owner
        elsewhere = next(p for p in cluster.procs if p is not source)
        done = _admin_unload(elsewhere.admin_url, topic)
        assert done.returncode == 0, done.stderr

        # the leader places it on another broker (the source is excluded); every broker agrees
        def moved():
            answers = asyncio.run(owners_seen_by_each_broker(cluster, [topic]))[topic]
            return answers if len(set(answers)) == 1 and answers[0] != source.url else None

        new_owner = wait_until(moved, 20, "topic moved")[0]
        s = state(cluster)
        assert s["assignments"][topic] != source.broker_id and not s["unassigned"]
        _send(new_owner, topic, [b"m3"])
        assert _receive(new_owner, topic, 1) == [(3, b"m3")]  # resumes at last + 1, cursor kept
        # a graceful stop (SIGTERM) hands the topic over sealed: offsets go on at the next owner
        leaving = next(p for p in cluster.procs if p.url == new_owner)
        assert leaving.stop() == 0
        assert "handed 1 topic(s) over" in leaving.log()

        def moved_again():
            answers = asyncio.run(owners_seen_by_each_broker(cluster, [topic]))[topic]
            return answers if len(set(answers)) == 1 and answers[0] != new_owner else None

        third_owner = wait_until(moved_again, 20, "topic handed over at shutdown")[0]
        _send(third_owner, topic, [b"m4"])
        assert _receive(third_owner, topic, 1) == [(4, b"m4")]
        # a rebalance move as the rebalancer writes it (marker with to_broker + delete of the source
        # assignment, one transaction): the owner seals and confirms, then the leader places it
        holder = next(p for p in cluster.procs if p.url == third_owner)
        target = next(p for p in cluster.procs if p.alive() and p is not holder)
        asyncio.run(_rebalance(cluster.etcd.url, topic, holder.broker_id, target.broker_id))

        def rebalanced():
            answers = asyncio.run(owners_seen_by_each_broker(cluster, [topic]))[topic]
            return answers if set(answers) == {target.url} else None

        wait_until(rebalanced, 20, "topic rebalanced")
        _send(target.url, topic, [b"m5"])
        assert _receive(target.url, topic, 1) == [(5, b"m5")]
        assert f"topic {topic} handed over by broker {holder.broker_id} (rebalance" in holder.log()


async def _rebalance(etcd_url: str, topic: str, source: str, target: str) -> None:
    from danube.metadata import keys
    from danube.metadata.etcd import EtcdMetadataStore
    from danube.metadata.store import Op

    store = EtcdMetadataStore(etcd_url)
    try:
        marker = {"reason": "rebalance", "from_broker": source, "to_broker": target, "timestamp": int(time.time())}
        result = await store.txn(
            [], [Op.put_json(keys.unassigned(topic), marker), Op.delete(keys.broker_topic(source, topic))]
        )
        assert result.succeeded
    finally:
        await store.close()


def test_a_broker_that_cannot_renew_its_lease_stops_publishes_before_it_expires(tmp_path):
    """etcd frozen (SIGSTOP): the owner fences itself within 2/3 of its lease, before the lease can
    expire; etcd back (SIGCONT): the same lease is renewed, publishes resume, nothing was reassigned."""
    import os
    import signal

    topic = "/default/fenced"
    with local_cluster(str(tmp_path / "fence"), lease_ttl=6) as cluster:
        _, owner = asyncio.run(lookup(cluster.procs[0].url, topic))
        before = state(cluster)
        with grpc.insecure_channel(owner.split("//")[1]) as ch:
            producers = pb_grpc.ProducerServiceStub(ch)
            p = producers.CreateProducer(
                pb.ProducerRequest(producer_name="p", topic_name=topic, dispatch_strategy=pb.Reliable), timeout=30
            )

            def send(i):
                try:
                    producers.SendMessage(
                        pb.StreamMessage(
                            request_id=i,
                            msg_id=pb.MsgID(producer_id=p.producer_id, topic_name=topic),
                            payload=b"x",
                            publish_time=1,
                            producer_name="p",
                        ),
                        timeout=10,
                    )
                    return "ok"
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE and "fenced" in exc.details(), exc
                    return "fenced"

            assert send(0) == "ok"
            os.kill(cluster.etcd.pid, signal.SIGSTOP)
            stopped = time.monotonic()
            try:
                i = 1
                while send(i) == "ok":
                    i += 1
                    assert time.monotonic() - stopped < 6, "still accepting publishes when the lease could expire"
                    time.sleep(0.05)
                fenced_after = time.monotonic() - stopped
            finally:
                os.kill(cluster.etcd.pid, signal.SIGCONT)
            # fenced 2/3 of the lease after the last renewal that got through (at most one
            # keepalive interval, 2 s, before the SIGSTOP): well inside the 6 s lease
            assert fenced_after < 6 * 2 / 3 + 1.0
            wait_until(lambda: send(1000) == "ok", 15, "publishes accepted again")
        after = state(cluster)
        assert after["assignments"] == before["assignments"] and after["leader"] == before["leader"]
        assert {b: i["registered_at"] for b, i in after["registered"].items()} == {
            b: i["registered_at"] for b, i in before["registered"].items()
        }


def test_admin_balance_is_answered_by_the_clusters_rebalancer(cluster):
    asyncio.run(owners_seen_by_each_broker(cluster, [f"/default/bal-{i}" for i in range(6)]))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "danube.cli.main",
            "admin",
            "--endpoint",
            cluster.procs[0].admin_url,
            "--output",
            "json",
            "brokers",
            "balance",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    balance = json.loads(done.stdout)
    assert balance["strategy"] == "fair" and balance["std_deviation"] >= 0


def test_admin_lists_the_clusters_brokers_and_leader(cluster):
    def admin(*args):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "danube.cli.main",
                "admin",
                "--endpoint",
                cluster.procs[1].admin_url,
                "--output",
                "json",
                "brokers",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    leader = state(cluster)["leader"]
    brokers = admin("list")
    assert sorted(b["broker_id"] for b in brokers) == sorted(p.broker_id for p in cluster.procs)
    assert [b["broker_id"] for b in brokers if b["broker_role"] == "Cluster_Leader"] == [leader]
    assert {b["broker_addr"] for b in brokers} == {p.url for p in cluster.procs}
    assert leader in json.dumps(admin("leader-broker"))


def test_drain_a_broker_through_another_brokers_admin_port_then_activate_it(cluster):
    """danube admin brokers unload: every topic of the broker moves away, it gets nothing new until
    danube admin brokers activate.  Sent to another broker's admin port, which forwards it."""
    asyncio.run(owners_seen_by_each_broker(cluster, [f"/default/drain-{i}" for i in range(6)]))
    drained = cluster.procs[2]
    had = [t for t, b in state(cluster)["assignments"].items() if b == drained.broker_id]
    assert had

    def admin(*args):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "danube.cli.main",
                "admin",
                "--endpoint",
                cluster.procs[0].admin_url,
                "--output",
                "json",
                "brokers",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert admin("unload", drained.broker_id, "--dry-run")["total"] == len(had)
    result = admin("unload", drained.broker_id)
    assert (result["total"], result["succeeded"], result["failed"]) == (len(had), len(had), 0)
    s = wait_until(
        lambda: (lambda st: st if not st["unassigned"] and all(t in st["assignments"] for t in had) else None)(
            state(cluster)
        ),
        20,
        "drained topics placed elsewhere",
    )
    assert drained.broker_id not in s["assignments"].values()
    brokers = {b["broker_id"]: b for b in admin("list")}
    assert brokers[drained.broker_id]["broker_status"] == "drained"
    new = [f"/default/after-drain-{i}" for i in range(6)]
    seen = asyncio.run(owners_seen_by_each_broker(cluster, new))
    assert drained.url not in {answers[0] for answers in seen.values()}
    admin("activate", drained.broker_id)
    wait_until(
        lambda: {b["broker_id"]: b for b in admin("list")}[drained.broker_id]["broker_status"] == "active",
        10,
        "broker active again",
    )
    seen = asyncio.run(owners_seen_by_each_broker(cluster, ["/default/after-activate"]))
    assert seen["/default/after-activate"][0] == drained.url  # the least loaded again under fair
