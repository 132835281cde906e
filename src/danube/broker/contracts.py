"""What the broker needs of the parts plugged into it, as ``typing.Protocol``\\ s.

As NATS's ``store.go`` states what a stream store must do and aiokafka's ``_protocols.py`` what
its pieces expect of each other, this module is the one statement of what the broker needs of the
parts plugged into it, below and above.  Below, three contracts:

- :class:`TopicStorage` — one topic's log, as a :class:`~danube.broker.topic.Topic` uses it.
  Implemented by ``danube.storage.TopicStorage`` (reliable topics: the WAL and durable segments)
  and ``danube.broker.memory_storage.MemoryTopicStorage`` (non-reliable topics: a bounded history
  in memory).
- :class:`StorageFactory` — how :class:`~danube.broker.service.BrokerService` opens a reliable
  topic's storage. Implemented by ``danube.storage.StorageFactory``.
- :class:`Dispatcher` — one subscription type's rules (as Danube's
  ``dispatcher/exclusive|shared|key_shared``), which a
  :class:`~danube.broker.subscription.Subscription` delegates to; one class per type in
  ``danube.broker.dispatch``.

Above, the broker's extension points: a layer above the broker (cluster, routing, server) that
adds to it does so by filling a typed slot of :class:`~danube.broker.service.BrokerService`
(``None`` until it does), never by setting an attribute the broker does not declare, and the
broker calls it only through these contracts, never by importing the layer:

- :class:`Cluster` — ``BrokerService.cluster``: the cluster node (lookups, ownership, moves) and
  what the layers above read of it through the broker (:class:`ClusterView`, :class:`Election`).
- :class:`PeerChannels` — ``BrokerService.peers``: channels to the other brokers, authenticated
  as this broker (``danube.cluster.peers.Peers``).
- :class:`RemotePublisher` — ``BrokerService.remote_publisher``: stores a record on a topic that
  another broker owns (a dead letter whose topic is served elsewhere).
- :class:`RepartitionHook` — ``BrokerService.repartition``: the live repartition runtime, told of
  every topic opened and asked how many partitions a consumer reads.
- :class:`Rebalancing` — ``BrokerService.rebalancer``: the cluster's rebalancer, for the admin service.

The schema gate (``BrokerService.schema_gate``) is ``danube.schema.validation.SchemaGate`` itself:
the schema package sits below the broker.  One topic's slot works the same way:
``Topic.delivery_gate`` (``danube.broker.topic.DeliveryGate``), which live repartition fills.

The implementations do not inherit from these classes: they match them by shape, and mypy checks
that they do (the functions under ``TYPE_CHECKING`` at the end of this module for the layers below;
the upper layers' own installing code, which assigns to these typed slots, for the others).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Collection, Protocol

if TYPE_CHECKING:
    from danube.broker.delivery import Delivery, MustAwait
    from danube.broker.subscription import Consumer
    from danube.metadata.election import LeaseHolder

__all__ = [
    "TopicStorage",
    "StorageFactory",
    "Dispatcher",
    "Cluster",
    "ClusterView",
    "Election",
    "PeerChannels",
    "RemotePublisher",
    "RepartitionHook",
    "Rebalancing",
]


class TopicStorage(Protocol):
    """One topic's log on this broker: offsets stamped in order, consecutive from ``first_offset``
    to ``next_offset - 1``, stored as whole frames (``danube.message_codec``), never re-encoded.

    Appends come from the broker's event loop, one at a time; reads may overlap them. A record
    becomes visible to subscribers only once :meth:`wait_durable` returned for it (the topic keeps
    that boundary, ``Topic.readable_next``)."""

    @property
    def next_offset(self) -> int:
        """The offset the next appended record gets."""

    @property
    def first_offset(self) -> int:
        """The oldest offset still readable; ``next_offset`` when nothing is held.  It moves up
        as history is dropped (retention, a memory budget): a subscriber behind it skips ahead."""

    def append_frames(self, buf: bytearray) -> tuple[int, int]:
        """Validate ``buf`` (unstamped frames), stamp the next offsets into it in place and append
        it; ``(first, last)``.  Synchronous and never waits on a disk.  Raises
        ``FrameFormatError``/``CorruptFrameError`` before anything is stored, and
        ``TopicSealedError`` once the storage is sealed or closed."""

    def durable_now(self, offset: int) -> bool:
        """Whether :meth:`wait_durable` for ``offset`` (appended already) would return at once."""

    async def wait_durable(self, offset: int) -> None:
        """Return once ``offset`` is durable under the storage's sync policy (at once in memory)."""

    async def read_frames(self, from_offset: int, max_bytes: int) -> bytes | memoryview:
        """Whole frames from ``from_offset``: at least one when there is one, about ``max_bytes``
        in all; ``b""`` at the end.  The result may be a view into the storage's own buffers,
        valid until the next await."""

    async def seal(self) -> int:
        """Stop writes for a handoff to another broker; the last offset stored (-1 if none)."""

    async def make_read_only(self, reason: str) -> int:
        """Refuse every append from now on (``TopicSealedError`` naming ``reason``) and release
        what writing holds (a WAL's writer and lock), but go on serving every offset stored; the
        last offset stored.  Only :meth:`close` follows."""

    async def close(self, *, export: bool = False) -> None:
        """Stop writes and release the storage; the topic stays owned here (no seal).  ``export``
        (a graceful stop): first put every committed record in durable history, if the storage
        keeps one."""


