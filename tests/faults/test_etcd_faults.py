"""etcd faults under danube-client 0.5.0 (default options) and ``danube.client``: etcd killed and
restarted within the lease ttl, and etcd away for longer than the ttl.  The brokers refuse writes
while they cannot renew their lease (they cannot know whether another broker took their topics),
saying so; the client's sends are held (by the broker the official client came through; by
``danube.client``'s own retries) and complete once etcd is back.  Past the ttl the brokers release
their topics' WALs but keep them readable: consumers go on receiving what was stored.  Nothing
reaches the application, nothing acked is lost, offsets stay continuous."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time

import grpc
import pytest

from danube.proto.danube import DanubeApi_pb2 as pb
from danube.proto.danube import DanubeApi_pb2_grpc as pb_grpc
from tests.faults.support import (
    TTL,
    apply_fault,
    owner_and_entry,
    run_danube_client,
    run_official_client,
    shared_config,
)
from tests.support.cluster import local_cluster
from tests.support.etcd import requires_etcd
from tests.support.waiting import wait_until

pytestmark = [requires_etcd, pytest.mark.timeout(240)]

REFUSAL = (
    r"broker \S+ cannot reach the metadata store \(etcd\) for \d+ s .*: writes to {topic} are refused until it is back"
)


@pytest.mark.parametrize("fault", ["etcd_restart", "etcd_down"])
def test_official_client_rides_through_etcd_faults(tmp_path, fault):
    base = str(tmp_path)
    topic = f"/default/fault-{fault}"
    with local_cluster(base, config=shared_config(base), lease_ttl=TTL) as cluster:
        victim, entry = owner_and_entry(cluster, topic)
        outcome = run_official_client(
            base, entry.url, topic, lambda: apply_fault(fault, cluster, topic, entry, victim), after_s=TTL + 3
        )
        figures = outcome.check()
        print(f"{fault}: {figures}")
        assert all(p.alive() for p in cluster.procs)


def _readable_config(base: str) -> str:
    """The fault clusters' storage, and a window of 10 delivered-but-unacked messages per
    subscription: a consumer that holds back leaves the rest of the topic in the broker's storage."""
    path = shared_config(base)
    with open(path, "a") as f:
        f.write("dispatch:\n  max_unacked_messages: 10\n")
    return path


def _probe_refusals(owner_url: str, topic: str) -> list[tuple[grpc.StatusCode, str]]:
    """Danube's protocol straight to the owner while it is cut off: a publish of the application's
    producer (its id comes back without etcd), a producer on a topic the owner does not serve and a
    new subscription on the topic."""
    ch = grpc.insecure_channel(owner_url.split("//")[1])
    stub = pb_grpc.ProducerServiceStub(ch)
    found = []
    try:
        pid = stub.CreateProducer(
            pb.ProducerRequest(producer_name="fp", topic_name=topic, dispatch_strategy=pb.Reliable), timeout=10
        ).producer_id
        calls = [
            lambda: stub.SendMessage(
                pb.StreamMessage(
                    request_id=1,
                    msg_id=pb.MsgID(producer_id=pid, topic_name=topic),
                    payload=b"probe",
                    publish_time=1,
                    producer_name="fp",
                ),
                timeout=10,
            ),
            lambda: stub.CreateProducer(
                pb.ProducerRequest(producer_name="np", topic_name=topic + "-new", dispatch_strategy=pb.Reliable),
                timeout=10,
            ),
            lambda: pb_grpc.ConsumerServiceStub(ch).Subscribe(
                pb.ConsumerRequest(topic_name=topic, consumer_name="nc", subscription="new-sub"), timeout=10
            ),
        ]
        for call in calls:
            try:
                call()
                found.append((grpc.StatusCode.OK, "accepted"))
            except grpc.RpcError as exc:
                found.append((exc.code(), exc.details()))
    finally:
        ch.close()
    return found


class _DanubeClientProbe(threading.Thread):
    """A ``danube.client`` producer on the topic without a retry budget, created while etcd is up
    (``early``) or once told to go; then it sends one message.  ``result``: what reached the
    application (the broker's refusal, if all is well)."""

    def __init__(self, entry_url: str, topic: str, *, early: bool) -> None:
        super().__init__(daemon=True)
        self.entry_url, self.topic, self.early = entry_url, topic, early
        self.created, self.go = threading.Event(), threading.Event()
        self.result = "not run"

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        from danube.client import DanubeClient

        client = (
            DanubeClient.builder().service_url(self.entry_url).with_retry(max_attempts=1, give_up_after_s=5).build()
        )
        try:
            producer = client.new_producer().with_topic(self.topic).with_name("probe").with_reliable().build()
            if self.early:
                await producer.create()
            self.created.set()
            await asyncio.to_thread(self.go.wait, 60)
            try:
                if not self.early:
                    await asyncio.wait_for(producer.create(), 30)
                await asyncio.wait_for(producer.send_and_wait(b"probe"), 30)
                self.result = "accepted"
            except Exception as exc:  # noqa: BLE001 - what reached the application
                self.result = f"{type(exc).__name__}: {exc}"
        finally:
            try:
                await asyncio.wait_for(client.close(), 10)
            except Exception:  # noqa: BLE001 - the broker may still be cut off
                pass


