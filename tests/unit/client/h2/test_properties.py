"""Properties of the client's HTTP/2 transport: any split of the peer's bytes gives the same
responses, the send windows are never overrun, and hostile bytes end the connection with a
reason while what it holds stays bounded."""

from __future__ import annotations

import asyncio

import grpc
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.client.h2 import frames
from danube.client.h2.limits import H2ClientLimits
from danube.proto.danube_batch import batch_pb2 as pb
from tests.unit.client.h2.peer import Peer, turn

_LIMITS = H2ClientLimits(max_frame_size=16384, keepalive_s=0)


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:]) if b > a]


@settings(max_examples=60, deadline=None)
@given(
    sequences=st.lists(st.integers(0, 2**40), min_size=1, max_size=20),
    frame_size=st.integers(1, 64),
    cuts=st.lists(st.integers(0, 10_000), max_size=30),
)
def test_any_split_of_the_peers_bytes_gives_the_same_responses(sequences, frame_size, cuts):
    async def scenario():
        peer = Peer(_LIMITS)
        peer.feed(peer.settings())
        call = peer.call()
        await turn()
        body = b"".join(
            frames.message_prefix(len(m)) + m
            for m in (pb.PublishAck(sequence=s, first_offset=s).SerializeToString() for s in sequences)
        )
        # the messages cut across DATA frames of frame_size bytes, then the bytes cut anywhere
        data = peer.response_headers(1) + b"".join(
            frames.frame(frames.DATA, 0, 1, body[i : i + frame_size]) for i in range(0, len(body), frame_size)
        )
        data += peer.trailers(1)
        for chunk in _chunks(data, cuts):
            peer.feed(chunk)
        got = []
        while batch := await call.read_batch():
            got += [a.sequence for a in batch]
        assert got == sequences
        assert await call.code() == grpc.StatusCode.OK

    asyncio.run(scenario())


@settings(max_examples=60, deadline=None)
@given(
    initial=st.integers(0, 300),
    sizes=st.lists(st.integers(0, 400), min_size=1, max_size=8),
    updates=st.lists(st.tuples(st.booleans(), st.integers(1, 200)), max_size=40),
)
def test_the_client_never_sends_past_the_stream_or_connection_window(initial, sizes, updates):
    async def scenario():
        peer = Peer(_LIMITS)
        peer.conn.send_window = 500  # as if the peer's connection window were nearly used up
        peer.feed(peer.settings([(frames.INITIAL_WINDOW_SIZE, initial)]))
        call = peer.call()
        await turn()
        stream_allowed, conn_allowed = initial, 500
        writer = asyncio.ensure_future(_write_all(call, sizes))
        for on_stream, increment in [*updates, (True, 10_000), (False, 10_000)]:
            await turn()
            sent = sum(len(p) for kind, _, _, p in peer.sent() if kind == frames.DATA)
            total = sum(len(p) for kind, _, _, p in peer.frames if kind == frames.DATA)
            assert sent >= 0 and total <= stream_allowed and total <= conn_allowed
            assert call.send_window >= 0 and peer.conn.send_window >= 0
            if on_stream:
                stream_allowed += increment
                peer.feed(frames.window_update(1, increment))
            else:
                conn_allowed += increment
                peer.feed(frames.window_update(0, increment))
        await asyncio.wait_for(writer, 2)
        await turn()
        peer.sent()
        data = b"".join(p for kind, _, _, p in peer.frames if kind == frames.DATA)
        got = frames.MessageReader(1 << 20).feed(data)
        assert [len(pb.PublishRequest.FromString(m).frames) for m in got] == sizes

    asyncio.run(scenario())


async def _write_all(call, sizes):
    for size in sizes:
        await call.write(pb.PublishRequest(frames=b"f" * size))


@settings(max_examples=150, deadline=None)
@given(garbage=st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=20))
def test_hostile_bytes_end_the_connection_with_a_reason_and_bounded_buffers(garbage):
    async def scenario():
        peer = Peer(_LIMITS)
        peer.feed(peer.settings())
        call = peer.call()
        await turn()
        for chunk in garbage:
            peer.feed(chunk)  # never raises: a bad frame is a connection error, not an exception
            # at most one frame (header, payload up to the advertised size) waits for its end
            assert len(peer.conn._buffer) <= frames.HEADER_SIZE + _LIMITS.max_frame_size + len(chunk)
            assert len(call._messages) * 5 <= _LIMITS.stream_window
        if peer.conn.closed:
            goaway = [p for kind, _, _, p in peer.sent() if kind == frames.GOAWAY]
            assert goaway and frames.parse_goaway(goaway[0])[2], "GOAWAY says why"
            assert call.done()
            try:
                await call.read_batch()
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE and exc.details()
            # the connection holds nothing of the peer's any more
            assert not peer.conn._buffer and not peer.conn._streams

    asyncio.run(scenario())


_HOSTILE_FRAMES = st.lists(
    st.tuples(
        st.integers(0, 11),  # every frame type, and one unknown
        st.integers(0, 255),
        st.sampled_from([0, 1, 2, 3, 7]),
        st.binary(max_size=40),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(sent=_HOSTILE_FRAMES)
def test_well_framed_hostile_frames_either_work_or_end_the_connection_with_a_reason(sent):
    # well-framed, so they reach the per-type handling (random bytes mostly stop at the frame size)
    async def scenario():
        peer = Peer(_LIMITS)
        peer.feed(peer.settings())
        call = peer.call()
        await turn()
        for kind, flags, stream_id, payload in sent:
            peer.feed(frames.frame(kind, flags, stream_id, payload))
            assert len(peer.conn._buffer) <= frames.HEADER_SIZE + _LIMITS.max_frame_size
            assert peer.conn._continuing is None or peer.conn._continuing[3] <= _LIMITS.max_header_block
        await turn()
        if peer.conn.closed:
            goaway = [p for kind, _, _, p in peer.sent() if kind == frames.GOAWAY]
            assert goaway and frames.parse_goaway(goaway[0])[2], "GOAWAY says why"
            assert call.done() and (await call.details())
        if call.done():
            code = await call.code()
            assert code is not None
            if code != grpc.StatusCode.OK:
                assert await call.details()

    asyncio.run(scenario())


def test_a_header_block_over_the_limit_ends_the_connection():
    async def scenario():
        peer = Peer(H2ClientLimits(max_header_block=1000, keepalive_s=0))
        peer.feed(peer.settings())
        call = peer.call()
        await turn()
        peer.feed(frames.frame(frames.HEADERS, 0, 1, b"\x00" * 600))
        assert not peer.conn.closed
        peer.feed(frames.frame(frames.CONTINUATION, 0, 1, b"\x00" * 600))
        assert peer.conn.closed and call.done()
        assert "1000-byte limit" in (await call.details())

    asyncio.run(scenario())