class StorageFactory(Protocol):
    """Opens reliable topics' storage on this broker: the broker's only way to a topic's log."""

    async def open_topic(self, topic: str) -> TopicStorage:
        """The storage of ``topic``, recovered and open; one instance per topic until it closes."""

    async def delete_topic(self, topic: str, *, unload: Callable[[], Awaitable[object]] | None = None) -> list[str]:
        """Remove everything stored for ``topic`` on this broker and in its durable store; the
        paths/keys removed.  Opens of ``topic`` are refused while it runs; ``unload`` (the broker
        closing the topic) is awaited first, so no late write brings files back, and the next open
        starts the topic anew, empty.  A broker without a storage factory (memory only) stores
        nothing to delete."""

    async def close(self) -> None:
        """Close every storage it opened (the broker closes its topics first)."""


class Dispatcher(Protocol):
    """One subscription type: who may join, who may receive, and what a receive takes.

    The :class:`~danube.broker.subscription.Subscription` keeps what every type shares — its
    consumers, the cursor and acks (``AckTracker``), redelivery and ack timeouts, the failure
    policy, the receivers waiting — and calls these hooks.  A dispatcher reads through its
    subscription (``read_lock``, ``redeliver``, ``deliver_fresh``, ``read_fresh``, ``frame_at``,
    ``window``), so every type stores the same bytes and tracks deliveries the same way."""

    @property
    def sub_type(self) -> str:
        """The type's name on the wire and in metadata: ``exclusive``, ``shared``, ..."""

    @property
    def takes_key_filters(self) -> bool:
        """Whether consumers of this type may subscribe with key filters."""

    @property
    def acks_release(self) -> bool:
        """Whether an ack may make deliverable what was held back for it (beyond the unacked
        window, which the subscription watches itself): waiting receivers are woken on acks."""

    @property
    def solo_in_order(self) -> bool:
        """Whether, while the subscription has one consumer, that consumer (active) may receive
        and takes fresh frames in offset order from the read position with no limit of the
        type's own: the subscription may then push them to it without asking the dispatcher."""

    def check_join(self, consumer_name: str) -> None:
        """Raise ``AlreadyExistsError`` when a consumer of this name may not become active now."""

    def joined(self, consumer: Consumer) -> None:
        """``consumer`` became active (or, being active, got new key filters)."""

    def left(self, consumer: Consumer) -> None:
        """``consumer`` is no longer active: forget what was routed to it (its unacked messages
        are taken back by the subscription)."""

    def restarted(self, consumer: Consumer) -> None:
        """A new receive stream serves ``consumer``: drop what was routed for the old one."""

    def may_receive(self, consumer: Consumer) -> bool:
        """Whether ``consumer`` is served at all now (a failover standby is not)."""

    def order_waiters(self, waiters: list[tuple[Consumer, asyncio.Future]]) -> None:
        """Sort receivers about to be woken (in place) into the order they should fetch in."""

    async def fetch(self, consumer: Consumer, max_messages: int, max_bytes: int, now: float) -> Delivery | None:
        """The next delivery for ``consumer`` (at most ``max_messages``, about ``max_bytes``),
        tracked as delivered; None when there is nothing for it now."""

    def fetch_now(
        self, consumer: Consumer, max_messages: int, max_bytes: int, now: float
    ) -> Delivery | None | MustAwait:
        """``fetch`` without an await, called only while no read holds ``read_lock``;
        ``danube.broker.delivery.MUST_AWAIT`` when only ``fetch`` can answer."""

    def forget(self, offsets: Collection[int]) -> None:
        """``offsets`` were taken back (nack, ack timeout): drop any copy waiting for a consumer."""

    @property
    def blocks_per_key(self) -> bool:
        """Whether a poison message held under the block policy stalls only its own key (key
        shared, as in Danube) rather than the whole subscription."""

    def blocked(self, offset: int) -> None:
        """``offset`` is now held under the block policy."""


