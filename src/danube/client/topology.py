"""Live routing on the client (docs/repartition.md): the routing cache and the topology push stream.

One :class:`TopologyWatch` per client, on its service connection: a ``WatchTopology`` stream that
subscribes the partitioned topics the client's producers and consumers use, applies every snapshot
and push to the :class:`RoutingCache` (created before the stream starts, so the first push always
has somewhere to land) and acks the generation the cache then reflects.  Updates are
generation-guarded per topic: a snapshot or push older than what the cache holds is ignored.
A broker without the call (UNIMPLEMENTED) leaves the client routing as before, unfenced.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import grpc

from danube.proto.danube_batch import batch_pb2 as pb

if TYPE_CHECKING:
    from danube.client.connection import Connections

log = logging.getLogger(__name__)

SNAPSHOT_TIMEOUT_S = 10.0


@dataclass
class TopicRoute:
    partitions: int
    version: int
    generation: int
    owners: dict[int, str] = field(default_factory=dict)
    in_transition: bool = False
    # partitions open for reading: during a shrink also the draining ones (consumers attach to them)
    live_partitions: int = 0


Listener = Callable[[str, TopicRoute], None]


class RoutingCache:
    def __init__(self) -> None:
        self.routes: dict[str, TopicRoute] = {}
        self.generation = 0
        self._listeners: dict[str, list[Listener]] = {}
        self._arrived: dict[str, asyncio.Event] = {}

    def listen(self, topic: str, listener: Listener) -> None:
        self._listeners.setdefault(topic, []).append(listener)

    def unlisten(self, topic: str, listener: Listener) -> None:
        listeners = self._listeners.get(topic, [])
        if listener in listeners:
            listeners.remove(listener)

    def arrived(self, topic: str) -> asyncio.Event:
        return self._arrived.setdefault(topic, asyncio.Event())

    def apply(self, topology: pb.Topology) -> int:
        """Applies a snapshot or push; returns the generation the cache reflects afterwards."""
        gen = topology.generation
        for routing in topology.topics:
            old = self.routes.get(routing.topic)
            if old is not None and (gen < old.generation or routing.partitioning_version < old.version):
                continue  # stale or out of order
            route = TopicRoute(
                partitions=routing.partitions,
                version=routing.partitioning_version,
                generation=gen,
                owners={o.index: o.broker_url for o in routing.owners if o.broker_url},
                in_transition=routing.in_transition,
                live_partitions=max(routing.live_partitions, routing.partitions),
            )
            self.routes[routing.topic] = route
            self.arrived(routing.topic).set()
            if old is None or (old.partitions, old.version) != (route.partitions, route.version):
                for listener in list(self._listeners.get(routing.topic, ())):
                    listener(routing.topic, route)
        self.generation = max(self.generation, gen)
        return self.generation


class TopologyWatch:
    def __init__(self, client: "Connections") -> None:
        self.client = client
        self.cache = RoutingCache()  # before the stream: a push right after connect has somewhere to land
        self.topics: set[str] = set()
        self.supported: bool | None = None
        self.acked = 0
        self._requests: asyncio.Queue[pb.TopologyStreamRequest | None] = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self._closed = False

    async def route(self, topic: str) -> TopicRoute | None:
        """The topic's route (subscribing the stream to it); None when the broker has no live routing."""
        if self.supported is False:
            return None
        if topic not in self.topics:
            self.topics.add(topic)
            self._requests.put_nowait(pb.TopologyStreamRequest(subscribe=pb.TopologyRequest(topics=[topic])))
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())
        arrived = self.cache.arrived(topic)
        waiter = asyncio.ensure_future(arrived.wait())
        done, _ = await asyncio.wait({waiter, self._task}, timeout=SNAPSHOT_TIMEOUT_S, return_when="FIRST_COMPLETED")
        if waiter not in done:
            waiter.cancel()
            return None
        return self.cache.routes.get(topic)

    async def _run(self) -> None:
        delay = 0.05
        while not self._closed:
            try:
                await self._stream()
                delay = 0.05
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    self.supported = False
                    log.info("the broker has no live routing (WatchTopology): routing unfenced")
                    return
                log.debug("topology stream broke (%s); reconnecting", exc.code())
            except Exception:  # noqa: BLE001 - reconnect
                log.debug("topology stream failed; reconnecting", exc_info=True)
            if self._closed:
                return
            await asyncio.sleep(delay)
            delay = min(1.0, delay * 2)
            # the new stream subscribes every topic again (its snapshot re-syncs the cache)
            self._requests = asyncio.Queue()
            if self.topics:
                self._requests.put_nowait(
                    pb.TopologyStreamRequest(subscribe=pb.TopologyRequest(topics=sorted(self.topics)))
                )

    async def _stream(self) -> None:
        requests = self._requests

        async def outgoing():
            while True:
                item = await requests.get()
                if item is None:
                    return
                yield item

        call = self.client.connection().batch_lane.WatchTopology(outgoing())
        try:
            async for topology in call:
                self.supported = True
                generation = self.cache.apply(topology)
                if generation > self.acked:
                    self.acked = generation
                    requests.put_nowait(pb.TopologyStreamRequest(ack=pb.TopologyAck(generation=generation)))
        finally:
            call.cancel()

    async def close(self) -> None:
        self._closed = True
        self._requests.put_nowait(None)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
