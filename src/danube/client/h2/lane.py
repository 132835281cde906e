"""The batch lane's stub with its two hot streams on the client's own HTTP/2 transport.

``Publish`` and ``Consume`` open calls on an ``H2Channel``; every other method (the unary calls,
``CreateProducer``, ``WatchTopology``) is the grpc.aio stub's, on the grpc.aio channel.  On either
transport a Consume stream takes an ack already encoded as bytes.
"""

from __future__ import annotations

import os
from typing import Any

from danube.client.h2.channel import H2Channel
from danube.client.requests_wire import passing_bytes
from danube.errors import InvalidArgumentError
from danube.proto.danube_batch import batch_pb2 as pb
from danube.proto.danube_batch import batch_pb2_grpc as batch_grpc

# Which transport carries the client's Publish and Consume streams on plain-text connections.
TRANSPORTS = ("h2", "grpc")
TRANSPORT_ENV = "DANUBE_CLIENT_TRANSPORT"


def default_transport(secured: bool = False) -> str:
    """``DANUBE_CLIENT_TRANSPORT`` when set; else ``h2`` for plain text and ``grpc`` for TLS or
    token connections (the client's own TLS is opt-in)."""
    value = os.environ.get(TRANSPORT_ENV, "").strip().lower()
    if not value:
        return "grpc" if secured else "h2"
    if value not in TRANSPORTS:
        raise InvalidArgumentError(f"{TRANSPORT_ENV}={value!r}: expected one of {', '.join(TRANSPORTS)}")
    return value


class H2BatchLane:
    """A ``BatchLaneStub`` whose Publish and Consume streams go over ``channel``."""

    def __init__(self, channel: H2Channel, stub: batch_grpc.BatchLaneStub) -> None:
        self.channel = channel
        self.grpc_stub = stub
        self.Publish = channel.stream_stream(
            "/danube_batch.BatchLane/Publish", pb.PublishRequest.SerializeToString, pb.PublishAck.FromString
        )
        self.Consume = channel.stream_stream(
            "/danube_batch.BatchLane/Consume", passing_bytes(pb.ConsumeRequest), pb.ConsumeResponse.FromString
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self.grpc_stub, name)


class GrpcBatchLane:
    """A ``BatchLaneStub`` on grpc.aio whose Consume stream takes requests encoded as bytes too
    (an ack, ``requests_wire.ack_request``) besides ``ConsumeRequest`` messages."""

    def __init__(self, channel: Any, stub: batch_grpc.BatchLaneStub) -> None:
        self.grpc_stub = stub
        self.Consume = channel.stream_stream(
            "/danube_batch.BatchLane/Consume",
            request_serializer=passing_bytes(pb.ConsumeRequest),
            response_deserializer=pb.ConsumeResponse.FromString,
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self.grpc_stub, name)
