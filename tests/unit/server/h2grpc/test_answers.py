"""What a call's answer puts on the wire, on a fake transport: a unary call that ends OK answers
headers, message and trailers in one go; one that cannot (a window too small, trailing metadata,
a status other than OK) answers the long way with the same meaning; a stream answers each
request message from its message sink, which may pause and resume taking them (backpressure)."""

from __future__ import annotations

import asyncio

import grpc
import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.server.h2grpc import H2Limits, H2Server, frames, wire
from danube.server.h2grpc.connection import GrpcConnection
from tests.unit.server.h2grpc.test_connection_fuzz import FakeTransport

LIMITS = H2Limits(handshake_timeout=0, idle_timeout=0)
REQUEST_HEADERS = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":authority", b"x"),
    (b"content-type", b"application/grpc"),
]


async def echo(request: bytes, context) -> bytes:
    return request


async def echo_with_trailer(request: bytes, context) -> bytes:
    context.set_trailing_metadata((("x-seen", str(len(request))),))
    return request


async def echo_not_found(request: bytes, context) -> bytes:
    context.set_code(grpc.StatusCode.NOT_FOUND)
    context.set_details("no such thing")
    return request


async def echo_stream(requests, context) -> None:
    ended = asyncio.get_running_loop().create_future()

    def sink(message) -> None:
        if message is grpc.aio.EOF:
            ended.set_result(None)
        elif not context.write_nowait(message):
            raise AssertionError("the answer had to wait")

    context.set_message_sink(sink)
    await ended


def strict(data: bytes) -> bytes:
    if data.startswith(b"bad"):
        raise ValueError("not a message")
    return data


class Peer:
    """A client's side of one connection: what it sends, and the frames it got back."""

    def __init__(self, loop: asyncio.AbstractEventLoop, client_settings=(), handlers=None) -> None:
        self.loop = loop
        self.server = H2Server(LIMITS)
        self.server.loop = loop
        self.statuses: list[tuple[str, grpc.StatusCode]] = []
        self.server.on_status = lambda method, code: self.statuses.append((method, code))
        self.server.add_registered_method_handlers(
            "t.T",
            {
                "Echo": grpc.unary_unary_rpc_method_handler(echo),
                "Trailer": grpc.unary_unary_rpc_method_handler(echo_with_trailer),
                "NotFound": grpc.unary_unary_rpc_method_handler(echo_not_found),
                "Stream": grpc.stream_stream_rpc_method_handler(echo_stream),
                "Strict": grpc.stream_stream_rpc_method_handler(echo_stream, request_deserializer=strict),
                **(handlers or {}),
            },
        )
        self.connection = GrpcConnection(self.server)
        self.transport = FakeTransport(self.connection)
        self.connection.connection_made(self.transport)
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.send(frames.PREFACE + frames.settings(list(client_settings)))
        self.read = 0

    def send(self, data: bytes) -> None:
        self.connection.data_received(data)
        for _ in range(4):
            self.loop.run_until_complete(asyncio.sleep(0))

    def open(self, stream_id: int, method: str, end_stream: bool = False) -> bytes:
        headers = [*REQUEST_HEADERS, (b":path", f"/t.T/{method}".encode())]
        flags = frames.END_HEADERS | (frames.END_STREAM if end_stream else 0)
        return frames.frame(frames.HEADERS, flags, stream_id, self.encoder.encode(headers))

    def frames_since(self) -> list[tuple[int, int, int, object]]:
        """The frames written since the last look; header blocks decoded."""
        data = bytearray(self.transport.written[self.read :])
        parsed, used = frames.parse_frames(data, 1 << 24)
        assert used == len(data), "the server wrote a partial frame"
        self.read += used
        out = []
        for kind, flags, stream_id, payload in parsed:
            if kind == frames.HEADERS:
                payload = [(bytes(n), bytes(v)) for n, v in self.decoder.decode(payload, raw=True)]
            out.append((kind, flags, stream_id, payload))
        return out


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.close()


def message(body: bytes) -> bytes:
    return wire.message_prefix(len(body)) + body


def test_a_unary_call_that_ends_ok_is_answered_in_three_frames_at_once(loop):
    peer = Peer(loop)
    peer.frames_since()  # the server's SETTINGS and window
    peer.send(peer.open(1, "Echo") + frames.frame(frames.DATA, frames.END_STREAM, 1, message(b"hello")))
    answer = [f for f in peer.frames_since() if f[2] == 1]
    assert answer == [
        (frames.HEADERS, frames.END_HEADERS, 1, [(b":status", b"200"), (b"content-type", b"application/grpc")]),
        (frames.DATA, 0, 1, message(b"hello")),
        (frames.HEADERS, frames.END_HEADERS | frames.END_STREAM, 1, [(b"grpc-status", b"0")]),
    ]
    assert peer.statuses == [("/t.T/Echo", grpc.StatusCode.OK)]
    assert not peer.connection._streams and peer.server.open_streams == 0
    assert not peer.connection.busy and peer.server.buffered_total == 0


