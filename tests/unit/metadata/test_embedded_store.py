"""MetadataStore conformance suite.

Every implementation must pass it: add a factory to ``STORES`` (an async
context manager yielding a fresh, empty store) to run the suite against it.
"""

import asyncio
import contextlib

import pytest

from danube.errors import MetadataError
from danube.metadata.embedded import EmbeddedMetadataStore


@contextlib.asynccontextmanager
async def embedded(tmp_path):
    store = EmbeddedMetadataStore(str(tmp_path / "meta.db"))
    try:
        yield store
    finally:
        await store.close()


STORES = {"embedded": embedded}


@pytest.fixture(params=sorted(STORES))
async def store(request, tmp_path):
    async with STORES[request.param](tmp_path) as s:
        yield s


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

    async def watch():
        async for event in store.watch("/w/"):
            events.append((event.kind, event.key, event.value))
            if len(events) == 2:
                return

    task = asyncio.create_task(watch())
    await asyncio.sleep(0.05)
    await store.put("/other", b"no")
    await store.put("/w/1", b"v")
    await store.delete("/w/1")
    await asyncio.wait_for(task, 5)
    assert events == [("put", "/w/1", b"v"), ("delete", "/w/1", None)]


async def test_concurrent_cas_has_one_winner(store):
    results = await asyncio.gather(*(store.put_if_version("/race", str(i).encode(), 0) for i in range(10)))
    assert results.count(True) == 1


async def test_embedded_store_is_durable(tmp_path):
    path = str(tmp_path / "durable.db")
    s = EmbeddedMetadataStore(path)
    await s.put("/k", b"v")
    await s.close()
    s = EmbeddedMetadataStore(path)
    assert (await s.get("/k")).value == b"v"
    await s.close()
    with pytest.raises(MetadataError, match="closed"):
        await s.get("/k")
