"""danube's gRPC server (danube.server.h2grpc) against the real grpcio client, and raw HTTP/2.

Each test starts an H2Server on 127.0.0.1 on a free port, in this test's event loop, with a
small test service (identity serializers: bytes in, bytes out) and stops it in a finally.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import h2.config
import h2.connection
import h2.events
import hpack
import pytest

from danube.server.h2grpc import H2Server, ServerLimits, frames, wire

SERVICE = "t.Test"
events: dict[str, asyncio.Event] = {}


async def echo(request: bytes, context) -> bytes:
    if request == b"abort":
        await context.abort(grpc.StatusCode.NOT_FOUND, "no such thing: 100% caf\u00e9")
    if request == b"boom":
        raise RuntimeError("handler bug")
    if request == b"sleep":
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            events["cancelled"].set()
            raise
    if request.startswith(b"nap:"):
        await asyncio.sleep(float(request[4:]))
    return request


async def meta(request: bytes, context) -> bytes:
    md = dict(context.invocation_metadata())
    remaining = context.time_remaining()
    return f"{md.get('x-key')}|{md.get('x-blob-bin')!r}|{context.peer().split(':')[0]}|{remaining is not None and 0 < remaining <= 5.1}".encode()  # grpc rounds 5 s up to "5010m"


async def big_meta(request: bytes, context) -> bytes:
    await context.send_initial_metadata((("x-big", "m" * 40000),))
    return request


async def stream_out(request: bytes, context):
    count, size = (int(x) for x in request.split(b","))
    for i in range(count):
        yield bytes([i % 251]) * size


async def stream_written(request: bytes, context) -> None:
    for i in range(int(request)):
        await context.write(b"%d" % i)
    context.set_code(grpc.StatusCode.OK)


async def bidi(request_iterator, context):
    async for message in request_iterator:
        yield message[::-1]


async def lazy_sum(request_iterator, context) -> bytes:
    await asyncio.sleep(float(dict(context.invocation_metadata()).get("x-delay", "0")))
    total = count = 0
    while True:
        message = await context.read()
        if message is grpc.aio.EOF:
            break
        total += len(message)
        count += 1
    return b"%d,%d" % (count, total)


_shared: list[bytes] = []


def shared_message() -> bytes:
    """One 8 MiB message, allocated once: what a broker delivers to many subscriptions."""
    if not _shared:
        _shared.append(bytes(range(256)) * (8 * 1024 * 1024 // 256))
    return _shared[0]


async def shared(request: bytes, context):
    """Writes the shared message ``int(request)`` times as ``wire.Encoded`` parts (never copied),
    then holds the stream open as a subscription on a quiet topic does."""
    for _ in range(int(request)):
        yield wire.Encoded((shared_message(),))
    await asyncio.sleep(60)


sink_counts = {"direct": 0, "queued": 0}


async def sink_echo(request_iterator, context):
    """Requests taken by callback (set_message_sink), answers written from it when the handler is
    not writing (write_nowait), queued otherwise: the per-call paths of the batch lane."""
    backlog: asyncio.Queue = asyncio.Queue()
    idle = [False]

    def on_message(message) -> None:
        if message is grpc.aio.EOF:
            backlog.put_nowait(None)
        elif idle[0] and backlog.empty() and context.write_nowait(message[::-1]):
            sink_counts["direct"] += 1
        else:
            sink_counts["queued"] += 1
            backlog.put_nowait(message[::-1])

    context.set_message_sink(on_message)
    while True:
        idle[0] = True
        item = await backlog.get()
        idle[0] = False
        if item is None:
            return
        yield item


async def paused_sum(request_iterator, context) -> bytes:
    """Takes requests by a sink that pauses after the first one and resumes 1.5 s later: the
    client must wait meanwhile, as for a handler that does not read."""
    loop = asyncio.get_running_loop()
    ended = loop.create_future()
    sizes: list[int] = []

    def on_message(message) -> None:
        if message is grpc.aio.EOF:
            ended.set_result(None)
            return
        sizes.append(len(message))
        if len(sizes) == 1:
            context.pause_messages()
            loop.call_later(1.5, context.resume_messages)

    context.set_message_sink(on_message)
    await ended
    return b"%d,%d" % (len(sizes), sum(sizes))


def _handlers():
    return {
        "SinkEcho": grpc.stream_stream_rpc_method_handler(sink_echo),
        "PausedSum": grpc.stream_unary_rpc_method_handler(paused_sum),
        "Echo": grpc.unary_unary_rpc_method_handler(echo),
        "Meta": grpc.unary_unary_rpc_method_handler(meta),
        "BigMeta": grpc.unary_unary_rpc_method_handler(big_meta),
        "StreamOut": grpc.unary_stream_rpc_method_handler(stream_out),
        "StreamWritten": grpc.unary_stream_rpc_method_handler(stream_written),
        "Shared": grpc.unary_stream_rpc_method_handler(shared),
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
        "LazySum": grpc.stream_unary_rpc_method_handler(lazy_sum),
        "Parsed": grpc.unary_unary_rpc_method_handler(
            echo, request_deserializer=lambda b: (_ for _ in ()).throw(ValueError("not a message"))
        ),
    }


@contextlib.asynccontextmanager
async def serving(limits: ServerLimits | None = None, *, generic: bool = False):
    events["cancelled"] = asyncio.Event()
    server = H2Server(limits)
    if generic:
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, _handlers()),))
    else:
        server.add_registered_method_handlers(SERVICE, _handlers())
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield server, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


@contextlib.asynccontextmanager
async def channel_to(address: str):
    channel = grpc.aio.insecure_channel(address)
    try:
        yield channel
    finally:
        await channel.close()


def method(channel, name: str, kind: str = "unary_unary"):
    return getattr(channel, kind)(f"/{SERVICE}/{name}")


async def test_unary_calls_in_parallel_come_back_to_their_callers():
    async with serving() as (_, address), channel_to(address) as channel:
        call = method(channel, "Echo")
        payloads = [b"m%d" % i * (i % 7 + 1) for i in range(300)]
        assert await asyncio.gather(*(call(p) for p in payloads)) == payloads
        assert await call(b"") == b""


async def test_generic_handlers_serve_too():
    async with serving(generic=True) as (_, address), channel_to(address) as channel:
        assert await method(channel, "Echo")(b"hi") == b"hi"


async def test_abort_reaches_the_client_with_its_code_and_message():
    async with serving() as (_, address), channel_to(address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await method(channel, "Echo")(b"abort")
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert info.value.details() == "no such thing: 100% caf\u00e9"


async def test_a_handler_bug_is_unknown_and_the_server_keeps_serving(caplog):
    async with serving() as (_, address), channel_to(address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await method(channel, "Echo")(b"boom")
        assert info.value.code() == grpc.StatusCode.UNKNOWN
        assert "RuntimeError: handler bug" in info.value.details()
        assert "unhandled error in /t.Test/Echo" in caplog.text
        assert await method(channel, "Echo")(b"after") == b"after"


async def test_an_unknown_method_is_unimplemented():
    async with serving() as (_, address), channel_to(address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await channel.unary_unary("/t.Test/Nope")(b"x")
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "/t.Test/Nope" in info.value.details()


async def test_a_request_that_does_not_parse_is_internal_with_the_reason():
    async with serving() as (_, address), channel_to(address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await method(channel, "Parsed")(b"\xff")
        assert info.value.code() == grpc.StatusCode.INTERNAL
        assert "cannot parse the request of /t.Test/Parsed: not a message" in info.value.details()


async def test_metadata_peer_and_deadline_reach_the_handler():
    async with serving() as (_, address), channel_to(address) as channel:
        answer = await method(channel, "Meta")(b"", metadata=(("x-key", "v1"), ("x-blob-bin", b"\x00\xff")), timeout=5)
        assert answer == b"v1|b'\\x00\\xff'|ipv4|True"


async def test_a_server_stream_larger_than_every_window_arrives_intact():
    async with serving() as (_, address), channel_to(address) as channel:
        count, size = 40, 1024 * 1024 + 3  # 40 MiB: past the client's windows many times over
        got = [m async for m in method(channel, "StreamOut", "unary_stream")(b"%d,%d" % (count, size))]
        assert len(got) == count
        assert all(m == bytes([i % 251]) * size for i, m in enumerate(got))


async def test_context_write_streams_and_the_call_ends_ok():
    async with serving() as (_, address), channel_to(address) as channel:
        call = method(channel, "StreamWritten", "unary_stream")(b"100")
        assert [m async for m in call] == [b"%d" % i for i in range(100)]
        assert await call.code() == grpc.StatusCode.OK


async def test_bidi_echoes_every_message_in_order():
    async with serving() as (_, address), channel_to(address) as channel:
        messages = [bytes([i % 256]) * (i * 997 % 200_000) + b"end" for i in range(120)]

        async def requests():
            for m in messages:
                yield m

        got = [m async for m in method(channel, "Bidi", "stream_stream")(requests())]
        assert got == [m[::-1] for m in messages]


async def test_a_handler_that_does_not_read_pushes_back_on_the_client():
    async with serving() as (_, address), channel_to(address) as channel:
        call = method(channel, "LazySum", "stream_unary")(metadata=(("x-delay", "1.5"),))
        chunk = b"z" * (1024 * 1024)
        written = 0

        async def write_all():
            nonlocal written
            for _ in range(48):
                await call.write(chunk)
                written += 1
            await call.done_writing()

        writer = asyncio.ensure_future(write_all())
        await asyncio.sleep(1.0)
        # The handler has read nothing yet: the stream's 8 MiB window plus the few whole
        # messages let through, not all 48 MiB.
        assert written < 30
        await writer
        assert await call == b"48,%d" % (48 * len(chunk))


async def test_a_paused_message_sink_pushes_back_on_the_client_until_it_resumes():
    async with serving() as (_, address), channel_to(address) as channel:
        call = method(channel, "PausedSum", "stream_unary")()
        chunk = b"z" * (1024 * 1024)
        written = 0

        async def write_all():
            nonlocal written
            for _ in range(48):
                await call.write(chunk)
                written += 1
            await call.done_writing()

        writer = asyncio.ensure_future(write_all())
        await asyncio.sleep(1.0)
        # Paused after the first message: the stream's 8 MiB window plus the few whole
        # messages let through, not all 48 MiB.
        assert written < 30
        await writer
        assert await call == b"48,%d" % (48 * len(chunk))


async def test_a_deadline_ends_the_call_with_deadline_exceeded():
    async with serving() as (_, address), channel_to(address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await method(channel, "Echo")(b"sleep", timeout=0.3)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await asyncio.wait_for(events["cancelled"].wait(), 5)
        assert await method(channel, "Echo")(b"ok", timeout=5) == b"ok"


async def test_a_client_cancel_cancels_the_handler():
    async with serving() as (_, address), channel_to(address) as channel:
        call = method(channel, "Echo")(b"sleep")
        await asyncio.sleep(0.3)
        call.cancel()
        await asyncio.wait_for(events["cancelled"].wait(), 5)
        assert await method(channel, "Echo")(b"still here") == b"still here"


async def test_an_oversized_request_is_resource_exhausted_and_the_connection_lives_on():
    async with serving(ServerLimits(max_receive_message_length=1000)) as (_, address), channel_to(address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await method(channel, "Echo")(b"x" * 5000)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "5000 vs. 1000" in info.value.details()
        assert await method(channel, "Echo")(b"x" * 1000) == b"x" * 1000


async def test_stop_lets_calls_in_flight_finish_then_refuses_new_ones():
    server = H2Server()
    server.add_registered_method_handlers(SERVICE, _handlers())
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with channel_to(f"127.0.0.1:{port}") as channel:
            assert await method(channel, "Echo")(b"warm") == b"warm"
            in_flight = asyncio.ensure_future(method(channel, "Echo")(b"nap:0.4"))
            await asyncio.sleep(0.1)
            await server.stop(3)
            assert await in_flight == b"nap:0.4"
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await method(channel, "Echo")(b"late", timeout=2)
            assert info.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    finally:
        await server.stop(None)


async def test_stop_cancels_what_outlives_the_grace_period_with_unavailable():
    async with serving() as (server, address), channel_to(address) as channel:
        long_call = asyncio.ensure_future(method(channel, "Echo")(b"sleep"))
        await asyncio.sleep(0.2)
        await server.stop(0.2)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await long_call
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert events["cancelled"].is_set()


# ---------------------------------------------------------------- raw HTTP/2 clients


async def raw_request(address: str, headers: list, body: bytes = b"") -> tuple[list, bytes, list]:
    """One request by hand with the h2 library as a client; (headers, data, trailers)."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    stream = conn.get_next_available_stream_id()
    conn.send_headers(stream, headers, end_stream=not body)
    if body:
        conn.send_data(stream, body, end_stream=True)
    writer.write(conn.data_to_send())
    got_headers, data, trailers = [], b"", []
    try:
        while True:
            chunk = await asyncio.wait_for(reader.read(65536), 5)
            if not chunk:
                break
            ended = False
            for event in conn.receive_data(chunk):
                if isinstance(event, h2.events.ResponseReceived):
                    got_headers = event.headers
                elif isinstance(event, h2.events.DataReceived):
                    data += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, stream)
                elif isinstance(event, h2.events.TrailersReceived):
                    trailers = event.headers
                elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                    ended = True
            writer.write(conn.data_to_send())
            if ended:
                break
    finally:
        writer.close()
    return got_headers, data, trailers