def test_an_answer_over_the_stream_window_waits_for_window_then_ends_the_same(loop):
    peer = Peer(loop, client_settings=[(frames.INITIAL_WINDOW_SIZE, 8)])
    peer.frames_since()
    body = bytes(range(40))
    peer.send(peer.open(1, "Echo") + frames.frame(frames.DATA, frames.END_STREAM, 1, message(body)))
    first = [f for f in peer.frames_since() if f[2] == 1]
    assert [f[0] for f in first] == [frames.HEADERS, frames.DATA]  # 8 bytes: the window
    assert len(first[1][3]) == 8
    peer.send(frames.window_update(1, 1000))
    rest = [f for f in peer.frames_since() if f[2] == 1]
    assert b"".join([first[1][3], *(f[3] for f in rest if f[0] == frames.DATA)]) == message(body)
    assert rest[-1] == (frames.HEADERS, frames.END_HEADERS | frames.END_STREAM, 1, [(b"grpc-status", b"0")])
    assert peer.statuses == [("/t.T/Echo", grpc.StatusCode.OK)]
    assert peer.server.open_streams == 0


def test_trailing_metadata_and_other_statuses_go_the_long_way_with_their_trailers(loop):
    peer = Peer(loop)
    peer.frames_since()
    peer.send(peer.open(1, "Trailer") + frames.frame(frames.DATA, frames.END_STREAM, 1, message(b"abc")))
    peer.send(peer.open(3, "NotFound") + frames.frame(frames.DATA, frames.END_STREAM, 3, message(b"x")))
    written = peer.frames_since()
    trailer = [f for f in written if f[2] == 1]
    assert trailer[1] == (frames.DATA, 0, 1, message(b"abc"))
    assert trailer[-1][3] == [(b"grpc-status", b"0"), (b"x-seen", b"3")]
    not_found = [f for f in written if f[2] == 3]
    assert not_found[-1][3] == [(b"grpc-status", b"5"), (b"grpc-message", b"no such thing")]
    assert peer.statuses == [("/t.T/Trailer", grpc.StatusCode.OK), ("/t.T/NotFound", grpc.StatusCode.NOT_FOUND)]
    assert peer.server.open_streams == 0


def test_a_stream_answers_each_message_from_its_sink_in_order(loop):
    peer = Peer(loop)
    peer.frames_since()
    bodies = [f"m{i}".encode() * (i + 1) for i in range(6)]
    peer.send(peer.open(1, "Stream") + b"".join(frames.frame(frames.DATA, 0, 1, message(b)) for b in bodies[:3]))
    peer.send(b"".join(frames.frame(frames.DATA, 0, 1, message(b)) for b in bodies[3:]))
    data = [f[3] for f in peer.frames_since() if f[2] == 1 and f[0] == frames.DATA]
    assert data == [message(b) for b in bodies]  # one whole message per DATA frame
    peer.send(frames.frame(frames.DATA, frames.END_STREAM, 1, b""))
    last = peer.frames_since()
    assert last[-1] == (frames.HEADERS, frames.END_HEADERS | frames.END_STREAM, 1, [(b"grpc-status", b"0")])
    assert peer.server.open_streams == 0 and peer.server.buffered_total == 0


