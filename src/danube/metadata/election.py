"""Leader election on one metadata key, under the candidate's lease.

Campaign = one transaction "if the key does not exist, put my name there attached to my lease".
The key disappears with the lease (the holder died or lost its lease) or on resignation; every
candidate watches it and campaigns again when it is deleted.  Whatever the leader writes as
leader carries :meth:`Election.guard`: comparisons that the key still holds this candidate's
name under the lease it was elected with, so a deposed leader's late writes fail.

The project's one election: the cluster leader (``danube.cluster.leader``, key
``/cluster/leader``, name = broker id) and each scalable topic's controller
(``danube.routing.scalable.controller``, name = broker URL) are instances of it.

A candidate is *leader* only once it won a campaign (a key holding its name under a lease it
did not campaign with, left by an earlier life, does not count) and once ``on_elected`` has
returned: callers never see a leader that is not ready to serve.  If ``on_elected`` fails, the
loop retries after a pause (the key is still the candidate's).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Awaitable, Callable, Protocol

from danube._tasks import cancel_and_wait
from danube.errors import MetadataError
from danube.metadata.store import Compare, MetadataStore, Op

log = logging.getLogger(__name__)

RETRY_S = 0.5  # pause after a failed round (store unreachable, on_elected failed) before the next


class LeaseHolder(Protocol):
    """What a candidate campaigns with: its current lease (0 while it has none) and whether it is
    fenced (a fenced candidate does not campaign).  ``danube.metadata.lease.LeaseKeeper`` and the
    cluster's ``Membership`` fit."""

    @property
    def lease_id(self) -> int: ...

    @property
    def fenced(self) -> bool: ...


Hook = Callable[[], Awaitable[None]]


class Election:
    def __init__(
        self,
        store: MetadataStore,
        key: str,
        candidate: str,
        lease: LeaseHolder,
        *,
        what: str = "",
        on_elected: Hook | None = None,
        on_deposed: Hook | None = None,
        ends_on: tuple[type[Exception], ...] = (),
    ) -> None:
        """``candidate``: the name written in ``key`` (what followers learn as the leader).
        ``what``: what is led, for the log.  ``ends_on``: errors (raised by ``on_elected``) after
        which the candidate leaves the election for good, its key deleted if it holds it (the thing
        led is gone)."""
        self.store = store
        self.key = key
        self.candidate = candidate
        self.lease = lease
        self.what = what or key
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        self._ends_on = ends_on
        self.is_leader = False
        self.leader = ""  # the current leader's name; "" while there is none
        self.changed = asyncio.Event()  # set on every change of the leader
        self._lease_at_election = 0
        self._task: asyncio.Task | None = None

    def guard(self) -> list[Compare]:
        """Comparisons a leader-only write must carry."""
        return [
            Compare.value(self.key, "==", self.candidate.encode()),
            Compare.lease(self.key, "==", self._lease_at_election),
        ]

    async def wait_leader(self, timeout: float = 10.0) -> str:
        """The leader's name once there is one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.leader:
            self.changed.clear()
            async with asyncio.timeout(max(0.0, deadline - loop.time())):  # not wait_for (gh-86296)
                await self.changed.wait()
        return self.leader

    async def campaign(self) -> bool:
        """One attempt: whether this candidate leads now."""
        lease = self.lease.lease_id
        if not lease or self.lease.fenced:
            return False
        result = await self.store.txn(
            [Compare.version(self.key, "==", 0)],
            [Op.put(self.key, self.candidate.encode(), lease=lease)],
            [Op.get(self.key)],
        )
        current = None if result.succeeded else result.results[0]
        if result.succeeded or (
            current is not None and current.value.decode() == self.candidate and current.lease == lease
        ):  # won, or the key is ours already (a retried campaign)
            self._lease_at_election = lease
            await self._set_leader(self.candidate)
            return True
        await self._set_leader(current.value.decode() if current is not None else "")
        return False

    async def _set_leader(self, name: str) -> None:
        was = self.is_leader
        becoming = bool(name) and name == self.candidate and self._lease_at_election != 0
        if becoming and not was:
            log.info("%s leads %s", self.candidate, self.what)
            if self._on_elected is not None:
                await self._on_elected()  # before anyone sees this candidate as the leader
        self.leader = name
        self.is_leader = becoming
        self.changed.set()
        if was and not self.is_leader:
            log.warning("%s no longer leads %s (now %r)", self.candidate, self.what, name)
            if self._on_deposed is not None:
                await self._on_deposed()

    @property
    def running(self) -> bool:
        """Whether this candidate takes part (started, not stopped, not ended by ``ends_on``)."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"election-{self.key}-{self.candidate}")

    async def stop(self, *, resign: bool = True) -> None:
        """Leave the election; ``resign``: delete the key if this candidate holds it (without, the key
        stays until its lease ends, as when the process dies)."""
        await cancel_and_wait(self._task)
        self._task = None
        if resign and self.is_leader:
            await self._resign()
        await self._set_leader("")

    async def _resign(self) -> None:
        with contextlib.suppress(MetadataError):
            await self.store.txn(self.guard(), [Op.delete(self.key)])

    async def _run(self) -> None:
        key = self.key
        while True:
            try:
                kv, revision = await self.store.get_with_revision(key)
                if kv is None:
                    await self.campaign()
                    kv, revision = await self.store.get_with_revision(key)
                await self._set_leader(kv.value.decode() if kv is not None else "")
                if self.is_leader and (kv is None or kv.lease != self.lease.lease_id):
                    await self._set_leader("")  # our lease changed under us: campaign again
                    continue
                async for event in self.store.watch(key, start_revision=revision + 1):
                    if event.key != key:
                        continue
                    if event.kind == "delete":
                        await self._set_leader("")
                        await self.campaign()
                    else:
                        await self._set_leader((event.value or b"").decode())
            except asyncio.CancelledError:
                raise
            except self._ends_on as exc:
                log.info("%s leaves the election of %s: %s", self.candidate, self.what, exc)
                await self._resign()
                self.is_leader, self.leader = False, ""
                self.changed.set()
                return
            except Exception as exc:  # noqa: BLE001 - keep campaigning
                log.warning("election of %s at %s: %s; retrying", self.what, self.candidate, exc)
                if self.is_leader:
                    await self._set_leader("")
                await asyncio.sleep(RETRY_S)
