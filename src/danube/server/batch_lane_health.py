"""The batch lane's ``Health``: Danube's HealthCheck for many producers and consumers in one call.

A client with a thousand producers and consumers asks Danube's ``HealthCheck`` once per id and
interval: hundreds of unary calls a second, each a gRPC call's cost on both sides for one boolean.
``Health`` names every id one connection watches and answers with the ones this broker no longer
serves (closed, moved away, unknown), exactly what ``HealthCheck`` would answer ``CLOSE`` for.
Danube's ``HealthCheck`` stays as it is for Danube's own clients.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from danube.proto.danube_batch import batch_pb2 as pb

if TYPE_CHECKING:
    from danube.broker.service import BrokerService


class HealthLane:
    """The ``Health`` method of ``BatchLaneService`` (mixed in; ``_broker`` is the service's)."""

    _broker: BrokerService

    async def Health(self, request, context):  # noqa: N802 - the gRPC method's name
        healthy = self._broker.health
        return pb.HealthResponse(
            closed_producer_ids=[i for i in request.producer_ids if not healthy("producer", i)],
            closed_consumer_ids=[i for i in request.consumer_ids if not healthy("consumer", i)],
        )