def _whole_log(proc) -> str:
    with open(proc.log_path, encoding="utf-8", errors="replace") as f:
        return f.read()


@pytest.mark.parametrize("client", ["official", "danube_client"])
def test_etcd_down_past_the_ttl_keeps_topics_readable_and_writes_resume(tmp_path, client):
    """The consumer holds back (no acks) while the producer runs, so most of what was acked stays in
    the owner's storage; etcd goes away; once the owner is past the ttl (its WAL released, its topics
    read-only) the consumer takes messages again and must get every message acked before etcd went
    away while etcd is still down; a publish there is refused saying why; once etcd is back the sends
    complete and nothing is lost."""
    base = str(tmp_path)
    topic = f"/default/readable-{client}"
    hold_file = os.path.join(base, "hold")
    hold = threading.Event()
    marks: dict[str, float] = {}
    probes: list = []
    with local_cluster(base, config=_readable_config(base), lease_ttl=TTL) as cluster:
        victim, entry = owner_and_entry(cluster, topic)

        probes_dc = (
            [_DanubeClientProbe(entry.url, topic, early=early) for early in (True, False)]
            if client == "danube_client"
            else []
        )

        def fault():
            for probe in probes_dc:
                probe.start()
                assert probe.created.wait(30), probe.result
            marks["down"] = time.time()
            cluster.etcd.kill()
            try:
                wait_until(
                    lambda: "one lease ttl after its last renewal" in victim.log(), TTL + 10, "the owner past the ttl"
                )
                marks["read_only"] = time.time()
                os.unlink(hold_file)
                hold.clear()
                probes.extend(_probe_refusals(victim.url, topic))
                for probe in probes_dc:
                    probe.go.set()
                for probe in probes_dc:
                    probe.join(40)
                time.sleep(max(0.0, marks["read_only"] + 3.0 - time.time()))
            finally:
                marks["back"] = time.time()
                cluster.etcd.start()

        open(hold_file, "w").close()
        hold.set()
        if client == "official":
            outcome = run_official_client(
                base, entry.url, topic, fault, before_s=1.5, after_s=TTL, hold_file=hold_file, delay_ms=20
            )
        else:
            outcome = run_danube_client(entry.url, topic, fault, before_s=1.5, after_s=TTL, delay_s=0.02, hold=hold)
        figures = outcome.check()
        # what reached the consumer while the owner was read-only and etcd away
        during = {
            p for (_, p), t in zip(outcome.received, outcome.received_at) if marks["read_only"] <= t < marks["back"]
        }
        before = {f"p-{i}" for i, _, end in outcome.acked if end < marks["down"]}
        figures.update(
            acked_before=len(before),
            received_during=len(during),
            outage_s=round(marks["back"] - marks["down"], 1),
            read_only_after_s=round(marks["read_only"] - marks["down"], 1),
        )
        print(f"{client}: {figures}")
        print(f"refusals: {probes} {[p.result for p in probes_dc]}")
        assert len(before) > 20, figures  # more than the unacked window: most were read from storage
        assert before <= during, (
            f"acked before etcd went away, not delivered while it was: {sorted(before - during)[:10]}"
        )
        assert [code for code, _ in probes] == [grpc.StatusCode.UNAVAILABLE] * 3, probes
        assert all(
            re.search(REFUSAL.format(topic=t), msg)
            for (_, msg), t in zip(probes, (topic, topic + "-new", topic), strict=True)
        ), probes
        if probes_dc:  # a producer created before (its send refused) and during the outage (its lookup)
            assert re.search(REFUSAL.format(topic=topic), probes_dc[0].result), probes_dc[0].result
            assert re.search(
                r"cannot reach the metadata store \(etcd\) for \d+ s .*: the partitions of "
                f"{topic} cannot be read until it is back",
                probes_dc[1].result,
            ), probes_dc[1].result
        # writes resumed after etcd came back: acked sends started before and ended after it
        assert any(end > marks["back"] for _, _, end in outcome.acked), figures
        assert all(p.alive() for p in cluster.procs)
        assert f"topic {topic} writable again" in _whole_log(victim)
