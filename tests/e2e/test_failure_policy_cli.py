"""`danube admin topics set-failure-policy | get-failure-policy` against a real broker, in Danube's syntax:
the policy reads back as set, and a subscription that is already live follows it at once (a nacked
message with no redelivery left lands in the dead-letter topic)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import subprocess
import sys
import uuid

import pytest

from danube.cli import admin as admin_cli
from danube.client import DanubeClient, SubType
from tests.support.broker import running_broker

pytestmark = pytest.mark.timeout(180)
DANUBE = [sys.executable, "-m", "danube.cli.main"]


def admin(broker, *args: str, process: bool = False) -> subprocess.CompletedProcess:
    """`danube admin ARGS --endpoint E`: in a process of its own, else through the CLI's entry point in
    this process (a Python start per call costs seconds on a loaded machine)."""
    argv = [*args, "--endpoint", f"http://127.0.0.1:{broker.admin_port}"]
    if process:
        return subprocess.run([*DANUBE, "admin", *argv], capture_output=True, text=True, timeout=60)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = admin_cli.main(argv)
        except SystemExit as exc:
            code = exc.code
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def set_policy(
    broker,
    topic: str,
    sub: str,
    *,
    count: int,
    poison: str,
    dead_letter: str | None = None,
    backoff: str = "fixed",
    process: bool = False,
) -> subprocess.CompletedProcess:
    args = [
        "topics",
        "set-failure-policy",
        topic,
        "--subscription",
        sub,
        "--max-redelivery-count",
        str(count),
        "--ack-timeout-ms",
        "5000",
        "--base-redelivery-delay-ms",
        "50",
        "--max-redelivery-delay-ms",
        "50",
        "--backoff-strategy",
        backoff,
        "--poison-policy",
        poison,
    ]
    return admin(broker, *args, *(["--dead-letter-topic", dead_letter] if dead_letter else []), process=process)


async def next_message(consumer, timeout: float, what: str):
    async def first():
        async for m in consumer:
            return m

    try:
        return await asyncio.wait_for(first(), timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"no {what} within {timeout}s") from None


def test_set_and_get_failure_policy_and_a_live_subscription_follows_it():
    topic, sub = f"/default/fp-{uuid.uuid4().hex[:8]}", "orders-sub"
    dlq = f"{topic}-dlq"
    with running_broker("--sync", "interval") as broker:
        for t in (topic, dlq):
            r = admin(broker, "topics", "create", t, "--dispatch-strategy", "reliable")
            assert r.returncode == 0, r.stderr

        async def run(*args, process=False):  # the CLI runs beside the client's event loop, never blocking it
            return await asyncio.to_thread(admin, broker, *args, process=process)

        async def scenario():
            client = DanubeClient.builder().service_url(broker.url).build()
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

                # the subscription is live with the broker's default policy (block after 5 redeliveries)
                r = await run("topics", "get-failure-policy", topic, "--subscription", sub, "--output", "json")
                assert r.returncode == 0, r.stderr
                assert json.loads(r.stdout)["poison_policy"] == "block"

                r = await asyncio.to_thread(
                    set_policy, broker, topic, sub, count=0, poison="dead_letter", dead_letter=dlq, process=True
                )
                assert r.returncode == 0, r.stderr
                assert r.stdout.strip() == f"✅ Failure policy updated for topic '{topic}' subscription '{sub}'"

                r = await run("topics", "get-failure-policy", topic, "--subscription", sub, "--output", "json")
                assert r.returncode == 0, r.stderr
                assert json.loads(r.stdout) == {
                    "topic": topic,
                    "subscription": sub,
                    "max_redelivery_count": 0,
                    "ack_timeout_ms": 5000,
                    "base_redelivery_delay_ms": 50,
                    "max_redelivery_delay_ms": 50,
                    "backoff_strategy": "fixed",
                    "dead_letter_topic": dlq,
                    "poison_policy": "dead_letter",
                }
                r = await run(
                    "topics",
                    "get-failure-policy",
                    topic.split("/")[2],
                    "--namespace",
                    "default",
                    "-s",
                    sub,
                    process=True,
                )
                assert r.returncode == 0, r.stderr
                assert r.stdout.splitlines() == [
                    f"Topic: {topic}",
                    f"Subscription: {sub}",
                    "Max Redelivery Count: 0",
                    "Ack Timeout Ms: 5000",
                    "Base Redelivery Delay Ms: 50",
                    "Max Redelivery Delay Ms: 50",
                    "Backoff Strategy: fixed",
                    f"Dead Letter Topic: {dlq}",
                    "Poison Policy: dead_letter",
                ]

                await producer.send_and_wait(b"poison")
                first = await next_message(consumer, 15, "first delivery")
                assert first.payload == b"poison"
                await consumer.nack(first, delay_ms=0, reason="cannot parse")
                landed = await next_message(dead, 15, "dead-lettered message")
                assert landed.payload == b"poison"
                assert landed.attributes.get("x-original-topic") == topic
                assert landed.attributes.get("x-original-subscription") == sub
                await dead.ack(landed)
                # no redelivery left: the subscription moves on to the next message
                await producer.send_and_wait(b"after")
                nxt = await next_message(consumer, 15, "the next message")
                assert nxt.payload == b"after"
                await consumer.ack(nxt)
            finally:
                await client.close()

        asyncio.run(scenario())

        # bad input: refused with a sentence, nothing changed
        r = set_policy(broker, topic, sub, count=0, poison="dead_letter")
        assert r.returncode == 1 and "invalid_argument" in r.stderr and "dead_letter_topic" in r.stderr, r.stderr
        r = set_policy(broker, topic, sub, count=-1, poison="drop")
        assert r.returncode == 2 and "--max-redelivery-count" in r.stderr, r.stderr
        # a partitioned topic's subscriptions live on its partitions: the base name is refused, a partition is not
        assert (
            admin(
                broker, "topics", "create", f"{topic}-p", "--partitions", "2", "--dispatch-strategy", "reliable"
            ).returncode
            == 0
        )
        r = set_policy(broker, f"{topic}-p", sub, count=1, poison="drop")
        assert r.returncode == 1 and "partitioned topic" in r.stderr and "-part-0" in r.stderr, r.stderr
        assert set_policy(broker, f"{topic}-p-part-0", sub, count=1, poison="drop").returncode == 0
        r = admin(broker, "topics", "get-failure-policy", topic, "-s", "no-such-sub")
        assert r.returncode == 1 and "failure policy not found" in r.stderr, r.stderr
        r = admin(broker, "-o", "json", "topics", "get-failure-policy", topic, "-s", sub)
        assert json.loads(r.stdout)["poison_policy"] == "dead_letter"


def test_a_failure_policy_is_refused_on_a_non_reliable_topic_as_danube_refuses_it():
    """Danube answers FAILED_PRECONDITION "... only be configured for reliable topics": through our admin CLI,
    through Danube's own admin message, on a topic our CLI made and one the official danube-client made."""
    import grpc

    from tests.conformance.broker.client.danube_admin import AdminClient, failure_policy
    from tests.support import danube_client_venv as dc

    dc.ensure_venv()
    ours, theirs = f"/default/fp-nr-{uuid.uuid4().hex[:8]}", f"/default/fp-nr-dc-{uuid.uuid4().hex[:8]}"
    with running_broker() as broker:
        assert admin(broker, "topics", "create", ours, "--dispatch-strategy", "non_reliable").returncode == 0
        sent = dc.run_script("produce.py", broker.url, theirs, "--count", "2", timeout=120)["sent"]
        assert len(sent) == 2  # the official client's producer made a non-reliable topic
        for topic in (ours, theirs):
            r = set_policy(broker, topic, "s", count=1, poison="drop")
            assert r.returncode == 1, r
            assert "failed_precondition" in r.stderr and "only be configured for reliable topics" in r.stderr, r.stderr
            r = admin(broker, "topics", "get-failure-policy", topic, "-s", "s")
            assert r.returncode == 1 and "failure policy not found" in r.stderr, r.stderr  # nothing was stored

        async def danube_admin():
            client = AdminClient(f"http://127.0.0.1:{broker.admin_port}")
            codes = {}
            for topic in (theirs, "/default/no-such-topic"):
                try:
                    await client.set_failure_policy(topic, "s", failure_policy(1, 1000, "drop"))
                    codes[topic] = (grpc.StatusCode.OK, "")
                except grpc.aio.AioRpcError as exc:
                    codes[topic] = (exc.code(), exc.details())
            reliable = f"{ours}-r"
            await client.create_topic(reliable, "reliable")
            await client.set_failure_policy(reliable, "s", failure_policy(1, 1000, "drop"))  # reads back equal
            return codes

        codes = asyncio.run(danube_admin())
        assert codes[theirs][0] == grpc.StatusCode.FAILED_PRECONDITION
        assert "only be configured for reliable topics" in codes[theirs][1]
        assert codes["/default/no-such-topic"][0] == grpc.StatusCode.NOT_FOUND
