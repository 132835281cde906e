"""A topic served by this broker: its storage, producers and subscriptions.

Reliable topics are stored by ``danube.storage`` (one WAL per topic) and a
batch becomes visible to subscribers only once it is durable under the sync
policy, so a consumer never sees a message a crash could take back.
Non-reliable topics keep a bounded in-memory history and deliver at most once.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from typing import Protocol, cast

from danube import message_codec
from danube.broker.coalesce import PublishCoalescer
from danube.broker.commits import Answer, CommitQueue, CommitTurn
from danube.broker.contracts import TopicStorage
from danube.broker.policies import TopicPolicies
from danube.broker.producer import Producer
from danube.broker.ratelimit import PublishGate
from danube.broker.stats import MetricsSink, TopicStats
from danube.broker.subscription import Subscription
from danube.errors import InvalidArgumentError, MessageTooLargeError, TopicTerminatedError

PARTITION_RE = re.compile(r"^(?P<base>/.+)-part-(?P<index>\d+)$")


class DeliveryGate(Protocol):
    """What a repartition installs on a target partition (danube.routing.repartition.gate)."""

    def readable(self, sub: Subscription, readable_next: int) -> int: ...


SYSTEM_PREFIX = "/system/"


def is_system_topic(name: str) -> bool:
    """Topics the broker itself writes (load reports): ``/system/<name>``."""
    return isinstance(name, str) and name.startswith(SYSTEM_PREFIX)


def partition_of(topic: str) -> tuple[str, int] | None:
    """``/ns/t-part-3`` → ``("/ns/t", 3)``; None for a plain topic."""
    m = PARTITION_RE.match(topic)
    return (m.group("base"), int(m.group("index"))) if m else None


class Topic:
    def __init__(
        self,
        name: str,
        *,
        reliable: bool,
        storage: TopicStorage,
        policies: TopicPolicies,
        metrics: MetricsSink,
        commit_turn: CommitTurn | None = None,
    ) -> None:
        self.name = name
        self.reliable = reliable
        self.storage = storage
        self.policies = policies
        self.metrics = metrics
        self.producers: dict[int, Producer] = {}
        self.subscriptions: dict[str, Subscription] = {}
        self.readable_next = storage.next_offset  # first offset not yet visible to subscribers
        # live repartition's delivery gate (danube.routing.repartition.gate) during a cutover, else None
        self.delivery_gate: DeliveryGate | None = None
        self.messages_in = 0
        self.bytes_in = 0
        self._producer_names: dict[int, str] = {}
        self.closed = False
        # sealed for good (keys.topic_terminated, read when the broker opens the topic; set by
        # BrokerService.terminate_topic): every append is refused, the history stays readable
        self.terminated = False
        # the broker cannot renew its cluster lease and gave the WAL up (BrokerService.make_read_only):
        # stored offsets are still delivered, acks kept in memory, nothing appended
        self.read_only = False
        self.coalescer = PublishCoalescer(self)  # single-message publishes (Danube's SendMessage)
        # appended batches waiting to be durable; ``commit_turn``: the broker's, which settles
        # every topic appended to in one loop callback per turn (None: the topic's own)
        self.commits = CommitQueue(self, commit_turn)
        # max_publish_rate (messages/s, 0 = unlimited): publishes over it are delayed, not refused.
        rate = policies.max_publish_rate
        self.publish_gate = PublishGate(rate) if rate > 0 else None
        # a batch of 1 to this many bytes meets max_message_size without a frame walk (a frame
        # is a header and its message; policies are frozen, so this holds for the topic's life)
        limit = policies.max_message_size
        self.sizes_ok_up_to = limit + message_codec.HEADER_SIZE if limit else sys.maxsize

    # ------------------------------------------------------------ producers

    def producer_name(self, producer_id: int) -> str:
        name = self._producer_names.get(producer_id)
        return name if name is not None else str(producer_id)

    def remember_producer_name(self, producer_id: int, name: str) -> None:
        self._producer_names[producer_id] = name

    def add_producer(self, producer: Producer) -> None:
        self.producers[producer.id] = producer
        self._producer_names[producer.id] = producer.name

    # ------------------------------------------------------------ publish

    def check_sizes(self, buf) -> None:
        """Check the message size limit (the storage append validates checksums and lengths)."""
        if len(buf) == 0:
            raise InvalidArgumentError("empty batch: a publish needs at least one frame")
        limit = self.policies.max_message_size
        if limit and len(buf) > limit + message_codec.HEADER_SIZE:
            positions = message_codec.frame_positions(buf)
            count = len(positions)
            positions.append(len(buf))
            for i in range(count):
                size = positions[i + 1] - positions[i] - message_codec.HEADER_SIZE
                if size > limit:
                    raise MessageTooLargeError(
                        f"message of {size} bytes exceeds the max_message_size of {limit} bytes on topic {self.name}"
                    )

    def append(self, buf: bytearray) -> tuple[int, int]:
        """Stamp and append a size-checked frame batch (not yet visible to subscribers).

        Both publish paths (a batch, the coalesced single messages) end here, so a terminated topic
        refuses every batch with one attribute test, right before the append."""
        if self.terminated:
            raise TopicTerminatedError.of(self.name)
        return self.storage.append_frames(buf)

    def committed(self, count: int, nbytes: int, last: int, started: float, *, notify: bool = True) -> None:
        """``count`` messages ending at ``last`` are durable: visible to subscribers from now on."""
        self.made_visible(count, nbytes, last, notify=notify)
        self.metrics.published(self.name, count, nbytes, (time.perf_counter() - started) * 1000)

    def made_visible(self, count: int, nbytes: int, last: int, *, notify: bool = True) -> None:
        """:meth:`committed` without the publish latency, which the caller observed itself (per
        batch, several batches made visible at once: ``danube.broker.commits``)."""
        if last + 1 > self.readable_next:
            self.readable_next = last + 1
        self.messages_in += count
        self.bytes_in += nbytes
        if notify:
            for sub in self.subscriptions.values():  # (``notify_subscriptions``, inline: every commit's path)
                sub.notify()

    def notify_subscriptions(self) -> None:
        for sub in self.subscriptions.values():
            sub.notify()

    async def publish(self, producer: Producer | None, buf: bytearray) -> tuple[int, int]:
        """Stamps, appends and commits a batch of unstamped frames; (first, last) once durable.

        ``producer`` None: records the broker writes itself (system topics), which no producer
        sent, so no size policy, no rate gate and no producer counters."""
        return await cast("asyncio.Future", self.publish_nowait(producer, buf))  # (no answer: a future)

    def publish_nowait(
        self, producer: Producer | None, buf: bytearray, answer: Answer | None = None, tag: int = 0
    ) -> asyncio.Future | None:
        """:meth:`publish` without a task of its own: checked and appended now (errors raise
        here, nothing stored), the future resolves to (first, last) once durable
        (``danube.broker.commits``).  With ``answer``: no future, None returned, and the commit
        calls ``answer(tag, producer.id, first, last, error)`` once (``CommitQueue.add_answered``).
        Under a publish rate limit, a task waits for its turn.

        ``Publishing.publish_nowait`` (service_publish) does the common case of an answered publish itself (no
        rate gate, a batch within ``sizes_ok_up_to``, not terminated): keep the two in step."""
        started = time.perf_counter()
        size = len(buf)
        if producer is None:
            if size == 0:
                raise InvalidArgumentError("empty batch: a publish needs at least one frame")
        else:
            if not 0 < size <= self.sizes_ok_up_to:
                self.check_sizes(buf)  # (what raises; a batch below the limit needs no frame walk)
            if self.publish_gate is not None:
                fut = asyncio.ensure_future(self._publish_in_turn(producer, buf, started))
                if answer is None:
                    return fut
                self.commits.answer_when_done(producer, fut, answer, tag)
                return None
        if self.terminated:  # (``append``, inline: the per-call path)
            raise TopicTerminatedError.of(self.name)
        first, last = self.storage.append_frames(buf)
        if answer is None:
            return self.commits.add(producer, first, last, size, started)
        self.commits.add_answered(producer, first, last, size, started, answer, tag)
        return None

    async def _publish_in_turn(self, producer: Producer, buf: bytearray, started: float) -> tuple[int, int]:
        gate = self.publish_gate
        if gate is not None:
            await gate.turn(len(message_codec.frame_positions(buf)))
        # (no await between the turn and the append: delayed publishes keep their order)
        first, last = self.append(buf)
        return await self.commits.add(producer, first, last, len(buf), started)

    def publish_one(self, producer: Producer, frame) -> asyncio.Future[int]:
        """One message (a whole unstamped frame), stored together with the other single-message
        publishes of this loop iteration; the future resolves to its offset once durable."""
        self.check_sizes(frame)
        if self.publish_gate is None:
            return self.coalescer.submit(producer, frame)
        return asyncio.ensure_future(self._publish_one_in_turn(producer, frame))

    async def _publish_one_in_turn(self, producer: Producer, frame) -> int:
        gate = self.publish_gate
        if gate is not None:
            await gate.turn(1)
        return await self.coalescer.submit(producer, frame)

    # ------------------------------------------------------------ reads (subscriptions)

    @property
    def first_offset(self) -> int:
        """The oldest offset the topic still holds (a subscriber behind it skips ahead)."""
        return self.storage.first_offset

    async def read_frames(self, from_offset: int, max_bytes: int) -> bytes | memoryview:
        """Whole stored frames from ``from_offset`` (``TopicStorage.read_frames``); subscribers
        read only below ``readable_next``."""
        return await self.storage.read_frames(from_offset, max_bytes)

    # ------------------------------------------------------------ stats

    def stats(self) -> TopicStats:
        return TopicStats(
            name=self.name,
            reliable=self.reliable,
            messages_in=self.messages_in,
            bytes_in=self.bytes_in,
            next_offset=self.storage.next_offset,
            producers=len(self.producers),
            consumers=sum(len(s.active_consumers()) for s in self.subscriptions.values()),
            subscriptions=[s.stats() for s in self.subscriptions.values()],
        )
