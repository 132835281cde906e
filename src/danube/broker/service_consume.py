"""BrokerService's consumers: subscribe, receive, ack and nack (the per-message hot paths), and
the acks Danube's clients send by subscription name.

A base class of :class:`~danube.broker.service.BrokerService` (``broker/service.py``), which
holds the state; its methods are moved here whole.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Iterable

from danube.broker.dispatch import dispatcher_class
from danube.broker.keyshared import KeyFilter
from danube.broker.policies import DispatchSettings, FailurePolicy
from danube.broker.registrations import Registration, check_name, new_id
from danube.broker.stats import MetricsSink
from danube.broker.subscription import Consumer, Delivery, Push, Subscription
from danube.broker.topic import Topic
from danube.errors import InvalidArgumentError, NotFoundError, NotServedHereError, PolicyViolationError
from danube.metadata import keys
from danube.metadata.store import MetadataStore

log = logging.getLogger(__name__)


class Consuming:
    if TYPE_CHECKING:  # what this part uses of the rest of BrokerService
        _closed_ids: set[tuple[str, int]]
        _consumers: dict[int, Consumer]
        _dormant: dict[tuple[str, int], Registration]
        dispatch: DispatchSettings
        failure_policy: FailurePolicy
        metadata: MetadataStore
        metrics: MetricsSink
        topics: dict[str, Topic]

        def _dead_letter(
            self, sub: Subscription, offset: int, *, attempt: int = 1, reason: str | None = None
        ) -> None: ...
        def _served(self, topic: Topic) -> Topic: ...
        async def _topic(self, name: str, *, reliable: bool | None, create: bool) -> Topic: ...
        def writes_refused(self) -> bool: ...
        def writes_refused_error(self, topic: str | None = None, what: str | None = None) -> NotServedHereError: ...

    # ------------------------------------------------------------ consumers

    async def subscribe(
        self,
        topic: str,
        subscription: str,
        consumer_name: str,
        *,
        sub_type: str = "exclusive",
        key_filters: Iterable[str] = (),
        reliable: bool | None = True,
        consumer_id: int | None = None,
        initial_position: str = "latest",
    ) -> int:
        """Attach a consumer; ``reliable=None`` requires the topic to exist already.
        ``initial_position`` (latest | earliest) places a subscription this call creates."""
        if initial_position not in ("latest", "earliest"):
            raise InvalidArgumentError(f"initial position must be latest or earliest, not {initial_position!r}")
        keys.split_topic(topic)
        check_name("subscription", subscription)
        check_name("consumer", consumer_name)
        dispatcher = dispatcher_class(sub_type)  # InvalidArgumentError for an unknown type
        key_filters = tuple(key_filters or ())
        if key_filters and not dispatcher.takes_key_filters:
            raise InvalidArgumentError("key filters apply to key_shared subscriptions only")
        t = await self._topic(topic, reliable=reliable, create=reliable is not None)
        sub = await self._subscription(t, subscription, sub_type, initial_position)
        for c in sub.consumers.values():
            if c.name == consumer_name:
                if key_filters and tuple(c.key_filter.patterns) != key_filters:
                    sub.set_key_filter(c, KeyFilter(key_filters))
                if not c.active:
                    sub.activate(c)
                return c.id
        if self.writes_refused():
            raise self.writes_refused_error(topic)  # a new consumer is registered in the metadata store
        sub.check_can_join(consumer_name)
        limit = t.policies.max_consumers_per_subscription
        if limit and len(sub.active_consumers()) >= limit:
            raise PolicyViolationError(
                f"subscription '{subscription}' on {topic} already has {limit} consumers (max_consumers_per_subscription)"
            )
        limit = t.policies.max_consumers_per_topic
        if limit and sum(len(s.active_consumers()) for s in t.subscriptions.values()) >= limit:
            raise PolicyViolationError(f"topic {topic} already has {limit} consumers (max_consumers_per_topic)")
        key = keys.subscription_consumer(topic, subscription, consumer_name)
        stored = None
        if consumer_id is None:
            stored = await self.metadata.get_json(key)
            consumer_id = int(stored["consumer_id"]) if stored and "consumer_id" in stored else new_id()
        record = {"consumer_id": consumer_id, "sub_type": sub_type, "key_filters": list(key_filters)}
        if stored != record:  # (a consumer re-subscribing after a move writes nothing: one etcd write less)
            await self.metadata.put_json(key, record)
        for c in sub.consumers.values():  # a concurrent subscribe of the same name won the race
            if c.name == consumer_name:
                return c.id
        # closed (unloaded) while this call awaited the metadata store: a consumer added now would
        # wait on a topic nobody serves, never told to look it up again
        self._served(t)
        consumer = Consumer(consumer_id, consumer_name, sub, KeyFilter(key_filters))
        sub.add_consumer(consumer)
        self._consumers[consumer_id] = consumer
        self._dormant.pop(("consumer", consumer_id), None)
        self._closed_ids.discard(("consumer", consumer_id))
        log.info(
            "consumer '%s' (%d) on %s subscription '%s' (%s, cursor %d)",
            consumer_name,
            consumer_id,
            topic,
            subscription,
            sub_type,
            sub.cursor,
        )
        return consumer_id

    async def _subscription(self, t: Topic, name: str, sub_type: str, initial_position: str = "latest") -> Subscription:
        sub = t.subscriptions.get(name)
        if sub is not None:
            if sub.sub_type != sub_type:
                raise InvalidArgumentError(
                    f"subscription '{name}' on {t.name} is {sub.sub_type}; it cannot be used as {sub_type}"
                )
            return sub
        if self.writes_refused():
            raise self.writes_refused_error(t.name)  # a new subscription is written to the metadata store
        limit = t.policies.max_subscriptions_per_topic
        if limit and len(t.subscriptions) >= limit:
            raise PolicyViolationError(
                f"topic {t.name} already has {limit} subscriptions (max_subscriptions_per_topic)"
            )
        cursor = t.readable_next - 1  # a new subscription starts at the latest offset (Danube's only choice) ...
        if initial_position == "earliest":  # ... or before the oldest message the topic still holds
            cursor = min(t.storage.first_offset, t.readable_next) - 1
        failure_policy = self.failure_policy
        if t.reliable:
            # one round trip for the three reads (a move's new owner re-opens every subscription)
            stored, saved, fp = await asyncio.gather(
                self.metadata.get_json(keys.subscription(t.name, name)),
                self.metadata.get_json(keys.subscription_cursor(t.name, name)),
                self.metadata.get_json(keys.subscription_failure_policy(t.name, name)),
            )
            if stored is not None:
                if stored.get("type", sub_type) != sub_type:
                    raise InvalidArgumentError(
                        f"subscription '{name}' on {t.name} is {stored.get('type')}; it cannot be used as {sub_type}"
                    )
                if isinstance(saved, int):
                    cursor = min(saved, t.readable_next - 1)
            else:
                await self.metadata.put_json(
                    keys.subscription(t.name, name), {"type": sub_type, "created_at": int(time.time() * 1000)}
                )
                await self.metadata.put_json(keys.subscription_cursor(t.name, name), cursor)
            if fp:
                failure_policy = FailurePolicy.from_dict(fp)
        sub = t.subscriptions.get(name)  # created concurrently while we awaited
        if sub is not None:
            return sub
        sub = Subscription(
            t,
            name,
            sub_type,
            cursor=cursor,
            failure_policy=failure_policy,
            settings=self.dispatch,
            metrics=self.metrics,
            dead_letter=self._dead_letter,
        )
        t.subscriptions[name] = sub
        return sub

    async def _consumer(self, consumer_id: int) -> Consumer:
        consumer = self._consumers.get(consumer_id)
        if consumer is not None and not consumer.closed:
            return consumer
        reg = self._dormant.get(("consumer", consumer_id))
        if reg is not None:
            await self.subscribe(
                reg.topic,
                reg.info["subscription"],
                reg.name,
                sub_type=reg.info.get("sub_type", "exclusive"),
                key_filters=reg.info.get("key_filters", ()),
                reliable=None,
                consumer_id=consumer_id,
            )
            consumer = self._consumers.get(consumer_id)
            if consumer is not None:
                return consumer
        if ("consumer", consumer_id) in self._closed_ids or (consumer is not None and consumer.closed):
            raise NotServedHereError(f"consumer {consumer_id} was closed: its topic is no longer served here")
        raise NotFoundError(f"unknown consumer id {consumer_id}: subscribe first")

    async def receive(
        self,
        consumer_id: int,
        *,
        max_messages: int,
        max_bytes: int,
        stream: int | None = None,
        interrupt: asyncio.Future | None = None,
        push: Push | None = None,
    ) -> Delivery:
        """Wait for the next delivery; ``stream`` (from :meth:`open_stream`) ends superseded streams.

        ``interrupt``: a future whose completion ends the wait with an empty delivery (count 0).
        ``push``: deliveries written by the caller's callback while it waits (``Subscription.receive``)."""
        consumer = self._consumers.get(consumer_id)
        if consumer is None or consumer.closed:
            consumer = await self._consumer(consumer_id)
        return await consumer.subscription.receive(consumer, max_messages, max_bytes, stream, interrupt, push)

    async def open_stream(self, consumer_id: int) -> int:
        """A receive stream starts for the consumer; an older stream of it stops (StreamSupersededError)
        and whatever was delivered to the consumer but not acked is delivered again.  Returns the
        stream token for :meth:`receive` and :meth:`detach`."""
        consumer = await self._consumer(consumer_id)
        if not consumer.active:
            consumer.subscription.activate(consumer)
        return consumer.subscription.restart_stream(consumer)

    def consumer_info(self, consumer_id: int) -> tuple[str, str] | None:
        """(topic, subscription) of a live consumer."""
        c = self._consumers.get(consumer_id)
        return (c.subscription.topic.name, c.subscription.name) if c is not None else None

    def producer_name(self, topic: str, producer_id: int) -> str:
        """The name of a topic's producer (for Danube's StreamMessage.producer_name)."""
        t = self.topics.get(topic)
        return t.producer_name(producer_id) if t is not None else str(producer_id)

    def detach(self, consumer_id: int, stream: int | None = None) -> None:
        """The consumer's stream ended: its unacked messages go back to the subscription.

        With ``stream``, only if that stream is still the consumer's current one."""
        c = self._consumers.get(consumer_id)
        if c is None or (stream is not None and stream != c.epoch):
            return
        if stream is not None or c.receiving == 0:
            c.subscription.deactivate(c)

    # Acks and nacks never fail because the topic was unloaded or moved: a message
    # delivered before the move and not acked where its cursor lives is delivered again by the
    # topic's current owner (at most the consumer's in-flight window), so an ack or nack that can
    # no longer reach its subscription is answered OK and counted here.
    late_acks = 0

    def _late_ack(self, what: str, exc: Exception) -> None:
        self.late_acks += 1
        log.debug("%s accepted after its topic left this broker (redelivered by the owner): %s", what, exc)

    async def ack(self, consumer_id: int, offsets: Iterable[int]) -> None:
        try:
            consumer = await self._consumer(consumer_id)
        except NotServedHereError as exc:
            return self._late_ack(f"ack for consumer {consumer_id}", exc)
        try:
            consumer.subscription.ack(offsets)
        except NotServedHereError as exc:  # its topic is being unloaded
            self._late_ack(f"ack for consumer {consumer_id}", exc)

    async def ack_ranges(self, consumer_id: int, ranges: Iterable[tuple[int, int]]) -> int:
        """Ack inclusive offset ranges (the batch lane's AckBatch); returns how many were newly acked."""
        try:
            consumer = await self._consumer(consumer_id)
        except NotServedHereError as exc:
            self._late_ack(f"ack for consumer {consumer_id}", exc)
            return 0
        try:
            return consumer.subscription.ack_ranges(list(ranges))
        except NotServedHereError as exc:
            self._late_ack(f"ack for consumer {consumer_id}", exc)
            return 0

    def ack_ranges_now(self, consumer_id: int, ranges: list[tuple[int, int]]) -> int | None:
        """:meth:`ack_ranges` without a coroutine, for a consumer loaded here; None when it is
        not (a restart: the caller awaits :meth:`ack_ranges`, which loads it)."""
        consumer = self._consumers.get(consumer_id)
        if consumer is None or consumer.closed:
            return None
        try:
            return consumer.subscription.ack_ranges(ranges)
        except NotServedHereError as exc:
            self._late_ack(f"ack for consumer {consumer_id}", exc)
            return 0

    async def nack(
        self, consumer_id: int, offset: int, *, delay_ms: int | None = None, reason: str | None = None
    ) -> None:
        try:
            consumer = await self._consumer(consumer_id)
        except NotServedHereError as exc:
            return self._late_ack(f"nack for consumer {consumer_id}", exc)
        try:
            consumer.subscription.nack(int(offset), delay_ms, reason)
        except NotServedHereError as exc:
            self._late_ack(f"nack for consumer {consumer_id}", exc)

    def reject_delivery(self, consumer_id: int, offset: int, problem: str) -> None:
        """A delivered record could not be converted for the consumer's protocol: it goes to
        its subscription's failure policy (dead letter, drop or block) instead of being sent
        again forever."""
        consumer = self._consumers.get(consumer_id)
        if consumer is not None:
            consumer.subscription.reject(offset, problem)
        else:
            log.error("message %d cannot be delivered to consumer %d (gone): %s", offset, consumer_id, problem)

    async def _served_subscription(self, topic: str, subscription: str) -> Subscription:
        keys.split_topic(topic)
        check_name("subscription", subscription)
        t = self.topics.get(topic)
        sub = t.subscriptions.get(subscription) if t is not None else None
        if sub is None:
            # After a restart the first ack may come before the consumer re-attached.
            for reg in list(self._dormant.values()):
                if reg.kind == "consumer" and reg.topic == topic and reg.info.get("subscription") == subscription:
                    await self._consumer(reg.id)
                    t = self.topics.get(topic)
                    sub = t.subscriptions.get(subscription) if t is not None else None
                    break
        if sub is None:
            raise NotFoundError(f"subscription '{subscription}' on topic {topic} is not served here")
        return sub

    async def _late_subscription(self, topic: str, subscription: str) -> Subscription | None:
        """The served subscription, or None when it is not served here (the topic was unloaded or
        moved, or is being reloaded): the ack or nack is then accepted (see ``_late_ack``)."""
        try:
            return await self._served_subscription(topic, subscription)
        except (NotFoundError, NotServedHereError) as exc:
            if topic in self.topics and subscription in self.topics[topic].subscriptions:
                raise
            self._late_ack(f"ack/nack on {topic} '{subscription}'", exc)
            return None

    async def _strict_subscription(self, topic: str, subscription: str) -> Subscription | None:
        """The subscription a held ack applies to: served here, or opened here from its stored record
        when this broker owns the topic and no consumer re-subscribed yet (a client that re-subscribes
        only after its next health check would otherwise have its acks held that long).  None: the
        topic is non-reliable (an ack changes nothing).  NotServedHereError when it cannot be applied
        here."""
        try:
            return await self._served_subscription(topic, subscription)
        except NotFoundError as exc:
            not_here = exc
        t = await self._topic(topic, reliable=None, create=False)  # NotServedHereError unless the owner
        if not t.reliable:
            return None
        stored = await self.metadata.get_json(keys.subscription(topic, subscription))
        if not stored or "type" not in stored:
            raise NotServedHereError(f"{not_here}; the ack was not applied, send it again")
        return await self._subscription(t, subscription, stored["type"])

    async def ack_subscription(
        self, topic: str, subscription: str, offsets: Iterable[int], *, strict: bool = False
    ) -> None:
        """Ack by (topic, subscription) — how Danube's AckRequest addresses a message.  ``strict``
        (an ack a broker's client proxy holds until it is applied): NotServedHereError, not a late
        ack, when it cannot be applied here."""
        if strict:
            sub = await self._strict_subscription(topic, subscription)
            if sub is not None:
                sub.ack(offsets)
            return
        sub = await self._late_subscription(topic, subscription)
        try:
            if sub is not None:
                sub.ack(offsets)
        except NotServedHereError as exc:  # its topic is being unloaded
            self._late_ack(f"ack on {topic} '{subscription}'", exc)

    async def nack_subscription(
        self,
        topic: str,
        subscription: str,
        offset: int,
        *,
        delay_ms: int | None = None,
        reason: str | None = None,
        strict: bool = False,
    ) -> None:
        if strict:
            sub = await self._strict_subscription(topic, subscription)
            if sub is not None:
                sub.nack(int(offset), delay_ms, reason)
            return
        sub = await self._late_subscription(topic, subscription)
        try:
            if sub is not None:
                sub.nack(int(offset), delay_ms, reason)
        except NotServedHereError as exc:
            self._late_ack(f"nack on {topic} '{subscription}'", exc)
