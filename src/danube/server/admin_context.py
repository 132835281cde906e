"""What every admin servicer shares: the broker's view for listings, forwarding to a topic's owner.

``AdminContext`` answers listings from the metadata store, the cluster view and the broker (so every
broker of a cluster gives the same answer), caches concurrent identical listings (``Listings``) and
forwards a call the topic's owner must act on to the owner's admin port, marked ``FORWARDED`` so
the owner answers itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable, cast

import grpc

from danube.cluster import peers
from danube.metadata import keys
from danube.proto.danube_admin import admin_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from danube.broker.service import BrokerService

log = logging.getLogger(__name__)


def namespace_name(namespace: str) -> str:
    """A namespace as Danube's admin CLI sends it (``default`` or ``/default``), checked by the
    project's name rule."""
    ns = namespace[1:] if isinstance(namespace, str) and namespace.startswith("/") else namespace
    return keys.check_namespace(ns)


def _delivery(doc: Any) -> str:
    strategy = (doc or {}).get("dispatch_strategy", "") if isinstance(doc, dict) else ""
    return "Reliable" if str(strategy).lower() == "reliable" else "NonReliable"


# Listings built at once over all keys (the admin port shares the broker's event loop with the
# client port, so many concurrent listings must not take its CPU).
LISTINGS_AT_ONCE = 4


class Listings:
    """Coalesced listings: calls for the same listing share one build that started after they
    arrived (so none misses what existed when it was made), at most one build running and one
    pending per listing, and at most ``LISTINGS_AT_ONCE`` builds over all listings.  A thousand
    concurrent ``topics list`` calls cost two builds, not a thousand."""

    def __init__(self) -> None:
        self._running: dict[Any, asyncio.Future] = {}
        self._pending: dict[Any, asyncio.Future] = {}
        self._gate = asyncio.Semaphore(LISTINGS_AT_ONCE)

    async def get(self, key: Any, build: Callable[[], Awaitable[Any]]) -> Any:
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = asyncio.ensure_future(self._build(key, build, self._running.get(key)))
        return await asyncio.shield(pending)

    async def _build(self, key: Any, build: Callable[[], Awaitable[Any]], before: asyncio.Future | None) -> Any:
        if before is not None:
            await asyncio.wait((before,))  # its outcome is its callers'; this build starts after it
        me = self._pending.pop(key)
        self._running[key] = me
        try:
            async with self._gate:
                return await build()
        finally:
            if self._running.get(key) is me:
                del self._running[key]