def test_an_answer_given_as_fields_is_one_frame_within_the_window_or_not_sent(loop):
    """``write_fields_nowait``: the message protobuf would write for uint64 fields 1, 2, ...,
    in one DATA frame while it fits the stream's window; False and nothing queued when not."""
    sent: list[bool] = []

    async def fields_stream(requests, context) -> None:
        ended = asyncio.get_running_loop().create_future()

        def sink(message) -> None:
            if message is grpc.aio.EOF:
                ended.set_result(None)
            else:
                sent.append(context.write_fields_nowait((len(message), 0, 300)))

        context.set_message_sink(sink)
        await ended

    handlers = {"Fields": grpc.stream_stream_rpc_method_handler(fields_stream)}
    peer = Peer(loop, client_settings=[(frames.INITIAL_WINDOW_SIZE, 12)], handlers=handlers)
    peer.frames_since()
    peer.send(peer.open(1, "Fields") + frames.frame(frames.DATA, 0, 1, message(b"abc") + message(b"de")))
    data = [f[3] for f in peer.frames_since() if f[2] == 1 and f[0] == frames.DATA]
    assert data == [message(b"\x08\x03\x18\xac\x02")]  # field 1 = 3, field 2 left out (0), field 3 = 300
    assert sent == [True, False]  # 10 bytes of a 12-byte window: the second did not fit
    peer.send(frames.window_update(1, 100) + frames.frame(frames.DATA, 0, 1, message(b"f")))
    data = [f[3] for f in peer.frames_since() if f[2] == 1 and f[0] == frames.DATA]
    assert data == [message(b"\x08\x01\x18\xac\x02")] and sent == [True, False, True]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(min_size=0, max_size=40), min_size=1, max_size=8), st.lists(st.integers(0, 400), max_size=6))
def test_a_stream_cut_into_reads_anywhere_is_answered_the_same(bodies, cuts):
    # a read is parsed where it is when nothing waits in the buffer, and only what it leaves over
    # (a frame cut short) is buffered: every way of cutting the bytes gives the same answers
    loop = asyncio.new_event_loop()
    try:
        peer = Peer(loop)
        peer.frames_since()
        wire_bytes = peer.open(1, "Stream") + b"".join(frames.frame(frames.DATA, 0, 1, message(b)) for b in bodies)
        points = sorted({min(c, len(wire_bytes)) for c in cuts} | {0, len(wire_bytes)})
        for start, end in zip(points, points[1:]):
            peer.send(wire_bytes[start:end])
        data = [f[3] for f in peer.frames_since() if f[2] == 1 and f[0] == frames.DATA]
        assert data == [message(b) for b in bodies]
        assert not peer.connection._buffer and not peer.connection._broken
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()


def connection_credit(peer: Peer) -> int:
    """The connection's receive window plus the credit owed back to the peer: constant while every
    byte received is either given back or held by a call."""
    return peer.connection._recv_window + peer.connection._recv_unacked


def test_a_message_the_sink_cannot_parse_ends_the_stream_internal_after_those_before_it(loop):
    peer = Peer(loop)
    peer.frames_since()
    credit = connection_credit(peer)
    bodies = [b"one", b"two", b"bad one", b"three"]
    peer.send(peer.open(1, "Strict") + frames.frame(frames.DATA, 0, 1, b"".join(message(b) for b in bodies)))
    written = [f for f in peer.frames_since() if f[2] == 1]
    assert [f[3] for f in written if f[0] == frames.DATA] == [message(b"one"), message(b"two")]
    trailers = [f for f in written if f[0] == frames.HEADERS][-1]
    assert trailers[1] & frames.END_STREAM
    assert written[-1] == (frames.RST_STREAM, 0, 1, (frames.NO_ERROR).to_bytes(4, "big"))  # the client still sends
    assert (b"grpc-status", b"13") in trailers[3]
    assert (b"grpc-message", b"cannot parse the request of /t.T/Strict: not a message") in trailers[3]
    assert peer.statuses == [("/t.T/Strict", grpc.StatusCode.INTERNAL)]
    assert connection_credit(peer) == credit  # the frame's window went back with the call
    assert peer.server.open_streams == 0 and peer.server.buffered_total == 0


def test_a_refused_message_gives_its_connection_window_back(loop):
    peer = Peer(loop)
    peer.frames_since()
    credit = connection_credit(peer)
    compressed = b"\x01" + (3).to_bytes(4, "big") + b"abc"
    peer.send(peer.open(1, "Stream") + frames.frame(frames.DATA, 0, 1, compressed))
    trailers = [f for f in peer.frames_since() if f[2] == 1 and f[0] == frames.HEADERS][-1]
    assert (b"grpc-status", b"12") in trailers[3]
    assert peer.statuses == [("/t.T/Stream", grpc.StatusCode.UNIMPLEMENTED)]
    assert connection_credit(peer) == credit
    # the next call on the connection has the whole window
    peer.send(peer.open(3, "Echo") + frames.frame(frames.DATA, frames.END_STREAM, 3, message(b"hi")))
    assert [f for f in peer.frames_since() if f[2] == 3][1] == (frames.DATA, 0, 3, message(b"hi"))


