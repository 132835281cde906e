"""BrokerService's topic states: unload (seal and let go), read-only while writes are refused,
terminate (no more publishes).

A base class of :class:`~danube.broker.service.BrokerService` (``broker/service.py``), which
holds the state; its methods are moved here whole.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from danube import movetrace
from danube.broker.contracts import Cluster, StorageFactory
from danube.broker.producer import Producer
from danube.broker.registrations import Registration
from danube.broker.stats import MetricsSink
from danube.broker.subscription import Consumer
from danube.broker.topic import Topic
from danube.errors import NotFoundError
from danube.metadata import keys
from danube.metadata.store import MetadataStore

log = logging.getLogger(__name__)


class TopicStates:
    if TYPE_CHECKING:  # what this part uses of the rest of BrokerService
        _closed_ids: set[tuple[str, int]]
        _consumers: dict[int, Consumer]
        _dormant: dict[tuple[str, int], Registration]
        _opening: dict[str, asyncio.Lock]
        _producers: dict[int, Producer]
        cluster: Cluster | None
        metadata: MetadataStore
        metrics: MetricsSink
        storage_factory: StorageFactory | None
        topics: dict[str, Topic]

        async def flush_cursors(self, *, force: bool = False, topic: Topic | None = None) -> int: ...

    # ------------------------------------------------------------ unload

    def _drop_clients(self, t: Topic) -> None:
        for p in t.producers.values():
            p.closed = True
            self._closed_ids.add(("producer", p.id))
            self._producers.pop(p.id, None)
        for sub in t.subscriptions.values():
            for c in list(sub.consumers.values()):
                c.closed = True
                self._closed_ids.add(("consumer", c.id))
                self._consumers.pop(c.id, None)
            sub.notify()
        for reg_key in [k for k, r in self._dormant.items() if r.topic == t.name]:
            self._dormant.pop(reg_key)
            self._closed_ids.add(reg_key)

    async def unload_topic(
        self, topic: str, *, local: bool = False, seal: bool = True, flush: bool = True
    ) -> int | None:
        """Seal the topic's storage and stop serving it here (clients get CLOSE and look it up again).

        Returns the last committed offset (None for a non-reliable topic).  In cluster mode the
        move goes through the cluster (``ClusterNode.unload``), which calls back with ``local=True``;
        ``seal=False`` only closes the storage (the topic was already handed to another broker);
        ``flush=False`` does not persist the cursors either (the broker lost its cluster lease: the
        topic's next owner may have moved them, or issued their offsets again).
        """
        keys.split_topic(topic)
        if self.cluster is not None and not local:
            return await self.cluster.unload(topic)
        lock = self._opening.setdefault(topic, asyncio.Lock())
        async with lock:
            t = self.topics.get(topic)
            if t is None:
                raise NotFoundError(f"topic {topic} is not served here")
            # Closed first: acks, nacks, new clients and publishes are refused from here on, so
            # the forced flush saves every cursor move the broker answered OK.
            t.closed = True
            self._drop_clients(t)
            movetrace.step(topic, "source.closed")
            if flush:
                await self.flush_cursors(force=True, topic=t)
            movetrace.step(topic, "source.cursors_flushed")
            last = None
            if t.reliable and seal:
                last = await t.storage.seal()
            else:
                await t.storage.close()
            self.topics.pop(topic, None)
            self.metrics.topic_closed(topic)
            log.info("topic %s unloaded%s", topic, f" (sealed at offset {last})" if last is not None else "")
            return last

    # ------------------------------------------------------------ read-only topics (writes refused)

    async def make_read_only(self, topic: str, reason: str) -> int | None:
        """Stop writing ``topic`` here and give its WAL up (writer and lock, so the next owner can
        open it) while its consumers go on reading every stored offset; their acks are kept in
        memory (the cursor flush skips the topic).  Publishes are refused before they reach the
        storage (``writes_refused_error``); the storage refuses them too, with ``reason``.  Returns the
        last offset stored, None when ``topic`` is not a reliable topic served here.  Undone by
        :meth:`reopen_for_writing`; a topic the broker lost goes with ``unload_topic(topic,
        local=True, seal=False, flush=False)``."""
        lock = self._opening.setdefault(topic, asyncio.Lock())
        async with lock:
            t = self.topics.get(topic)
            if t is None or t.closed or not t.reliable or t.read_only:
                return None
            t.read_only = True
            return await t.storage.make_read_only(reason)

    async def reopen_for_writing(self, topic: str) -> bool:
        """A read-only topic this broker still owns (its cluster lease survived): open its storage
        anew and put it under the served topic, so producers, subscriptions and their streams go
        on as they were; then persist the cursors acked meanwhile.  When the reopened log does not
        continue exactly where the read-only one stopped (someone else wrote it), the topic is
        dropped without persisting anything (its clients look it up again) and False returned."""
        if self.storage_factory is None:
            return False
        lock = self._opening.setdefault(topic, asyncio.Lock())
        async with lock:
            t = self.topics.get(topic)
            if t is None or t.closed or not t.read_only:
                return False
            old = t.storage
            storage = await self.storage_factory.open_topic(topic)
            continues = storage.next_offset == old.next_offset
            if continues:
                t.storage = storage
                t.read_only = False
            else:
                log.error(
                    "topic %s: the reopened WAL ends at %d, the read-only one at %d: not served here any more",
                    topic,
                    storage.next_offset - 1,
                    old.next_offset - 1,
                )
                await storage.close()
        if not continues:
            await self.unload_topic(topic, local=True, seal=False, flush=False)
            await old.close()
            return False
        await old.close()
        log.info("topic %s writable again at offset %d", topic, t.storage.next_offset)
        try:
            await self.flush_cursors(topic=t)
        except Exception:  # noqa: BLE001 - the periodic flush retries
            log.exception("persisting the cursors of %s after its reopening failed", topic)
        return True

    # ------------------------------------------------------------ terminate

    async def terminate_topic(self, topic: str) -> bool:
        """Seal ``topic`` for good: persist its terminated marker (``keys.topic_terminated``), then
        refuse every publish to it here if it is served here (TopicTerminatedError, not retriable).

        The marker is read whenever a broker opens the topic, so the refusal holds after a move or
        a restart; producers stay attached, consumers read the history to its end.  Under the
        topic's opening lock, so a concurrent open either sees the marker or is flagged here.
        Returns whether the topic is served here (the owner must be told otherwise: the caller
        forwards to it, or the owner learns from what it watches)."""
        keys.split_topic(topic)
        lock = self._opening.setdefault(topic, asyncio.Lock())
        async with lock:
            await self.metadata.put(keys.topic_terminated(topic), b"1")
            return self.mark_terminated(topic)

    def mark_terminated(self, topic: str, terminated: bool = True) -> bool:
        """Set the served topic's flag without touching the marker (its writer already did: the
        repartition finalizer's transaction); False when ``topic`` is not served here."""
        t = self.topics.get(topic)
        if t is None:
            return False
        if t.terminated != terminated:
            t.terminated = terminated
            log.info("topic %s %s", topic, "terminated: publishes refused" if terminated else "reopened for publishes")
        return True
