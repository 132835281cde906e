"""MetadataStore conformance suite, run here on the embedded (sqlite) store.

Every implementation must pass it. The tests that take the ``store`` fixture are the suite:
tests/integration/metadata/test_store_conformance_etcd.py collects them again against a real etcd
on loopback; add another store the same way, with its own ``store`` fixture.
"""

import asyncio

import pytest

from danube.errors import MetadataError
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.metadata.store import CompactedError, Compare, LeaseNotFoundError, Op
from tests.support.waiting import async_wait_until


@pytest.fixture
async def store(tmp_path):
    s = EmbeddedMetadataStore(str(tmp_path / "meta.db"))
    try:
        yield s
    finally:
        await s.close()


async def until_watching(store, key: str, seen: asyncio.Event) -> None:
    """Write ``key`` until the watcher reports it (``seen``): a watch "from now on" misses what was
    written before it was set up, so the test's own writes must wait for that, however slow."""

    async def poke():
        await store.put(key, b"")
        await asyncio.sleep(0.05)
        return seen.is_set()

    await async_wait_until(poke, timeout=20, what=f"a watch seeing {key}", interval=0)


async def test_get_put_delete(store):
    assert await store.get("/a") is None
    v1 = await store.put("/a", b"one")
    v2 = await store.put("/a", b"two")
    assert v2 > v1 > 0
    kv = await store.get("/a")
    assert (kv.key, kv.value, kv.version) == ("/a", b"two", v2)
    assert await store.delete("/a") is True
    assert await store.delete("/a") is False
    assert await store.get("/a") is None
    assert await store.put("/a", b"again") == 1  # a re-created key starts over


async def test_compare_and_swap(store):
    assert await store.put_if_version("/cas", b"x", 0) is True
    assert await store.put_if_version("/cas", b"y", 0) is False
    version = (await store.get("/cas")).version
    assert await store.put_if_version("/cas", b"z", version) is True
    assert await store.put_if_version("/cas", b"w", version) is False
    assert (await store.get("/cas")).value == b"z"


async def test_prefix_reads_are_sorted_and_bounded(store):
    for key in ("/t/b", "/t/a", "/t/c/d", "/u/a", "/t"):
        await store.put(key, key.encode())
    assert [kv.key for kv in await store.get_prefix("/t/")] == ["/t/a", "/t/b", "/t/c/d"]
    assert await store.delete_prefix("/t/") == 3
    assert [kv.key for kv in await store.get_prefix("/")] == ["/t", "/u/a"]


async def test_json_helpers(store):
    await store.put_json("/j", {"b": 1, "a": [1, 2]})
    assert await store.get_json("/j") == {"a": [1, 2], "b": 1}
    assert await store.get_json("/missing") is None


async def test_watch_sees_puts_and_deletes_under_prefix(store):
    events = []
    watching = asyncio.Event()

    async def watch():
        async for event in store.watch("/w/"):
            if event.key == "/w/.ready":
                watching.set()
                continue
            events.append((event.kind, event.key, event.value))
            if len(events) == 2:
                return

    task = asyncio.create_task(watch())
    await until_watching(store, "/w/.ready", watching)
    await store.put("/other", b"no")
    await store.put("/w/1", b"v")
    await store.delete("/w/1")
    await asyncio.wait_for(task, 5)
    assert events == [("put", "/w/1", b"v"), ("delete", "/w/1", None)]


async def test_concurrent_cas_has_one_winner(store):
    results = await asyncio.gather(*(store.put_if_version("/race", str(i).encode(), 0) for i in range(10)))
    assert results.count(True) == 1


async def test_revisions_increase_and_are_reported(store):
    r0 = await store.revision()
    await store.put("/r/a", b"1")
    kv, r1 = await store.get_with_revision("/r/a")
    assert r1 > r0 and kv.mod_revision == r1
    await store.put("/r/b", b"2")
    kvs, r2 = await store.get_prefix_with_revision("/r/")
    assert r2 > r1 and [k.mod_revision for k in kvs] == [r1, r2]


async def test_watch_from_a_revision_replays_then_follows(store):
    await store.put("/h/a", b"1")
    start = await store.revision()  # the put of /h/a
    await store.put("/h/b", b"2")
    await store.delete("/h/a")
    await store.put("/x", b"elsewhere")
    seen = []
    replayed = asyncio.Event()

    async def watch():
        async for event in store.watch("/h/", start_revision=start):
            seen.append((event.kind, event.key, event.revision))
            if len(seen) == 3:
                replayed.set()
            if len(seen) == 4:
                return

    task = asyncio.create_task(watch())
    await asyncio.wait_for(replayed.wait(), 10)  # the history first, then a write made after it
    await store.put("/h/c", b"3")
    await asyncio.wait_for(task, 5)
    kinds = [(k, key) for k, key, _ in seen]
    assert kinds == [("put", "/h/a"), ("put", "/h/b"), ("delete", "/h/a"), ("put", "/h/c")]
    revisions = [r for _, _, r in seen]
    assert revisions == sorted(revisions) and revisions[0] == start


