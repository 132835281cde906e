"""The batch lane's ``Health``: Danube's HealthCheck for many producers and consumers in one call.

A client with a thousand producers and consumers asks Danube's ``HealthCheck`` once per id and
interval: hundreds of unary calls a second, each a gRPC call's cost on both sides for one boolean.
``Health`` names every id one connection watches and answers with the ones this broker no longer
serves (closed, moved away, unknown), exactly what ``HealthCheck`` would answer ``CLOSE`` for.
Danube's ``HealthCheck`` stays as it is for Danube's own clients.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from danube.errors import DanubeError, InvalidArgumentError
from danube.proto.danube_batch import batch_pb2 as pb
from danube.server import status as status_map

if TYPE_CHECKING:
    from danube.broker.service import BrokerService


# Ids one call may name: a connection's producers and consumers, with room to spare. The message
# size limit alone would let a client make the broker build half a million-entry answer per call.
MAX_HEALTH_IDS = 65_536


class HealthLane:
    """The ``Health`` method of ``BatchLaneService`` (mixed in; ``_broker`` is the service's)."""

    _broker: BrokerService

    async def Health(self, request, context):  # noqa: N802 - the gRPC method's name
        try:
            named = len(request.producer_ids) + len(request.consumer_ids)
            if named > MAX_HEALTH_IDS:
                raise InvalidArgumentError(
                    f"a Health call names {named} ids, more than {MAX_HEALTH_IDS}: split it over several calls"
                )
        except DanubeError as exc:
            await status_map.abort(context, exc)
        healthy = self._broker.health
        return pb.HealthResponse(
            closed_producer_ids=[i for i in request.producer_ids if not healthy("producer", i)],
            closed_consumer_ids=[i for i in request.consumer_ids if not healthy("consumer", i)],
        )
