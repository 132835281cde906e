"""BrokerService's producers and publishing: create a producer, publish a batch (the per-message
hot paths), refuse writes while shutting down or while the cluster lease is stale.

A base class of :class:`~danube.broker.service.BrokerService` (``broker/service.py``), which
holds the state; its methods are moved here whole.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Callable, cast

from danube import message_codec
from danube.broker.commits import Answer
from danube.broker.contracts import Cluster
from danube.broker.producer import ACCESS_MODES, Producer
from danube.broker.registrations import Registration, check_name, new_id
from danube.broker.topic import Topic, is_system_topic
from danube.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    NotFoundError,
    NotServedHereError,
    PolicyViolationError,
)
from danube.metadata import keys
from danube.metadata.store import MetadataStore

log = logging.getLogger(__name__)
_check_fields = message_codec.check_fields
_perf_counter = time.perf_counter
_CheckedFrames = message_codec.CheckedFrames


def fields_refused(buf, producer_id: int) -> bool:
    """Whether a frame of ``buf`` is one a subscriber could not decode (``check_deliverable``
    says which and why).  A batch the batch lane checked whole for this producer
    (``message_codec.check_batch``) carries the answer: its frames are not walked again."""
    if type(buf) is _CheckedFrames and buf.producer_id == producer_id:
        return buf.fields_position >= 0
    return _check_fields(buf, producer_id)[0] >= 0


def check_deliverable(buf, producer: Producer) -> None:
    """Refuse a batch whole, before anything is stored, when a subscriber could not decode one
    of its frames: routing key, attribute names and values must be UTF-8 and every frame must
    carry the publishing producer's id (or 0: not set).  One codec pass, no Python object per
    record."""
    position, problem = message_codec.check_fields(buf, producer.id)
    if position >= 0:
        index = len(message_codec.frame_positions(memoryview(buf)[:position]))
        raise InvalidArgumentError(
            f"batch refused, nothing stored: frame {index} (byte {position}) cannot be delivered: "
            f"{message_codec.FIELDS_PROBLEMS.get(problem, 'it is malformed')}"
            + (f" (producer {producer.id} publishes it)" if problem == message_codec.FIELDS_WRONG_PRODUCER else "")
        )


class Publishing:
    if TYPE_CHECKING:  # what this part uses of the rest of BrokerService
        _closed_ids: set[tuple[str, int]]
        _dormant: dict[tuple[str, int], Registration]
        _draining: bool
        _writes_refused: bool
        _producers: dict[int, Producer]
        _published: asyncio.Event
        _publishing: int
        cluster: Cluster | None
        lease_fresh: Callable[[], bool] | None
        metadata: MetadataStore

        def _served(self, topic: Topic) -> Topic: ...
        async def _topic(self, name: str, *, reliable: bool | None, create: bool) -> Topic: ...

    # ------------------------------------------------------------ producers

    async def create_producer(
        self, topic: str, producer_name: str, *, access_mode: str = "shared", reliable: bool = False
    ) -> int:
        keys.split_topic(topic)
        check_name("producer", producer_name)
        if access_mode not in ACCESS_MODES:
            raise InvalidArgumentError(f"unknown producer access mode {access_mode!r}; expected shared or exclusive")
        t = await self._topic(topic, reliable=bool(reliable), create=True)
        if t.reliable != bool(reliable):
            raise InvalidArgumentError(
                f"topic {topic} is {'reliable' if t.reliable else 'non-reliable'}; a producer asked for "
                f"{'reliable' if reliable else 'non-reliable'} dispatch"
            )
        for p in t.producers.values():
            if p.name == producer_name:
                return p.id
        if self.writes_refused() and not is_system_topic(topic):
            raise self.writes_refused_error(topic)  # a new producer is registered in the metadata store
        for p in t.producers.values():
            if p.access_mode == "exclusive" or access_mode == "exclusive":
                raise AlreadyExistsError(
                    f"topic {topic} has producer '{p.name}' and access mode exclusive allows only one producer"
                )
        limit = t.policies.max_producers_per_topic
        if limit and len(t.producers) >= limit:
            raise PolicyViolationError(f"topic {topic} already has {limit} producers (max_producers_per_topic)")
        key = keys.topic_producer(topic, producer_name)
        stored = await self.metadata.get_json(key)
        if stored and "producer_id" in stored:
            producer_id = int(stored["producer_id"])
        else:
            producer_id = new_id()
        record = {"producer_id": producer_id, "access_mode": access_mode, "reliable": t.reliable}
        if stored != record:  # (a producer re-created after a move writes nothing: one etcd write less)
            await self.metadata.put_json(key, record)
        for p in t.producers.values():  # a concurrent create of the same name won the race
            if p.name == producer_name:
                return p.id
        self._served(t)  # closed while this call awaited the metadata store (see subscribe)
        producer = Producer(producer_id, producer_name, t, access_mode)
        t.add_producer(producer)
        self._producers[producer_id] = producer
        self._dormant.pop(("producer", producer_id), None)
        self._closed_ids.discard(("producer", producer_id))
        log.info("producer '%s' (%d) on %s", producer_name, producer_id, topic)
        return producer_id

    async def _producer(self, producer_id: int) -> Producer:
        producer = self._producers.get(producer_id)
        if producer is not None and not producer.closed:
            return producer
        reg = self._dormant.get(("producer", producer_id))
        if reg is not None:
            await self.create_producer(
                reg.topic,
                reg.name,
                access_mode=reg.info.get("access_mode", "shared"),
                reliable=bool(reg.info.get("reliable", False)),
            )
            producer = self._producers.get(producer_id)
            if producer is not None:
                return producer
        if ("producer", producer_id) in self._closed_ids:
            raise NotServedHereError(f"producer {producer_id} was closed: its topic is no longer served here")
        raise NotFoundError(f"unknown producer id {producer_id}: create the producer first")

    async def publish(
        self, producer_id: int, frames_buf: bytearray, *, partitioning_version: int | None = None
    ) -> tuple[int, int]:
        """A producer's batch of unstamped frames (the batch lane): validated, stamped, appended,
        dispatched; (first, last) once durable under the sync policy."""
        self._check_accepting(producer_id)
        self._publishing += 1
        try:
            producer = await self._producer(producer_id)
            if not isinstance(frames_buf, bytearray):
                frames_buf = bytearray(frames_buf)
            if fields_refused(frames_buf, producer.id):
                check_deliverable(frames_buf, producer)
            return await producer.topic.publish(producer, frames_buf)
        finally:
            self._publish_done()

    async def publish_one(self, producer_id: int, frame) -> int:
        """A producer's one message, one whole unstamped frame (Danube's SendMessage); its offset
        once durable.

        Concurrent calls on a topic share one append and one durability wait
        (``danube.broker.coalesce``); one producer's messages keep their order.

        The per-call path: the checks of ``_check_accepting`` and ``_publish_done`` are inlined."""
        if self._draining or self._writes_refused or (self.lease_fresh is not None and not self.lease_fresh()):
            self._check_accepting(producer_id)
        self._publishing += 1
        try:
            producer = self._producers.get(producer_id)
            if producer is None or producer.closed:
                producer = await self._producer(producer_id)
            return await producer.topic.publish_one(producer, frame)
        finally:
            self._publishing -= 1
            if not self._publishing:
                self._published.set()

    def publish_nowait(
        self,
        producer_id: int,
        frames_buf: bytearray,
        answer: Answer | None = None,
        tag: int = 0,
    ) -> asyncio.Future | bool | None:
        """:meth:`publish` without a task per call (the batch lane's per-call path): checked and
        appended now (errors raise here), the future resolves to (first, last) once durable.
        None when the producer is not loaded here yet (a restart): the caller awaits
        :meth:`publish`, which loads it.  ``answer``: no future (True returned); the topic's
        commit calls ``answer(tag, producer_id, first, last, error)`` once the batch is committed
        (error None) or failed, and settles the broker's count of publishes in flight once per
        commit (``danube.broker.commits``): no future, done-callback or loop callback per call."""
        if self._draining or self._writes_refused or (self.lease_fresh is not None and not self.lease_fresh()):
            self._check_accepting(producer_id)  # (``writes_refused``, inlined: the per-call path)
        producer = self._producers.get(producer_id)
        if producer is None or producer.closed:
            return None
        checked: Any = frames_buf  # (``fields_refused``, inline: the per-call path)
        if (
            checked.fields_position >= 0
            if type(checked) is _CheckedFrames and checked.producer_id == producer.id
            else _check_fields(frames_buf, producer.id)[0] >= 0
        ):
            check_deliverable(frames_buf, producer)
        if answer is not None:
            topic = producer.topic
            size = len(frames_buf)
            if topic.publish_gate is None and 0 < size <= topic.sizes_ok_up_to and not topic.terminated:
                # (``Topic.publish_nowait``'s common case, inline: the per-call path)
                started = _perf_counter()
                first, last = topic.storage.append_frames(frames_buf)
                topic.commits.add_answered(producer, first, last, size, started, answer, tag)
            else:
                topic.publish_nowait(producer, frames_buf, answer, tag)
            self._publishing += 1  # (answered in a later callback, never inside this call)
            return True
        fut = cast(asyncio.Future, producer.topic.publish_nowait(producer, frames_buf))
        self._publishing += 1
        fut.add_done_callback(self._publish_answered)
        return fut

    def _publish_answered(self, _fut: asyncio.Future) -> None:
        self._publishing -= 1
        if not self._publishing:
            self._published.set()

    def _publishes_answered(self, count: int) -> None:
        """``count`` publishes were answered by their topic's commit (``CommitTurn.answered``)."""
        self._publishing -= count
        if not self._publishing:
            self._published.set()

    def _check_accepting(self, producer_id: int | None = None) -> None:
        if self._draining:
            raise NotServedHereError("broker shutting down: publish refused, send it again to the topic's new owner")
        if self.writes_refused():
            raise self.writes_refused_error(self.producer_topic(producer_id) if producer_id is not None else None)

    def writes_refused(self) -> bool:
        """Whether writes are refused because the cluster lease is not renewed (cluster mode)."""
        return self._writes_refused or (self.lease_fresh is not None and not self.lease_fresh())

    def writes_refused_error(self, topic: str | None = None, what: str | None = None) -> NotServedHereError:
        """The refusal of a write (a publish, a new topic, producer or subscription) to ``topic``, or
        of ``what`` (a metadata read), while writes are refused: UNAVAILABLE, saying why and until when."""
        if self.cluster is not None:
            return NotServedHereError(self.cluster.unreachable(what) if what else self.cluster.write_refusal(topic))
        return NotServedHereError("broker fenced (cluster lease not renewed): publish refused, look the topic up again")

    def _publish_done(self) -> None:
        self._publishing -= 1
        if self._publishing == 0:
            self._published.set()

    def producer_topic(self, producer_id: int) -> str | None:
        p = self._producers.get(producer_id)
        return p.topic.name if p is not None else None