# ---------------------------------------------------------------- the broker's extension points


class ClusterView(Protocol):
    """The cluster's assignments as this broker last saw them (``danube.cluster.view.ClusterView``)."""

    @property
    def registered(self) -> Collection[str]:
        """The ids of the brokers registered in the cluster."""

    @property
    def unassigned(self) -> Collection[str]:
        """Topics waiting for the leader to place them."""

    @property
    def leader(self) -> str | None:
        """The id of the cluster's leader as this broker last saw it; None between leaders."""

    def owner(self, topic: str) -> str | None:
        """The id of the broker ``topic`` is assigned to, if any."""

    def broker_url(self, broker_id: str) -> str | None:
        """The client URL a registered broker advertises."""


class Election(Protocol):
    """The cluster leader's election as this broker takes part in it (``danube.cluster.leader``)."""

    @property
    def is_leader(self) -> bool:
        """Whether this broker holds the leader key now."""

    def guard(self) -> list[Any]:
        """Compares that make a metadata write fail once this broker is no longer the leader."""


class Cluster(Protocol):
    """``BrokerService.cluster``: the cluster node in cluster mode (``danube.cluster.node.ClusterNode``).

    The broker delegates lookups and unloads to it and asks it before opening a topic; the layers
    above read the assignments and the election through it."""

    @property
    def broker_id(self) -> str:
        """This broker's id in the cluster."""

    @property
    def view(self) -> ClusterView:
        """The in-memory copy of the cluster's assignments."""

    @property
    def election(self) -> Election:
        """The leader election this broker takes part in."""

    @property
    def membership(self) -> LeaseHolder:
        """This broker's cluster lease (its registration); other leases of the broker's may ride on it."""

    @property
    def client_proxy(self) -> Any:
        """Danube's proxy mode (``danube.cluster.client_proxy.ClientProxy``); None when it is off."""

    async def lookup(self, topic: str) -> Any:
        """Where clients of ``topic`` go: a ``danube.broker.service.LookupResult``."""

    async def check_owner(self, topic: str) -> None:
        """Raise ``NotServedHereError`` (with the owner's URL) unless ``topic`` may be opened here."""

    def unreachable(self, what: str) -> str:
        """Why ``what`` cannot be done while the metadata store is out of reach."""

    def write_refusal(self, topic: str | None = None) -> str:
        """Why a write is refused while this broker's cluster lease is stale."""

    async def unload(self, topic: str) -> int | None:
        """Unload ``topic`` from this broker so another one takes it over."""

    async def unload_anywhere(self, topic: str, *, caller: str | None = None) -> int | None:
        """Unload ``topic`` from its owner, wherever it is: here, or through the owner's admin port
        as ``caller`` (an admin call's ``authorization`` header) or else as this broker."""

    async def drain(
        self,
        broker_id: str,
        *,
        dry_run: bool = False,
        include: tuple = (),
        exclude: tuple = (),
        timeout_s: float = 60.0,
        caller: str | None = None,
    ) -> dict:
        """Move every topic off ``broker_id`` and keep new ones away from it until :meth:`activate`;
        the moves it made (or would make, with ``dry_run``) as ``UnloadBrokerResponse`` fields."""

    async def activate(self, broker_id: str) -> None:
        """Let the leader place topics on ``broker_id`` again (after :meth:`drain`)."""


