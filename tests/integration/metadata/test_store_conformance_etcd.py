"""The MetadataStore conformance suite (tests/unit/metadata/test_store_conformance.py) against a real
etcd on loopback (tests/support/etcd.py): one server for the module, every key wiped before each
test; then what only the etcd store does: ride out a restart of etcd, give up after its retry
timeout."""

import asyncio

import pytest

from danube.errors import MetadataError
from tests.support.etcd import etcd_available, etcd_or_skip, running_etcd, wiped_store
from tests.support.recollect import collect_again

collect_again(globals(), "tests.unit.metadata.test_store_conformance", "store")


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory):
    yield from etcd_or_skip(tmp_path_factory)


@pytest.fixture
async def store(etcd_server):
    async with wiped_store(etcd_server) as s:
        yield s


async def test_etcd_store_survives_an_etcd_restart(tmp_path):
    """Calls made while etcd is down wait and succeed once it is back; a watch resumes where it stopped."""
    if not etcd_available():
        pytest.skip("etcd binary not installed")
    from danube.metadata.etcd import EtcdMetadataStore

    with running_etcd(str(tmp_path / "etcd")) as server:
        store = EtcdMetadataStore(server.url, retry_timeout=20)
        try:
            lease = await store.grant_lease(30)
            await store.put("/re/a", b"1", lease=lease)
            after_a = await store.revision() + 1
            seen = []
            live = asyncio.Event()

            async def watch():  # from a revision: the watch misses nothing however late it starts
                async for event in store.watch("/re/", start_revision=after_a):
                    seen.append((event.kind, event.key, event.value))
                    live.set()
                    if len(seen) == 2:
                        return

            task = asyncio.create_task(watch())
            await store.put("/re/b", b"before")
            await asyncio.wait_for(live.wait(), 20)  # the watch is running when etcd goes away
            await asyncio.to_thread(server.stop)
            pending = asyncio.create_task(store.put("/re/c", b"during"))
            await asyncio.sleep(0.5)
            assert not pending.done()
            await asyncio.to_thread(server.start)
            await asyncio.wait_for(pending, 20)
            await asyncio.wait_for(task, 20)
            assert seen == [("put", "/re/b", b"before"), ("put", "/re/c", b"during")]
            assert await store.keepalive(lease) >= 1  # leases survive a restart of etcd
            assert (await store.get("/re/a")).value == b"1"
        finally:
            await store.close()


async def test_etcd_store_gives_up_after_its_retry_timeout(tmp_path):
    if not etcd_available():
        pytest.skip("etcd binary not installed")
    from danube.metadata.etcd import EtcdMetadataStore
    from danube.processes import free_port

    store = EtcdMetadataStore(f"http://127.0.0.1:{free_port()}", retry_timeout=0.5)
    try:
        with pytest.raises(MetadataError) as info:
            await store.get("/x")
        assert info.value.retriable
    finally:
        await store.close()
