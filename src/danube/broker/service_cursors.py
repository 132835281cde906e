"""BrokerService's cursor persistence: subscriptions' acknowledged positions written to the
metadata store in bounded transactions, on a timer and on demand.

A base class of :class:`~danube.broker.service.BrokerService` (``broker/service.py``), which
holds the state; its methods are moved here whole.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING

from danube.broker.policies import DispatchSettings
from danube.broker.subscription import Subscription
from danube.broker.topic import Topic
from danube.metadata import keys
from danube.metadata.store import MetadataStore, Op

log = logging.getLogger(__name__)

# Cursor writes per metadata transaction (etcd refuses more than --max-txn-ops, 128 by default).
CURSORS_PER_TXN = 64

# A flush names every moved cursor's key (about one per subscription per second at a thousand busy
# topics), and building one validates both names: the keys are remembered instead.  The bound is
# above the subscriptions a broker flushes in a round, so the cyclic walk stays in the cache.
_cursor_key = functools.lru_cache(maxsize=1 << 16)(keys.subscription_cursor)


class CursorPersistence:
    if TYPE_CHECKING:  # what this part uses of the rest of BrokerService
        _flush_lock: asyncio.Lock
        dispatch: DispatchSettings
        metadata: MetadataStore
        topics: dict[str, Topic]

    # ------------------------------------------------------------ cursors

    async def flush_cursors(self, *, force: bool = False, topic: Topic | None = None) -> int:
        async with self._flush_lock:
            return await self._flush_cursors(force, topic)

    async def _flush_cursors(self, force: bool, topic: Topic | None) -> int:
        # Every moved cursor in transactions of at most CURSORS_PER_TXN keys, all sent at once: one
        # flush is one round trip however many subscriptions moved, and on a store that commits
        # concurrent writes together (the embedded store) one sync, not one per chunk.
        chunks: list[list[Subscription]] = []
        batch: list[Subscription] = []
        for t in [topic] if topic is not None else list(self.topics.values()):
            # a read-only topic's cursors wait until the broker knows it still owns the topic
            # (reopen_for_writing); a broker that lost it never writes them (unload_topic flush=False)
            if not t.reliable or t.read_only:
                continue
            for sub in list(t.subscriptions.values()):
                if sub.dirty or force:
                    batch.append(sub)
                    if len(batch) >= CURSORS_PER_TXN:
                        chunks.append(batch)
                        batch = []
        if batch:
            chunks.append(batch)
        if len(chunks) <= 1:
            return await self._write_cursors(chunks[0]) if chunks else 0
        # a failed chunk keeps its own cursors dirty (retried next flush); the others are written
        results = await asyncio.gather(*(self._write_cursors(c) for c in chunks), return_exceptions=True)
        written = 0
        for result in results:
            if isinstance(result, BaseException):
                raise result
            written += result
        return written

    async def _write_cursors(self, subs: list[Subscription]) -> int:
        ops = []
        for sub in subs:
            sub.dirty = False
            ops.append(Op.put_json(_cursor_key(sub.topic.name, sub.name), sub.cursor))
        try:
            if len(ops) == 1:
                await self.metadata.put(ops[0].key, ops[0].value)
            else:
                await self.metadata.txn((), ops)
        except BaseException:
            for sub in subs:
                sub.dirty = True
            raise
        return len(ops)

    async def _flush_cursors_loop(self) -> None:
        interval = self.dispatch.cursor_flush_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.flush_cursors()
            except Exception:  # noqa: BLE001 - retried on the next tick
                log.exception("persisting cursors failed; retrying")
