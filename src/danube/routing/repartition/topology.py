"""Live routing on the broker: topology snapshots, per-connection pushes, adoption tracking.

- ``GetTopology`` / the first message of ``WatchTopology``: a snapshot of the requested partitioned
  topics (partition count, partitioning version, owners, in transition) with the live generation
  (the metadata revision the broker's partitioning watch reached).
- A push goes to a connection only when *its* routing content changed: a topic it subscribed to
  got a new partition count or partitioning version.  Unrelated metadata churn (other topics,
  cursors, the drain, finalize) pushes nothing.  The push carries the live generation.
- :class:`AdoptionTracker`: per connection the highest generation it acked; a connection counts
  only once it acked at least once and is dropped when it closes.  ``lowest()`` is what the broker
  reports (``/routing/adoption/{broker_id}``) and the leader takes the minimum of over live brokers.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Callable, Iterable

from danube.proto.danube_batch import batch_pb2 as pb
from danube.routing.repartition.model import PartitioningState
from danube.routing.repartition.version_fence import VersionFence


class AdoptionTracker:
    def __init__(self) -> None:
        self._acked: dict[int, int] = {}
        self.changed = asyncio.Event()

    def ack(self, connection: int, generation: int) -> None:
        if generation > self._acked.get(connection, -1):
            self._acked[connection] = generation
            self.changed.set()

    def drop(self, connection: int) -> None:
        if self._acked.pop(connection, None) is not None:
            self.changed.set()

    def lowest(self) -> int | None:
        """The lowest acked generation over connections that acked; None when none has."""
        return min(self._acked.values()) if self._acked else None

    def __len__(self) -> int:
        return len(self._acked)


def _content(state: PartitioningState | None) -> tuple[int, int] | None:
    return None if state is None else (state.partitions, state.version)


class TopologyStream:
    """One client connection's push stream."""

    def __init__(self, connection: int) -> None:
        self.connection = connection
        self.topics: set[str] = set()
        self.sent: dict[str, tuple[int, int] | None] = {}
        self.queue: asyncio.Queue[pb.Topology | None] = asyncio.Queue()  # None: the stream's end
        self.pushes = 0


class TopologyHub:
    def __init__(self, fence: VersionFence, *, owner_url: Callable[[str], str | None]) -> None:
        self.fence = fence
        self._owner_url = owner_url
        self.tracker = AdoptionTracker()
        self._streams: dict[int, TopologyStream] = {}
        self._ids = itertools.count(1)
        fence.add_listener(self._changed)

    # ------------------------------------------------------------ snapshots

    async def states(self, topics: Iterable[str]) -> dict[str, PartitioningState | None]:
        await self.fence.ready()
        out: dict[str, PartitioningState | None] = {}
        for topic in topics:
            state = self.fence.states.get(topic)
            if state is None:  # not stored: version 0 with the recorded partition count (or not partitioned)
                stored = await self.fence.store.load(topic)
                state = stored.state if stored is not None else None
            out[topic] = state
        return out

    def routing(self, topic: str, state: PartitioningState | None) -> pb.TopicRouting:
        if state is None:
            return pb.TopicRouting(topic=topic, partitions=0, partitioning_version=0)
        owners = [
            pb.PartitionOwner(index=i, broker_url=self._owner_url(f"{topic}-part-{i}") or "")
            for i in range(state.partitions)
        ]
        return pb.TopicRouting(
            topic=topic,
            partitions=state.partitions,
            partitioning_version=state.version,
            owners=owners,
            in_transition=state.transition is not None,
            live_partitions=state.readable_partitions,
        )

    async def snapshot(self, topics: Iterable[str]) -> pb.Topology:
        topics = list(dict.fromkeys(topics))
        generation = self.fence.revision
        states = await self.states(topics)
        return pb.Topology(
            generation=max(generation, self.fence.revision), topics=[self.routing(t, s) for t, s in states.items()]
        )

    # ------------------------------------------------------------ push streams

    def open(self) -> TopologyStream:
        stream = TopologyStream(next(self._ids))
        self._streams[stream.connection] = stream
        return stream

    def close(self, stream: TopologyStream) -> None:
        self._streams.pop(stream.connection, None)
        self.tracker.drop(stream.connection)

    async def subscribe(self, stream: TopologyStream, topics: Iterable[str]) -> None:
        """Add topics to the stream and send their snapshot (registered first: a change while the
        snapshot is read is pushed too; the client keeps the higher generation)."""
        topics = [t for t in dict.fromkeys(topics) if t not in stream.topics]
        stream.topics.update(topics)
        snap = await self.snapshot(topics)
        for routing in snap.topics:
            stream.sent[routing.topic] = (
                (routing.partitions, routing.partitioning_version) if routing.partitions else None
            )
        stream.queue.put_nowait(snap)

    def ack(self, stream: TopologyStream, generation: int) -> None:
        self.tracker.ack(stream.connection, generation)

    def _changed(self, topic: str, state: PartitioningState | None, revision: int) -> None:
        content = _content(state)
        for stream in self._streams.values():
            if topic not in stream.topics or stream.sent.get(topic) == content:
                continue
            stream.sent[topic] = content
            stream.pushes += 1
            stream.queue.put_nowait(pb.Topology(generation=revision, topics=[self.routing(topic, state)]))

    def describe(self) -> dict[str, Any]:
        return {
            "connections": len(self._streams),
            "acked_connections": len(self.tracker),
            "lowest_acked_generation": self.tracker.lowest(),
        }
