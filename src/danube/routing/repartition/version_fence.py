"""The version fence: an owner refuses a batch routed under a stale partitioning version.

The broker keeps one :class:`VersionFence`; the batch lane asks it once per batch
(:meth:`VersionFence.admit`: one dict lookup on the partition's name when the request carries a
version, nothing when it carries none — Danube's lane is covered by lookups).  The fence follows
every partitioning state with one watch (``RepartitionStore.watch``) and, when a cutover reaches a
partition this broker serves, records that partition's offsets (model: ``old_end`` of a source
once the batches admitted under the old version are stored, ``new_start`` of a target at once).

Refusal: :class:`StaleRoutingError` (FAILED_PRECONDITION, retriable), naming the current version,
the partition count and, when known, the URL of the partition's owner — the client refreshes its
routing and routes the batch's messages again; nothing of the batch is stored.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from danube.errors import FencedError
from danube.routing.repartition.model import CUTOVER, PartitioningState
from danube.routing.repartition.store import RepartitionStore

log = logging.getLogger(__name__)

RECORD_RETRY_S = 0.5


class StaleRoutingError(FencedError):
    """A publish routed under an older partitioning version than the topic's: route it again."""

    def __init__(self, message: str, *, version: int = 0, partitions: int = 0, redirect_url: str = "") -> None:
        super().__init__(message)
        self.version = version
        self.partitions = partitions
        self.redirect_url = redirect_url


def split_partition(name: str) -> tuple[str, int] | None:
    """``/ns/t-part-3`` → ``("/ns/t", 3)``."""
    base, sep, index = name.rpartition("-part-")
    if not sep or not index.isdigit() or not base:
        return None
    return base, int(index)


