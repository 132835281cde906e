"""Records a subscriber cannot decode: refused whole on publish, and never a stall on delivery.

"Already stored" poison records are appended below the publish check (straight into the
topic's storage), as a broker before the check or a damaged import would have left them.
"""

import asyncio
import struct

import pytest

from danube import message_codec
from danube.broker import FailurePolicy
from danube.errors import InvalidArgumentError
from tests.unit.broker.conftest import stop

T = "/default/poison"
U64_MAX = 2**64 - 1


def raw_frame(key: bytes | None, attrs=(), *, producer_id: int = 0, payload: bytes = b"p") -> bytes:
    """A checksum-valid frame with any bytes as key and attributes (the encoders take only text)."""
    body = bytearray(
        struct.pack("<QQBBHH", 1, producer_id, 1 if key is not None else 0, 0, len(attrs), len(key or b""))
    )
    body += key or b""
    for name, value in attrs:
        body += struct.pack("<H", len(name)) + name + struct.pack("<I", len(value)) + value
    body += payload
    len_field = struct.pack("<I", len(body))
    return (
        struct.pack("<QI", 0, message_codec.crc32c(bytes(body), message_codec.crc32c(len_field)))
        + len_field
        + bytes(body)
    )


def good(*payloads: str) -> bytes:
    return message_codec.encode_payloads([p.encode() for p in payloads], publish_time=1)


def texts(delivery) -> list[str]:
    return [bytes(r.payload).decode() for r in message_codec.iter_records(delivery.frames)]


async def receive(broker, cid, timeout=3.0):
    return await asyncio.wait_for(broker.receive(cid, max_messages=100, max_bytes=1 << 20), timeout)


def store_below_the_check(broker, topic: str, buf: bytes) -> None:
    """Append frames as an older broker did: stamped, stored, visible, never checked."""
    t = broker.topics[topic]
    first, last = t.append(bytearray(buf))
    t.committed(last - first + 1, len(buf), last, 0.0)


@pytest.mark.parametrize(
    "bad",
    [
        raw_frame(b"\xff\xfe"),
        raw_frame(b"k", [(b"\xc3\x28", b"v")]),
        raw_frame(None, [(b"name", b"\xed\xa0\x80")]),
        raw_frame(b"k", producer_id=U64_MAX),
    ],
    ids=["key", "attribute-name", "attribute-value", "producer-id-2^64-1"],
)
async def test_publish_refuses_the_whole_batch_before_storing_anything(broker, bad):
    pid = await broker.create_producer(T, "p", reliable=True)
    await broker.publish(pid, bytearray(good("before")))
    with pytest.raises(InvalidArgumentError, match="batch refused, nothing stored: frame 1 "):
        await broker.publish(pid, bytearray(good("ok") + bad + good("after")))
    assert broker.topics[T].storage.next_offset == 1  # not one frame of the batch was stored
    assert await broker.publish(pid, bytearray(good("next"))) == (1, 1)


