"""Broker membership: a registration key under a lease, kept alive, with a write fence.

A broker registers ``/cluster/register/{broker_id}`` (JSON: broker_id,
broker_url, admin_url, started_at) attached to a lease of ``lease_ttl_s``
seconds and renews the lease every ``lease_ttl_s / 3``.

The fence: etcd expires the lease at the earliest ``ttl`` seconds after the
last keepalive the server *received*, which is after the moment this broker
*sent* it.  So once ``fence_after_s`` (default ``2/3 · ttl``) has passed since
the send time of the last successful keepalive, the broker calls ``on_fence``
and must stop accepting writes: that is strictly before the lease can expire
and before the leader can hand the broker's topics to another broker.  When a
later keepalive succeeds on the same lease, ``on_unfence`` is called.  When the
lease is gone (expired or revoked), the broker stays fenced, calls
``on_lease_lost`` and registers again under a new lease (its topics were or
will be reassigned by the leader; the node unloads them before unfencing).

The keepalive loop itself is the project's one lease keeper
(``danube.metadata.lease.LeaseKeeper``); this module adds the registration and the fence.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Awaitable, Callable, Protocol

from danube._tasks import cancel_and_wait
from danube.errors import MetadataError
from danube.metadata import keys
from danube.metadata.lease import LeaseKeeper
from danube.metadata.store import Compare, MetadataStore, Op

log = logging.getLogger(__name__)


class Fence(Protocol):
    """What the broker honours: while fenced it refuses writes (publishes)."""

    def fence(self, reason: str) -> None: ...

    def unfence(self) -> None: ...


class Membership(LeaseKeeper):
    def __init__(
        self,
        store: MetadataStore,
        broker_id: str,
        info: dict,
        *,
        lease_ttl_s: int = 10,
        fence: Fence | None = None,
        fence_after_s: float | None = None,
        on_lease_lost: Callable[[], Awaitable[None]] | None = None,
        on_reregistered: Callable[[], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if lease_ttl_s < 2:
            raise ValueError("lease_ttl_s must be >= 2")
        super().__init__(store, lease_ttl_s=lease_ttl_s, name=f"broker {broker_id}", clock=clock)
        self.broker_id = broker_id
        self.info = dict(info, broker_id=broker_id)
        self.fence_after_s = fence_after_s if fence_after_s is not None else self.lease_ttl_s * 2.0 / 3.0
        self._fence = fence
        self._on_lease_lost = on_lease_lost
        self._on_reregistered = on_reregistered
        self._watchdog: asyncio.Task | None = None
        self.registrations = 0  # how many times this broker registered (1 + re-registrations)

    async def _take_lease(self) -> int:
        lease = await self.store.grant_lease(self.lease_ttl_s)
        key = keys.broker_register(self.broker_id)
        value = json.dumps(dict(self.info, registered_at=time.time()), sort_keys=True).encode()
        result = await self.store.txn([Compare.version(key, "==", 0)], [Op.put(key, value, lease=lease)], [Op.get(key)])
        if not result.succeeded:
            await self.store.revoke_lease(lease)
            raise MetadataError(
                f"broker id {self.broker_id} is already registered (another broker is alive "
                "with this id, or the previous lease has not expired yet)"
            )
        self.registrations += 1
        log.info("broker %s registered under lease %x (ttl %d s)", self.broker_id, lease, self.lease_ttl_s)
        return lease

    async def register(self) -> int:
        """Grant a lease and write the registration; a live registration of the same id is an error."""
        return await self.acquire()

    async def register_waiting(self, timeout: float) -> int:
        """:meth:`register`, retrying while a previous registration of this id is still leased."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                return await self.register()
            except MetadataError:
                if loop.time() >= deadline:
                    raise
                await asyncio.sleep(0.5)

    def start(self) -> None:
        super().start()
        self._watchdog = asyncio.get_running_loop().create_task(self._fence_watchdog(), name=f"fence-{self.broker_id}")

    async def stop(self, *, revoke: bool = True) -> None:
        await cancel_and_wait(self._watchdog)
        self._watchdog = None
        await super().stop(revoke=revoke)

    # ------------------------------------------------------------ fencing

    def lease_fresh(self) -> bool:
        """Whether writes are allowed now: not fenced and the last good keepalive was sent less than
        ``fence_after_s`` ago (read from the clock, not from the watchdog's flag, so a process that
        was stopped past its lease refuses writes from its first instruction after waking)."""
        return not self.fenced and self._clock() < self.last_ok_sent + self.fence_after_s

    def unrenewed_s(self) -> float:
        """Seconds since the last good keepalive (or grant) was sent."""
        return max(0.0, self._clock() - self.last_ok_sent)

    def _set_fenced(self, reason: str) -> None:
        if not self.fenced:
            self.fenced = True
            log.warning("broker %s fenced: %s", self.broker_id, reason)
            if self._fence is not None:
                self._fence.fence(reason)

    def _clear_fence(self) -> None:
        if self.fenced:
            self.fenced = False
            log.info("broker %s unfenced: lease %x renewed", self.broker_id, self.lease_id)
            if self._fence is not None:
                self._fence.unfence()

    async def _fence_watchdog(self) -> None:
        while True:
            deadline = self.last_ok_sent + self.fence_after_s
            now = self._clock()
            if now >= deadline:
                self._set_fenced(
                    f"no lease renewal for {now - self.last_ok_sent:.1f} s (lease ttl {self.lease_ttl_s} s)"
                )
                await asyncio.sleep(0.05)
            else:
                await asyncio.sleep(min(0.1, deadline - now))

    # ------------------------------------------------------------ the lease keeper's events

    def _renewed(self) -> None:
        self._clear_fence()

    async def _lost(self, old_lease: int) -> None:
        self._set_fenced(f"lease {old_lease:x} expired")
        if self._on_lease_lost is not None:
            await self._on_lease_lost()  # a failure is logged by the keeper: re-registering matters more

    async def _reacquired(self) -> None:
        self._clear_fence()
        if self._on_reregistered is not None:
            await self._on_reregistered()
