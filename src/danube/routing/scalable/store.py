"""Scalable topic metadata in the MetadataStore (``ScalableTopicResources`` of Pulsar PIP-468 scalable topics).

Paths (keys.py, PIP-468's layout):

- ``/topics/{ns}/{topic}``                                  ScalableTopicMetadata JSON (the layout)
- ``/topics/{ns}/{topic}/controller``                       controller leader's broker URL (lease)
- ``/topics/{ns}/{topic}/operation``                        the split/merge in progress (danube's addition)
- ``/topics/{ns}/{topic}/subscriptions/{sub}``              SubscriptionMetadata JSON
- ``/topics/{ns}/{topic}/subscriptions/{sub}/consumers/{c}`` ConsumerRegistration JSON (the session)

The layout is only ever changed by compare-and-swap on its key's version (:meth:`cas_layout`,
one transaction that may carry more comparisons and operations, e.g. the controller's leader
guard and the removal of the operation record).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, AsyncIterator, Sequence

from danube.errors import AlreadyExistsError, NotFoundError
from danube.metadata import keys
from danube.metadata.store import CompactedError, Compare, MetadataStore, Op, dump_json
from danube.model.segment_layout import LayoutError, SegmentLayout


@dataclass(frozen=True)
class StoredLayout:
    layout: SegmentLayout
    version: int  # the key's version: the CAS operand
    mod_revision: int


@dataclass(frozen=True)
class TopicSnapshot:
    """What a DAG watch delivers: the layout (None once the topic is deleted) and the controller URL."""

    topic: str
    layout: SegmentLayout | None
    controller_url: str
    revision: int


class ScalableTopicStore:
    def __init__(self, metadata: MetadataStore) -> None:
        self.metadata = metadata

    # ------------------------------------------------------------ the layout

    async def create(self, topic: str, layout: SegmentLayout) -> StoredLayout:
        """Write the initial layout; AlreadyExistsError if the name is taken (scalable or ordinary topic)."""
        layout.validate()
        key = keys.scalable_topic(topic)
        result = await self.metadata.txn(
            [Compare.version(key, "==", 0), Compare.version(keys.topic_delivery(topic), "==", 0)],
            [Op.put(key, layout.to_json())],
        )
        if not result.succeeded:
            raise AlreadyExistsError(f"topic {topic} already exists")
        stored = await self.load(topic)
        assert stored is not None
        return stored

    async def load(self, topic: str) -> StoredLayout | None:
        kv = await self.metadata.get(keys.scalable_topic(topic))
        if kv is None:
            return None
        return StoredLayout(SegmentLayout.from_json(kv.value), kv.version, kv.mod_revision)

    async def require(self, topic: str) -> StoredLayout:
        stored = await self.load(topic)
        if stored is None:
            raise NotFoundError(f"scalable topic {topic} does not exist")
        return stored

    async def cas_layout(
        self,
        topic: str,
        expected_version: int,
        layout: SegmentLayout,
        *,
        compare: Sequence[Compare] = (),
        ops: Sequence[Op] = (),
    ) -> bool:
        """Replace the layout iff its key is still at ``expected_version`` (and ``compare`` holds)."""
        layout.validate()
        key = keys.scalable_topic(topic)
        result = await self.metadata.txn(
            [Compare.version(key, "==", expected_version), *compare], [Op.put(key, layout.to_json()), *ops]
        )
        return result.succeeded

    async def delete(self, topic: str) -> bool:
        """Remove the layout and everything under it (controller, operation, subscriptions, sessions)."""
        key = keys.scalable_topic(topic)
        result = await self.metadata.txn([Compare.version(key, ">", 0)], [Op.delete(key), Op.delete_prefix(key + "/")])
        return result.succeeded

    async def list(self, namespace: str) -> list[str]:
        prefix = keys.scalable_namespace_prefix(namespace)
        out = []
        for kv in await self.metadata.get_prefix(prefix):
            rest = kv.key[len(prefix) :]
            if "/" in rest:
                continue
            try:
                SegmentLayout.from_json(kv.value)
            except LayoutError:
                continue
            out.append(f"/{namespace}/{rest}")
        return out

    # ------------------------------------------------------------ the operation in progress

    async def load_operation(self, topic: str) -> tuple[dict, int] | None:
        kv = await self.metadata.get(keys.scalable_operation(topic))
        return None if kv is None else (json.loads(kv.value), kv.version)

    # ------------------------------------------------------------ controller

    async def controller_url(self, topic: str) -> str:
        kv = await self.metadata.get(keys.scalable_controller(topic))
        return "" if kv is None else kv.value.decode()

    # ------------------------------------------------------------ subscriptions and consumer sessions

    async def put_subscription(self, topic: str, sub: str, doc: dict[str, Any]) -> bool:
        """Create the subscription record; False if it already exists."""
        key = keys.scalable_subscription(topic, sub)
        result = await self.metadata.txn([Compare.version(key, "==", 0)], [Op.put(key, dump_json(doc))])
        return result.succeeded

    async def subscriptions(self, topic: str) -> dict[str, dict]:
        prefix = keys.scalable_subscriptions(topic)
        out = {}
        for kv in await self.metadata.get_prefix(prefix):
            rest = kv.key[len(prefix) :]
            if "/" not in rest:
                out[rest] = json.loads(kv.value)
        return out

    async def delete_subscription(self, topic: str, sub: str) -> bool:
        key = keys.scalable_subscription(topic, sub)
        result = await self.metadata.txn([Compare.version(key, ">", 0)], [Op.delete(key), Op.delete_prefix(key + "/")])
        return result.succeeded

    async def put_consumer(
        self, topic: str, sub: str, name: str, doc: dict[str, Any], *, compare: Sequence[Compare] = ()
    ) -> bool:
        key = keys.scalable_consumer(topic, sub, name)
        result = await self.metadata.txn(list(compare), [Op.put(key, dump_json(doc))])
        return result.succeeded

    async def consumers(self, topic: str, sub: str) -> dict[str, dict]:
        prefix = keys.scalable_consumers(topic, sub)
        return {kv.key[len(prefix) :]: json.loads(kv.value) for kv in await self.metadata.get_prefix(prefix)}

    async def delete_consumer(self, topic: str, sub: str, name: str, *, compare: Sequence[Compare] = ()) -> bool:
        result = await self.metadata.txn(list(compare), [Op.delete(keys.scalable_consumer(topic, sub, name))])
        return result.succeeded

    # ------------------------------------------------------------ DAG watch

    async def watch(self, topic: str) -> AsyncIterator[TopicSnapshot]:
        """The current snapshot, then one per change of the layout or of the controller, in order.

        Ends after the topic is deleted (its last snapshot has ``layout=None``)."""
        key, ctl = keys.scalable_topic(topic), keys.scalable_controller(topic)
        while True:
            kvs, revision = await self.metadata.get_prefix_with_revision(key)
            by_key = {kv.key: kv for kv in kvs if kv.key in (key, ctl)}
            layout = SegmentLayout.from_json(by_key[key].value) if key in by_key else None
            url = by_key[ctl].value.decode() if ctl in by_key else ""
            yield TopicSnapshot(topic, layout, url, revision)
            if layout is None:
                return
            try:
                async for event in self.metadata.watch(key, start_revision=revision + 1):
                    if event.key == key:
                        if event.kind == "delete" or event.value is None:
                            yield TopicSnapshot(topic, None, url, event.revision)
                            return
                        layout = SegmentLayout.from_json(event.value)
                    elif event.key == ctl:
                        url = event.value.decode() if event.kind == "put" and event.value else ""
                    else:
                        continue
                    yield TopicSnapshot(topic, layout, url, event.revision)
            except CompactedError:
                await asyncio.sleep(0)  # fell behind the store's history: read afresh
