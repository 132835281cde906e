"""StorageFactory: opens reliable topics' storage on this broker (the broker's only way in)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from typing import Awaitable, Callable

from danube import movetrace
from danube.errors import StorageError
from danube.metadata import keys
from danube.metadata.keys import MAX_NAME_CHARS, split_topic
from danube.metadata.store import MetadataStore
from danube.storage.backends import DurableBackend, FilesystemBackend
from danube.storage.catalog import SegmentCatalog
from danube.storage.config import StorageConfig
from danube.storage.owner_fence import OwnerFence, bump_owner_epoch, cursor_floor
from danube.storage.paths import remove_topic_data, remove_topic_dir, set_aside
from danube.storage.recovery import clear_sealed_state, local_wal_continuity, resolve_recovery_start
from danube.storage.segment import DESCRIPTOR_SUFFIX, topic_prefix
from danube.storage.topic_storage import TopicStorage

log = logging.getLogger(__name__)


class StorageFactory:
    def __init__(
        self,
        config: StorageConfig,
        metadata: MetadataStore,
        *,
        broker_id: str,
        backend: DurableBackend | None = None,
        background: bool = True,
    ) -> None:
        """``background=False`` leaves export and retention to explicit calls (tests, tools)."""
        self.config = config
        self.background = background
        self.metadata = metadata
        self.broker_id = str(broker_id)
        self._backend = backend
        self._backend_lock = asyncio.Lock()
        self._topics: dict[str, TopicStorage] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        self._deleting: set[str] = set()  # topics whose storage is being removed: opens refused
        self._closed = False

    async def backend(self) -> DurableBackend:
        async with self._backend_lock:
            if self._backend is None:
                # boto3 client creation reads config files and takes ~100 ms: off the loop.
                self._backend = await asyncio.to_thread(self.config.make_backend)
            return self._backend

    def open_topics(self) -> list[str]:
        return sorted(self._topics)

    def get(self, topic: str) -> TopicStorage | None:
        return self._topics.get(topic)

    async def open_topic(self, topic: str) -> TopicStorage:
        """The topic's storage, recovered per the recovery-start precedence; one instance per topic."""
        split_topic(topic)
        if self._closed:
            raise StorageError("storage factory is closed", retriable=False)
        if topic in self._deleting:
            raise StorageError(f"topic {topic} is being deleted on this broker; retry", retriable=True)
        lock = self._opening.setdefault(topic, asyncio.Lock())
        async with lock:
            existing = self._topics.get(topic)
            if existing is not None:
                return existing
            storage = await self._open(topic)
            self._topics[topic] = storage
            storage.on_closed = self._forget
            return storage

    def _forget(self, storage: TopicStorage) -> None:
        if self._topics.get(storage.topic) is storage:
            del self._topics[storage.topic]

    async def _open(self, topic: str) -> TopicStorage:
        from danube.wal import Wal

        cfg = self.config
        backend = await self.backend()
        durable = durable_topic(topic, self.broker_id)
        # the owner epoch (shared_fs) is taken while the catalog loads: one round trip less for a
        # move's new owner; the fence is claimed below, before the WAL is opened, as before
        bump = (
            bump_owner_epoch(self.metadata, cfg.metadata_prefix, topic, self.broker_id)
            if cfg.mode == "shared_fs"
            else asyncio.sleep(0, 0)
        )
        catalog, epoch = await asyncio.gather(SegmentCatalog.load(self.metadata, cfg.metadata_prefix, durable), bump)
        wal_dir = cfg.wal_dir(topic)
        start = await resolve_recovery_start(self.metadata, cfg.metadata_prefix, durable, wal_dir, catalog)
        if start.source in ("durable", "empty"):
            # No WAL and no seal here (a crashed owner's WAL is on its own disk): never start below
            # what consumers already acked.
            floor = await cursor_floor(self.metadata, topic)
            if floor > start.initial_offset:
                log.warning(
                    "%s: recovered from %s at %d, but subscriptions acked up to %d: starting at %d "
                    "(offsets %d..%d were only in the previous owner's WAL)",
                    topic,
                    start.source,
                    start.initial_offset,
                    floor - 1,
                    floor,
                    start.initial_offset,
                    floor - 1,
                )
                start = dataclasses.replace(start, initial_offset=floor, hot_cutover=True)
        if start.discard_local:
            log.info("%s: removing the local WAL left behind by a seal (all of it is durable)", topic)
            await asyncio.to_thread(remove_topic_dir, cfg.local_wal_root, wal_dir)
        elif start.set_aside_local:
            moved = await asyncio.to_thread(set_aside, cfg.local_wal_root, wal_dir)
            log.warning("%s: local WAL without continuity moved aside to %s", topic, moved)

        fence = None
        if cfg.mode == "shared_fs":
            # The WAL directory may be on the shared root: the owner epoch taken above fences any
            # previous owner before its tail is read (danube.storage.owner_fence).
            fence = OwnerFence(topic, wal_dir, epoch, self.broker_id)
            await asyncio.to_thread(fence.claim)

        options = cfg.wal.open_kwargs()
        movetrace.step(topic, "dest.wal_opening")
        wal = await asyncio.to_thread(Wal.open, wal_dir, initial_offset=start.initial_offset, **options)
        movetrace.step(topic, "dest.wal_opened")
        if start.source == "local" and len(catalog) and wal.next_offset <= catalog.end_offset:
            # The durable history moved on without this broker (it lost ownership without sealing):
            # its WAL is stale.  Keep it aside and continue from the durable end.
            await asyncio.to_thread(wal.close)
            moved = await asyncio.to_thread(set_aside, cfg.local_wal_root, wal_dir)
            log.warning(
                "%s: local WAL ends at %d but durable history reaches %d; stale WAL moved to %s",
                topic,
                wal.next_offset - 1,
                catalog.end_offset,
                moved,
            )
            if fence is not None:
                await asyncio.to_thread(fence.claim)  # the epoch file went aside with the stale WAL
            wal = await asyncio.to_thread(Wal.open, wal_dir, initial_offset=catalog.end_offset + 1, **options)
        elif (
            start.source == "local"
            and len(catalog)
            and wal.first_offset > catalog.end_offset + 1
            and wal.next_offset > wal.first_offset
        ):
            log.error(
                "%s: offsets %d..%d are neither durable nor in the local WAL",
                topic,
                catalog.end_offset + 1,
                wal.first_offset - 1,
            )

        storage = TopicStorage(
            topic,
            cfg,
            wal,
            backend,
            catalog,
            self.metadata,
            broker_id=self.broker_id,
            recovery=start,
            wal_dir=wal_dir,
            durable_topic=durable,
        )
        storage.owner_fence = fence
        if start.source == "local" and fence is not None and fence.epoch > 1:
            log.info(
                "%s: continuing the WAL of the previous owner (owner epoch %d): offsets up to %d",
                topic,
                fence.epoch,
                wal.next_offset - 1,
            )
        try:
            await storage.exporter.reconcile()
            if start.sealed is not None:
                # The new owner is open: the handoff marker has done its job.
                await clear_sealed_state(self.metadata, cfg.metadata_prefix, durable)
        except BaseException:
            await asyncio.to_thread(wal.close)
            raise
        if self.background:
            storage.start()
        log.info(
            "%s: storage open (%s, recovered from %s, offsets %d..%d, durable through %d)",
            topic,
            cfg.mode,
            start.source,
            storage.first_offset,
            storage.next_offset - 1,
            catalog.end_offset,
        )
        return storage

    async def delete_topic(self, topic: str, *, unload: Callable[[], Awaitable[object]] | None = None) -> list[str]:
        """Remove everything stored for ``topic``; what was removed (paths, object keys).

        Opens of ``topic`` on this broker are refused (StorageError, retriable) from the first line
        until this returns, and ``unload`` (the broker closing the topic, so its storage) is awaited
        first: nothing here can write the topic again while its files go, and the next open starts
        it anew, empty.  StorageError (retriable) if the topic is still open after ``unload``.

        Removed, in this order: the durable catalog and seal marker in metadata (the catalog is the
        authority on what history exists, so from here on nothing old is ever read), the durable
        segment objects (``shared_fs`` / ``object_store``, and ``local``'s lazy exports), the local
        WAL directory and its set-aside copies.  The owner epoch key stays: a topic created again
        gets a higher epoch than any old owner still running (danube.storage.owner_fence).  Every path is
        checked to lie inside its root (danube.storage.paths)."""
        split_topic(topic)
        if self._closed:
            raise StorageError("storage factory is closed", retriable=False)
        if topic in self._deleting:
            raise StorageError(f"topic {topic} is already being deleted on this broker", retriable=True)
        self._deleting.add(topic)
        try:
            if unload is not None:
                await unload()
            # an open that started before the fence finishes first (then the topic is open: refused)
            async with self._opening.setdefault(topic, asyncio.Lock()):
                if topic in self._topics:
                    raise StorageError(
                        f"topic {topic} is still open on this broker; unload it before deleting its storage",
                        retriable=True,
                    )
                return await self._delete(topic)
        finally:
            self._deleting.discard(topic)

    async def _delete(self, topic: str) -> list[str]:
        cfg = self.config
        durable = durable_topic(topic, self.broker_id)
        await self.metadata.delete_prefix(keys.storage_segments(cfg.metadata_prefix, durable))
        await self.metadata.delete(keys.storage_state(cfg.metadata_prefix, durable))
        removed: list[str] = []
        failures: list[str] = []
        backend = await self.backend()
        try:
            if isinstance(backend, FilesystemBackend):
                removed += await asyncio.to_thread(remove_topic_data, backend.root, durable)
            else:
                objects = await asyncio.to_thread(backend.list, topic_prefix(durable))
                # sidecars first: a data object without its sidecar is invisible to readers
                for key in sorted((o.key for o in objects), key=lambda k: not k.endswith(DESCRIPTOR_SUFFIX)):
                    await asyncio.to_thread(backend.delete, key)
                    removed.append(key)
        except (OSError, StorageError) as exc:
            # Unreferenced now (the catalog is gone): the next open of this name removes what is
            # left (SegmentExporter.reconcile); reported so the operator knows.
            failures.append(f"durable segments in {backend.describe()}: {exc}")
        try:
            removed += await asyncio.to_thread(remove_topic_data, cfg.local_wal_root, topic)
        except OSError as exc:
            failures.append(f"local WAL under {cfg.local_wal_root}: {exc}")
        log.info("%s: storage deleted (%d paths/objects removed)", topic, len(removed))
        if failures:
            raise StorageError(
                f"topic {topic}: its metadata and catalog are deleted but not all its files: " + "; ".join(failures)
            )
        return removed

    async def close(self) -> None:
        self._closed = True
        for storage in list(self._topics.values()):
            try:
                await storage.close(export=True)
            except Exception:  # noqa: BLE001 - close the others anyway
                log.exception("%s: closing storage failed", storage.topic)
        self._topics.clear()


SYSTEM_NAMESPACE = "/system/"
_NOT_IN_A_NAME = re.compile(r"[^A-Za-z0-9_.\-]")


def durable_topic(topic: str, broker_id: str) -> str:
    """The name a topic's durable history (catalog, segments, seal marker) is kept under.

    A topic has one owner and one offset space, so that is the topic itself.  A system topic
    (``/system/...``, such as ``/system/load_reports``) is different: every broker of a cluster
    writes its own copy, with its own offsets, so each copy's history goes under
    ``/system/<name>.<broker_id>`` (anything but letters, digits, ``_.-`` in the id becomes
    ``_``); Spark jobs read them all (``danube.spark.jobs.common.topics_to_read``)."""
    if not topic.startswith(SYSTEM_NAMESPACE):
        return topic
    ns, name = split_topic(topic)
    return f"/{ns}/{(name + '.' + _NOT_IN_A_NAME.sub('_', broker_id))[:MAX_NAME_CHARS]}"


__all__ = ["StorageFactory", "durable_topic", "local_wal_continuity"]