class PeerChannels(Protocol):
    """``BrokerService.peers``: gRPC channels to the other brokers of the cluster, carrying this
    broker's credentials (or a forwarded caller's), ``danube.cluster.peers.Peers``."""

    def channel(self, url: str, *, caller: str | None = None) -> Any:
        """A ``grpc.aio.Channel`` to ``url``; the caller closes it."""

    def runs_as_broker(self, caller: str | None) -> bool:
        """Whether a call forwarded for ``caller`` is made as this broker."""

    def explain(self, exc: Any, *, as_broker: bool) -> str:
        """A sentence for a failed peer call (``grpc.aio.AioRpcError``)."""


class RemotePublisher(Protocol):
    """``BrokerService.remote_publisher``: stores one record on a topic another broker owns
    (``danube.cluster.forward_publish``), as the broker does with a dead letter served elsewhere."""

    async def publish(
        self,
        owner_url: str,
        topic: str,
        producer_name: str,
        payload: bytes,
        *,
        publish_time: int,
        routing_key: str | None,
        attributes: dict[str, str],
    ) -> None:
        """Store the record at ``owner_url``; raises when the owner refuses or cannot be reached."""


class RepartitionHook(Protocol):
    """``BrokerService.repartition``: the live repartition runtime
    (``danube.routing.repartition.runtime.RepartitionRuntime``)."""

    def topic_opened(self, name: str) -> None:
        """The broker opened ``name`` (before any subscription reads it)."""

    async def readable_partitions(self, topic: str, count: int) -> int:
        """How many partitions of ``topic`` (recorded with ``count``) a consumer reads: with a
        repartition under way, the ones a shrink still drains and the retired ones too."""


class Rebalancing(Protocol):
    """``BrokerService.rebalancer``: the cluster's rebalancer (``danube.cluster.rebalancing.loop``),
    which the admin service answers from (``danube.cluster.rebalancing.admin``)."""

    @property
    def config(self) -> Any:
        """The rebalancing settings (``RebalancingConfig``)."""

    def is_leader(self) -> bool:
        """Whether this broker's rebalancer may move topics."""

    async def observe(self) -> Any:
        """The cluster's load as the rebalancer sees it now."""

    async def dry_run(self, max_moves: int | None = None) -> Any:
        """The moves a cycle would make, without making them."""

    async def trigger(self, max_moves: int = 1) -> Any:
        """Run a cycle now (on the leader)."""

    async def history_records(self, limit: int | None = None) -> Any:
        """The moves made, newest first."""


if TYPE_CHECKING:
    # mypy checks that the implementations keep the contracts (this is never run).
    from danube.broker.dispatch.exclusive import ExclusiveDispatcher
    from danube.broker.dispatch.failover import FailoverDispatcher
    from danube.broker.dispatch.key_shared import KeySharedDispatcher
    from danube.broker.dispatch.shared import SharedDispatcher
    from danube.broker.memory_storage import MemoryTopicStorage
    from danube.storage.factory import StorageFactory as WalStorageFactory
    from danube.storage.topic_storage import TopicStorage as WalTopicStorage

    def _storages(memory: MemoryTopicStorage, wal: WalTopicStorage) -> tuple[TopicStorage, TopicStorage]:
        return memory, wal

    def _factory(factory: WalStorageFactory) -> StorageFactory:
        return factory

    def _dispatchers(
        a: ExclusiveDispatcher, b: FailoverDispatcher, c: SharedDispatcher, d: KeySharedDispatcher
    ) -> tuple[Dispatcher, Dispatcher, Dispatcher, Dispatcher]:
        return a, b, c, d
