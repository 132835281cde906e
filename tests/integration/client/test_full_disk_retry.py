"""danube.client's producer and a full WAL disk (RESOURCE_EXHAUSTED from StorageFullError): the refused
batch is resent after the retry budget's backoff, so a send waits until space is freed; only a budget
spent while the disk stays full reaches the application, as a ClientError that says so.

The real broker (``BrokerApp``: BrokerService, local storage, gRPC on a free loopback port) runs in the
test's event loop; the topic's WAL raises ENOSPC on append while ``full`` is set (what a full file
system makes ``Wal.append_frames`` raise; tests/faults/test_disk_full.py mounts a real full tmpfs).
"""

from __future__ import annotations

import asyncio
import errno

import grpc
import pytest

from danube.client import DanubeClient
from danube.errors import ClientError
from danube.server.app import BrokerApp
from danube.server.config import BrokerConfig
from tests.support.ports import free_port

TOPIC = "/default/full-disk"


@pytest.fixture
async def app(tmp_path):
    broker_app = BrokerApp(
        BrokerConfig(port=free_port(), admin_port=0, metrics_port=0, data_dir=str(tmp_path / "broker"))
    )
    await broker_app.start()
    try:
        yield broker_app
    finally:
        await broker_app.stop()


def fill_disk(app: BrokerApp) -> dict:
    """Make the topic's WAL refuse appends with ENOSPC while ``state["full"]``; counts the refusals."""
    wal = app.broker.topics[TOPIC].storage.wal
    real = wal.append_frames
    state = {"full": True, "refused": 0}

    def append_frames(buf):
        if state["full"]:
            state["refused"] += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(buf)

    wal.append_frames = append_frames
    return state


def client_for(app: BrokerApp, give_up_after_s: float) -> DanubeClient:
    return (
        DanubeClient.builder()
        .service_url(f"http://127.0.0.1:{app.bound['client']}")
        .with_retry(initial_backoff_s=0.02, max_backoff_s=0.1, give_up_after_s=give_up_after_s)
        .with_health_check_interval(0)
        .build()
    )


async def test_send_waits_through_a_full_disk_and_completes_once_space_is_freed(app):
    client = client_for(app, give_up_after_s=30)
    try:
        producer = client.new_producer().with_topic(TOPIC).with_name("p").with_linger_ms(1).build()
        await producer.create()
        assert await producer.send_and_wait(b"before") == 0
        state = fill_disk(app)
        sending = asyncio.ensure_future(producer.send_and_wait(b"during"))
        while state["refused"] < 3:  # refused, resent after backoff, refused again...
            assert not sending.done(), sending
            await asyncio.sleep(0.02)
        state["full"] = False  # space freed
        assert await asyncio.wait_for(sending, 15) == 1  # no offset skipped by the refusals
        assert await producer.send_and_wait(b"after") == 2
        records = [bytes(m) for m in await read_all(client, 3)]
        assert records == [b"before", b"during", b"after"]  # stored once each, in order
        await producer.close()
    finally:
        await client.close()


async def test_a_disk_full_past_the_retry_budget_fails_the_send_with_a_clear_error(app):
    client = client_for(app, give_up_after_s=0.5)
    try:
        producer = client.new_producer().with_topic(TOPIC).with_name("p").with_linger_ms(1).build()
        await producer.create()
        assert await producer.send_and_wait(b"before") == 0
        state = fill_disk(app)
        started = asyncio.get_running_loop().time()
        with pytest.raises(ClientError) as failed:
            await asyncio.wait_for(producer.send_and_wait(b"never"), 15)
        assert asyncio.get_running_loop().time() - started >= 0.5  # retried for the whole budget
        assert state["refused"] >= 3
        message = str(failed.value)
        assert "retry budget is spent" in message and "RESOURCE_EXHAUSTED" in message and TOPIC in message, message
        cause = failed.value.__cause__  # the broker's last refusal, code and flag kept
        assert getattr(cause, "grpc_code", None) == grpc.StatusCode.RESOURCE_EXHAUSTED and cause.retriable, cause
    finally:
        await client.close()


async def read_all(client: DanubeClient, count: int) -> list:
    consumer = (
        client.new_consumer()
        .with_topic(TOPIC)
        .with_consumer_name("c")
        .with_subscription("s")
        .with_reliable()
        .with_initial_position("earliest")
        .build()
    )
    await consumer.subscribe()
    got = []
    try:
        async with asyncio.timeout(15):
            async for m in consumer:
                got.append(m.payload)
                await consumer.ack(m)
                if len(got) >= count:
                    break
    finally:
        await consumer.close()
    return got
