"""The auth guard in front of the batch lane's Publish on the native server: the handler takes
batches by message sink, and the guard checks every one of them before it is handed over (a
batch for a topic the caller may not produce to ends the call PERMISSION_DENIED, nothing of it
stored, nothing after it read).  A real broker (local WAL), a real connection on a fake
transport, the guard with a real RBAC authorizer and JWT verifier."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from danube import message_codec
from danube.broker import BrokerService, DispatchSettings
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.proto.danube_batch import batch_pb2 as pb
from danube.security.jwt import TokenVerifier, issue_token
from danube.security.rbac import Authorizer
from danube.server import batch_lane
from danube.server.auth.guard import CallGuard
from danube.server.batch_lane_publish import parse_request
from danube.server.h2grpc import frames, wire
from danube.storage.config import StorageConfig
from danube.storage.factory import StorageFactory
from tests.unit.server.h2grpc.test_answers import REQUEST_HEADERS, Peer

pytestmark = pytest.mark.timeout(60)
SECRET = "unit-test-secret-0123456789abcdef-xyz"
ALLOWED, FORBIDDEN = "/default/allowed", "/default/forbidden"


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


def request(sequence: int, producer_id: int) -> bytes:
    batch = message_codec.encode_payloads([b"a", b"b"], publish_time=1, producer_id=producer_id)
    body = pb.PublishRequest(sequence=sequence, producer_id=producer_id, frames=batch).SerializeToString()
    return wire.message_prefix(len(body)) + body


def test_the_guard_checks_every_batch_the_publish_sink_takes(loop, tmp_path):
    run = loop.run_until_complete
    store = EmbeddedMetadataStore(str(tmp_path / "metadata.db"))
    config = StorageConfig.from_dict({"wal": {"sync": "never"}}, data_dir=str(tmp_path))
    broker = BrokerService(
        store, StorageFactory(config, store, broker_id="t"), dispatch=DispatchSettings(cursor_flush_interval_ms=50)
    )
    run(broker.start())
    authorizer = Authorizer(store, refresh_s=0)
    run(authorizer.start())
    run(authorizer.put_role("writer", [f"produce:{ALLOWED}"]))
    run(authorizer.bind("alice", ["writer"]))
    allowed = run(broker.create_producer(ALLOWED, "p", reliable=True))
    forbidden = run(broker.create_producer(FORBIDDEN, "q", reliable=True))
    guard = CallGuard(verifier=TokenVerifier(SECRET, issuer="danube-auth"), authorizer=authorizer, broker=broker)
    service = batch_lane.BatchLaneService(broker)
    handler = grpc.stream_stream_rpc_method_handler(
        service.Publish,
        request_deserializer=parse_request,  # Publish's, as batch_lane.add_to_server registers it
        response_serializer=pb.PublishAck.SerializeToString,
    )
    guarded = guard.wrap("/danube_batch.BatchLane/Publish", handler, lambda context: None)
    peer = Peer(loop, handlers={"Publish": guarded})
    peer.frames_since()

    async def read_of(data: bytes) -> None:  # in the loop, as a transport calls the connection
        peer.connection.data_received(data)
        for _ in range(6):  # the append, the commit, the ack's write and flush
            await asyncio.sleep(0)

    token = issue_token("alice", SECRET).encode()
    headers = [*REQUEST_HEADERS, (b":path", b"/t.T/Publish"), (b"authorization", b"Bearer " + token)]
    run(read_of(frames.frame(frames.HEADERS, frames.END_HEADERS, 1, peer.encoder.encode(headers))))
    call = peer.connection._calls[1]

    run(read_of(frames.frame(frames.DATA, 0, 1, request(1, allowed) + request(2, allowed))))
    assert call._sink is not None, "the handler reads by iteration: the guard offered no checked sink"
    acks = [f for f in peer.frames_since() if f[0] == frames.DATA and f[2] == 1]
    assert [pb.PublishAck.FromString(f[3][5:]).sequence for f in acks] == [1, 2]
    assert broker.topics[ALLOWED].readable_next == 4

    # one read: a forbidden batch between two allowed ones
    run(read_of(frames.frame(frames.DATA, 0, 1, request(3, allowed) + request(4, forbidden) + request(5, allowed))))
    answer = peer.frames_since()
    trailers = [f[3] for f in answer if f[0] == frames.HEADERS and f[2] == 1]
    assert trailers, f"the call did not end: {answer}"
    status = dict(trailers[-1])
    assert status[b"grpc-status"] == str(grpc.StatusCode.PERMISSION_DENIED.value[0]).encode()
    assert b"forbidden" in status[b"grpc-message"]
    assert broker.topics[FORBIDDEN].readable_next == 0 and broker.topics[FORBIDDEN].storage.next_offset == 0
    assert broker.topics[ALLOWED].storage.next_offset == 6  # batch 3 only: nothing after the refusal was read
    assert peer.statuses[-1] == ("/t.T/Publish", grpc.StatusCode.PERMISSION_DENIED)

    run(authorizer.stop())
    run(broker.stop())
    run(store.close())
