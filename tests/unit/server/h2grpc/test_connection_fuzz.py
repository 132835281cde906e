"""Fuzz target: ``GrpcConnection.data_received`` fed arbitrary frame sequences in arbitrary
pieces (hypothesis), on a fake transport.

Whatever a peer sends, nothing escapes ``data_received``, the connection stays within its
limits while it lives (streams, buffered request bytes, its read buffer), what it writes
is well-formed HTTP/2, and once the connection is lost every server-wide counter is back
to zero.
"""

from __future__ import annotations

import asyncio

import grpc
import hpack
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from danube.server.h2grpc import H2Limits, H2Server, frames, wire
from danube.server.h2grpc.connection import GrpcConnection

LIMITS = H2Limits(
    max_concurrent_streams=4,
    max_streams_total=6,
    stream_window=65535,
    connection_window=65535 * 2,
    max_frame_size=16384,
    max_header_list_size=2048,
    max_continuation_frames=3,
    max_settings_entries=4,
    reset_burst=5,
    resets_per_second=1,
    max_queued_control_frames=8,
    max_frames_per_read=7,
    max_buffered_bytes=40000,
    max_buffered_bytes_total=60000,
    max_receive_message_length=50000,
    handshake_timeout=0,
    idle_timeout=0,
)


async def echo(request: bytes, context) -> bytes:
    await asyncio.sleep(0)
    return request


async def collect(request_iterator, context) -> bytes:
    return b"".join([m async for m in request_iterator])


async def paced(request_iterator, context) -> bytes:
    """Takes its messages by sink, pausing after every second one until a later loop turn."""
    loop = asyncio.get_running_loop()
    ended = loop.create_future()
    got: list[bytes] = []

    def sink(message) -> None:
        if message is grpc.aio.EOF:
            ended.set_result(None)
            return
        got.append(message)
        if len(got) % 2 == 0:
            context.pause_messages()
            loop.call_soon(context.resume_messages)

    context.set_message_sink(sink)
    await ended
    return b"".join(got)


class FakeTransport(asyncio.Transport):
    def __init__(self, protocol) -> None:
        super().__init__()
        self.protocol = protocol
        self.written = bytearray()
        self.closed = False
        self.reading = True
        self.paused_writing = False

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 5555) if name == "peername" else default

    def write(self, data) -> None:
        assert not self.closed or True
        self.written += data
        if len(self.written) > 4096 and not self.paused_writing:  # a peer that reads slowly
            self.paused_writing = True
            self.protocol.pause_writing()

    def drain_peer(self) -> None:
        if self.paused_writing:
            self.paused_writing = False
            self.protocol.resume_writing()

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_write_buffer_size(self) -> int:
        return 0


ENCODER_HEADERS = [
    [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/t.T/Echo"),
        (b":authority", b"x"),
        (b"content-type", b"application/grpc"),
    ],
    [
        (b":method", b"POST"),
        (b":path", b"/t.T/Collect"),
        (b"content-type", b"application/grpc"),
        (b"grpc-timeout", b"1m"),
    ],
    [(b":method", b"POST"), (b":path", b"/t.T/Paced"), (b"content-type", b"application/grpc")],
    [(b":method", b"GET"), (b":path", b"/")],
    [(b":method", b"POST"), (b":path", b"/t.T/Nope"), (b"content-type", b"application/grpc"), (b"x-big", b"v" * 3000)],
]

stream_ids = st.sampled_from([0, 1, 2, 3, 5, 7, 9, 11, 13])
settings_payloads = st.lists(
    st.tuples(st.sampled_from([1, 3, 4, 5, 6, 0x99]), st.integers(0, 2**32 - 1)), max_size=6
).map(lambda pairs: b"".join(key.to_bytes(2, "big") + value.to_bytes(4, "big") for key, value in pairs))
payloads = st.one_of(
    st.binary(max_size=40),
    st.builds(lambda n, body: wire.message_prefix(n) + body, st.integers(0, 60000), st.binary(max_size=64)),
    settings_payloads,
    st.integers(0, 2**32 - 1).map(lambda v: v.to_bytes(4, "big")),
)
messages = st.one_of(
    st.binary(max_size=30).map(lambda body: wire.message_prefix(len(body)) + body),
    st.integers(0, 60000).map(lambda n: wire.message_prefix(n) + b"\x00" * min(n, 16000)),
    st.binary(max_size=16000),
)
# Mostly what a client would send (streams opened in order, DATA on them, resets, pings,
# settings, window updates, split header blocks), with arbitrary frames mixed in.
steps = st.one_of(
    st.tuples(st.just("open"), st.integers(0, len(ENCODER_HEADERS) - 1), st.booleans()),
    st.tuples(st.just("data"), st.integers(0, 8), messages, st.booleans()),
    st.tuples(st.just("rst"), st.integers(0, 8)),
    st.tuples(st.just("ping"), st.sampled_from([0, 1])),
    st.tuples(st.just("settings"), settings_payloads),
    st.tuples(st.just("window"), st.integers(-1, 8), st.integers(0, 2**31)),
    st.tuples(st.just("split"), st.integers(0, len(ENCODER_HEADERS) - 1), st.integers(0, 5)),
    st.tuples(st.just("raw"), st.integers(0, 10), st.sampled_from([0, 1, 4, 5, 8, 0x20, 0x25]), stream_ids, payloads),
    st.just(("drain",)),
    st.just(("tick",)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 9).map(bool), st.lists(steps, max_size=40), st.lists(st.integers(1, 64), max_size=8))
