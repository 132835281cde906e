"""BrokerService: the one object the gRPC edges (Danube protocol, batch lane, admin) call.

It owns the topics served here, the registry of producers and consumers, and
cursor persistence.  Registrations (producer and consumer names with their ids)
and subscription cursors are kept in the metadata store, so after a restart a
client that kept its ids simply continues: the broker re-attaches the producer
or consumer on first use and the subscription resumes at cursor + 1.

This module holds the service's state, its lifecycle, lookups and topic opening; each other job is
a base class in a module of its own, its methods moved there whole:

- ``service_publish.py`` (``Publishing``): producers and the publish paths;
- ``service_consume.py`` (``Consuming``): subscriptions, consumers, receive, ack and nack;
- ``service_dead_letters.py`` (``DeadLetters``): moving a message to its dead-letter topic;
- ``service_cursors.py`` (``CursorPersistence``): writing cursors to the metadata store;
- ``service_topic_states.py`` (``TopicStates``): unload, read-only while writes are refused, terminate;
- ``registrations.py``: the ids and names of producers and consumers.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from danube import movetrace
from danube.broker.commits import CommitTurn
from danube.broker.contracts import (
    Cluster,
    PeerChannels,
    Rebalancing,
    RemotePublisher,
    RepartitionHook,
    StorageFactory,
    TopicStorage,
)
from danube.broker.memory_storage import MemoryTopicStorage
from danube.broker.policies import DispatchSettings, FailurePolicy, TopicPolicies
from danube.broker.producer import Producer
from danube.broker.registrations import Registration
from danube.broker.service_consume import Consuming
from danube.broker.service_cursors import CursorPersistence
from danube.broker.service_dead_letters import DeadLetters
from danube.broker.service_publish import Publishing
from danube.broker.service_topic_states import TopicStates
from danube.broker.stats import BrokerStats, MetricsSink
from danube.broker.subscription import Consumer, Delivery, Subscription
from danube.broker.topic import SYSTEM_PREFIX, Topic, is_system_topic, partition_of
from danube.errors import (
    InvalidArgumentError,
    MetadataError,
    NotFoundError,
    NotServedHereError,
    quote,
)
from danube.metadata import keys
from danube.metadata.store import MetadataStore

if TYPE_CHECKING:
    from danube.schema.validation import SchemaGate

log = logging.getLogger(__name__)

__all__ = ["BrokerService", "LookupResult", "Delivery", "SYSTEM_PREFIX", "is_system_topic"]

# how long a metadata read is tried while the broker refuses writes (it most likely cannot reach the store)
REFUSED_WRITES_READ_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class LookupResult:
    kind: str  # "connect" | "redirect" | "failed"
    broker_url: str
    connect_url: str
    proxy: bool = False


class BrokerService(Publishing, Consuming, DeadLetters, CursorPersistence, TopicStates):
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
        self._writes_refused = False  # cluster lease not renewed in time: no writes (danube.cluster.membership)
        # cluster mode: whether the lease was renewed recently enough to write, asked at every
        # publish; a process stopped (SIGSTOP, a long pause) past its lease wakes up with its
        # requests queued before the timer that sets _writes_refused has run
        self.lease_fresh: Callable[[], bool] | None = None
        self.topics: dict[str, Topic] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        self._producers: dict[int, Producer] = {}
        self._consumers: dict[int, Consumer] = {}
        self._dormant: dict[tuple[str, int], Registration] = {}  # registrations from before a restart
        self._closed_ids: set[tuple[str, int]] = set()
        self._flush_task: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._started = False
        self._stopping = False
        self._draining = False  # shutdown began: no new publishes, in-flight ones finish
        self._publishing = 0  # publishes between receipt and their answer
        self._published = asyncio.Event()  # set whenever _publishing drops to 0
        # every topic's commits of a loop turn in one callback; it settles _publishing for the
        # publishes it answers by callback (danube.broker.commits)
        self._commit_turn = CommitTurn(self._publishes_answered)
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
    def _parse_registration(key: str, value: bytes) -> Registration | None:
        import json

        parts = key.split("/")  # "", "topics", ns, topic, kind, ...
        try:
            if len(parts) == 6 and parts[4] == "producers":
                info = json.loads(value)
                return Registration("producer", int(info["producer_id"]), f"/{parts[2]}/{parts[3]}", parts[5], info)
            if len(parts) == 8 and parts[4] == "subscriptions" and parts[6] == "consumers":
                info = json.loads(value)
                info["subscription"] = parts[5]
                return Registration("consumer", int(info["consumer_id"]), f"/{parts[2]}/{parts[3]}", parts[7], info)
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
                # refusing writes: the topic may have another owner by now)
                await topic.storage.close(export=not self._writes_refused)
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

    # ------------------------------------------------------------ writes refused (stale cluster lease)

    def refuse_writes(self, reason: str) -> None:
        """Stop accepting publishes (the cluster lease may expire soon; danube.cluster.membership)."""
        self._writes_refused = True
        log.warning("broker %s refuses publishes: %s", self.broker_id, reason)

    def allow_writes(self) -> None:
        self._writes_refused = False

    async def partitions(self, topic: str) -> list[str]:
        keys.split_topic(topic)
        if not self.writes_refused():
            return await self._partitions(topic)
        # cut off from the metadata store (most likely): a short try, then the reason, not a wait
        # for the store's whole retry budget and the client's deadline
        try:
            async with asyncio.timeout(REFUSED_WRITES_READ_TIMEOUT_S):
                return await self._partitions(topic)
        except (TimeoutError, MetadataError) as exc:
            raise self.writes_refused_error(None, f"the partitions of {topic} cannot be read") from exc

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
            topic = Topic(
                name,
                reliable=is_reliable,
                storage=storage,
                policies=policies,
                metrics=self.metrics,
                commit_turn=self._commit_turn,
            )
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

    # ------------------------------------------------------------ health

    def health(self, client_type: str, client_id: int) -> bool:
        if client_type == "producer":
            p = self._producers.get(client_id)
            return p is not None and not p.closed
        c = self._consumers.get(client_id)
        return c is not None and not c.closed

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
