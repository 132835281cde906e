"""A metadata-store lease kept alive: granted, renewed every ``ttl / 3`` seconds, taken anew when lost.

Whatever is written under the lease (a broker's registration, an election key) vanishes when
the lease is not renewed in time or is revoked.  :class:`LeaseKeeper` is the one keepalive loop
of the project: the cluster membership (``danube.cluster.membership``) extends it with a
registration key and the write fence; the scalable topic service of a standalone broker uses it
as is for its controllers' elections.

A renewal that fails (store unreachable, slow) is retried at the next tick; the lease may
still be alive.  A renewal the store refuses because the lease is gone ends that lease:
:meth:`LeaseKeeper._lost` runs, then a new lease is taken (retried until it succeeds), then
:meth:`LeaseKeeper._reacquired` runs.  ``last_ok_sent`` is the clock time at which the last
successful renewal (or the grant) was *sent*: the store counts the lease's ttl from a moment
after it, which is what a fence must be computed from.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from danube._tasks import cancel_and_wait
from danube.errors import MetadataError
from danube.metadata.store import LeaseNotFoundError, MetadataStore

log = logging.getLogger(__name__)

RETRY_S = 0.5  # pause between attempts to take a new lease after the old one was lost


class LeaseKeeper:
    """One lease of ``lease_ttl_s`` seconds, renewed in the background between :meth:`start` and
    :meth:`stop`.  ``lease_id`` is 0 while there is none; ``fenced`` is always False here (a
    subclass that fences writes sets it), so a keeper is what an election's candidate needs."""

    def __init__(
        self,
        store: MetadataStore,
        *,
        lease_ttl_s: int = 10,
        name: str = "lease",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if lease_ttl_s < 1:
            raise ValueError("lease_ttl_s must be >= 1")
        self.store = store
        self.name = name  # for the log
        self.lease_ttl_s = int(lease_ttl_s)
        self.keepalive_interval_s = self.lease_ttl_s / 3.0
        self._clock = clock
        self.lease_id = 0
        self.fenced = False
        self.last_ok_sent = 0.0  # clock time the last successful renewal (or the grant) was sent
        self.lease_changed = asyncio.Event()  # set whenever a new lease is taken
        self._task: asyncio.Task | None = None

    # ------------------------------------------------------------ what a subclass may extend

    async def _take_lease(self) -> int:
        """Grant the lease (a subclass also writes its keys under it, raising MetadataError when it
        cannot; it revokes the lease it granted then)."""
        return await self.store.grant_lease(self.lease_ttl_s)

    def _renewed(self) -> None:
        """A renewal succeeded."""

    async def _lost(self, old_lease: int) -> None:
        """The store no longer knows ``old_lease`` (``lease_id`` is 0 already); before a new one."""

    async def _reacquired(self) -> None:
        """A new lease was taken after the old one was lost."""

    # ------------------------------------------------------------ lifecycle

    async def acquire(self) -> int:
        """Take a lease (:meth:`_take_lease`) and make it the current one."""
        sent = self._clock()
        lease = await self._take_lease()
        self.lease_id = lease
        self.last_ok_sent = sent
        self.lease_changed.set()
        return lease

    def start(self) -> None:
        """Renew the current lease in the background (:meth:`acquire` first)."""
        self._task = asyncio.get_running_loop().create_task(self._keepalive_loop(), name=f"keepalive-{self.name}")

    async def stop(self, *, revoke: bool = True) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if revoke and self.lease_id:
            try:
                await self.store.revoke_lease(self.lease_id)
            except Exception as exc:  # noqa: BLE001 - leaving is best effort: the lease expires anyway
                log.warning(
                    "%s: could not revoke lease %x at shutdown (%s); it expires in %d s",
                    self.name,
                    self.lease_id,
                    exc,
                    self.lease_ttl_s,
                )

    # ------------------------------------------------------------ keepalive

    async def _keepalive_loop(self) -> None:
        while True:
            await asyncio.sleep(self.keepalive_interval_s)
            sent = self._clock()
            try:
                async with asyncio.timeout(self.lease_ttl_s):  # (wait_for may swallow a cancel on 3.11)
                    await self.store.keepalive(self.lease_id)
            except LeaseNotFoundError:
                await self._replace_lost_lease()
                continue
            except (MetadataError, TimeoutError) as exc:
                log.warning("%s: lease keepalive failed: %s", self.name, exc)
                continue
            self.last_ok_sent = max(self.last_ok_sent, sent)
            self._renewed()

    async def _replace_lost_lease(self) -> None:
        old = self.lease_id
        self.lease_id = 0
        try:
            await self._lost(old)
        except Exception:  # noqa: BLE001 - taking a new lease matters more
            log.exception("%s: lease-lost handler failed", self.name)
        while True:
            try:
                await self.acquire()
                break
            except MetadataError as exc:
                log.warning("%s: cannot take a new lease after losing lease %x: %s", self.name, old, exc)
                await asyncio.sleep(RETRY_S)
        try:
            await self._reacquired()
        except Exception:  # noqa: BLE001
            log.exception("%s: new-lease handler failed", self.name)
