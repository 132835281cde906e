"""Delivery cutting and range acks: whole batches, no work per message."""

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from danube import message_codec
from danube.broker.subscription import cut_frames

H = message_codec.HEADER_SIZE


def reference_cut(buf, max_messages, max_bytes):
    """The frame-by-frame definition: take frames while both limits hold, at least one."""
    view = memoryview(buf)
    pos = count = 0
    while pos + H <= len(view) and count < max_messages:
        size = H + int.from_bytes(view[pos + 12 : pos + 16], "little")
        if count and pos + size > max_bytes:
            break
        pos += size
        count += 1
    return pos, count


@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=40),
    max_messages=st.integers(1, 50),
    max_bytes=st.integers(1, 20_000),
)
def test_cut_frames_matches_the_frame_by_frame_definition(sizes, max_messages, max_bytes):
    buf = message_codec.encode_records([(1, 2, None, None, b"p" * n) for n in sizes])
    view, count = cut_frames(buf, max_messages, max_bytes)
    assert (len(view), count) == reference_cut(buf, max_messages, max_bytes)
    assert message_codec.validate(view)[0] == count


def test_cut_frames_of_an_empty_buffer_is_empty():
    view, count = cut_frames(b"", 10, 100)
    assert (len(view), count) == (0, 0)


async def test_ack_ranges_moves_the_cursor_without_expanding_offsets(make_broker):
    from tests.unit.broker.conftest import stop

    b = await make_broker()
    pid = await b.create_producer("/default/acks", "p", reliable=True)
    cid = await b.subscribe("/default/acks", "s", "c")
    await b.publish(pid, bytearray(message_codec.encode_payloads([b"x"] * 5000)))
    got = 0
    while got < 5000:
        d = await asyncio.wait_for(b.receive(cid, max_messages=5000, max_bytes=1 << 20), 2)
        got += d.count
    sub = b.topics["/default/acks"].subscriptions["s"]
    # overlapping and out-of-order ranges; a range past the end is ignored
    assert await b.ack_ranges(cid, [(4000, 4999), (0, 2999), (2500, 3999), (6000, 7000)]) == 5000
    assert sub.cursor == 4999
    assert sub.tracker.unacked == 0
    assert await b.ack_ranges(cid, [(0, 4999)]) == 0  # acking again changes nothing
    await stop(b)
