"""The client's HTTP/2 connection against a fake server peer: handshake, calls, status,
flow control both ways, resets, GOAWAY, connection loss and cancellation."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from danube.client.connection import broker_url_of
from danube.client.h2 import frames
from danube.client.h2.channel import H2Channel
from danube.client.h2.lane import H2BatchLane
from danube.client.h2.limits import H2ClientLimits
from danube.client.h2.reading import batch_reader
from danube.proto.danube_batch import batch_pb2 as pb
from tests.support.ports import free_port
from tests.unit.client.h2.peer import Peer, ack, messages_bytes, turn


async def opened(peer: Peer, settings=()):
    peer.feed(peer.settings(settings))
    call = peer.call()
    await turn()
    return call


async def test_handshake_acks_the_peers_settings_and_pings_and_opens_the_connection_window():
    peer = Peer()
    kinds = [(kind, flags) for kind, flags, _, _ in peer.sent()]
    assert kinds[0] == (frames.SETTINGS, 0)
    update = [p for kind, _, sid, p in peer.frames if kind == frames.WINDOW_UPDATE and sid == 0]
    assert frames.parse_u32(update[0], "") == peer.limits.connection_window - frames.DEFAULT_WINDOW
    peer.feed(peer.settings() + frames.ping(b"12345678"))
    await turn()
    sent = peer.sent()
    assert (frames.SETTINGS, frames.ACK, 0, b"") in sent
    assert (frames.PING, frames.ACK, 0, b"12345678") in sent


async def test_responses_headers_and_trailers_end_a_call_ok_and_writes_leave_in_one_transport_write():
    peer = Peer()
    call = await opened(peer)
    before = peer.transport.writes
    for seq in range(3):
        await call.write(pb.PublishRequest(sequence=seq))
    await turn()
    assert peer.transport.writes == before + 1  # three requests, one socket write
    data = [p for kind, _, sid, p in peer.sent() if kind == frames.DATA and sid == call.stream_id]
    reader = frames.MessageReader(1 << 20)
    assert [pb.PublishRequest.FromString(m).sequence for m in reader.feed(b"".join(data))] == [0, 1, 2]
    peer.feed(peer.response_headers(1) + frames.frame(frames.DATA, 0, 1, messages_bytes([ack(0), ack(1)])))
    assert [a.sequence for a in await call.read_batch()] == [0, 1]
    peer.feed(frames.frame(frames.DATA, 0, 1, messages_bytes([ack(2)])) + peer.trailers(1))
    assert [a.sequence for a in await call.read_batch()] == [2]
    assert await call.read_batch() == []
    assert await call.code() == grpc.StatusCode.OK
    await call.done_writing()  # after the end: nothing, no error


async def test_error_trailers_raise_aio_rpc_error_with_percent_decoded_message_and_redirect_metadata():
    peer = Peer()
    call = await opened(peer)
    await call.write(pb.PublishRequest(sequence=1))
    peer.feed(
        peer.response_headers(1)
        + peer.trailers(1, 14, "not here %E2%80%94 ask 100%25", [("x-danube-broker-url", "http://10.0.0.2:6650")])
    )
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call.read()
    error = raised.value
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert error.details() == "not here \u2014 ask 100%"
    assert broker_url_of(error) == "http://10.0.0.2:6650"
    with pytest.raises(asyncio.InvalidStateError):
        await call.write(pb.PublishRequest(sequence=2))


async def test_trailers_only_answer_and_non_grpc_http_status():
    peer = Peer()
    first = await opened(peer)
    second = peer.call()
    await turn()
    peer.feed(
        peer.headers(
            1, [(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "5")], end_stream=True
        )
        + peer.headers(3, [(":status", "503"), ("content-type", "text/plain")])
    )
    with pytest.raises(grpc.aio.AioRpcError) as one:
        await first.read_batch()
    assert one.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as two:
        await second.read_batch()
    assert two.value.code() == grpc.StatusCode.UNAVAILABLE and "503" in two.value.details()
    await turn()
    assert (frames.RST_STREAM, 0, 3, (frames.CANCEL).to_bytes(4, "big")) in peer.sent()


async def test_rst_stream_goaway_and_connection_loss_fail_calls_with_their_codes():
    peer = Peer()
    calls = [await opened(peer)] + [peer.call() for _ in range(3)]
    await turn()
    assert [c.stream_id for c in calls] == [1, 3, 5, 7]
    peer.feed(frames.rst_stream(1, frames.REFUSED_STREAM))
    peer.feed(frames.goaway(3, frames.NO_ERROR, b"draining"))
    codes = []
    for call in calls[:3:2]:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call.read()
        codes.append((raised.value.code(), raised.value.details()))
    assert codes[0][0] == grpc.StatusCode.UNAVAILABLE and "error code 7" in codes[0][1]
    assert codes[1][0] == grpc.StatusCode.UNAVAILABLE and "draining" in codes[1][1] and "not processed" in codes[1][1]
    assert not calls[1].done() and not peer.conn.usable  # stream 3 goes on; no new ones here
    peer.conn.connection_lost(ConnectionResetError("reset by peer"))
    with pytest.raises(grpc.aio.AioRpcError) as lost:
        await calls[1].read_batch()
    assert lost.value.code() == grpc.StatusCode.UNAVAILABLE and "lost" in lost.value.details()


async def test_cancel_resets_the_stream_and_the_reader_sees_cancellation():
    peer = Peer()
    call = await opened(peer)
    read = batch_reader(call)
    reading = asyncio.ensure_future(read())
    await turn()
    assert call.cancel() and not call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    assert await call.code() == grpc.StatusCode.CANCELLED and call.cancelled()
    await turn()
    assert (frames.RST_STREAM, 0, 1, frames.CANCEL.to_bytes(4, "big")) in peer.sent()
    with pytest.raises(asyncio.InvalidStateError):
        await call.write(pb.PublishRequest())


async def test_writer_waits_for_window_update_and_never_exceeds_the_windows():
    peer = Peer()
    call = await opened(peer, [(frames.INITIAL_WINDOW_SIZE, 10)])
    payload = pb.PublishRequest(frames=b"x" * 100)
    writing = asyncio.ensure_future(call.write(payload))
    await turn()
    assert not writing.done()
    sent = sum(len(p) for kind, _, _, p in peer.sent() if kind == frames.DATA)
    assert sent == 10 and call.send_window == 0
    peer.feed(frames.window_update(1, 50))
    await turn()
    assert sum(len(p) for kind, _, _, p in peer.sent() if kind == frames.DATA) == 50
    peer.feed(frames.window_update(1, 1000))
    await asyncio.wait_for(writing, 1)
    await turn()
    peer.sent()
    data = b"".join(p for kind, _, _, p in peer.frames if kind == frames.DATA)
    assert frames.MessageReader(1000).feed(data) == [payload.SerializeToString()]


async def test_write_nowait_writes_only_what_would_not_wait_and_never_part_of_a_message():
    peer = Peer()
    peer.feed(peer.settings([(frames.INITIAL_WINDOW_SIZE, 40)]))
    call = peer.call()
    assert not call.write_nowait(pb.PublishRequest(sequence=1))  # the stream is not open yet
    await turn()
    small, large = pb.PublishRequest(sequence=2), pb.PublishRequest(frames=b"x" * 100)
    assert call.write_nowait(small)
    assert not call.write_nowait(large)  # past the stream's window: nothing of it goes out
    assert call.send_window == 40 - frames.PREFIX_SIZE - len(small.SerializeToString())
    await turn()
    data = b"".join(p for kind, _, _, p in peer.sent() if kind == frames.DATA)
    assert frames.MessageReader(1000).feed(data) == [small.SerializeToString()]
    assert call.cancel()
    assert not call.write_nowait(small)  # over: write() raises, write_nowait leaves it to write()


async def test_on_messages_takes_responses_in_the_read_that_brought_them_and_read_batch_waits_for_the_end():
    peer = Peer()
    call = await opened(peer)
    taken: list = []
    call.on_messages = lambda responses: taken.append([a.sequence for a in responses])
    peer.feed(peer.response_headers(1) + frames.frame(frames.DATA, 0, 1, messages_bytes([ack(0), ack(1)])))
    assert taken == [[0, 1]]  # no loop turn needed
    reading = asyncio.ensure_future(call.read_batch())
    await turn()
    assert not reading.done()  # nothing queued for a reader: it waits for the end
    peer.feed(frames.frame(frames.DATA, 0, 1, messages_bytes([ack(2)])) + peer.trailers(1))
    assert taken == [[0, 1], [2]]
    assert await asyncio.wait_for(reading, 1) == []
    assert await call.code() == grpc.StatusCode.OK


async def test_a_failing_on_messages_ends_the_call_internal():
    peer = Peer()
    call = await opened(peer)

    def broken(responses) -> None:
        raise RuntimeError("boom")

    call.on_messages = broken
    peer.feed(peer.response_headers(1) + frames.frame(frames.DATA, 0, 1, messages_bytes([ack(0)])))
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call.read_batch()
    assert raised.value.code() == grpc.StatusCode.INTERNAL and "boom" in raised.value.details()
    await turn()
    assert [f for f in peer.sent() if f[0] == frames.RST_STREAM]  # the server is told


async def test_reading_messages_gives_the_stream_window_back():
    limits = H2ClientLimits(stream_window=65536, keepalive_s=0)
    peer = Peer(limits)
    call = await opened(peer)
    await call.write(pb.PublishRequest())
    body = messages_bytes([b"\x08\x01" * 5000] * 4)
    peer.feed(peer.response_headers(1) + frames.frame(frames.DATA, 0, 1, body))
    await turn()
    assert not [p for kind, _, sid, p in peer.sent() if kind == frames.WINDOW_UPDATE and sid == 1]
    assert len(await call.read_batch()) == 4
    await turn()
    updates = [frames.parse_u32(p, "") for kind, _, sid, p in peer.sent() if kind == frames.WINDOW_UPDATE and sid == 1]
    assert updates == [len(body)]


async def test_a_peer_sending_past_the_stream_window_fails_only_that_call():
    limits = H2ClientLimits(stream_window=65535, keepalive_s=0)
    peer = Peer(limits)
    call = await opened(peer)
    peer.feed(peer.response_headers(1))
    for _ in range(5):  # unread messages: nothing is given back, the fifth is past the window
        peer.feed(frames.frame(frames.DATA, 0, 1, messages_bytes([b"\x08\x01" * 7997])))
    assert len(await call.read_batch()) == 4
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call.read()
    assert raised.value.code() == grpc.StatusCode.INTERNAL and "receive window" in raised.value.details()
    assert not peer.conn.closed


async def test_a_message_over_the_limit_is_resource_exhausted_before_its_body_arrives():
    peer = Peer(H2ClientLimits(max_message=1000, keepalive_s=0))
    call = await opened(peer)
    peer.feed(peer.response_headers(1) + frames.frame(frames.DATA, 0, 1, frames.message_prefix(5000)))
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call.read()
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "1000" in raised.value.details()


async def test_a_frame_over_the_advertised_size_ends_the_connection_with_a_reason():
    peer = Peer()
    call = await opened(peer)
    peer.feed(frames.frame_header(frames.DATA, 0, 1, peer.limits.max_frame_size + 1))
    assert peer.conn.closed and peer.transport.closed
    goaway = [p for kind, _, _, p in peer.sent() if kind == frames.GOAWAY]
    assert frames.parse_goaway(goaway[0])[1] == frames.FRAME_SIZE_ERROR
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call.read()
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE and "limit" in raised.value.details()


async def test_streams_wait_for_the_peers_concurrency_limit():
    peer = Peer()
    first = await opened(peer, [(frames.MAX_CONCURRENT_STREAMS, 1)])
    second = peer.call()
    await turn()
    assert first.stream_id == 1 and second.stream_id == 0
    peer.feed(peer.response_headers(1) + peer.trailers(1))
    assert await first.read_batch() == []
    await turn()
    assert second.stream_id == 3


async def test_a_silent_server_is_pinged_then_dropped():
    peer = Peer(H2ClientLimits(keepalive_s=0.05, keepalive_timeout_s=0.05))
    call = await opened(peer)
    await asyncio.sleep(0.12)  # one quiet tick: a PING goes out
    assert [p for kind, flags, _, p in peer.sent() if kind == frames.PING and not flags]
    await asyncio.sleep(0.15)  # no answer
    assert peer.conn.closed
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call.read()
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE and "PING" in raised.value.details()


async def test_a_call_whose_connection_cannot_be_made_fails_unavailable():
    channel = H2Channel(f"127.0.0.1:{free_port()}")  # nothing listens there
    call = H2BatchLane(channel, None).Publish()  # type: ignore[arg-type]
    with pytest.raises(asyncio.InvalidStateError):
        await call.write(pb.PublishRequest())
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call.read_batch()
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE and "failed to connect" in raised.value.details()
    await channel.close()


async def test_a_call_cancelled_before_its_stream_opened_ends_its_writer_cleanly():
    peer = Peer()
    peer.feed(peer.settings([(frames.MAX_CONCURRENT_STREAMS, 0)]))  # no stream may open yet
    call = peer.call()
    writing = asyncio.ensure_future(call.write(pb.PublishRequest()))
    await turn()
    assert call.cancel() and call.stream_id == 0
    with pytest.raises(asyncio.InvalidStateError):
        await writing
    assert await call.code() == grpc.StatusCode.CANCELLED
    await turn()
    assert not [f for f in peer.sent() if f[0] == frames.HEADERS]
