"""The handoff timeline of Danube's reliable-topic moves in every storage mode, with real backends.

Broker A writes offsets 0..21, a consumer has acknowledged through 13, A seals;
broker B (its own disk, the shared metadata and durable store) resumes the
topic, producers continue at 22..27, and the consumer reading from 14 gets
14..27 with no gap and no duplicate.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from danube import message_codec
from danube.metadata import keys
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.storage import StorageConfig, StorageFactory
from danube.storage.recovery import read_sealed_state
from danube.storage.segment import list_segments, topic_prefix

TOPIC = "/default/reliable_topic"
SUB = "subs_reliable"


def _config(mode, tmp_path, broker, s3):
    section = {"mode": mode, "wal": {"max_file_mb": 4 / 1024}, "export_interval_seconds": 0.2}
    if mode == "shared_fs":
        section["durable"] = {"root": str(tmp_path / "shared")}
    elif mode == "object_store":
        section["durable"] = s3.storage_section("cluster-a")
    # local mode keeps its durable history on the broker's disk, so the handoff stays on one machine
    data_dir = tmp_path / ("broker" if mode == "local" else broker)
    return StorageConfig.from_dict(section, data_dir=str(data_dir))


def _message(i: int) -> bytes:
    return b"message-%d|" % i + bytes([i % 251]) * 400


@contextlib.asynccontextmanager
async def _phase(name: str, seconds: float = 30):
    """Bound one phase, so that a hang fails naming it instead of sitting until the suite's timeout."""
    bound = asyncio.timeout(seconds)
    try:
        async with bound:
            yield
    except TimeoutError:
        if bound.expired():
            pytest.fail(f"{name} did not finish in {seconds:.0f} s (a lost wake-up?)")
        raise


async def _produce(storage, messages):
    last = None
    for i in messages:
        first, last = storage.append_frames(
            bytearray(message_codec.encode_payloads([_message(i)], publish_time=1000 + i))
        )
        assert first == i, "offsets continue without a gap"
    await storage.wait_durable(last)


async def _consume(storage, start, through):
    got = []

    async def run():
        async for piece in storage.tail_frames(start, 700):
            for record in message_codec.iter_records(piece):
                got.append((record.offset, bytes(record.payload)))
                if record.offset >= through:
                    return

    await asyncio.wait_for(run(), 30)
    return got


@pytest.mark.parametrize("mode", ["local", "shared_fs", "object_store"])
async def test_seal_and_resume_keep_one_offset_space(mode, tmp_path, request):
    s3 = request.getfixturevalue("s3_bucket") if mode == "object_store" else None
    metadata = EmbeddedMetadataStore(str(tmp_path / "metadata.db"))  # stands for the cluster's store
    factory_a = StorageFactory(_config(mode, tmp_path, "broker-a", s3), metadata, broker_id="broker-a")
    factory_b = StorageFactory(_config(mode, tmp_path, "broker-b", s3), metadata, broker_id="broker-b")
    try:
        # T1..T3: broker A accepts 0..21; the consumer reads 0..13 and its cursor is stored.
        async with _phase("A: open_topic"):
            a = await factory_a.open_topic(TOPIC)
        async with _phase("A: produce 0..21 and wait_durable"):
            await _produce(a, range(22))
        seen = await _consume(a, 0, 13)
        assert [o for o, _ in seen] == list(range(14))
        await metadata.put_json(keys.subscription_cursor(TOPIC, SUB), 13)

        # T4: unload → seal at 21; all of 0..21 is durable; A's WAL is gone.
        async with _phase("A: seal"):
            assert await a.seal() == 21
        state = await read_sealed_state(metadata, factory_a.config.metadata_prefix, TOPIC)
        assert state.last_committed_offset == 21 and state.broker_id == "broker-a"
        backend = await factory_a.backend()
        history = await asyncio.to_thread(list_segments, backend, topic_prefix(TOPIC))
        assert history[0].start_offset == 0 and history[-1].end_offset == 21
        assert all(x.end_offset + 1 == y.start_offset for x, y in zip(history, history[1:]))
        with pytest.raises(Exception, match="sealed"):
            a.append_frames(bytearray(message_codec.encode_payloads([b"late write"])))

        # T5: B loads the topic from the sealed state: next offset 22, sealed marker cleared.
        async with _phase("B: open_topic"):
            b = await factory_b.open_topic(TOPIC)
        assert b.recovery.source == "sealed"
        assert b.next_offset == 22 and b.hot_start == 22
        assert await read_sealed_state(metadata, factory_b.config.metadata_prefix, TOPIC) is None

        # T6: producers reconnect: 22..27.
        async with _phase("B: produce 22..27 and wait_durable"):
            await _produce(b, range(22, 28))

        # T8..T9: the consumer resumes from its cursor: 14..21 from durable history, 22..27 from B's WAL.
        cursor = await metadata.get_json(keys.subscription_cursor(TOPIC, SUB))
        got = await _consume(b, cursor + 1, 27)
        assert [o for o, _ in got] == list(range(14, 28)), "no gap and no duplicate across the handoff"
        assert [p for _, p in got] == [_message(i) for i in range(14, 28)]

        # read_frames agrees with the tail across the boundary
        below = await b.read_frames(20, 1 << 20)
        assert [r.offset for r in message_codec.iter_records(below)] == [20, 21]

        # B seals too: the durable history is now 0..27, still one offset space.
        async with _phase("B: seal"):
            assert await b.seal() == 27
        history = await asyncio.to_thread(list_segments, backend, topic_prefix(TOPIC))
        assert [(d.start_offset, d.end_offset) for d in history][-1][1] == 27
        assert all(x.end_offset + 1 == y.start_offset for x, y in zip(history, history[1:]))
    finally:
        async with _phase("closing the factories"):
            await factory_a.close()
            await factory_b.close()
            await metadata.close()
