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
from danube.metadata.store import Compare, LeaseNotFoundError, MetadataStore, Op

log = logging.getLogger(__name__)


class Fence(Protocol):
    """What the broker honours: while fenced it refuses writes (publishes)."""

    def fence(self, reason: str) -> None: ...

    def unfence(self) -> None: ...


class Membership:
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
        clock=time.monotonic,
    ) -> None:
        if lease_ttl_s < 2:
            raise ValueError("lease_ttl_s must be >= 2")
        self.store = store
        self.broker_id = broker_id
        self.info = dict(info, broker_id=broker_id)
        self.lease_ttl_s = int(lease_ttl_s)
        self.fence_after_s = fence_after_s if fence_after_s is not None else self.lease_ttl_s * 2.0 / 3.0
        self.keepalive_interval_s = self.lease_ttl_s / 3.0
        self._fence = fence
        self._on_lease_lost = on_lease_lost
        self._on_reregistered = on_reregistered
        self._clock = clock
        self.lease_id = 0
        self.fenced = False
        self.last_ok_sent = 0.0  # monotonic send time of the last successful keepalive / grant
        self._task: asyncio.Task | None = None
        self._watchdog: asyncio.Task | None = None
        self.registrations = 0  # how many times this broker registered (1 + re-registrations)
        self.lease_changed = asyncio.Event()

    async def register(self) -> int:
        """Grant a lease and write the registration; a live registration of the same id is an error."""
        sent = self._clock()
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
        self.lease_id = lease
        self.last_ok_sent = sent
        self.registrations += 1
        self.lease_changed.set()
        log.info("broker %s registered under lease %x (ttl %d s)", self.broker_id, lease, self.lease_ttl_s)
        return lease

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
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._keepalive_loop(), name=f"membership-{self.broker_id}")
        self._watchdog = loop.create_task(self._fence_watchdog(), name=f"fence-{self.broker_id}")

    async def stop(self, *, revoke: bool = True) -> None:
        await cancel_and_wait(self._task)
        await cancel_and_wait(self._watchdog)
        self._task = self._watchdog = None
        if revoke and self.lease_id:
            try:
                await self.store.revoke_lease(self.lease_id)
            except MetadataError:
                log.warning(
                    "could not revoke lease %x at shutdown; it expires in %d s", self.lease_id, self.lease_ttl_s
                )

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

    # ------------------------------------------------------------ keepalive

    async def _keepalive_loop(self) -> None:
        while True:
            await asyncio.sleep(self.keepalive_interval_s)
            sent = self._clock()
            try:
                async with asyncio.timeout(self.lease_ttl_s):  # (wait_for may swallow a cancel on 3.11)
                    await self.store.keepalive(self.lease_id)
            except LeaseNotFoundError:
                await self._lease_lost()
                continue
            except (MetadataError, TimeoutError) as exc:
                log.warning("lease keepalive of broker %s failed: %s", self.broker_id, exc)
                continue
            self.last_ok_sent = max(self.last_ok_sent, sent)
            self._clear_fence()

    async def _lease_lost(self) -> None:
        self._set_fenced(f"lease {self.lease_id:x} expired")
        old = self.lease_id
        self.lease_id = 0
        if self._on_lease_lost is not None:
            try:
                await self._on_lease_lost()
            except Exception:  # noqa: BLE001 - re-registering matters more
                log.exception("lease-lost handler of broker %s failed", self.broker_id)
        while True:
            try:
                await self.register()
                break
            except MetadataError as exc:
                log.warning("broker %s cannot re-register after losing lease %x: %s", self.broker_id, old, exc)
                await asyncio.sleep(0.5)
        self._clear_fence()
        if self._on_reregistered is not None:
            try:
                await self._on_reregistered()
            except Exception:  # noqa: BLE001
                log.exception("re-registration handler of broker %s failed", self.broker_id)
