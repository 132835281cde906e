"""The one lease keeper (danube.metadata.lease) on the in-memory embedded store: renewals keep the
lease past its ttl, a failed renewal is retried without dropping the lease, a lost lease is
replaced (with the keeper's hooks around it), and stop revokes it."""

from __future__ import annotations

import asyncio

import pytest

from danube.errors import MetadataError
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.metadata.lease import LeaseKeeper
from tests.support.waiting import async_wait_until


class Recorder(LeaseKeeper):
    """A keeper that records its events."""

    def __init__(self, store, **kwargs) -> None:
        super().__init__(store, **kwargs)
        self.events: list[str] = []
        self.renewals = 0

    def _renewed(self) -> None:
        self.renewals += 1

    async def _lost(self, old_lease: int) -> None:
        assert self.lease_id == 0
        self.events.append(f"lost {old_lease:x}")

    async def _reacquired(self) -> None:
        self.events.append(f"new {self.lease_id:x}")


class FlakyStore(EmbeddedMetadataStore):
    """Refuses renewals while ``failing``."""

    failing = False
    attempts = 0

    async def keepalive(self, lease_id: int) -> int:
        self.attempts += 1
        if self.failing:
            raise MetadataError("store unreachable")
        return await super().keepalive(lease_id)


@pytest.fixture
async def store():
    s = FlakyStore(":memory:")
    yield s
    await s.close()


async def test_renewals_keep_the_lease_past_its_ttl_and_stop_revokes_it(store):
    keeper = Recorder(store, lease_ttl_s=1)
    lease = await keeper.acquire()
    assert keeper.lease_changed.is_set() and keeper.last_ok_sent > 0
    await store.put("/test/k", b"v", lease=lease)
    keeper.start()
    try:
        await async_wait_until(lambda: keeper.renewals >= 4, what="four renewals")  # > 1 s: past the ttl
        assert await store.get("/test/k") is not None and keeper.lease_id == lease and not keeper.fenced
    finally:
        await keeper.stop()
    assert await store.get("/test/k") is None  # revoked: its keys are gone


async def test_a_failed_renewal_keeps_the_lease_and_is_retried(store):
    keeper = Recorder(store, lease_ttl_s=2)  # renewed every 0.67 s: one failure leaves the lease alive
    lease = await keeper.acquire()
    sent = keeper.last_ok_sent
    store.failing = True
    keeper.start()
    try:
        await async_wait_until(lambda: store.attempts >= 1, what="a failed renewal")
        assert keeper.renewals == 0 and keeper.lease_id == lease and keeper.last_ok_sent == sent
        store.failing = False
        await async_wait_until(lambda: keeper.renewals >= 1, what="a renewal once the store is back")
        assert keeper.lease_id == lease and keeper.last_ok_sent > sent and keeper.events == []
    finally:
        await keeper.stop()


async def test_a_lost_lease_is_replaced(store):
    keeper = Recorder(store, lease_ttl_s=1)
    first = await keeper.acquire()
    keeper.lease_changed.clear()
    keeper.start()
    try:
        await store.revoke_lease(first)
        await asyncio.wait_for(keeper.lease_changed.wait(), 10)
        await async_wait_until(lambda: len(keeper.events) == 2, what="lost and new")
        assert keeper.lease_id not in (0, first)
        assert keeper.events == [f"lost {first:x}", f"new {keeper.lease_id:x}"]
        await store.keepalive(keeper.lease_id)  # the new lease is alive
    finally:
        await keeper.stop()


def test_a_ttl_below_one_second_is_refused():
    with pytest.raises(ValueError):
        LeaseKeeper(None, lease_ttl_s=0)  # type: ignore[arg-type]
