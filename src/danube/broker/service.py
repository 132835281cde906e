"""BrokerService: the one object the gRPC edges (Danube protocol, batch lane, admin) call.

It owns the topics served here, the registry of producers and consumers, and
cursor persistence.  Registrations (producer and consumer names with their ids)
and subscription cursors are kept in the metadata store, so after a restart a
client that kept its ids simply continues: the broker re-attaches the producer
or consumer on first use and the subscription resumes at cursor + 1.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

from danube import frames, movetrace
from danube.broker.contracts import (
    Cluster,
    PeerChannels,
    Rebalancing,
    RemotePublisher,
    RepartitionHook,
    StorageFactory,
    TopicStorage,
)
from danube.broker.dispatch import dispatcher_class
from danube.broker.keyshared import KeyFilter
from danube.broker.memory_storage import MemoryTopicStorage
from danube.broker.policies import DispatchSettings, FailurePolicy, TopicPolicies
from danube.broker.producer import ACCESS_MODES, Producer
from danube.broker.salvage import salvage
from danube.broker.stats import BrokerStats, MetricsSink
from danube.broker.subscription import Consumer, Delivery, Push, Subscription, cut_frames
from danube.broker.topic import Topic, partition_of
from danube.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    MetadataError,
    NotFoundError,
    NotServedHereError,
    PolicyViolationError,
    quote,
)
from danube.metadata import keys
from danube.metadata.store import MetadataStore, Op

if TYPE_CHECKING:
    from danube.schema.validation import SchemaGate

log = logging.getLogger(__name__)

__all__ = ["BrokerService", "LookupResult", "Delivery", "SYSTEM_PREFIX", "is_system_topic"]

SYSTEM_PREFIX = "/system/"
# how long a metadata read is tried while the broker is fenced (it most likely cannot reach the store)
FENCED_READ_TIMEOUT_S = 2.0
# Cursor writes per metadata transaction (etcd refuses more than --max-txn-ops, 128 by default).
CURSORS_PER_TXN = 64


def is_system_topic(name: str) -> bool:
    """Topics the broker itself writes (load reports): ``/system/<name>``."""
    return isinstance(name, str) and name.startswith(SYSTEM_PREFIX)


@dataclass(frozen=True)
class LookupResult:
    kind: str  # "connect" | "redirect" | "failed"
    broker_url: str
    connect_url: str
    proxy: bool = False


@dataclass(frozen=True)
class _Registration:
    kind: str  # "producer" | "consumer"
    id: int
    topic: str
    name: str
    info: dict


def _new_id() -> int:
    # Random ids stay unique across restarts without a counter in the metadata store.
    return secrets.randbits(52) or 1


def _check_name(what: str, name: str) -> str:
    # The project's one name rule (danube.metadata.keys): the name becomes a metadata key segment.
    return keys.check_name(what, name)


def check_deliverable(buf, producer: Producer) -> None:
    """Refuse a batch whole, before anything is stored, when a subscriber could not decode one
    of its frames: routing key, attribute names and values must be UTF-8 and every frame must
    carry the publishing producer's id (or 0: not set).  One codec pass, no Python object per
    record."""
    position, problem = frames.check_fields(buf, producer.id)
    if position >= 0:
        index = len(frames.frame_positions(memoryview(buf)[:position]))
        raise InvalidArgumentError(
            f"batch refused, nothing stored: frame {index} (byte {position}) cannot be delivered: "
            f"{frames.FIELDS_PROBLEMS.get(problem, 'it is malformed')}"
            + (f" (producer {producer.id} publishes it)" if problem == frames.FIELDS_WRONG_PRODUCER else "")
        )


class BrokerService:
    def __init__(
        self,
        metadata: MetadataStore,
        storage_factory: StorageFactory | None,
        *,
        broker_url: str = "http://127.0.0.1:6650",
        broker_id: str = "standalone",
        policies: TopicPolicies | None = None,
        failure_policy: FailurePolicy | None = None,
        dispatch: DispatchSettings | None = None,
        metrics: MetricsSink | None = None,
    ) -> None:
        self.metadata = metadata
        self.storage_factory = storage_factory
        self.broker_url = broker_url
        self.broker_id = broker_id
        self.policies = policies or TopicPolicies()
        self.failure_policy = failure_policy or FailurePolicy()
        self.dispatch = dispatch or DispatchSettings()
        self.metrics = metrics or MetricsSink()
        # Extension points the layers above fill (broker/contracts.py); None until they do.
        self.cluster: Cluster | None = None  # the cluster node in cluster mode (lookups, ownership, moves)
        self.peers: PeerChannels | None = None  # channels to the other brokers (danube.cluster.peers)
        self.remote_publisher: RemotePublisher | None = None  # a dead letter whose topic is served elsewhere
        self.repartition: RepartitionHook | None = None  # live repartition (danube.routing.repartition)
        self.rebalancer: Rebalancing | None = None  # the cluster's rebalancer, for the admin service
        self.schema_gate: SchemaGate | None = None  # the publish paths' schema checks (danube.schema)
        self.metrics_url: str | None = None  # where this broker's metrics are scraped, advertised in ListBrokers
        # Danube's auto_create_topics: false leaves creating topics to the admin API (system topics excepted)
        self.auto_create_topics = True
        self._fenced = False  # cluster lease not renewed in time: no writes (danube.cluster.membership)
        # cluster mode: whether the lease was renewed recently enough to write, asked at every
        # publish; a process stopped (SIGSTOP, a long pause) past its lease wakes up with its
        # requests queued before the timer that sets _fenced has run
        self.lease_fresh: Callable[[], bool] | None = None
        self.topics: dict[str, Topic] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        self._producers: dict[int, Producer] = {}
        self._consumers: dict[int, Consumer] = {}
        self._dormant: dict[tuple[str, int], _Registration] = {}  # registrations from before a restart
        self._closed_ids: set[tuple[str, int]] = set()
        self._flush_task: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._started = False
        self._stopping = False
        self._draining = False  # shutdown began: no new publishes, in-flight ones finish
        self._publishing = 0  # publishes between receipt and their answer
        self._published = asyncio.Event()  # set whenever _publishing drops to 0
        self._flush_lock = asyncio.Lock()  # one cursor flush at a time: a stale write never lands last

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        kvs = await self.metadata.get_prefix("/topics/")
        # Only a scalable topic holds a value at "/topics/{ns}/{topic}" itself (its layout): the keys
        # under it are its controller's (consumer sessions), not this broker's registrations.
        scalable = {kv.key + "/" for kv in kvs if kv.key.count("/") == 3}
        for kv in kvs:
            if scalable and "/".join(kv.key.split("/", 4)[:4]) + "/" in scalable:
                continue
            reg = self._parse_registration(kv.key, kv.value)
            if reg is not None:
                self._dormant[(reg.kind, reg.id)] = reg
        self._flush_task = asyncio.create_task(self._flush_cursors_loop(), name="danube-cursor-flush")
        self._started = True
        log.info(
            "broker %s started at %s (%d registered producers/consumers)",
            self.broker_id,
            self.broker_url,
            len(self._dormant),
        )

    @staticmethod
    def _parse_registration(key: str, value: bytes) -> _Registration | None:
        import json

        parts = key.split("/")  # "", "topics", ns, topic, kind, ...
        try:
            if len(parts) == 6 and parts[4] == "producers":
                info = json.loads(value)
                return _Registration("producer", int(info["producer_id"]), f"/{parts[2]}/{parts[3]}", parts[5], info)
            if len(parts) == 8 and parts[4] == "subscriptions" and parts[6] == "consumers":
                info = json.loads(value)
                info["subscription"] = parts[5]
                return _Registration("consumer", int(info["consumer_id"]), f"/{parts[2]}/{parts[3]}", parts[7], info)
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring unreadable registration %s", key)
        return None

    def begin_shutdown(self) -> None:
        """Refuse new publishes (UNAVAILABLE, retriable) while those in flight finish and are answered."""
        if not self._draining:
            self._draining = True
            log.info("broker %s shutting down: new publishes are refused", self.broker_id)

    async def drain_publishes(self, timeout: float) -> bool:
        """After :meth:`begin_shutdown`: wait until every publish in flight was answered (True) or ``timeout``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._publishing:
            self._published.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:  # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation (gh-86296)
                async with asyncio.timeout(remaining):
                    await self._published.wait()
            except TimeoutError:
                return self._publishing == 0
        return True

    async def stop(self) -> None:
        """Stop serving: persist every cursor, close storage (no seal)."""
        if self._stopping:
            return
        self.begin_shutdown()
        self._stopping = True
        if self._flush_task is not None:
            self._flush_task.cancel()
            try:
                await self._flush_task
            except (asyncio.CancelledError, Exception):
                pass
        for task in list(self._tasks):
            task.cancel()
        # Acks are refused from here on (topic closed), so the forced flush below saves the last
        # cursor any ack moved while the broker answered OK.
        for topic in list(self.topics.values()):
            topic.closed = True
            self._drop_clients(topic)
        try:
            await self.flush_cursors(force=True)
        except Exception:  # noqa: BLE001 - storage must still be closed
            log.exception("persisting cursors at shutdown failed")
        for topic in list(self.topics.values()):
            try:
                # a graceful stop puts every committed message in durable history (not when
                # fenced: the topic may have another owner by now)
                await topic.storage.close(export=not self._fenced)
            except Exception:  # noqa: BLE001 - close the others anyway
                log.exception("closing storage of %s failed", topic.name)
        self.topics.clear()
        if self.storage_factory is not None:
            await self.storage_factory.close()
        log.info("broker %s stopped; cursors persisted", self.broker_id)

    # ------------------------------------------------------------ discovery

    async def lookup(self, topic: str) -> LookupResult:
        keys.split_topic(topic)
        if self.cluster is not None:
            return await self.cluster.lookup(topic)
        return LookupResult("connect", self.broker_url, self.broker_url)

    # ------------------------------------------------------------ cluster fence

    def fence(self, reason: str) -> None:
        """Stop accepting publishes (the cluster lease may expire soon; danube.cluster.membership)."""
        self._fenced = True
        log.warning("broker %s refuses publishes: %s", self.broker_id, reason)

    def unfence(self) -> None:
        self._fenced = False

    async def partitions(self, topic: str) -> list[str]:
        keys.split_topic(topic)
        if not self.fenced():
            return await self._partitions(topic)
        # cut off from the metadata store (most likely): a short try, then the reason, not a wait
        # for the store's whole retry budget and the client's deadline
        try:
            async with asyncio.timeout(FENCED_READ_TIMEOUT_S):
                return await self._partitions(topic)
        except (TimeoutError, MetadataError) as exc:
            raise self.fenced_error(None, f"the partitions of {topic} cannot be read") from exc

    async def _partitions(self, topic: str) -> list[str]:
        count = await self.metadata.get_json(keys.topic_partitions(topic))
        if isinstance(count, int) and count > 0:
            if self.repartition is not None:
                # a live repartition: the partitions a shrink drains or retired are read too
                count = await self.repartition.readable_partitions(topic, count)
            return [f"{topic}-part-{i}" for i in range(count)]
        return [topic]

    # ------------------------------------------------------------ topics

    async def _topic(self, name: str, *, reliable: bool | None, create: bool) -> Topic:
        """The served topic, opened (and created when ``create``) on first use.

        A topic being unloaded (closed, not yet dropped) is not served: clients attaching
        to it would join producers and subscriptions that are about to go away."""
        topic = self.topics.get(name)
        if topic is not None:
            return self._served(topic)
        keys.split_topic(name)
        if self._stopping:
            raise NotServedHereError("the broker is shutting down")
        lock = self._opening.setdefault(name, asyncio.Lock())
        async with lock:
            if self._stopping:
                raise NotServedHereError("the broker is shutting down")
            topic = self.topics.get(name)
            if topic is not None:
                return self._served(topic)
            if self.cluster is not None and not is_system_topic(name):
                movetrace.step(name, "dest.open")
                await self.cluster.check_owner(name)
            # one round trip for the three reads, not three (a move's new owner waits on them)
            delivery, terminated_key, policy_doc = await asyncio.gather(
                self.metadata.get_json(keys.topic_delivery(name)),
                self.metadata.get(keys.topic_terminated(name)),
                self.metadata.get_json(keys.topic_policy(name)),
            )
            if delivery is None:
                if not create or reliable is None:
                    raise NotFoundError(f"topic {name} does not exist; it is created by its first producer")
                if not self.auto_create_topics and not is_system_topic(name):
                    raise NotFoundError(
                        f"Unable to find the topic: {name} (auto_create_topics is off: "
                        f"create it with `danube admin topics create`)"
                    )
                delivery = {"dispatch_strategy": "reliable" if reliable else "non_reliable"}
                await self.metadata.put_json(keys.topic_delivery(name), delivery)
                part = partition_of(name)
                if part is not None:
                    await self._record_partition(*part)
            is_reliable = delivery.get("dispatch_strategy") == "reliable"
            # sealed for good (terminate_topic): read before the topic is served, so no publish ever
            # reaches a terminated topic reopened here (a move, a restart)
            terminated = terminated_key is not None
            policies = TopicPolicies.from_dict(policy_doc) if policy_doc else self.policies
            storage: TopicStorage
            if is_reliable:
                if self.storage_factory is None:
                    raise NotServedHereError("this broker has no storage for reliable topics")
                storage = await self.storage_factory.open_topic(name)
            else:
                storage = MemoryTopicStorage(name, max_bytes=self.dispatch.non_reliable_buffer_bytes)
            topic = Topic(name, reliable=is_reliable, storage=storage, policies=policies, metrics=self.metrics)
            topic.terminated = terminated
            for reg in self._dormant.values():
                if reg.kind == "producer" and reg.topic == name:
                    topic.remember_producer_name(reg.id, reg.name)
            self.topics[name] = topic
            if self.repartition is not None:  # a repartition's target is gated before its first read
                self.repartition.topic_opened(name)
            self.metrics.topic_opened(name)
            movetrace.step(name, "dest.opened")
            log.info(
                "topic %s served here (%s, next offset %d%s)",
                name,
                "reliable" if is_reliable else "non-reliable",
                storage.next_offset,
                ", terminated" if terminated else "",
            )
            return topic

    # What the layers above use of the topics and registrations (not the private ways in).

    async def topic(self, name: str, *, reliable: bool | None = None, create: bool = False) -> Topic:
        """The served topic ``name``, opened here on first use (created only with ``create`` and a
        ``reliable`` choice); ``NotFoundError`` when it does not exist, ``NotServedHereError`` when
        another broker owns it or it is being unloaded."""
        return await self._topic(name, reliable=reliable, create=create)

    async def subscription(
        self, topic: Topic, name: str, sub_type: str, initial_position: str = "latest"
    ) -> Subscription:
        """Subscription ``name`` of a served topic, created (type ``sub_type``) when it is new."""
        return await self._subscription(topic, name, sub_type, initial_position)

    async def producer(self, producer_id: int) -> Producer:
        """The producer ``producer_id``, re-attached when it was registered before a restart."""
        return await self._producer(producer_id)

    def registered_topic(self, kind: str, client_id: int) -> str | None:
        """The topic of a ``"producer"`` or ``"consumer"`` registered before a restart and not yet
        re-attached (``producer_topic``/``consumer_info`` answer for attached ones)."""
        reg = self._dormant.get((kind, client_id))
        return reg.topic if reg is not None else None

    def track_task(self, task: asyncio.Task) -> None:
        """A background task of an extension point, cancelled when the broker stops."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _served(self, topic: Topic) -> Topic:
        if topic.closed:
            if self._stopping:
                raise NotServedHereError("the broker is shutting down")
            raise NotServedHereError(f"topic {topic.name} is being unloaded from this broker; look it up again")
        return topic

    async def _record_partition(self, base: str, index: int) -> None:
        key = keys.topic_partitions(base)
        for _ in range(10):
            kv = await self.metadata.get(key)
            current = 0 if kv is None else int(kv.value or b"0")
            if current > index:
                return
            if await self.metadata.put_if_version(key, str(index + 1).encode(), 0 if kv is None else kv.version):
                return

    # ------------------------------------------------------------ producers

    async def create_producer(
        self, topic: str, producer_name: str, *, access_mode: str = "shared", reliable: bool = False
    ) -> int:
        keys.split_topic(topic)
        _check_name("producer", producer_name)
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
        if self.fenced() and not is_system_topic(topic):
            raise self.fenced_error(topic)  # a new producer is registered in the metadata store
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
            producer_id = _new_id()
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
        if self._draining or self._fenced or (self.lease_fresh is not None and not self.lease_fresh()):
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

    def publish_nowait(self, producer_id: int, frames_buf: bytearray) -> asyncio.Future | None:
        """:meth:`publish` without a task per call (the batch lane's per-call path): checked and
        appended now (errors raise here), the future resolves to (first, last) once durable.
        None when the producer is not loaded here yet (a restart): the caller awaits
        :meth:`publish`, which loads it."""
        if self._draining or self.fenced():
            self._check_accepting(producer_id)
        producer = self._producers.get(producer_id)
        if producer is None or producer.closed:
            return None
        check_deliverable(frames_buf, producer)
        fut = producer.topic.publish_nowait(producer, frames_buf)
        self._publishing += 1
        fut.add_done_callback(self._publish_answered)
        return fut

    def _publish_answered(self, _fut: asyncio.Future) -> None:
        self._publishing -= 1
        if not self._publishing:
            self._published.set()

    def _check_accepting(self, producer_id: int | None = None) -> None:
        if self._draining:
            raise NotServedHereError("broker shutting down: publish refused, send it again to the topic's new owner")
        if self.fenced():
            raise self.fenced_error(self.producer_topic(producer_id) if producer_id is not None else None)

    def fenced(self) -> bool:
        """Whether writes are refused because the cluster lease is not renewed (cluster mode)."""
        return self._fenced or (self.lease_fresh is not None and not self.lease_fresh())

    def fenced_error(self, topic: str | None = None, what: str | None = None) -> NotServedHereError:
        """The refusal of a write (a publish, a new topic, producer or subscription) to ``topic``, or
        of ``what`` (a metadata read), while fenced: UNAVAILABLE, saying why and until when."""
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
        _check_name("subscription", subscription)
        _check_name("consumer", consumer_name)
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
        if self.fenced():
            raise self.fenced_error(topic)  # a new consumer is registered in the metadata store
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
            consumer_id = int(stored["consumer_id"]) if stored and "consumer_id" in stored else _new_id()
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
        if self.fenced():
            raise self.fenced_error(t.name)  # a new subscription is written to the metadata store
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
        _check_name("subscription", subscription)
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

    # ------------------------------------------------------------ dead letters

    def _dead_letter(self, sub: Subscription, offset: int, *, attempt: int = 1, reason: str | None = None) -> None:
        task = asyncio.get_running_loop().create_task(self._send_dead_letter(sub, offset, attempt, reason))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_dead_letter(self, sub: Subscription, offset: int, attempt: int, reason: str | None) -> None:
        dlq = sub.failure_policy.dead_letter_topic
        try:
            data = await sub.topic.read_frames(offset, 1)
            frame, _ = cut_frames(data, 1, 1)
            # Read leniently: the record may be here because its key or attributes are not UTF-8.
            rec = salvage(frame)
            attrs = dict(rec.attributes)
            # Danube's dead-letter attributes (its poison handler's names and values)
            attrs.update(
                {
                    "x-original-topic": sub.topic.name,
                    "x-original-subscription": sub.name,
                    "x-original-topic-offset": str(offset),
                    "x-original-producer-id": str(rec.producer_id),
                    "x-poison-policy": "dead_letter",
                    "x-delivery-attempt": str(attempt),
                }
            )
            if reason is not None:
                attrs["x-failure-reason"] = reason
            # (a name cut to the rule's 255 characters: "dlq-" + a subscription name may be longer)
            producer_name = f"dlq-{sub.name}"[: keys.MAX_NAME_CHARS]
            if self.cluster is not None:
                found = await self.lookup(dlq)
                # another broker owns the dead-letter topic
                if found.kind == "redirect" and self.remote_publisher is not None:
                    await self.remote_publisher.publish(
                        found.broker_url,
                        dlq,
                        producer_name,
                        bytes(rec.payload),
                        publish_time=rec.publish_time,
                        routing_key=rec.routing_key,
                        attributes=attrs,
                    )
                    log.warning(
                        "message %d of %s moved to dead-letter topic %s (at %s)",
                        offset,
                        sub.topic.name,
                        dlq,
                        found.broker_url,
                    )
                    return
            producer_id = await self.create_producer(dlq, producer_name, reliable=True)
            buf = bytearray(
                frames.encode_record(
                    rec.payload,
                    publish_time=rec.publish_time,
                    producer_id=producer_id,
                    key=rec.routing_key,
                    attributes=attrs,
                )
            )
            await self.publish(producer_id, buf)
            log.warning("message %d of %s moved to dead-letter topic %s", offset, sub.topic.name, dlq)
        except Exception:  # noqa: BLE001 - report, the subscription goes on
            log.exception("could not move message %d of %s to dead-letter topic %s", offset, sub.topic.name, dlq)

    # ------------------------------------------------------------ health

    def health(self, client_type: str, client_id: int) -> bool:
        if client_type == "producer":
            p = self._producers.get(client_id)
            return p is not None and not p.closed
        c = self._consumers.get(client_id)
        return c is not None and not c.closed

    # ------------------------------------------------------------ cursors

    async def flush_cursors(self, *, force: bool = False, topic: Topic | None = None) -> int:
        async with self._flush_lock:
            return await self._flush_cursors(force, topic)

    async def _flush_cursors(self, force: bool, topic: Topic | None) -> int:
        # Every moved cursor in one transaction (of at most CURSORS_PER_TXN keys): one metadata
        # commit per flush, however many subscriptions moved, not one commit per subscription.
        written = 0
        batch: list[Subscription] = []
        for t in [topic] if topic is not None else list(self.topics.values()):
            # a read-only topic's cursors wait until the broker knows it still owns the topic
            # (reopen_for_writing); a broker that lost it never writes them (unload_topic flush=False)
            if not t.reliable or t.read_only:
                continue
            for sub in list(t.subscriptions.values()):
                if sub.dirty or force:
                    batch.append(sub)
                    if len(batch) >= CURSORS_PER_TXN:
                        written += await self._write_cursors(batch)
                        batch = []
        if batch:
            written += await self._write_cursors(batch)
        return written

    async def _write_cursors(self, subs: list[Subscription]) -> int:
        ops = []
        for sub in subs:
            sub.dirty = False
            ops.append(Op.put_json(keys.subscription_cursor(sub.topic.name, sub.name), sub.cursor))
        try:
            if len(ops) == 1:
                await self.metadata.put(ops[0].key, ops[0].value)
            else:
                await self.metadata.txn((), ops)
        except BaseException:
            for sub in subs:
                sub.dirty = True
            raise
        return len(ops)

    async def _flush_cursors_loop(self) -> None:
        interval = self.dispatch.cursor_flush_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.flush_cursors()
            except Exception:  # noqa: BLE001 - retried on the next tick
                log.exception("persisting cursors failed; retrying")

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

    # ------------------------------------------------------------ read-only topics (the cluster fence)

    async def make_read_only(self, topic: str, reason: str) -> int | None:
        """Stop writing ``topic`` here and give its WAL up (writer and lock, so the next owner can
        open it) while its consumers go on reading every stored offset; their acks are kept in
        memory (the cursor flush skips the topic).  Publishes are refused before they reach the
        storage (``fenced_error``); the storage refuses them too, with ``reason``.  Returns the
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

    # ------------------------------------------------------------ stats

    def stats(self) -> BrokerStats:
        """Counters of every topic served here (cheap, no I/O: the load reporter calls it on the loop)."""
        return BrokerStats(broker_url=self.broker_url, topics={name: t.stats() for name, t in self.topics.items()})

    # ------------------------------------------------------------ system topics

    async def publish_system(self, topic: str, frames_buf) -> tuple[int, int]:
        """Append unstamped frames to the reliable system topic ``topic`` (``/system/...``) owned by
        this broker, creating it on first use: no producer registration, no policy limits; stamped,
        appended and durable under the sync policy like :meth:`publish`.  Returns (first, last)."""
        if not is_system_topic(topic):
            raise InvalidArgumentError(
                f"{quote(topic)} is not a system topic; system topics are named {SYSTEM_PREFIX}<name>"
            )
        t = await self._topic(topic, reliable=True, create=True)
        if not t.reliable:
            raise InvalidArgumentError(f"system topic {topic} exists as a non-reliable topic; it must be reliable")
        buf = frames_buf if isinstance(frames_buf, bytearray) else bytearray(frames_buf)
        return await t.publish(None, buf)
