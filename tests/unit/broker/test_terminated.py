"""Terminated topics (docs/broker.md): the persisted marker refuses publishes on every path, after a
restart and on another broker, with a non-retriable FAILED_PRECONDITION; the history stays readable.
And: persisted scalable consumer sessions are not taken for the broker's own registrations."""

import contextlib
import json
import logging

import grpc
import pytest

from danube.broker import BrokerService, DispatchSettings
from danube.client.errors import from_batch_status
from danube.errors import TopicTerminatedError, quote
from danube.metadata import keys
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.server.status import status_for
from danube.storage.config import StorageConfig
from danube.storage.factory import StorageFactory
from tests.unit.broker.conftest import stop
from tests.unit.broker.test_service import batch, payloads, receive

T = "/default/ending"


async def read_all(broker, cid, n):
    got = []
    while len(got) < n:
        d = await receive(broker, cid)
        got += payloads(d)
        await broker.ack(cid, range(d.first_offset, d.last_offset + 1))
    return got


def check_refusal(exc: TopicTerminatedError, topic: str) -> None:
    assert not exc.retriable
    assert quote(topic) in str(exc) and "terminated" in str(exc)
    code = status_for(exc)
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    back = from_batch_status(code.value[0], str(exc), exc.retriable)  # what a danube.client sees
    assert isinstance(back, TopicTerminatedError) and not back.retriable and back.grpc_code == code


async def test_terminate_refuses_publishes_reads_to_the_end_and_survives_a_restart(make_broker):
    b = await make_broker()
    pid = await b.create_producer(T, "p", reliable=True)
    cid = await b.subscribe(T, "s", "c")
    assert await b.publish(pid, batch(["a", "b", "c"])) == (0, 2)
    assert await b.terminate_topic(T) is True
    with pytest.raises(TopicTerminatedError) as refused:  # the batch lane
        await b.publish(pid, batch(["late"]))
    check_refusal(refused.value, T)
    with pytest.raises(TopicTerminatedError):  # Danube's SendMessage (coalesced)
        await b.publish_one(pid, batch(["late"]))
    assert b.topics[T].storage.next_offset == 3  # nothing of them was stored
    assert await read_all(b, cid, 3) == ["a", "b", "c"]  # the history reads to its end
    pid2 = await b.create_producer(T, "p2", reliable=True)  # attaching is allowed, publishing is not
    with pytest.raises(TopicTerminatedError):
        await b.publish(pid2, batch(["late"]))
    await stop(b)

    b = await make_broker()  # a restart: read back from the marker
    with pytest.raises(TopicTerminatedError):
        await b.publish(pid, batch(["late"]))  # the producer re-attaches, its publish is refused
    with pytest.raises(TopicTerminatedError):
        await b.publish_one(pid, batch(["late"]))
    assert b.topics[T].terminated and b.topics[T].storage.next_offset == 3
    await b.subscribe(T, "s2", "c2")  # a new subscription starts at the end
    assert b.topics[T].subscriptions["s2"].stats().backlog == 0
    assert await b.subscribe(T, "s", "c") == cid  # the old one resumes after its acks
    assert b.topics[T].subscriptions["s"].cursor == 2
    await stop(b)


async def test_terminating_a_topic_not_served_here_refuses_it_at_open(make_broker):
    b = await make_broker()
    pid = await b.create_producer(T, "p", reliable=True)
    await b.publish(pid, batch(["a"]))
    await b.unload_topic(T)
    assert await b.terminate_topic(T) is False  # not served: the marker alone
    assert await b.metadata.get(keys.topic_terminated(T)) is not None
    pid = await b.create_producer(T, "p", reliable=True)  # the client re-creates it: the topic opens
    with pytest.raises(TopicTerminatedError):
        await b.publish(pid, batch(["late"]))  # refused before any append
    assert b.topics[T].storage.next_offset == 1
    await stop(b)


@contextlib.asynccontextmanager
async def shared_fs_broker(tmp_path, metadata, name):
    config = StorageConfig.from_dict(
        {"mode": "shared_fs", "wal": {"sync": "always"}, "durable": {"root": str(tmp_path / "shared")}},
        data_dir=str(tmp_path / name),
    )
    broker = BrokerService(
        metadata,
        StorageFactory(config, metadata, broker_id=name),
        broker_id=name,
        dispatch=DispatchSettings(cursor_flush_interval_ms=50),
    )
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


async def test_a_terminated_topic_opened_on_another_broker_refuses_publishes(tmp_path):
    metadata = EmbeddedMetadataStore(str(tmp_path / "metadata.db"))
    try:
        async with shared_fs_broker(tmp_path, metadata, "a") as a:
            pid = await a.create_producer(T, "p", reliable=True)
            await a.subscribe(T, "s", "c")
            await a.publish(pid, batch(["a", "b"]))
            await a.terminate_topic(T)
            await a.unload_topic(T)  # the move: sealed here
        async with shared_fs_broker(tmp_path, metadata, "b") as b:
            pid_b = await b.create_producer(T, "p", reliable=True)
            with pytest.raises(TopicTerminatedError) as refused:
                await b.publish(pid_b, batch(["late"]))
            check_refusal(refused.value, T)
            with pytest.raises(TopicTerminatedError):
                await b.publish_one(pid_b, batch(["late"]))
            cid = await b.subscribe(T, "s", "c")
            assert await read_all(b, cid, 2) == ["a", "b"]  # the history, moved, reads to its end
            assert b.topics[T].storage.next_offset == 2
    finally:
        await metadata.close()


async def test_broker_start_skips_scalable_consumer_sessions_quietly(make_broker, caplog):
    b = await make_broker()
    await b.subscribe(T, "s", "c")  # an ordinary consumer registration
    scalable = "/default/orders"  # a scalable topic: its layout and a session
    await b.metadata.put(keys.scalable_topic(scalable), b'{"epoch": 0}')
    await b.metadata.put(
        keys.scalable_consumer(scalable, "billing", "c1"),
        json.dumps({"consumerName": "c1", "consumerId": 7, "layoutEpoch": 0, "assignedSegments": [0]}).encode(),
    )
    await stop(b)
    with caplog.at_level(logging.WARNING, logger="danube.broker.service"):
        b = await make_broker()
    assert "unreadable registration" not in caplog.text
    assert {(r.kind, r.topic, r.name) for r in b._dormant.values()} == {("consumer", T, "c")}
    await stop(b)
