"""A failure policy set through a broker that does not own the topic reaches the owner's live
subscription at once (the admin call is forwarded), in Danube's CLI syntax, on a 2-broker cluster."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from danube.client import DanubeClient, SubType
from tests.integration.cluster.test_admin_cluster import _run
from tests.support.cluster import local_cluster, lookup
from tests.support.etcd import requires_etcd

pytestmark = [requires_etcd, pytest.mark.timeout(180)]


async def next_message(consumer, timeout: float, what: str):
    async def first():
        async for m in consumer:
            return m

    try:
        return await asyncio.wait_for(first(), timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"no {what} within {timeout}s") from None


def test_policy_set_at_a_non_owner_applies_to_the_owners_live_subscription(tmp_path):
    topic, sub = f"/default/fpc-{uuid.uuid4().hex[:8]}", "live-sub"
    dlq = f"{topic}-dlq"
    with local_cluster(str(tmp_path / "c"), brokers=2) as cluster:
        first = cluster.procs[0]
        for t in (topic, dlq):
            code, out = _run(first.admin_url, "topics", "create", t, "--dispatch-strategy", "reliable")
            assert code == 0, out
        _, owner_url = asyncio.run(lookup(first.url, topic))
        other = next(p for p in cluster.procs if p.url != owner_url)

        async def admin(*args):  # beside the client's event loop, never blocking it
            return await asyncio.to_thread(_run, other.admin_url, *args)

        async def scenario():
            client = DanubeClient.builder().service_url(other.url).build()
            try:
                producer = (
                    await client.new_producer().with_topic(topic).with_name("p").with_reliable(True).build().create()
                )
                consumer = await (
                    client.new_consumer()
                    .with_topic(topic)
                    .with_consumer_name("c")
                    .with_subscription(sub)
                    .with_subscription_type(SubType.Shared)
                    .with_reliable(True)
                    .build()
                    .subscribe()
                )
                dead = await (
                    client.new_consumer()
                    .with_topic(dlq)
                    .with_consumer_name("d")
                    .with_subscription("dlq-sub")
                    .with_reliable(True)
                    .build()
                    .subscribe()
                )
                code, out = await admin(
                    "topics",
                    "set-failure-policy",
                    topic,
                    "--subscription",
                    sub,
                    "--max-redelivery-count",
                    "0",
                    "--ack-timeout-ms",
                    "5000",
                    "--base-redelivery-delay-ms",
                    "50",
                    "--max-redelivery-delay-ms",
                    "50",
                    "--poison-policy",
                    "dead_letter",
                    "--dead-letter-topic",
                    dlq,
                )
                assert (code, out) == (0, {"success": True})
                code, out = await admin("topics", "get-failure-policy", topic, "--subscription", sub)
                assert code == 0, out
                assert (out["max_redelivery_count"], out["poison_policy"], out["dead_letter_topic"]) == (
                    0,
                    "dead_letter",
                    dlq,
                )

                await producer.send_and_wait(b"poison")
                got = await next_message(consumer, 20, "first delivery")
                await consumer.nack(got, delay_ms=0, reason="cannot parse")
                # with the owner's old policy (5 redeliveries, then block) this would come back instead
                landed = await next_message(dead, 20, "dead-lettered message")
                assert landed.payload == b"poison"
                assert landed.attributes.get("x-original-topic") == topic
                await dead.ack(landed)
            finally:
                await client.close()

        asyncio.run(scenario())
        for p in cluster.procs:  # either broker reads the same policy
            code, out = _run(p.admin_url, "topics", "get-failure-policy", topic, "-s", sub)
            assert code == 0 and out["dead_letter_topic"] == dlq, (p.broker_id, out)
