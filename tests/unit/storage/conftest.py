"""Helpers for storage tests: real WALs in temp dirs, the embedded metadata store, file-system backends
(the S3 ones, against a moto server, are in tests/integration/storage)."""

from __future__ import annotations

import pytest

from danube import message_codec
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.storage import StorageConfig, StorageFactory

TOPIC = "/default/reliable_topic"


def make_config(tmp_path, mode: str = "shared_fs", *, s3=None, file_kb: float = 4, **extra) -> StorageConfig:
    section = {"mode": mode, "wal": {"max_file_mb": file_kb / 1024, "sync": "always"}}
    if mode == "shared_fs":
        section["durable"] = {"root": str(tmp_path / "shared")}
    elif mode == "object_store":
        section["durable"] = s3.storage_section()
    section.update(extra)
    return StorageConfig.from_dict(section, data_dir=str(tmp_path / "broker"))


def payload(offset_hint: int, size: int = 200) -> bytes:
    head = b"msg-%06d-" % offset_hint
    return head + b"p" * max(size - len(head), 0)


async def append(storage, start_hint: int, count: int, size: int = 200) -> tuple[int, int]:
    """Append ``count`` one-frame batches; return (first, last) offsets."""
    first = last = None
    for i in range(count):
        buf = bytearray(message_codec.encode_payloads([payload(start_hint + i, size)]))
        f, last = storage.append_frames(buf)
        first = f if first is None else first
    await storage.wait_durable(last)
    return first, last


def offsets_of(buf) -> list[int]:
    return [r.offset for r in message_codec.iter_records(buf)]


async def read_all(storage, from_offset: int, until: int, max_bytes: int = 4096) -> list:
    """Records from ``from_offset`` through ``until`` via tail_frames."""
    import asyncio

    out = []

    async def run():
        async for piece in storage.tail_frames(from_offset, max_bytes):
            for record in message_codec.iter_records(piece):
                out.append(record)
                if record.offset >= until:
                    return

    await asyncio.wait_for(run(), 20)
    return out


@pytest.fixture
async def metadata(tmp_path):
    store = EmbeddedMetadataStore(str(tmp_path / "metadata.db"))
    yield store
    await store.close()


@pytest.fixture
async def factories(metadata):
    """Make StorageFactory instances (one per simulated broker); all closed at the end."""
    made = []

    def make(config, broker_id="broker-a", background=False, **kwargs):
        factory = StorageFactory(config, metadata, broker_id=broker_id, background=background, **kwargs)
        made.append(factory)
        return factory

    yield make
    for factory in made:
        await factory.close()