def test_data_received_survives_any_frames_and_stays_within_its_limits(preface_ok, script, cuts):
    loop = asyncio.new_event_loop()
    try:
        server = H2Server(LIMITS)
        server.loop = loop
        server.add_registered_method_handlers(
            "t.T",
            {
                "Echo": grpc.unary_unary_rpc_method_handler(echo),
                "Collect": grpc.stream_unary_rpc_method_handler(collect),
                "Paced": grpc.stream_unary_rpc_method_handler(paced),
            },
        )
        connection = GrpcConnection(server)
        transport = FakeTransport(connection)
        connection.connection_made(transport)
        encoder = hpack.Encoder()
        wire_bytes = bytearray(frames.PREFACE if preface_ok else b"PRI * HTTP/1.1\r\n\r\nSM\r\n\r\n")
        wire_bytes += frames.settings([])

        def feed(data: bytes) -> None:
            connection.data_received(data)  # must never raise
            assert len(connection._streams) <= LIMITS.max_concurrent_streams
            assert server.open_streams <= 2 * LIMITS.max_streams_total
            assert (
                connection.buffered
                <= LIMITS.max_buffered_bytes + LIMITS.max_receive_message_length + LIMITS.connection_window
            )
            assert len(connection._buffer) <= LIMITS.max_frame_size + frames.HEADER_SIZE + len(data)

        opened: list[int] = []

        def sid(index: int) -> int:
            return opened[index % len(opened)] if opened else 1

        for step in script:
            what = step[0]
            if what == "open":
                stream_id = 2 * len(opened) + 1
                opened.append(stream_id)
                flags = frames.END_HEADERS | (frames.END_STREAM if step[2] else 0)
                wire_bytes += frames.frame(frames.HEADERS, flags, stream_id, encoder.encode(ENCODER_HEADERS[step[1]]))
            elif what == "data":
                wire_bytes += frames.frame(frames.DATA, frames.END_STREAM if step[3] else 0, sid(step[1]), step[2])
            elif what == "rst":
                wire_bytes += frames.rst_stream(sid(step[1]), frames.CANCEL)
            elif what == "ping":
                wire_bytes += frames.frame(frames.PING, step[1], 0, b"12345678")
            elif what == "settings":
                wire_bytes += frames.frame(frames.SETTINGS, 0, 0, step[1])
            elif what == "window":
                wire_bytes += frames.window_update(0 if step[1] < 0 else sid(step[1]), step[2] & 0x7FFFFFFF)
            elif what == "split":
                stream_id = 2 * len(opened) + 1
                opened.append(stream_id)
                block = encoder.encode(ENCODER_HEADERS[step[1]])
                pieces = [
                    block[i :: step[2] + 1]
                    and block[len(block) * i // (step[2] + 1) : len(block) * (i + 1) // (step[2] + 1)]
                    for i in range(step[2] + 1)
                ]
                wire_bytes += frames.frame(
                    frames.HEADERS, 0 if len(pieces) > 1 else frames.END_HEADERS, stream_id, pieces[0]
                )
                for i, piece in enumerate(pieces[1:], 2):
                    wire_bytes += frames.frame(
                        frames.CONTINUATION, frames.END_HEADERS if i == len(pieces) else 0, stream_id, piece
                    )
            elif what == "raw":
                _, kind, flags, stream_id, payload = step
                wire_bytes += frames.frame(kind, flags, stream_id, payload)
            else:
                pieces = [bytes(wire_bytes)]
                for cut in cuts:  # arbitrary piece boundaries
                    last = pieces.pop()
                    pieces += [last[:cut], last[cut:]]
                wire_bytes.clear()
                for piece in pieces:
                    if piece:
                        feed(piece)
                if what == "drain":
                    transport.drain_peer()
                loop.run_until_complete(asyncio.sleep(0))
                loop.run_until_complete(asyncio.sleep(0))
        if wire_bytes:
            feed(bytes(wire_bytes))
        for _ in range(3):
            loop.run_until_complete(asyncio.sleep(0))
        # What the server wrote is HTTP/2 frames, whole.
        written, used = frames.parse_frames(bytearray(transport.written), 1 << 24)
        assert used == len(transport.written)
        assert written[0][0] == frames.SETTINGS
        event(
            f"broken={connection._broken} streams_opened={connection._last_stream_id > 0} "
            f"trips={','.join(sorted(server.trips))}"
        )
        connection.connection_lost(None)
        for _ in range(3):
            loop.run_until_complete(asyncio.sleep(0))
        assert server.open_streams == 0
        assert server.buffered_total == 0
        assert connection.buffered == 0
        assert server.connections == 0
    finally:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()