def grpc_headers(path: bytes, **extra: bytes) -> list:
    return [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", path),
        (b":authority", b"test"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ] + [(k.replace("_", "-").encode(), v) for k, v in extra.items()]


async def test_raw_unary_call_gets_headers_message_and_trailers():
    async with serving() as (_, address):
        headers, data, trailers = await raw_request(
            address, grpc_headers(b"/t.Test/Echo"), wire.message_prefix(3) + b"abc"
        )
        assert dict(headers)[b":status"] == b"200"
        assert data == wire.message_prefix(3) + b"abc"
        assert dict(trailers)[b"grpc-status"] == b"0"


async def test_a_malformed_timeout_is_invalid_argument():
    async with serving() as (_, address):
        headers, _, _ = await raw_request(
            address, grpc_headers(b"/t.Test/Echo", grpc_timeout=b"soon"), wire.message_prefix(1) + b"a"
        )
        fields = dict(headers)
        assert fields[b"grpc-status"] == str(grpc.StatusCode.INVALID_ARGUMENT.value[0]).encode()
        assert b"grpc-timeout" in fields[b"grpc-message"]


async def test_a_compressed_message_is_unimplemented():
    async with serving() as (_, address):
        headers, _, _ = await raw_request(
            address, grpc_headers(b"/t.Test/Echo", grpc_encoding=b"gzip"), b"\x01" + (3).to_bytes(4, "big") + b"abc"
        )
        assert dict(headers)[b"grpc-status"] == str(grpc.StatusCode.UNIMPLEMENTED.value[0]).encode()


async def test_a_unary_call_with_two_messages_is_internal():
    async with serving() as (_, address):
        body = wire.message_prefix(1) + b"a" + wire.message_prefix(1) + b"b"
        headers, _, _ = await raw_request(address, grpc_headers(b"/t.Test/Echo"), body)
        assert dict(headers)[b"grpc-status"] == str(grpc.StatusCode.INTERNAL.value[0]).encode()


async def test_a_request_ending_inside_a_message_is_internal():
    async with serving() as (_, address):
        headers, _, _ = await raw_request(address, grpc_headers(b"/t.Test/Echo"), wire.message_prefix(10) + b"abc")
        fields = dict(headers)
        assert fields[b"grpc-status"] == str(grpc.StatusCode.INTERNAL.value[0]).encode()
        assert b"inside a message" in fields[b"grpc-message"]


@pytest.mark.parametrize(
    "method_name, content_type, status", [(b"GET", b"application/grpc", b"405"), (b"POST", b"text/plain", b"415")]
)
async def test_requests_that_are_not_grpc_get_a_plain_http_status(method_name, content_type, status):
    async with serving() as (_, address):
        headers = [
            (b":method", method_name),
            (b":scheme", b"http"),
            (b":path", b"/t.Test/Echo"),
            (b":authority", b"test"),
            (b"content-type", content_type),
        ]
        got, _, _ = await raw_request(address, headers)
        assert dict(got)[b":status"] == status


async def test_garbage_instead_of_http2_closes_that_connection_only():
    async with serving() as (_, address), channel_to(address) as channel:
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\x00" * 100)
        while await asyncio.wait_for(reader.read(65536), 5):
            pass  # the server's SETTINGS, then the close
        assert reader.at_eof()
        writer.close()
        assert await method(channel, "Echo")(b"fine") == b"fine"


# ---------------------------------------------------------------- configuration


def test_binding_a_port_in_use_or_a_bad_address_is_a_runtime_error():
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        server = H2Server()
        with pytest.raises(RuntimeError, match="cannot bind"):
            server.add_insecure_port(f"127.0.0.1:{taken.getsockname()[1]}")
        with pytest.raises(RuntimeError, match="not a number"):
            server.add_insecure_port("127.0.0.1:http")
    finally:
        taken.close()


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_receive_message_length", 0),
        ("max_frame_size", 1000),
        ("stream_window", 2**31),
        ("connection_window", 100),
        ("max_concurrent_streams", True),
    ],
)
def test_limits_outside_what_http2_allows_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        ServerLimits(**{field: value})


