"""The batch lane: gRPC service ``danube_batch.BatchLane`` (protocol in docs/batch-lane.md).

Each request carries a whole batch of frames as one ``bytes`` field.  The
service does no per-message work: it checks the whole buffer with one call to
the codec (``danube.message_codec.validate``), hands the bytearray to
``BrokerService.publish`` (which stamps offsets in place, appends and waits for
durability), and on the way out hands the broker's frame buffers to gRPC as
they are.  Errors of one batch are answered in that batch's ack and the stream
goes on; errors map to gRPC codes only in ``danube.server.status``.

The service is put together from one module per job: the producer side
(``batch_lane_publish``: CreateProducer, Publish), the consumer side
(``batch_lane_consume``: Consume, Ack, Nack), what both put on the wire
(``batch_lane_wire``) and the many-ids health check (``batch_lane_health``: Health); live
routing (GetTopology, WatchTopology) is here.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, AsyncIterator

import grpc

from danube.broker.acks import AckBatcher
from danube.errors import DanubeError
from danube.proto.danube_batch import batch_pb2 as pb
from danube.proto.danube_batch import batch_pb2_grpc as pb_grpc
from danube.server import status as status_map
from danube.server.batch_lane_consume import ConsumeLane, consume_request
from danube.server.batch_lane_health import HealthLane
from danube.server.batch_lane_publish import MAX_STREAM_IN_FLIGHT, PublishLane, publish_handler
from danube.server.batch_lane_wire import redelivery_counts_in_frame_order

if TYPE_CHECKING:
    from danube.broker.service import BrokerService

__all__ = [
    "MAX_STREAM_IN_FLIGHT",
    "BatchLaneService",
    "add_to_server",
    "redelivery_counts_in_frame_order",
]


class BatchLaneService(PublishLane, ConsumeLane, HealthLane, pb_grpc.BatchLaneServicer):
    def __init__(self, broker: BrokerService) -> None:
        self._broker = broker
        self._schema = broker.schema_gate  # danube.schema.validation.SchemaGate
        self._publish_nowait = broker.publish_nowait  # the per-call publish path
        # In-stream acks of every Consume stream, applied once per consumer and loop turn.
        self._acks = AckBatcher(self._apply_acks)
        self._repartition = None  # danube.routing.repartition.runtime.RepartitionRuntime (version fence)
        if broker.metadata is not None:
            from danube.routing.repartition import runtime as repartition_runtime

            self._repartition = repartition_runtime.for_broker(broker)
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                pass
            else:
                self._repartition.start()

    # ------------------------------------------------------------ live routing (docs/repartition.md)

    async def GetTopology(self, request, context):
        if self._repartition is None:
            return pb.Topology()
        try:
            return await self._repartition.hub.snapshot(request.topics)
        except DanubeError as exc:
            await status_map.abort(context, exc)

    async def WatchTopology(self, request_iterator, context) -> AsyncIterator[pb.Topology]:
        """Per connection: the snapshot of the subscribed topics, then a push whenever their routing
        changes; the client acks the generation it applied (adoption tracking)."""
        if self._repartition is None:
            return
        hub = self._repartition.hub
        stream = hub.open()

        async def read_control():
            try:
                async for request in request_iterator:
                    kind = request.WhichOneof("kind")
                    if kind == "subscribe":
                        await hub.subscribe(stream, request.subscribe.topics)
                    elif kind == "ack":
                        hub.ack(stream, request.ack.generation)
            finally:
                stream.queue.put_nowait(None)

        reader = asyncio.ensure_future(read_control())
        try:
            while True:
                item = await stream.queue.get()
                if item is None:
                    break
                yield item
        finally:
            reader.cancel()
            hub.close(stream)


class _Handlers:
    """Stands in for a server while the generated function registers: keeps its handlers."""

    def __init__(self) -> None:
        self.handlers: dict = {}

    def add_generic_rpc_handlers(self, _generic) -> None:
        pass

    def add_registered_method_handlers(self, _service: str, handlers: dict) -> None:
        self.handlers = dict(handlers)


def add_to_server(server: grpc.aio.Server, broker: BrokerService) -> BatchLaneService:
    """Registers the batch lane on ``server`` (called by danube.server.app), as the generated
    function does, but for Publish's requests and Consume's acks, which danube's own readers
    parse."""
    service = BatchLaneService(broker)
    taken = _Handlers()
    pb_grpc.add_BatchLaneServicer_to_server(service, taken)
    handlers = taken.handlers
    handlers["Publish"] = publish_handler(handlers["Publish"])
    # (Consume's acks read from their bytes by danube's reader; its other requests by protobuf)
    handlers["Consume"] = handlers["Consume"]._replace(request_deserializer=consume_request)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, handlers),))
    server.add_registered_method_handlers(_SERVICE, handlers)
    return service


_SERVICE = "danube_batch.BatchLane"
