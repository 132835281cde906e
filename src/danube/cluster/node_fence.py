"""The cluster node's fence (:class:`danube.cluster.membership.Fence`): cut off from etcd,
writes are refused, then every topic turns read-only once the lease may have expired; renewed
again, they reopen for writing; a lost lease closes them.

A base class of :class:`~danube.cluster.node.ClusterNode` (``cluster/node.py``), which holds the
state; its methods are moved here whole.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Coroutine

if TYPE_CHECKING:
    from danube.broker.service import BrokerService
    from danube.cluster.membership import Membership

log = logging.getLogger(__name__)


class Fencing:
    if TYPE_CHECKING:  # what this part uses of the rest of ClusterNode
        broker: BrokerService
        membership: Membership
        broker_id: str

        def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...

        async def _drop(self, topic: str, why: str, *, flush: bool = True) -> None: ...

    def fence(self, reason: str) -> None:
        """No lease renewal for 2/3 ttl: refuse writes now; once the lease may have expired (ttl
        after the last good keepalive was sent) and the broker is still fenced, turn every topic
        read-only, which releases its WAL (writer and lock) so the topic's next owner can open it
        — a broker cut off from etcd cannot learn that it lost the topic — while consumers go on
        reading what was stored."""
        self.broker.refuse_writes(reason)
        self._spawn(self._read_only_when_lease_may_expire())

    def unfence(self) -> None:
        """The lease was renewed: it never expired, so nobody else was given this broker's topics;
        the read-only ones are opened for writing again.  (A lost lease closes them first:
        ``_lease_lost`` runs before the re-registration unfences.)"""
        self.broker.allow_writes()
        if any(t.read_only for t in self.broker.topics.values()):
            self._spawn(self._reopen_read_only())

    async def _read_only_when_lease_may_expire(self) -> None:
        m = self.membership
        since = m.last_ok_sent
        await asyncio.sleep(max(since + m.lease_ttl_s - m._clock(), 0.0))
        if not m.fenced or m.last_ok_sent != since:
            return
        served = [t for t in list(self.broker.topics) if not t.startswith("/system/")]
        log.warning(
            "broker %s: still fenced one lease ttl after its last renewal; %d topic(s) read-only, their WALs released",
            self.broker_id,
            len(served),
        )
        reason = (
            f"broker {self.broker_id} cannot reach the metadata store (etcd) and gave the topic's WAL up "
            "when its cluster lease could expire"
        )
        for name in served:
            if not m.fenced or m.last_ok_sent != since:
                break  # renewed (or re-registered) meanwhile: the rest stays writable
            try:
                await self.broker.make_read_only(name, reason)
            except Exception:  # noqa: BLE001 - release the others anyway
                log.exception("making %s read-only failed; closing it", name)
                await self._drop(name, "it could not be made read-only", flush=False)
        if not m.fenced and any(t.read_only for t in self.broker.topics.values()):
            self._spawn(self._reopen_read_only())  # unfenced while this ran: nobody else reopens them

    async def _reopen_read_only(self) -> None:
        for name in [n for n, t in list(self.broker.topics.items()) if t.read_only]:
            if not self.membership.lease_fresh():
                return  # fenced again: the next renewal reopens what is left
            try:
                await self.broker.reopen_for_writing(name)
            except Exception:  # noqa: BLE001 - its clients look it up again and reopen it
                log.exception("reopening %s for writing failed; closing it", name)
                await self._drop(name, "it could not be reopened for writing", flush=False)

    async def _lease_lost(self) -> None:
        # the cursors stay as they are in etcd: the topics' next owners may have moved them, or
        # (local storage) issued their offsets again
        for topic in [t for t in list(self.broker.topics) if not t.startswith("/system/")]:
            await self._drop(topic, "this broker lost its cluster lease", flush=False)