async def test_a_frame_carrying_the_publishers_own_id_is_accepted(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    buf = message_codec.encode_payloads([b"a", b"b"], producer_id=pid) + message_codec.encode_payloads(
        [b"c"], producer_id=0
    )
    assert await broker.publish(pid, bytearray(buf)) == (0, 2)
    with pytest.raises(InvalidArgumentError, match="producer id"):
        await broker.publish(pid, bytearray(message_codec.encode_payloads([b"d"], producer_id=pid + 1)))


async def test_a_stored_poison_record_is_dropped_and_delivery_goes_on(make_broker):
    b = await make_broker(failure_policy=FailurePolicy(poison_policy="drop"))
    pid = await b.create_producer(T, "p", reliable=True)
    cid = await b.subscribe(T, "s", "c")
    await b.publish(pid, bytearray(good("m0", "m1")))
    store_below_the_check(b, T, raw_frame(b"\xff") + good("m3"))
    await b.publish(pid, bytearray(good("m4")))
    got = []
    while len(got) < 4:
        d = await receive(b, cid)
        got += texts(d)
        await b.ack(cid, range(d.first_offset, d.last_offset + 1))
    assert got == ["m0", "m1", "m3", "m4"]  # offset 2 (the poison) skipped, nothing stalls
    assert b.topics[T].subscriptions["s"].cursor == 4  # and the cursor passed it
    await stop(b)


async def test_a_stored_poison_record_blocks_under_the_block_policy(make_broker):
    b = await make_broker(failure_policy=FailurePolicy(poison_policy="block"))
    pid = await b.create_producer(T, "p", reliable=True)
    cid = await b.subscribe(T, "s", "c")
    await b.publish(pid, bytearray(good("m0")))
    store_below_the_check(b, T, raw_frame(b"k", [(b"\xff", b"v")]))
    await b.publish(pid, bytearray(good("m2")))
    d = await receive(b, cid)
    assert texts(d) == ["m0"]
    await b.ack(cid, [0])
    sub = b.topics[T].subscriptions["s"]
    with pytest.raises(asyncio.TimeoutError):
        await receive(b, cid, timeout=0.3)  # held at offset 1, as configured
    assert sub.tracker.blocked == {1}
    assert sub.unblock() == 1  # an admin skip releases it
    assert texts(await receive(b, cid)) == ["m2"]
    await stop(b)


async def test_a_stored_poison_record_goes_to_the_dead_letter_topic_readable(make_broker):
    b = await make_broker(
        failure_policy=FailurePolicy(poison_policy="dead_letter", dead_letter_topic="/default/poison-dlq")
    )
    pid = await b.create_producer(T, "p", reliable=True)
    cid = await b.subscribe(T, "s", "c")
    store_below_the_check(b, T, raw_frame(b"ke\xffy", [(b"a", b"\xfe")], payload=b"kept"))
    await b.publish(pid, bytearray(good("m1")))
    assert texts(await receive(b, cid)) == ["m1"]
    for _ in range(100):
        dlq = b.topics.get("/default/poison-dlq")
        if dlq is not None and dlq.storage.next_offset == 1:
            break
        await asyncio.sleep(0.02)
    rec = message_codec.decode_batch(await b.topics["/default/poison-dlq"].storage.read_frames(0, 1 << 20))[0]
    assert bytes(rec.payload) == b"kept"
    assert rec.routing_key == "ke\\xffy" and rec.attributes["a"] == "\\xfe"
    assert rec.attributes["x-original-topic-offset"] == "0" and rec.attributes["x-original-topic"] == T
    await stop(b)


async def test_a_key_shared_subscription_skips_a_stored_poison_record(make_broker):
    b = await make_broker(failure_policy=FailurePolicy(poison_policy="drop"))
    pid = await b.create_producer(T, "p", reliable=True)
    cid = await b.subscribe(T, "s", "c", sub_type="key_shared")
    store_below_the_check(b, T, raw_frame(b"\x80"))
    await b.publish(pid, bytearray(message_codec.encode_payloads([b"m1"], key="k")))
    assert texts(await receive(b, cid)) == ["m1"]
    await stop(b)


async def test_a_record_the_protocol_cannot_carry_is_rejected_to_the_failure_policy(make_broker):
    """The Danube lane's conversion hook: a delivered record that fails conversion is not sent again."""
    b = await make_broker(failure_policy=FailurePolicy(poison_policy="drop"))
    pid = await b.create_producer(T, "p", reliable=True)
    cid = await b.subscribe(T, "s", "c")
    await b.publish(pid, bytearray(good("m0", "m1")))
    d = await receive(b, cid)
    b.reject_delivery(cid, d.first_offset, "test: cannot convert")
    await b.ack(cid, [1])
    sub = b.topics[T].subscriptions["s"]
    assert sub.cursor == 1 and sub.tracker.unacked == 0
    await stop(b)