async def test_transactions_compare_and_apply_atomically(store):
    result = await store.txn(
        [Compare.version("/tx/a", "==", 0)],
        [Op.put("/tx/a", b"1"), Op.put("/tx/b", b"2"), Op.get("/tx/a")],
        [Op.get("/tx/a")],
    )
    assert result.succeeded
    assert result.results[2].value == b"1"
    kv_a, kv_b = await store.get("/tx/a"), await store.get("/tx/b")
    assert kv_a.mod_revision == kv_b.mod_revision == result.revision  # one revision for the whole txn
    again = await store.txn([Compare.version("/tx/a", "==", 0)], [Op.put("/tx/a", b"x")], [Op.get("/tx/a")])
    assert not again.succeeded and again.results[0].value == b"1"
    assert (await store.get("/tx/a")).value == b"1"
    # value, mod_revision and != comparisons; delete and prefix ops
    ok = await store.txn(
        [
            Compare.value("/tx/a", "==", b"1"),
            Compare.mod_revision("/tx/b", "==", kv_b.mod_revision),
            Compare.version("/tx/b", "!=", 0),
        ],
        [Op.delete("/tx/a"), Op.get_prefix("/tx/")],
    )
    assert ok.succeeded and ok.results[0] == 1 and [kv.key for kv in ok.results[1]] == ["/tx/b"]
    assert not (await store.txn([Compare.value("/tx/missing", "==", b"")], [Op.put("/tx/z", b"")])).succeeded
    assert (await store.txn([], [Op.delete_prefix("/tx/")])).results == (1,)


async def test_lease_keys_vanish_on_revoke_and_expiry(store):
    lease = await store.grant_lease(5)
    await store.put("/l/kept", b"a", lease=lease)
    assert (await store.get("/l/kept")).lease == lease
    assert await store.keepalive(lease) >= 1
    await store.revoke_lease(lease)
    assert await store.get("/l/kept") is None
    with pytest.raises(LeaseNotFoundError):
        await store.keepalive(lease)
    await store.revoke_lease(lease)  # already gone: no error

    short = await store.grant_lease(2)
    written = await store.txn([Compare.version("/l/short", "==", 0)], [Op.put("/l/short", b"b", lease=short)])
    events = []

    async def watch():  # from the write on: the expiry is seen however late the watch is set up
        async for event in store.watch("/l/", start_revision=written.revision + 1):
            events.append((event.kind, event.key))
            return

    task = asyncio.create_task(watch())
    await asyncio.wait_for(task, 10)  # nobody touches the store: expiry alone deletes the key
    assert events == [("delete", "/l/short")]
    assert await store.get("/l/short") is None
    with pytest.raises(LeaseNotFoundError):
        await store.keepalive(short)
    with pytest.raises(LeaseNotFoundError):
        await store.put("/l/late", b"c", lease=short)


async def test_keepalive_keeps_a_lease_alive(store):
    lease = await store.grant_lease(2)
    await store.put("/k/alive", b"a", lease=lease)
    for _ in range(9):  # 2.7 s in all, longer than the lease, renewed every 0.3 s
        await asyncio.sleep(0.3)
        await store.keepalive(lease)
    assert (await store.get("/k/alive")) is not None
    await store.revoke_lease(lease)


async def test_embedded_store_is_durable(tmp_path):
    path = str(tmp_path / "durable.db")
    s = EmbeddedMetadataStore(path)
    await s.put("/k", b"v")
    revision = await s.revision()
    await s.close()
    s = EmbeddedMetadataStore(path)
    assert (await s.get("/k")).value == b"v"
    assert await s.revision() == revision
    await s.close()
    with pytest.raises(MetadataError, match="closed"):
        await s.get("/k")


async def test_embedded_history_is_bounded(tmp_path, monkeypatch):
    import danube.metadata.embedded as embedded_mod

    monkeypatch.setattr(embedded_mod, "HISTORY_REVISIONS", 10)
    s = EmbeddedMetadataStore(str(tmp_path / "h.db"))
    for i in range(1100):
        await s.put("/p", str(i).encode())
    with pytest.raises(CompactedError):
        async for _ in s.watch("/", start_revision=1):
            pass
    await s.close()
