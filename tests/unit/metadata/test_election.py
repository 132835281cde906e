"""The one election (danube.metadata.election) on the in-memory embedded store: one leader, the
others follow it, its guard stops holding once it is gone, the next one is elected; a leader is
visible only once ready; a fenced or lease-less candidate does not campaign; a stale key of the
candidate's own name does not make it leader; ``ends_on`` ends the election."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from danube.errors import NotFoundError
from danube.metadata.election import Election
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.metadata.store import Op
from tests.support.waiting import async_wait_until

KEY = "/test/leader"


@dataclass
class Lease:
    lease_id: int = 0
    fenced: bool = False


@pytest.fixture
async def store():
    s = EmbeddedMetadataStore(":memory:")
    yield s
    await s.close()


async def candidate(store, name, **kwargs) -> Election:
    lease = Lease(await store.grant_lease(30))
    return Election(store, KEY, name, lease, **kwargs)


async def test_one_leader_followers_and_the_next_leader(store):
    events: list[tuple[str, str]] = []

    def hooks(name):
        async def elected():
            events.append(("elected", name))

        async def deposed():
            events.append(("deposed", name))

        return {"on_elected": elected, "on_deposed": deposed}

    elections = [await candidate(store, n, **hooks(n)) for n in ("a", "b", "c")]
    for e in elections:
        e.start()
    try:
        await asyncio.gather(*(e.wait_leader() for e in elections))
        leaders = [e for e in elections if e.is_leader]
        assert len(leaders) == 1
        first = leaders[0]
        assert {e.leader for e in elections} == {first.candidate}
        assert (await store.get(KEY)).value == first.candidate.encode()
        assert events == [("elected", first.candidate)]
        guard = first.guard()
        assert (await store.txn(guard, [Op.put("/test/x", b"1")])).succeeded
        # the leader dies: its lease ends, its key with it
        await first.stop(resign=False)
        await store.revoke_lease(first.lease.lease_id)
        others = [e for e in elections if e is not first]
        await async_wait_until(lambda: sum(e.is_leader for e in others) == 1, what="the next leader")
        second = next(e for e in others if e.is_leader)
        await async_wait_until(lambda: all(e.leader == second.candidate for e in others), what="followers follow")
        assert not (await store.txn(guard, [Op.put("/test/x", b"late")])).succeeded  # a late write fails
        assert ("deposed", first.candidate) in events and events[-1] == ("elected", second.candidate)
        # resigning deletes the key at once: the last one leads
        await second.stop(resign=True)
        last = next(e for e in others if e is not second)
        await async_wait_until(lambda: last.is_leader, what="the last candidate leads")
    finally:
        for e in elections:
            await e.stop()


async def test_a_leader_is_visible_only_once_ready_and_a_failed_start_is_retried(store):
    seen = []
    attempts = []

    async def elected():
        seen.append((election.is_leader, election.leader))
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("not ready yet")

    election = await candidate(store, "a", on_elected=elected)
    election.start()
    try:
        await election.wait_leader()
        assert election.is_leader and len(attempts) == 2  # the failure was retried (the key stayed ours)
        assert seen == [(False, ""), (False, "")]  # nobody saw a leader before it was ready
    finally:
        await election.stop()
    assert await store.get(KEY) is None  # resigned


async def test_no_campaign_without_a_lease_or_while_fenced(store):
    lease = Lease()
    election = Election(store, KEY, "a", lease)
    assert not await election.campaign()
    lease.lease_id = await store.grant_lease(30)
    lease.fenced = True
    assert not await election.campaign()
    assert await store.get(KEY) is None
    lease.fenced = False
    assert await election.campaign() and election.is_leader
    assert await election.campaign()  # a retried campaign finds its own key: still the leader
    await election.stop()


async def test_a_stale_key_of_its_own_name_is_not_leadership(store):
    old_life = await store.grant_lease(30)
    await store.put(KEY, b"a", lease=old_life)  # left by an earlier process with the same name
    election = await candidate(store, "a")
    election.start()
    try:
        await async_wait_until(lambda: election.leader == "a", what="the key read")
        assert not election.is_leader  # it never won a campaign under this lease
        assert not (await store.txn(election.guard(), [Op.put("/test/x", b"1")])).succeeded
        await store.revoke_lease(old_life)  # the old key goes: the candidate campaigns and wins
        await async_wait_until(lambda: election.is_leader, what="elected after the stale key went")
        assert (await store.get(KEY)).lease == election.lease.lease_id
    finally:
        await election.stop()


async def test_ends_on_leaves_the_election_for_good(store):
    async def elected():
        raise NotFoundError("the thing led is gone")

    election = await candidate(store, "a", on_elected=elected, ends_on=(NotFoundError,))
    election.start()
    await async_wait_until(lambda: not election.running, what="the election ended")
    assert not election.is_leader and election.leader == ""
    assert await store.get(KEY) is None  # its key was deleted on leaving
    await election.stop()