# ---------------------------------------------------------------- HTTP/2 rules, frame by frame


class RawConnection:
    """A hand-driven HTTP/2 client: frames out as given, frames back as they come."""

    def __init__(self, reader, writer) -> None:
        self.reader, self.writer = reader, writer
        self.buffer = bytearray()
        self.encoder = hpack.Encoder()

    def send(self, *raw: bytes) -> None:
        self.writer.write(b"".join(raw))

    def headers(self, stream_id: int, headers: list, *, end_stream: bool = False, end_headers: bool = True) -> bytes:
        flags = (frames.END_STREAM if end_stream else 0) | (frames.END_HEADERS if end_headers else 0)
        return frames.frame(frames.HEADERS, flags, stream_id, self.encoder.encode(headers))

    async def until(self, wanted, seconds: float = 5.0) -> list:
        """Frames received until ``wanted(frame)`` is true for one, or the server closes."""
        got = []
        while True:
            parsed, used = frames.parse_frames(self.buffer, 1 << 24)
            del self.buffer[:used]
            got += parsed
            if any(wanted(f) for f in parsed):
                return got
            chunk = await asyncio.wait_for(self.reader.read(65536), seconds)
            if not chunk:
                return got
            self.buffer += chunk


@contextlib.asynccontextmanager
async def raw_connection(address: str, settings: list | None = None):
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    conn = RawConnection(reader, writer)
    conn.send(frames.PREFACE, frames.settings(settings or []))
    try:
        yield conn
    finally:
        writer.close()