class PausingSink:
    """A handler taking its requests by sink that pauses once it holds ``room`` of them untaken
    (as the publish stream does with batches being stored): ``take`` lets some go and resumes."""

    def __init__(self, room: int, deserializer=None) -> None:
        self.room = room
        self.got: list = []
        self.held: list = []
        self.context = None
        self.handler = grpc.stream_stream_rpc_method_handler(self._run, request_deserializer=deserializer)
        self.resume_inside = False  # resume from inside the sink (a batch settled at once)

    async def _run(self, requests, context) -> None:
        self.context = context
        ended = asyncio.get_running_loop().create_future()

        def sink(message) -> None:
            self.got.append(message)
            if message is grpc.aio.EOF:
                ended.set_result(None)
                return
            self.held.append(message)
            if len(self.held) >= self.room:
                context.pause_messages()
                if self.resume_inside:
                    self.held.clear()
                    context.resume_messages()

        context.set_message_sink(sink)
        await ended

    def take(self) -> None:
        self.held.clear()
        self.context.resume_messages()


def data_frames(stream_id: int, bodies, end: bool = False) -> bytes:
    out = b"".join(frames.frame(frames.DATA, 0, stream_id, message(b)) for b in bodies)
    return out + (frames.frame(frames.DATA, frames.END_STREAM, stream_id, b"") if end else b"")


def test_a_paused_sink_gets_the_messages_that_waited_in_order_then_the_end(loop):
    pausing = PausingSink(room=2)
    peer = Peer(loop, handlers={"Pause": pausing.handler})
    bodies = [b"m%d" % i for i in range(7)]
    # one read: the sink pauses after the second message, the rest of the read waits
    peer.send(peer.open(1, "Pause") + data_frames(1, bodies[:5]))
    assert pausing.got == bodies[:2]
    assert peer.connection._calls[1].waits_on_server  # the idle check does not blame the peer
    peer.send(data_frames(1, bodies[5:], end=True))  # more, and the end: they wait too
    assert pausing.got == bodies[:2]
    pausing.take()
    assert pausing.got == bodies[:4]
    pausing.take()
    assert pausing.got == bodies[:6]  # paused again: the last message and the end wait
    pausing.take()
    assert pausing.got == [*bodies, grpc.aio.EOF]
    peer.send(b"")
    last = peer.frames_since()[-1]
    assert last[:3] == (frames.HEADERS, frames.END_HEADERS | frames.END_STREAM, 1)
    assert (b"grpc-status", b"0") in last[3]  # trailers-only: the handler wrote nothing
    assert peer.server.open_streams == 0 and peer.server.buffered_total == 0


def test_a_sink_resumed_from_inside_itself_keeps_taking_the_same_read_in_order(loop):
    pausing = PausingSink(room=1)
    pausing.resume_inside = True
    peer = Peer(loop, handlers={"Pause": pausing.handler})
    bodies = [b"m%d" % i for i in range(5)]
    peer.send(peer.open(1, "Pause") + data_frames(1, bodies, end=True))
    assert pausing.got == [*bodies, grpc.aio.EOF]
    assert peer.server.buffered_total == 0


def test_a_paused_sink_holds_the_stream_window_back_until_it_takes_its_messages(loop):
    pausing = PausingSink(room=1)
    peer = Peer(loop, handlers={"Pause": pausing.handler})
    credit = connection_credit(peer)
    body = bytes(100)
    peer.send(peer.open(1, "Pause") + data_frames(1, [body] * 8))
    assert pausing.got == [body]
    call = peer.connection._calls[1]
    assert call.buffered == 7 * len(body) and peer.server.buffered_total == call.buffered
    # past the few unread messages a handler may leave, their window is not given back
    assert connection_credit(peer) < credit
    for _ in range(7):
        pausing.take()
    assert pausing.got == [body] * 8
    assert connection_credit(peer) == credit and peer.server.buffered_total == 0  # all of it back once taken


def test_a_message_that_waited_and_cannot_be_parsed_ends_the_stream_internal(loop):
    pausing = PausingSink(room=1, deserializer=strict)
    peer = Peer(loop, handlers={"Pause": pausing.handler})
    peer.frames_since()
    credit = connection_credit(peer)
    peer.send(peer.open(1, "Pause") + data_frames(1, [b"one", b"bad", b"two"]))
    assert pausing.got == [b"one"]
    pausing.take()
    assert pausing.got == [b"one"]
    peer.send(b"")  # the loop turns that write the answer
    trailers = [f for f in peer.frames_since() if f[2] == 1 and f[0] == frames.HEADERS][-1]
    assert (b"grpc-status", b"13") in trailers[3]
    assert peer.statuses == [("/t.T/Pause", grpc.StatusCode.INTERNAL)]
    assert connection_credit(peer) == credit and peer.server.buffered_total == 0
