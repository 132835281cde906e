"""The client's HTTP/2 transport against grpcio's server (grpc.aio.server on 127.0.0.1): messages
both ways over many DATA frames, and an error status with trailing metadata, as grpc.aio reads them."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from danube.client.connection import broker_url_of
from danube.client.h2.channel import H2Channel
from danube.client.h2.lane import H2BatchLane
from danube.client.security import with_tls, with_token_supplier
from danube.proto.danube_batch import batch_pb2 as pb
from danube.proto.danube_batch import batch_pb2_grpc as batch_grpc
from tests.support.certs import make_pki
from tests.support.ports import free_port


class EchoLane(batch_grpc.BatchLaneServicer):
    """Acks each Publish request with its sequence and size; sequence -1 ends the call UNAVAILABLE
    with the redirect header in the trailers."""

    async def Publish(self, request_iterator, context):
        async for request in request_iterator:
            if request.sequence == 2**63 - 1:
                context.set_trailing_metadata((("x-danube-broker-url", "http://127.0.0.1:7777"),))
                await context.abort(grpc.StatusCode.UNAVAILABLE, "moved \u2192 elsewhere 100%")
            yield pb.PublishAck(sequence=request.sequence, first_offset=len(request.frames))


@pytest.fixture
async def lane():
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
    )
    batch_grpc.add_BatchLaneServicer_to_server(EchoLane(), server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    channel = H2Channel(f"127.0.0.1:{port}")
    try:
        yield H2BatchLane(channel, None)  # type: ignore[arg-type]
    finally:
        await channel.close()
        await server.stop(None)


async def test_messages_both_ways_and_many_calls_on_one_connection(lane):
    calls = [lane.Publish() for _ in range(5)]
    sizes = [0, 10, 70_000, 1_000_000, 5]  # past grpc's 64 KiB initial windows and 16 KiB frames
    for call in calls:
        for seq, size in enumerate(sizes):
            await call.write(pb.PublishRequest(sequence=seq, frames=b"z" * size))
        await call.done_writing()
    for call in calls:
        acks = []
        while batch := await call.read_batch():
            acks += [(a.sequence, a.first_offset) for a in batch]
        assert acks == list(enumerate(sizes))
        assert await call.code() == grpc.StatusCode.OK


async def test_an_error_status_carries_its_details_and_trailing_metadata(lane):
    call = lane.Publish()
    await call.write(pb.PublishRequest(sequence=1))
    await call.write(pb.PublishRequest(sequence=2**63 - 1))
    assert (await call.read()).sequence == 1
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await asyncio.wait_for(call.read(), 10)
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    assert raised.value.details() == "moved \u2192 elsewhere 100%"
    assert broker_url_of(raised.value) == "http://127.0.0.1:7777"


class TokenEcho(batch_grpc.BatchLaneServicer):
    """Ends each Publish call with the caller's authorization header in its trailers."""

    async def Publish(self, request_iterator, context):
        async for request in request_iterator:
            yield pb.PublishAck(sequence=request.sequence)
        seen = dict(context.invocation_metadata()).get("authorization", "")
        context.set_trailing_metadata((("seen-authorization", seen),))


async def test_tls_with_alpn_h2_a_token_per_call_and_an_untrusted_server_refused(tmp_path):
    pki = make_pki(str(tmp_path))
    server = grpc.aio.server()
    batch_grpc.add_BatchLaneServicer_to_server(TokenEcho(), server)
    port = free_port()
    with open(pki.server.key, "rb") as key, open(pki.server.cert, "rb") as cert:
        server.add_secure_port(f"127.0.0.1:{port}", grpc.ssl_server_credentials([(key.read(), cert.read())]))
    await server.start()
    tokens = iter(["first", "second"])
    security = with_token_supplier(with_tls(None, pki.ca), lambda: next(tokens))
    channel = H2Channel(f"127.0.0.1:{port}", security=security)
    try:
        lane = H2BatchLane(channel, None)  # type: ignore[arg-type]
        seen = []
        for seq in (1, 2):  # the supplier is asked for each call
            call = lane.Publish()
            await call.write(pb.PublishRequest(sequence=seq))
            await call.done_writing()
            assert [a.sequence for a in await call.read_batch()] == [seq]
            assert await call.read_batch() == []
            seen.append(dict(await call.trailing_metadata())["seen-authorization"])
        assert seen == ["Bearer first", "Bearer second"]
        # a client that trusts another CA does not talk to this server
        untrusted = H2Channel(f"127.0.0.1:{port}", security=with_tls(None, pki.other_ca))
        call = H2BatchLane(untrusted, None).Publish()  # type: ignore[arg-type]
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call.read_batch()
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE and "CERTIFICATE" in raised.value.details().upper()
        await untrusted.close()
    finally:
        await channel.close()
        await server.stop(None)
