"""`danube admin topics unload` on a standalone broker: seal, CLOSE, reload through resume.

A real broker process (local storage mode), the project's client in this
process, and the admin CLI as a subprocess.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import grpc

from danube.client import DanubeClient
from danube.proto.danube import DanubeApi_pb2 as api
from danube.proto.danube import DanubeApi_pb2_grpc as api_grpc
from tests.support.broker import running_broker

TOPIC = "/default/reliable_topic"


def _admin(broker, *args):
    cmd = [
        sys.executable,
        "-m",
        "danube.cli.main",
        "admin",
        "--endpoint",
        f"http://127.0.0.1:{broker.admin_port}",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


async def _health(broker, client_type, client_id) -> int:
    async with grpc.aio.insecure_channel(broker.target) as channel:
        stub = api_grpc.HealthCheckStub(channel)
        resp = await stub.HealthCheck(api.HealthCheckRequest(request_id=1, client=client_type, id=client_id))
        return resp.status


async def _collect(consumer, received, until_offset, timeout=30.0):
    async def run():
        while not received or max(received) < until_offset:
            batch = await consumer.receive_batch(timeout=timeout)
            assert batch is not None, f"no delivery; got {sorted(set(received))}"
            for m in batch.messages():
                received.append(m.offset)
                assert bytes(m.payload) == b"message-%d" % m.offset, "payload belongs to its offset"
            yield batch

    async for batch in run():
        pass


async def test_unload_seals_and_the_next_clients_resume_with_continuous_offsets(tmp_path):
    (tmp_path / "broker").mkdir()
    with running_broker(data_dir=str(tmp_path / "broker")) as broker:
        client = DanubeClient.builder().service_url(broker.url).build()
        try:
            producer = client.new_producer().with_topic(TOPIC).with_name("p1").with_reliable(True).build()
            await producer.create()
            # A new subscription starts at the latest offset: subscribe before producing.
            consumer = (
                client.new_consumer()
                .with_topic(TOPIC)
                .with_consumer_name("c1")
                .with_subscription("subs_reliable")
                .with_reliable(True)
                .build()
            )
            await consumer.subscribe()
            offsets = [await producer.send_and_wait(b"message-%d" % i) for i in range(22)]
            assert offsets == list(range(22))
            before: list[int] = []
            delivered = []
            while not before or max(before) < 13:
                batch = await consumer.receive_batch(timeout=30)
                assert batch is not None
                delivered += batch.messages()
                before.extend(m.offset for m in batch.messages())
            await consumer.ack_many([m for m in delivered if m.offset <= 13])  # the cursor: 13
            producer_id = producer.producer_ids[0]
            assert await _health(broker, api.HealthCheckRequest.Producer, producer_id) == api.HealthCheckResponse.OK

            result = await asyncio.to_thread(_admin, broker, "topics", "unload", TOPIC)
            assert result.returncode == 0, result.stderr
            assert "Topic Unloaded: true" in result.stdout  # Danube's text
            assert await _health(broker, api.HealthCheckRequest.Producer, producer_id) == api.HealthCheckResponse.CLOSE

            # Told CLOSE, clients create their producer and consumer again: the lookup reloads the
            # topic through resume and offsets continue at 22.
            await consumer.close()
            await producer.close()
            producer = client.new_producer().with_topic(TOPIC).with_name("p1").with_reliable(True).build()
            await producer.create()
            offsets = [await producer.send_and_wait(b"message-%d" % i) for i in range(22, 28)]
            assert offsets == list(range(22, 28))
            consumer = (
                client.new_consumer()
                .with_topic(TOPIC)
                .with_consumer_name("c1")
                .with_subscription("subs_reliable")
                .with_reliable(True)
                .build()
            )
            await consumer.subscribe()

            described = await asyncio.to_thread(_admin, broker, "--output", "json", "topics", "describe", TOPIC)
            assert described.returncode == 0, described.stderr
            storage = json.loads(described.stdout)["storage"]
            assert storage["recovered_from"] == "sealed"
            assert int(storage["first_offset"]) == 0 and int(storage["next_offset"]) == 28
            assert int(storage["hot_start_offset"]) == 22 and int(storage["durable_end_offset"]) == 21

            after: list[int] = []
            await _collect(consumer, after, 27)
            distinct = sorted(set(before + after))
            assert distinct == list(range(28)), "every offset delivered, none missing"
            resumed = [o for o in after if o >= 14]
            assert resumed == sorted(resumed) and sorted(set(resumed)) == list(range(min(resumed), 28))

            listed = await asyncio.to_thread(_admin, broker, "--output", "json", "topics", "list", "default")
            assert [t["name"] for t in json.loads(listed.stdout)] == [TOPIC]
            await consumer.close()
            await producer.close()
        finally:
            await client.close()


def test_admin_cli_reports_unknown_topic_and_unreachable_endpoint(tmp_path):
    (tmp_path / "broker").mkdir()
    with running_broker(data_dir=str(tmp_path / "broker")) as broker:
        result = _admin(broker, "topics", "unload", "/default/nope")
        assert result.returncode == 1 and "not_found" in result.stderr
        result = _admin(broker, "topics", "unload", "not-a-topic")  # no namespace: refused before asking
        assert result.returncode == 2 and "no namespace" in result.stderr
        result = _admin(broker, "topics", "unload", "/not-a-topic")
        assert result.returncode == 1 and "invalid_argument" in result.stderr
    from tests.support.ports import free_port

    cmd = [
        sys.executable,
        "-m",
        "danube.cli.main",
        "admin",
        "--endpoint",
        f"http://127.0.0.1:{free_port()}",
        "--timeout",
        "3",
        "topics",
        "list",
        "default",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "danube admin:" in result.stderr