class AdminContext:
    """Shared lookups over the broker and its metadata store."""

    def __init__(self, broker: BrokerService) -> None:
        self.broker = broker
        self.metadata = broker.metadata
        self.listings = Listings()

    async def topics_in(self, namespace: str) -> dict[str, str]:
        """``{topic: delivery}`` for every topic of ``namespace`` known to metadata or served here."""
        ns = namespace_name(namespace)
        out: dict[str, str] = {}
        fields: dict[str, set[str]] = {}
        for kv in await self.metadata.get_prefix(f"/topics/{ns}/"):
            parts = kv.key.split("/")  # ['', 'topics', ns, topic, field, ...]
            if len(parts) >= 5:
                name = f"/{ns}/{parts[3]}"
                fields.setdefault(name, set()).add(parts[4])
                if parts[4] == "delivery":
                    out[name] = _delivery(json.loads(kv.value))
                else:
                    out.setdefault(name, "")
        for name, names in fields.items():  # the base name of a partitioned topic is no topic (its partitions are)
            if names == {"partitions"}:
                out.pop(name, None)
        for name, topic in self.broker.topics.items():
            if keys.split_topic(name)[0] == ns:
                out[name] = "Reliable" if topic.reliable else "NonReliable"
        if self.cluster is not None:  # assigned somewhere in the cluster (the view), even if not yet in metadata
            for name in list(self.cluster.view.assignments):
                if name.startswith(f"/{ns}/"):
                    out.setdefault(name, "")
        return {name: delivery or "NonReliable" for name, delivery in sorted(out.items())}

    async def namespaces(self) -> list[str]:
        names = set()
        for kv in await self.metadata.get_prefix("/namespaces/"):
            parts = kv.key.split("/")
            if len(parts) >= 3 and parts[2]:
                names.add(parts[2])
        for kv in await self.metadata.get_prefix("/topics/"):
            parts = kv.key.split("/")
            if len(parts) >= 3 and parts[2]:
                names.add(parts[2])
        for name in self.broker.topics:
            names.add(keys.split_topic(name)[0])
        if self.cluster is not None:
            for name in list(self.cluster.view.assignments):
                names.add(name.split("/")[1])
        return sorted(n for n in names if n)

    async def subscriptions(self, topic: str) -> list[str]:
        keys.split_topic(topic)
        names = set()
        prefix = keys.topic_subscriptions(topic)
        for kv in await self.metadata.get_prefix(prefix):
            sub = kv.key[len(prefix) :].split("/", 1)[0]
            if sub:
                names.add(sub)
        served = self.broker.topics.get(topic)
        if served is not None:
            names.update(served.subscriptions.keys())
        return sorted(names)

    @property
    def cluster(self):
        return self.broker.cluster

    def owner(self, topic: str) -> str:
        """The broker serving ``topic`` ("" when none): the cluster view's assignment, else this broker."""
        cluster = self.cluster
        if cluster is not None:
            owner = cluster.view.owner(topic)
            if owner is not None:
                return str(owner)
        return str(self.broker.broker_id) if topic in self.broker.topics else ""

    def remote_owner(self, topic: str, context) -> str | None:
        """The owner's id when the request must go to another broker's admin port: cluster mode, the
        topic assigned elsewhere, and the request not already forwarded (no loops)."""
        cluster = self.cluster
        if cluster is None or forwarded(context):
            return None
        owner = cluster.view.owner(topic)
        return owner if owner is not None and str(owner) != str(cluster.broker_id) else None

    async def forward(self, broker_id: str, method: str, request, context, stub=pb_grpc.TopicAdminStub):
        """``TopicAdmin.method(request)`` (or ``stub``'s) at ``broker_id``'s admin port; its reply, or its error (same code).
        It carries the caller's token, so RBAC at the owner judges the caller (danube.cluster.peers)."""
        info = self.cluster.view.registered.get(broker_id) or {}
        admin_url = info.get("admin_url")
        if not admin_url:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"broker {broker_id} has no admin port registered")
        channels, caller = peers.for_broker(self.broker), peers.caller_authorization(context)
        try:
            async with channels.channel(cast(str, admin_url), caller=caller) as channel:  # aborted without one
                call = getattr(stub(channel), method)
                return await call(request, timeout=60, metadata=((FORWARDED, "1"),))
        except grpc.aio.AioRpcError as exc:
            await context.abort(
                exc.code(), f"at broker {broker_id}: {channels.explain(exc, as_broker=channels.runs_as_broker(caller))}"
            )

    def registry(self):
        """The broker's schema registry (the one its gate follows), else one over the metadata store."""
        gate = self.broker.schema_gate
        if gate is not None:
            return gate.registry
        from danube.schema.registry import SchemaRegistry

        return SchemaRegistry(self.metadata)

    async def known(self, topic: str) -> tuple[bool, str]:
        """(exists, delivery) of a topic."""
        keys.split_topic(topic)
        served = self.broker.topics.get(topic)
        if served is not None:
            return True, "Reliable" if served.reliable else "NonReliable"
        doc = await self.metadata.get_json(keys.topic_delivery(topic))
        return doc is not None, _delivery(doc)


FORWARDED = "x-danube-admin-forwarded"


def forwarded(context) -> bool:
    """Whether the call came from another broker's admin service (answered here, never forwarded again)."""
    try:
        return any(k == FORWARDED for k, _v in (context.invocation_metadata() or ()))
    except Exception:  # noqa: BLE001 - no metadata: a client's call
        return False


async def unimplemented(context, what: str) -> None:
    await context.abort(
        grpc.StatusCode.UNIMPLEMENTED,
        f"{what} is not available on a standalone broker yet (it comes with the cluster layer)",
    )
