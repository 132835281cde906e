"""The WAL's file system full: a small tmpfs mounted by the test holds the broker's WAL root (its
metadata stays elsewhere).  Publishes are refused with RESOURCE_EXHAUSTED naming the topic and the
reason, nothing acked is damaged, reads go on, and publishing resumes by itself once space is freed
(no restart, the same producer).  danube-client 0.5.0 retries RESOURCE_EXHAUSTED by itself;
danube.client too, within its retry budget, and fails the send with a clear error once it is spent."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time

import grpc
import pytest

from danube.client import DanubeClient
from danube.errors import DanubeError
from danube.proto.danube import DanubeApi_pb2 as pb
from danube.proto.danube import DanubeApi_pb2_grpc as pb_grpc
from tests.support.broker import running_broker
from tests.support.waiting import async_wait_until

pytestmark = [pytest.mark.timeout(180)]

TOPIC = "/default/full"


@contextlib.contextmanager
def small_tmpfs(path: str, size: str = "8m"):
    os.makedirs(path, exist_ok=True)
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs for the full-disk test (needs root or CAP_SYS_ADMIN): "
            f"{result.stderr.strip() or result.returncode}"
        )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], capture_output=True)


def _send(stub, producer_id: int, i: int, payload: bytes) -> None:
    stub.SendMessage(
        pb.StreamMessage(
            request_id=i,
            msg_id=pb.MsgID(producer_id=producer_id, topic_name=TOPIC),
            payload=payload,
            publish_time=int(time.time() * 1000),
            producer_name="fill",
        ),
        timeout=30,
    )


async def _consume(url: str, count: int, timeout: float = 30.0) -> list[tuple[int, bytes]]:
    client = DanubeClient.builder().service_url(url).build()
    consumer = (
        client.new_consumer()
        .with_topic(TOPIC)
        .with_consumer_name("reader")
        .with_subscription("r")
        .with_reliable()
        .build()
    )
    await consumer.subscribe()
    got: list[tuple[int, bytes]] = []
    try:
        if count == 0:
            return got
        async with asyncio.timeout(timeout):
            async for m in consumer:
                got.append((m.offset, bytes(m.payload)))
                await consumer.ack(m)
                if len(got) >= count:
                    break
    finally:
        await consumer.close()
        await client.close()
    return got


def test_full_wal_file_system_refuses_publishes_and_recovers(tmp_path):
    fs = str(tmp_path / "fs")
    with small_tmpfs(fs):
        filler = os.path.join(fs, "filler")
        with open(filler, "wb") as f:
            f.write(b"\0" * (5 * 1024 * 1024))  # leaves ~3 MiB for the WAL
        config = tmp_path / "broker.yml"
        config.write_text(
            f"storage:\n  mode: local\n  local_wal_root: {fs}/wal\n"
            "  wal:\n    max_file_mb: 1\n    initial_file_kb: 64\n"
        )
        data_dir = str(tmp_path / "data")
        os.makedirs(data_dir)
        with running_broker("--config", str(config), data_dir=data_dir) as broker:
            channel = grpc.insecure_channel(broker.target)
            producers = pb_grpc.ProducerServiceStub(channel)
            # the reader's subscription first: it starts at the topic's end
            producer_id = producers.CreateProducer(
                pb.ProducerRequest(
                    request_id=1,
                    producer_name="fill",
                    topic_name=TOPIC,
                    producer_access_mode=pb.Shared,
                    dispatch_strategy=pb.Reliable,
                ),
                timeout=30,
            ).producer_id
            asyncio.run(_consume(broker.url, 0, timeout=10))
            payload = b"x" * 1024
            acked = 0
            with pytest.raises(grpc.RpcError) as refused:
                while acked < 20_000:
                    _send(producers, producer_id, acked, b"%08d" % acked + payload)
                    acked += 1
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
            assert TOPIC in refused.value.details() and "full" in refused.value.details(), refused.value.details()
            assert acked > 1000, acked
            # refused again (nothing changed), not a different failure
            with pytest.raises(grpc.RpcError) as again:
                _send(producers, producer_id, acked, b"%08d" % acked + payload)
            assert again.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

            async def while_full_then_freed():
                # reads go on while the disk is full: every acked message, in order
                got = await _consume(broker.url, acked)
                assert [p[:8] for _, p in got] == [b"%08d" % i for i in range(acked)]
                assert [o for o, _ in got] == list(range(acked))
                # danube.client retries the refusal within its budget: its send waits while the disk
                # is full and completes once space is freed (no restart, the same producer)
                client = DanubeClient.builder().service_url(broker.url).build()
                producer = client.new_producer().with_topic(TOPIC).with_name("after").with_reliable().build()
                await producer.create()
                # as large as the refused messages (a smaller one may fit what the active WAL file still has)
                sending = asyncio.ensure_future(producer.send_and_wait(b"after-fu" + payload))
                await async_wait_until(  # it was refused and sent again
                    lambda: producer._parts[0].reconnects >= 1 or sending.done(), 30, "the send refused and retried"
                )
                assert not sending.done(), sending  # held by the client's retries, not failed
                os.remove(filler)
                offset = await asyncio.wait_for(sending, 60)
                await producer.close()
                # a budget spent while the disk stays full fails the send with a clear error
                with contextlib.suppress(OSError), open(filler, "wb") as f:
                    for _ in range(8 * 16):  # until the file system is full (the WAL took some)
                        f.write(b"\0" * (64 * 1024))
                        f.flush()
                short = (
                    DanubeClient.builder()
                    .service_url(broker.url)
                    .with_retry(initial_backoff_s=0.05, max_backoff_s=0.2, give_up_after_s=1.0)
                    .build()
                )
                spent = short.new_producer().with_topic(TOPIC).with_name("spent").with_reliable().build()
                await spent.create()
                with pytest.raises(DanubeError) as full:
                    for _ in range(400):  # what the WAL's active file still holds is taken first
                        await asyncio.wait_for(spent.send_and_wait(b"refused-" + payload * 16), 30)
                message = str(full.value)
                assert "retry budget is spent" in message and "RESOURCE_EXHAUSTED" in message, message
                assert TOPIC in message and "full" in message, message
                os.remove(filler)
                await short.close()
                await client.close()
                return offset

            offset = asyncio.run(while_full_then_freed())
            assert offset == acked  # no offset lost or skipped by the refusals
            _send(producers, producer_id, acked + 1, b"%08d" % (acked + 1) + payload)
            got = asyncio.run(_consume(broker.url, 2))
            assert [o for o, _ in got] == [acked, acked + 1]
            assert got[0][1] == b"after-fu" + payload
            channel.close()
            log = broker.log()
            assert "internal error" not in log.lower(), log[-3000:]