def goaway_code(got: list) -> int | None:
    for kind, _, _, payload in got:
        if kind == frames.GOAWAY:
            return int.from_bytes(payload[4:8], "big")
    return None


async def test_ping_is_answered_with_the_same_payload():
    async with serving() as (_, address), raw_connection(address) as conn:
        conn.send(frames.frame(frames.PING, 0, 0, b"12345678"))
        got = await conn.until(lambda f: f[0] == frames.PING)
        assert (frames.PING, frames.ACK, 0, b"12345678") in got


@pytest.mark.parametrize(
    "case", ["even stream", "interrupted header block", "push promise", "data on stream 0", "bad window size"]
)
async def test_protocol_errors_end_that_connection_with_goaway_and_the_server_serves_on(case):
    async with serving() as (_, address), channel_to(address) as channel, raw_connection(address) as conn:
        call = grpc_headers(b"/t.Test/Echo")
        if case == "even stream":
            conn.send(conn.headers(2, call))
        elif case == "interrupted header block":
            conn.send(conn.headers(1, call, end_headers=False), frames.frame(frames.PING, 0, 0, b"x" * 8))
        elif case == "push promise":
            conn.send(frames.frame(frames.PUSH_PROMISE, frames.END_HEADERS, 1, b"\x00\x00\x00\x02"))
        elif case == "data on stream 0":
            conn.send(frames.frame(frames.DATA, 0, 0, b"abc"))
        else:
            conn.send(frames.settings([(frames.INITIAL_WINDOW_SIZE, 2**31)]))
        got = await conn.until(lambda f: f[0] == frames.GOAWAY)
        expected = frames.FLOW_CONTROL_ERROR if case == "bad window size" else frames.PROTOCOL_ERROR
        assert goaway_code(got) == expected
        assert await conn.reader.read() == b""  # and the server hung up
        assert await method(channel, "Echo")(b"still here") == b"still here"


