"""The embedded store's group commit: writes that arrive while its sqlite thread is busy share one
transaction (one sync), yet each keeps its own revision, its own answer and its own failure."""

import asyncio
import threading

import pytest

from danube.metadata.embedded import EmbeddedMetadataStore
from danube.metadata.store import Compare, LeaseNotFoundError, Op


@pytest.fixture
async def store(tmp_path):
    s = EmbeddedMetadataStore(str(tmp_path / "meta.db"))
    try:
        yield s
    finally:
        await s.close()


class Rounds:
    """Counts the store's group commits and can hold its sqlite thread, so the writes a test
    issues meanwhile queue up and go into the next round together."""

    def __init__(self, store: EmbeddedMetadataStore, monkeypatch) -> None:
        self.count = 0
        self.sizes: list[int] = []
        original = store._commit_round

        def counted() -> None:
            with store._queue_lock:
                size = len(store._queue)
            if size:
                self.count += 1
                self.sizes.append(size)
            original()

        monkeypatch.setattr(store, "_commit_round", counted)
        self._store = store
        self._gate = threading.Event()

    def hold(self) -> None:
        self._gate.clear()
        self._store._executor.submit(self._gate.wait, 30)

    def release(self) -> None:
        self._gate.set()


async def _queued(store: EmbeddedMetadataStore, n: int) -> None:
    while len(store._queue) < n:
        await asyncio.sleep(0.001)


async def test_concurrent_writes_share_one_commit_and_keep_one_revision_each(store, monkeypatch):
    rounds = Rounds(store, monkeypatch)
    start = await store.revision()
    rounds.hold()
    tasks = [asyncio.create_task(store.put(f"/k/{i:03d}", str(i).encode())) for i in range(100)]
    await _queued(store, 100)
    rounds.release()
    versions = await asyncio.gather(*tasks)
    assert versions == [1] * 100
    assert rounds.count == 1 and rounds.sizes == [100]
    assert await store.revision() == start + 100
    kvs = await store.get_prefix("/k/")
    # each write its own revision, in the order the writes were made
    assert [kv.mod_revision for kv in kvs] == list(range(start + 1, start + 101))
    assert [kv.value for kv in kvs] == [str(i).encode() for i in range(100)]


async def test_a_failing_write_fails_alone_and_takes_no_revision(store, monkeypatch):
    rounds = Rounds(store, monkeypatch)
    start = await store.revision()
    rounds.hold()
    first = asyncio.create_task(store.put("/a", b"1"))
    bad = asyncio.create_task(store.put("/bad", b"x", lease=12345))  # no such lease
    unknown = asyncio.create_task(store.txn((), (Op("bogus", "/c"),)))
    last = asyncio.create_task(store.put("/b", b"2"))
    await _queued(store, 4)
    rounds.release()
    assert await first == 1
    with pytest.raises(LeaseNotFoundError):
        await bad
    with pytest.raises(ValueError):
        await unknown
    assert await last == 1
    assert rounds.count == 1
    assert await store.get("/bad") is None
    assert (await store.get("/a")).mod_revision == start + 1
    assert (await store.get("/b")).mod_revision == start + 2
    assert await store.revision() == start + 2


async def test_a_transaction_in_a_round_answers_its_own_revision(store, monkeypatch):
    rounds = Rounds(store, monkeypatch)
    start = await store.revision()
    rounds.hold()
    put = asyncio.create_task(store.put("/x", b"1"))
    swap = asyncio.create_task(store.txn([Compare.version("/x", "==", 1)], [Op.put("/x", b"2")], [Op.get("/x")]))
    refused = asyncio.create_task(store.txn([Compare.version("/x", "==", 1)], [Op.put("/x", b"3")], [Op.get("/x")]))
    after = asyncio.create_task(store.put("/y", b"1"))
    await _queued(store, 4)
    rounds.release()
    await put
    ok = await swap
    assert ok.succeeded and ok.revision == start + 2
    no = await refused  # sees the swap before it in the same round: version 2 now
    assert not no.succeeded and no.revision == start + 2
    assert no.results[0].value == b"2"
    await after
    assert await store.revision() == start + 3


async def test_watchers_see_a_round_in_revision_order(store, monkeypatch):
    rounds = Rounds(store, monkeypatch)
    events = []
    done = asyncio.Event()

    async def watch():
        async for event in store.watch("/w/", start_revision=await store.revision() + 1):
            events.append((event.revision, event.key))
            if len(events) == 20:
                done.set()
                return

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0.05)
    rounds.hold()
    tasks = [asyncio.create_task(store.put(f"/w/{i:02d}", b"")) for i in range(20)]
    await _queued(store, 20)
    rounds.release()
    await asyncio.gather(*tasks)
    await asyncio.wait_for(done.wait(), 20)
    await watcher
    revisions = [r for r, _ in events]
    assert revisions == sorted(revisions) and len(set(revisions)) == 20
    assert [k for _, k in events] == [f"/w/{i:02d}" for i in range(20)]


async def test_grouped_writes_are_durable_when_answered(tmp_path, monkeypatch):
    path = str(tmp_path / "meta.db")
    store = EmbeddedMetadataStore(path)
    rounds = Rounds(store, monkeypatch)
    rounds.hold()
    tasks = [asyncio.create_task(store.put(f"/d/{i}", b"v")) for i in range(50)]
    await _queued(store, 50)
    rounds.release()
    await asyncio.gather(*tasks)
    revision = await store.revision()
    await store.close()
    reopened = EmbeddedMetadataStore(path)
    try:
        assert len(await reopened.get_prefix("/d/")) == 50
        assert await reopened.revision() == revision
    finally:
        await reopened.close()


async def test_a_read_after_an_answered_write_sees_it(store):
    # a read is never answered from before a write its caller already saw answered
    for i in range(50):
        await store.put("/r", str(i).encode())
        assert (await store.get("/r")).value == str(i).encode()


async def test_writes_after_close_are_refused(tmp_path):
    from danube.errors import MetadataError

    store = EmbeddedMetadataStore(str(tmp_path / "meta.db"))
    await store.close()
    with pytest.raises(MetadataError):
        await store.put("/late", b"x")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t


async def test_lease_expiry_is_seen_after_keepalives_and_shorter_grants():
    # the store skips the leases table until the earliest deadline it knows of: a keepalive (later
    # deadline) or a shorter lease granted after a longer one must still expire on time
    clock = Clock()
    store = EmbeddedMetadataStore(":memory:", clock=clock.now)
    try:
        long = await store.grant_lease(100)
        kept = await store.grant_lease(10)
        await store.put("/long", b"", lease=long)
        await store.put("/kept", b"", lease=kept)
        clock.t += 5
        await store.keepalive(kept)  # now due at +15
        clock.t += 7  # +12: past the first deadline the store knew of, not past the renewed one
        assert await store.get("/kept") is not None
        short = await store.grant_lease(1)  # due at +13, before every other deadline
        await store.put("/short", b"", lease=short)
        clock.t += 2  # +14
        assert await store.get("/short") is None
        assert await store.get("/kept") is not None
        clock.t += 2  # +16
        assert await store.get("/kept") is None
        assert await store.get("/long") is not None
        await store.revoke_lease(long)
        assert await store.get("/long") is None
        assert await store._run(store._expire_leases) == 0
    finally:
        await store.close()
