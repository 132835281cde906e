"""The cluster node's lookups and ownership checks: where a topic is served (placing a new one
through the leader's unassigned marker), and whether this broker may open it.

A base class of :class:`~danube.cluster.node.ClusterNode` (``cluster/node.py``), which holds the
state; its methods are moved here whole.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from danube.broker.service import LookupResult
from danube.errors import NotServedHereError
from danube.metadata import keys
from danube.metadata.store import Compare, MetadataStore, Op

if TYPE_CHECKING:
    from danube.cluster.client_proxy import ClientProxy
    from danube.cluster.membership import Membership
    from danube.cluster.view import ClusterView

log = logging.getLogger(__name__)


class Lookups:
    if TYPE_CHECKING:  # what this part uses of the rest of ClusterNode
        store: MetadataStore
        view: ClusterView
        membership: Membership
        client_proxy: ClientProxy | None
        broker_id: str
        broker_url: str
        lookup_timeout_s: float
        _unloading: set[str]
        _pending_markers: dict[str, asyncio.Future]
        _marker_writer: asyncio.Task | None

    async def lookup(self, topic: str):
        keys.split_topic(topic)
        owner = self.view.owner(topic)
        if owner is None and topic not in self.view.unassigned:
            owner = await self._request_placement(topic)
        if owner is None:
            try:
                owner = await self.view.wait_owner(topic, self.lookup_timeout_s)
            except TimeoutError:
                log.warning(
                    "lookup of %s: no broker was assigned within %.0f s (leader: %s)",
                    topic,
                    self.lookup_timeout_s,
                    self.view.leader or "none",
                )
                return LookupResult("failed", "", "")
        if owner == self.broker_id:
            return LookupResult("connect", self.broker_url, self.broker_url)
        url = self.view.broker_url(owner)
        if url is None:
            try:
                url = await self.view.wait_for(lambda: self.view.broker_url(owner), 2.0)
            except TimeoutError:
                return LookupResult("failed", "", "")
        if self.client_proxy is not None:
            # the client keeps talking to this broker, which forwards to the owner and follows the
            # topic when the owner moves it, stops or dies (danube.cluster.client_proxy)
            return LookupResult("redirect", url, self.broker_url, proxy=True)
        return LookupResult("redirect", url, url)

    async def _request_placement(self, topic: str) -> str | None:
        """Write the unassigned marker of ``topic`` unless a broker holds it (then its id).

        Concurrent lookups share transactions: every topic asked for while one is in flight goes
        into the next (``_write_markers``), so a burst of new topics costs a few round trips."""
        future = self._pending_markers.get(topic)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            self._pending_markers[topic] = future
            if self._marker_writer is None or self._marker_writer.done():
                self._marker_writer = asyncio.get_running_loop().create_task(self._flush_markers())
        return await asyncio.shield(future)

    async def _flush_markers(self) -> None:
        while self._pending_markers:
            limit = max(1, 120 // (len(self.view.registered) + 1))  # compares per txn under etcd's 128
            batch = list(self._pending_markers.items())[:limit]
            for topic, _ in batch:
                del self._pending_markers[topic]
            try:
                owners = await self._write_markers([topic for topic, _ in batch])
            except Exception as exc:  # noqa: BLE001 - every waiting lookup gets the error
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for topic, future in batch:
                if not future.done():
                    future.set_result(owners.get(topic))

    async def _write_markers(self, topics: list[str]) -> dict[str, str]:
        """In one transaction: no broker holds any of ``topics`` and none has a marker → write their
        markers.  Otherwise topic by topic (the view may lag: no stale marker for an assigned topic).
        Returns the owners found."""
        brokers = sorted(self.view.registered)

        def compares(topic):
            return [Compare.version(keys.broker_topic(b, topic), "==", 0) for b in brokers] + [
                Compare.version(keys.unassigned(topic), "==", 0)
            ]

        if len(topics) > 1:
            result = await self.store.txn(
                [c for t in topics for c in compares(t)], [Op.put(keys.unassigned(t), b"null") for t in topics]
            )
            if result.succeeded:
                return {}
        owners: dict[str, str] = {}
        for topic in topics:
            result = await self.store.txn(
                compares(topic),
                [Op.put(keys.unassigned(topic), b"null")],
                [Op.get(keys.broker_topic(b, topic)) for b in brokers],
            )
            if not result.succeeded:
                owner = next((b for b, kv in zip(brokers, result.results) if kv is not None), None)
                if owner is not None:
                    owners[topic] = owner
        return owners

    def unreachable(self, what: str) -> str:
        """Why ``what`` (e.g. "writes to /ns/t are refused") while fenced."""
        return (
            f"broker {self.broker_id} cannot reach the metadata store (etcd) for "
            f"{self.membership.unrenewed_s():.0f} s (its cluster lease is not renewed): {what} until it is back"
        )

    def write_refusal(self, topic: str | None = None) -> str:
        """Why a write (a publish, a new topic, producer or subscription) is refused while fenced."""
        what = f"writes to {topic} are refused" if topic else "writes are refused"
        return self.unreachable(what) + "; consumers go on reading what is stored"

    async def check_owner(self, topic: str) -> None:
        if self.membership.fenced:
            raise NotServedHereError(self.write_refusal(topic))
        if topic in self._unloading:
            raise NotServedHereError(f"topic {topic} is moving away from this broker; look it up again")
        if self.view.owner(topic) == self.broker_id:
            return
        # the view may lag behind the leader's write: ask the store
        if await self.store.get(keys.broker_topic(self.broker_id, topic)) is not None:
            return
        owner = self.view.owner(topic)
        url = self.view.broker_url(owner) if owner else None
        where = f"broker {owner} ({url})" if owner else "no broker yet"
        error = NotServedHereError(
            f"topic {topic} is not served by broker {self.broker_id}: owner is {where}; look it up again"
        )
        if url:
            error.owner_url = url  # sent as trailing metadata x-danube-broker-url (danube.server.status)
        raise error
