"""ScalableTopicStore: PIP-468's paths, CAS-only layout changes, the DAG watch (embedded and etcd)."""

import asyncio
import json

import pytest

from danube.errors import AlreadyExistsError, NotFoundError
from danube.metadata import keys
from danube.model.segment_layout import SegmentLayout
from danube.routing.scalable.store import ScalableTopicStore
from tests.support.waiting import async_wait_until

T = "/default/orders"


async def test_create_load_cas_delete(metadata):
    store = ScalableTopicStore(metadata)
    stored = await store.create(T, SegmentLayout.initial(2))
    assert stored.layout.epoch == 0 and len(stored.layout.active_segments) == 2
    raw = await metadata.get("/topics/default/orders")  # PIP-468's path
    assert json.loads(raw.value)["nextSegmentId"] == 2
    with pytest.raises(AlreadyExistsError):
        await store.create(T, SegmentLayout.initial(1))
    split = stored.layout.split_segment(0)
    assert await store.cas_layout(T, stored.version, split)
    assert not await store.cas_layout(T, stored.version, split.split_segment(1))  # stale version
    assert (await store.load(T)).layout == split
    assert await store.list("default") == [T]
    await store.put_subscription(T, "billing", {"subscription": "billing"})
    assert not await store.put_subscription(T, "billing", {})
    await store.put_consumer(T, "billing", "c1", {"consumerName": "c1"})
    assert (await metadata.get("/topics/default/orders/subscriptions/billing/consumers/c1")) is not None
    assert await store.consumers(T, "billing") == {"c1": {"consumerName": "c1"}}
    assert list(await store.subscriptions(T)) == ["billing"]
    assert await store.delete(T)
    assert await store.load(T) is None and await metadata.get_prefix("/topics/default/orders") == []
    with pytest.raises(NotFoundError):
        await store.require(T)


async def test_refuses_the_name_of_an_ordinary_topic(metadata):
    await metadata.put_json(keys.topic_delivery("/default/plain"), {"dispatch_strategy": "reliable"})
    with pytest.raises(AlreadyExistsError):
        await ScalableTopicStore(metadata).create("/default/plain", SegmentLayout.initial(1))


async def test_watch_delivers_every_layout_and_the_controller(metadata):
    store = ScalableTopicStore(metadata)
    stored = await store.create(T, SegmentLayout.initial(1))
    await store.create("/default/orders2", SegmentLayout.initial(1))  # a prefix sibling: not ours
    seen = []

    async def watch():
        async for snap in store.watch(T):
            seen.append(snap)
            if snap.layout is None:
                return

    task = asyncio.create_task(watch())
    await async_wait_until(lambda: seen, what="the watch's first snapshot")  # before any change
    one = stored.layout.split_segment(0)
    assert await store.cas_layout(T, stored.version, one)
    await metadata.put(keys.scalable_controller(T), b"http://127.0.0.1:1")
    await store.cas_layout(T, stored.version + 1, one.merge_segments(1, 2))
    await store.cas_layout("/default/orders2", 1, SegmentLayout.initial(1).split_segment(0))
    await store.delete(T)
    await asyncio.wait_for(task, 10)
    assert [s.layout.epoch if s.layout else None for s in seen] == [0, 1, 1, 2, None]
    assert [s.controller_url for s in seen][:3] == ["", "", "http://127.0.0.1:1"]
    assert all(a.revision < b.revision for a, b in zip(seen, seen[1:]))