async def test_data_beyond_the_connection_window_is_a_flow_control_error():
    limits = ServerLimits(connection_window=65535, stream_window=1024 * 1024)
    async with serving(limits) as (_, address), raw_connection(address) as conn:
        conn.send(conn.headers(1, grpc_headers(b"/t.Test/LazySum")))
        conn.send(*(frames.frame(frames.DATA, 0, 1, b"\x00" * 16384) for _ in range(5)))
        got = await conn.until(lambda f: f[0] == frames.GOAWAY)
        assert goaway_code(got) == frames.FLOW_CONTROL_ERROR


async def test_data_beyond_a_stream_window_resets_that_stream_only():
    limits = ServerLimits(stream_window=16384)
    async with serving(limits) as (_, address), raw_connection(address) as conn:
        conn.send(conn.headers(1, grpc_headers(b"/t.Test/LazySum", x_delay=b"5")))
        conn.send(frames.frame(frames.DATA, 0, 1, b"\x00" * 16384), frames.frame(frames.DATA, 0, 1, b"\x00" * 100))
        got = await conn.until(lambda f: f[0] == frames.RST_STREAM)
        assert (frames.RST_STREAM, 0, 1, frames.FLOW_CONTROL_ERROR.to_bytes(4, "big")) in got
        conn.send(
            conn.headers(3, grpc_headers(b"/t.Test/Echo")),
            frames.frame(frames.DATA, frames.END_STREAM, 3, wire.message_prefix(2) + b"ok"),
        )
        got = await conn.until(lambda f: f[0] == frames.HEADERS and f[2] == 3 and f[1] & frames.END_STREAM)
        assert any(kind == frames.DATA and sid == 3 and payload.endswith(b"ok") for kind, _, sid, payload in got)


