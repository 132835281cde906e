"""Recovery-start resolution and the sealed mobility marker.

Where a topic's WAL starts when a broker opens it, first match wins:

1. **sealed**: ``storage/topics/<ns>/<t>/state`` says the previous owner sealed at
   ``last_committed_offset`` N → a fresh WAL at N + 1, with *hot cutover*: offsets
   below N + 1 are served from durable history only.  A local WAL directory left
   behind is discarded (the seal exported all of it before writing the marker).
2. **local**: this broker still has the topic's WAL (its checkpoint and files) →
   continue it.  If the durable catalog is ahead of it (another owner wrote
   later without sealing) the local copy is stale and is moved aside, never
   deleted.
3. **durable**: durable segments exist → a fresh WAL at the last segment's end + 1.
4. **empty**: offset 0.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass

from danube.errors import StorageError
from danube.metadata import keys
from danube.metadata.store import MetadataStore
from danube.storage.catalog import SegmentCatalog

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StorageStateSealed:
    sealed: bool
    last_committed_offset: int  # -1 when the topic was sealed empty
    broker_id: str
    timestamp: int  # seconds since the epoch

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> "StorageStateSealed":
        data = json.loads(raw)
        try:
            return cls(
                sealed=bool(data["sealed"]),
                last_committed_offset=int(data["last_committed_offset"]),
                broker_id=str(data.get("broker_id", "")),
                timestamp=int(data.get("timestamp", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise StorageError(f"unreadable sealed state {raw[:120]!r}: {exc}", retriable=False) from exc


async def read_sealed_state(metadata: MetadataStore, prefix: str, topic: str) -> StorageStateSealed | None:
    kv = await metadata.get(keys.storage_state(prefix, topic))
    if kv is None:
        return None
    state = StorageStateSealed.from_json(kv.value)
    return state if state.sealed else None


async def write_sealed_state(
    metadata: MetadataStore, prefix: str, topic: str, last_committed_offset: int, broker_id: str
) -> StorageStateSealed:
    state = StorageStateSealed(True, last_committed_offset, broker_id, int(time.time()))
    await metadata.put(keys.storage_state(prefix, topic), state.to_json())
    return state


async def clear_sealed_state(metadata: MetadataStore, prefix: str, topic: str) -> bool:
    return await metadata.delete(keys.storage_state(prefix, topic))


@dataclass(frozen=True)
class RecoveryStart:
    source: str  # "sealed" | "local" | "durable" | "empty"
    initial_offset: int  # next_offset of the WAL if it is (or turns out) empty
    hot_cutover: bool  # offsets below initial_offset come from durable history only
    sealed: StorageStateSealed | None = None
    discard_local: bool = False  # delete the local WAL directory (everything in it is durable)
    set_aside_local: bool = False  # move the local WAL directory aside (kept for inspection)


def local_wal_continuity(wal_dir: str) -> bool:
    """True if ``wal_dir`` holds a WAL checkpoint whose rotated files all exist, or any WAL file."""
    from danube.wal.checkpoint import read_checkpoint
    from danube.wal.files import list_segment_files

    if not os.path.isdir(wal_dir):
        return False
    files = list_segment_files(wal_dir)
    ckpt = read_checkpoint(wal_dir)
    if ckpt is not None:
        present = {seq for seq, _path in files}
        missing = [seq for seq in ckpt.rotated if seq not in present]
        if missing:
            log.warning("WAL %s: checkpoint names missing files %s; no local continuity", wal_dir, missing)
            return False
    return bool(files)


async def resolve_recovery_start(
    metadata: MetadataStore, prefix: str, topic: str, wal_dir: str, catalog: SegmentCatalog
) -> RecoveryStart:
    import asyncio

    durable_next = catalog.end_offset + 1
    sealed = await read_sealed_state(metadata, prefix, topic)
    has_local = await asyncio.to_thread(local_wal_continuity, wal_dir)
    if sealed is not None:
        resume = sealed.last_committed_offset + 1
        if durable_next < resume:
            log.error(
                "%s: sealed at %d but durable history ends at %d; offsets %d..%d are unreadable",
                topic,
                sealed.last_committed_offset,
                catalog.end_offset,
                durable_next,
                resume - 1,
            )
        return RecoveryStart(
            "sealed", resume, True, sealed=sealed, discard_local=await asyncio.to_thread(os.path.isdir, wal_dir)
        )
    if has_local:
        return RecoveryStart("local", durable_next, False)
    if len(catalog):
        return RecoveryStart(
            "durable", durable_next, True, set_aside_local=await asyncio.to_thread(os.path.isdir, wal_dir)
        )
    return RecoveryStart("empty", 0, False)