@dataclass
class _Epoch:
    """Batches admitted under one version of one partition and not stored yet."""

    version: int
    inflight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def done(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self.idle.set()


class _Entry:
    __slots__ = ("base", "index", "epoch", "pending_start")

    def __init__(self, base: str, index: int, version: int) -> None:
        self.base = base
        self.index = index
        self.epoch = _Epoch(version)
        # a target of the cutover to this version whose new_start this broker must still record
        self.pending_start = False


class VersionFence:
    def __init__(
        self,
        store: RepartitionStore,
        *,
        next_offset: Callable[[str], int | None],
        owner_url: Callable[[str], str | None] = lambda name: None,
    ) -> None:
        self.store = store
        self._next_offset = next_offset  # the served partition's next offset, None when not served here
        self._owner_url = owner_url
        self.states: dict[str, PartitioningState] = {}
        self._entries: dict[str, _Entry | None] = {}
        self._counts: dict[str, int] = {}  # topic -> its partition count (batches to others are refused)
        self._recorded: set[tuple] = set()  # (base, index, to_version, "old_end" | "new_start")
        self._recording: set[tuple] = set()
        self._task: asyncio.Task | None = None
        self._ready = asyncio.Event()
        self.revision = 0
        self.refused = 0
        self._listeners: list[Callable[[str, PartitioningState | None, int], None]] = []
        self.on_stored: Callable[[str], None] | None = None

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._follow())

    async def ready(self) -> None:
        self.start()
        await self._ready.wait()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def add_listener(self, callback: Callable[[str, PartitioningState | None, int], None]) -> None:
        """``callback(topic, state, revision)`` on every change of a partitioning state."""
        self._listeners.append(callback)

    async def _follow(self) -> None:
        while True:
            try:
                states, revision = await self.store.snapshot()
                for topic, state in states.items():
                    self._apply(topic, state, revision)
                self.revision = revision
                self._ready.set()
                async for ev in self.store.watch(start_revision=revision + 1):
                    self._apply(ev.topic, ev.state, ev.revision)
                    self.revision = ev.revision
                return
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the store closed or broke: start over from a snapshot
                log.debug("partitioning watch broke; re-reading", exc_info=True)
                await asyncio.sleep(RECORD_RETRY_S)

    # ------------------------------------------------------------ following the states

    def _apply(self, topic: str, state: PartitioningState | None, revision: int) -> None:
        if state is None:
            self.states.pop(topic, None)
            self._counts.pop(topic, None)
        else:
            old = self.states.get(topic)
            if old is not None and old.version > state.version:
                return
            self.states[topic] = state
            self._counts[topic] = state.partitions
            self._on_state(topic, state)
        for callback in self._listeners:
            callback(topic, state, revision)

    def _on_state(self, topic: str, state: PartitioningState) -> None:
        t = state.transition
        for i in range(state.live_partitions):
            name = f"{topic}-part-{i}"
            entry = self._entries.get(name)
            if entry is None:
                entry = self._entry(name)
            old = None
            if entry is not None and entry.epoch.version < state.version:
                old = entry.epoch
                entry.epoch = _Epoch(state.version)
                entry.epoch.idle.set()
            if t is None or t.phase != CUTOVER or entry is None:
                continue
            served = self._next_offset(name) is not None
            if i in t.targets and i not in t.new_start and (topic, i, t.to_version, "new_start") not in self._recorded:
                # where moved keys may start: the next offset now, before any batch admitted under
                # the new version is stamped; a partition not served here records the first offset
                # of the first new-version batch it stores (``stored``) or, idle, its next offset
                if served and entry.epoch.inflight == 0:
                    self._write(topic, i, t.to_version, new_start=self._next_offset(name))
                else:
                    entry.pending_start = True
            if i in t.sources and i not in t.old_end and served:
                self._record_end(topic, i, t.to_version, old)

    def _write(self, topic: str, index: int, to_version: int, **offsets: int | None) -> None:
        what = "new_start" if "new_start" in offsets else "old_end"
        key = (topic, index, to_version, what)
        if key in self._recorded:
            return
        self._recorded.add(key)
        asyncio.ensure_future(self._write_retrying(key, offsets))

    async def _write_retrying(self, key: tuple, offsets: dict) -> None:
        topic, index, to_version, _ = key
        for _ in range(100):
            try:
                await self.store.record_offsets(topic, index, to_version=to_version, **offsets)
                log.info("repartition of %s to version %d: partition %d records %s", topic, to_version, index, offsets)
                return
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - retried: the drain waits for this record
                log.warning("recording %s of %s-part-%d failed; retrying", offsets, topic, index, exc_info=True)
                await asyncio.sleep(RECORD_RETRY_S)
        self._recorded.discard(key)

    def _record_end(self, topic: str, index: int, to_version: int, old: _Epoch | None) -> None:
        key = (topic, index, to_version, "old_end")
        if key in self._recorded or key in self._recording:
            return
        self._recording.add(key)
        asyncio.ensure_future(self._end_when_idle(key, old))

    async def _end_when_idle(self, key: tuple, old: _Epoch | None) -> None:
        topic, index, to_version, _ = key
        try:
            if old is not None and old.inflight:
                await old.idle.wait()  # every batch admitted under the old version is stored
            offset = self._next_offset(f"{topic}-part-{index}")
            if offset is not None:
                self._write(topic, index, to_version, old_end=offset)
        finally:
            self._recording.discard(key)

    def stored(self, name: str, epoch: _Epoch, first: int) -> None:
        """A batch admitted under ``epoch`` was stored from offset ``first`` (before ``epoch.done()``)."""
        if self.on_stored is not None:
            self.on_stored(name)
        entry = self._entries.get(name)
        if entry is not None and entry.pending_start and entry.epoch is epoch:
            entry.pending_start = False
            self._write(entry.base, entry.index, epoch.version, new_start=first)

    def sweep(self) -> None:
        """Record offsets of partitions opened here after their cutover (called periodically)."""
        for topic, state in list(self.states.items()):
            t = state.transition
            if t is None or t.phase != CUTOVER:
                continue
            for i in range(state.live_partitions):
                name = f"{topic}-part-{i}"
                entry = self._entries.get(name)
                offset = self._next_offset(name)
                if entry is None or offset is None:
                    continue
                if entry.pending_start and entry.epoch.inflight == 0 and i not in t.new_start:
                    entry.pending_start = False
                    self._write(topic, i, t.to_version, new_start=offset)
                if i in t.sources and i not in t.old_end:
                    self._record_end(topic, i, t.to_version, None)

    # ------------------------------------------------------------ the check, once per batch

    def admit(self, name: str, version: int) -> _Epoch | None:
        """The batch of partition ``name`` routed under ``version`` may be stored: returns its epoch
        (call ``done()`` once it is stored or failed), None for a topic that is not a partition.
        Raises StaleRoutingError for a stale version.  A version newer than the fence knows needs
        :meth:`catch_up` first (``NeedsCatchUp``)."""
        entry = self._entries.get(name)
        if entry is None:
            if name in self._entries:
                return None
            entry = self._entry(name)
            if entry is None:
                return None
        epoch = entry.epoch
        if version == epoch.version and entry.index < self._counts.get(entry.base, entry.index + 1):
            epoch.inflight += 1
            if epoch.inflight == 1:
                epoch.idle.clear()
            return epoch
        if version > epoch.version:
            raise NeedsCatchUp(entry.base)
        # a stale version, or the current one for a partition the count no longer has (retired, or
        # shrunk away while it drains): routed nowhere under this version
        self.refused += 1
        state = self.states.get(entry.base)
        partitions = state.partitions if state is not None else 0
        raise StaleRoutingError(
            f"{name}: routed under partitioning version {version}, the topic is at version "
            f"{epoch.version} with {partitions} partitions; route it again",
            version=epoch.version,
            partitions=partitions,
            redirect_url=self._owner_url(name) or "",
        )

    def _entry(self, name: str) -> _Entry | None:
        part = split_partition(name)
        if part is None:
            self._entries[name] = None
            return None
        base, index = part
        state = self.states.get(base)
        entry = _Entry(base, index, state.version if state is not None else 0)
        self._entries[name] = entry
        return entry

    async def catch_up(self, base: str) -> None:
        """Read ``base``'s state from the store now (a publish is newer than the watch delivered)."""
        stored = await self.store.load(base)
        if stored is not None:
            self._apply(base, stored.state, stored.revision)

    async def admit_async(self, name: str, version: int) -> _Epoch | None:
        try:
            return self.admit(name, version)
        except NeedsCatchUp as need:
            await self.catch_up(need.base)
            try:
                return self.admit(name, version)
            except NeedsCatchUp:
                # the client routed under a version the store does not have: let it route again
                raise StaleRoutingError(
                    f"{name}: partitioning version {version} is unknown here; route it again",
                    version=self.states[need.base].version if need.base in self.states else 0,
                    partitions=self.states[need.base].partitions if need.base in self.states else 0,
                ) from None

    def describe(self) -> dict:
        return {
            "revision": self.revision,
            "refused": self.refused,
            "topics": {t: s.to_dict() for t, s in self.states.items()},
            "at": time.time(),
        }


class NeedsCatchUp(Exception):
    def __init__(self, base: str) -> None:
        super().__init__(base)
        self.base = base
