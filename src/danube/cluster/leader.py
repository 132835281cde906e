"""Leader election: compare-and-swap on ``/cluster/leader`` under the broker's lease.

Campaign = one transaction "if /cluster/leader does not exist, put my id
there attached to my lease".  The key disappears with the lease (broker death,
lost lease) or on resignation; every broker watches it and campaigns again
when it is deleted.  Whatever the leader writes as leader is guarded by
:meth:`LeaderElection.guard`: a comparison that the leader key still holds
this broker's id under this lease, so a deposed leader's late writes fail.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Protocol

from danube._tasks import cancel_and_wait
from danube.errors import MetadataError
from danube.metadata import keys
from danube.metadata.store import Compare, MetadataStore, Op

log = logging.getLogger(__name__)


class LeaseSource(Protocol):
    """The broker's membership: its current lease (0 while it has none) and whether it is fenced."""

    lease_id: int
    fenced: bool


class LeaderElection:
    def __init__(
        self,
        store: MetadataStore,
        broker_id: str,
        membership: LeaseSource,
        *,
        on_elected: Callable[[], Awaitable[None]] | None = None,
        on_deposed: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        self.broker_id = broker_id
        self.membership = membership
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        self.is_leader = False
        self.leader_id: str | None = None
        self._lease_at_election = 0
        self._task: asyncio.Task | None = None
        self.changed = asyncio.Event()  # set on every change of leader_id

    def guard(self) -> list[Compare]:
        """Comparisons a leader-only write must carry."""
        return [
            Compare.value(keys.leader(), "==", self.broker_id.encode()),
            Compare.lease(keys.leader(), "==", self._lease_at_election),
        ]

    async def campaign(self) -> bool:
        lease = self.membership.lease_id
        if not lease or self.membership.fenced:
            return False
        key = keys.leader()
        result = await self.store.txn(
            [Compare.version(key, "==", 0)], [Op.put(key, self.broker_id.encode(), lease=lease)], [Op.get(key)]
        )
        if result.succeeded:
            self._lease_at_election = lease
            await self._set_leader(self.broker_id)
            return True
        current = result.results[0]
        if current is not None and current.value.decode() == self.broker_id and current.lease == lease:
            self._lease_at_election = lease  # our own key (a retried campaign)
            await self._set_leader(self.broker_id)
            return True
        await self._set_leader(current.value.decode() if current is not None else None)
        return False

    async def _set_leader(self, leader_id: str | None) -> None:
        was = self.is_leader
        self.leader_id = leader_id
        self.is_leader = leader_id == self.broker_id
        self.changed.set()
        if self.is_leader and not was:
            log.info("broker %s is the cluster leader", self.broker_id)
            if self._on_elected is not None:
                await self._on_elected()
        elif was and not self.is_leader:
            log.warning("broker %s is no longer the cluster leader (now %s)", self.broker_id, leader_id)
            if self._on_deposed is not None:
                await self._on_deposed()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"leader-{self.broker_id}")

    async def stop(self, *, resign: bool = True) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if resign and self.is_leader:
            try:
                await self.store.txn(self.guard(), [Op.delete(keys.leader())])
            except MetadataError:
                pass
            await self._set_leader(None)

    async def _run(self) -> None:
        key = keys.leader()
        while True:
            try:
                kv, revision = await self.store.get_with_revision(key)
                if kv is None:
                    await self.campaign()
                    kv, revision = await self.store.get_with_revision(key)
                await self._set_leader(kv.value.decode() if kv is not None else None)
                if self.is_leader and (kv is None or kv.lease != self.membership.lease_id):
                    await self._set_leader(None)  # our lease changed under us: campaign again
                    continue
                async for event in self.store.watch(key, start_revision=revision + 1):
                    if event.key != key:
                        continue
                    if event.kind == "delete":
                        await self._set_leader(None)
                        if await self.campaign():
                            pass
                    else:
                        await self._set_leader(event.value.decode())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep campaigning
                log.warning("leader election of broker %s: %s; retrying", self.broker_id, exc)
                if self.is_leader:
                    await self._set_leader(None)
                await asyncio.sleep(0.5)