@pytest.mark.parametrize("window, copies", [(4096, 200), (3, 2)])  # 3: even the 5-byte prefix is split
async def test_a_response_waits_for_the_clients_window_and_keeps_to_its_frame_size(window, copies):
    body = bytes(range(256)) * copies  # more than the window: several frames, each within it
    async with serving() as (_, address), raw_connection(address, [(frames.INITIAL_WINDOW_SIZE, window)]) as conn:
        conn.send(
            conn.headers(1, grpc_headers(b"/t.Test/Echo")),
            frames.frame(frames.DATA, frames.END_STREAM, 1, wire.message_prefix(len(body)) + body),
        )
        data = bytearray()
        while True:
            got = await conn.until(lambda f: f[0] in (frames.DATA, frames.HEADERS))
            assert got, "the server hung up"
            for kind, flags, sid, payload in got:
                if kind == frames.DATA:
                    assert len(payload) <= window  # never past the window the client gave
                    data += payload
                    conn.send(frames.window_update(1, len(payload)))
            if any(kind == frames.HEADERS and flags & frames.END_STREAM for kind, flags, _, _ in got):
                break
        assert bytes(data) == wire.message_prefix(len(body)) + body


async def test_large_response_metadata_goes_out_in_continuation_frames():
    async with serving() as (_, address), raw_connection(address) as conn:
        conn.send(
            conn.headers(1, grpc_headers(b"/t.Test/BigMeta"), end_stream=False),
            frames.frame(frames.DATA, frames.END_STREAM, 1, wire.message_prefix(1) + b"x"),
        )
        got = await conn.until(lambda f: f[0] == frames.HEADERS and f[1] & frames.END_STREAM)
        kinds = [kind for kind, *_ in got if kind in (frames.HEADERS, frames.CONTINUATION)]
        assert frames.CONTINUATION in kinds
        decoder = hpack.Decoder(max_header_list_size=1 << 20)
        block = b"".join(p for kind, _, _, p in got if kind in (frames.HEADERS, frames.CONTINUATION))
        headers = dict(decoder.decode(block, raw=True))  # response headers and trailers
        assert headers[b"x-big"] == b"m" * 40000


async def test_requests_by_callback_and_answers_written_from_it_keep_their_order():
    # small messages go straight out from the callback; ones larger than the stream's window
    # wait in the handler's queue, and everything arrives in the order it was sent
    sizes = [3] * 50 + [200_000, 5, 5, 300_000] + [7] * 50
    messages = [bytes([i % 251]) * size + b"|%d" % i for i, size in enumerate(sizes)]
    sink_counts.update(direct=0, queued=0)
    async with serving() as (_, address), channel_to(address) as channel:
        call = method(channel, "SinkEcho", "stream_stream")()
        got = []
        for m in messages:  # one at a time: each answer before the next request
            await call.write(m)
            got.append(await asyncio.wait_for(call.read(), 10))
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        assert got == [m[::-1] for m in messages]
        assert await call.code() == grpc.StatusCode.OK
        burst = method(channel, "SinkEcho", "stream_stream")(iter(messages))  # all at once
        assert [r async for r in burst] == [m[::-1] for m in messages]
    assert sink_counts["direct"] > 50 and sink_counts["queued"] >= 2
