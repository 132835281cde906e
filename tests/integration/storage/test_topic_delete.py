"""`topics delete` frees the topic's storage: its WAL directory, its durable segments (a directory
or an S3 bucket on a moto server) and its catalog go, other topics keep theirs, and a producer
that comes back creates the topic anew, empty (StorageFactory.delete_topic)."""

from __future__ import annotations

import asyncio
import contextlib
import os

import grpc
import pytest

from danube.broker import BrokerService
from danube.client import DanubeClient
from danube.errors import InvalidTopicNameError, StorageError, UnsafePathError
from danube.metadata import keys
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.proto.danube_admin import admin_pb2 as admin_pb
from danube.proto.danube_admin import admin_pb2_grpc as admin_grpc
from danube.server import admin as admin_service
from danube.server import batch_lane, danube_services
from danube.storage.config import StorageConfig
from danube.storage.factory import StorageFactory
from danube.storage.owner_fence import epoch_key
from danube.storage.paths import remove_topic_data, set_aside, stale_dirs, topic_dir
from danube.storage.segment import topic_prefix

DOOMED = "/default/doomed"
KEPT = "/default/kept"
SIMILAR = "/default/doomed-1"  # a name that starts like DOOMED: its files must stay


def _config(mode, tmp_path, s3):
    section = {"mode": mode, "wal": {"sync": "never"}}
    if mode == "object_store":
        section["durable"] = s3.storage_section("deltest")
    elif mode == "shared_fs":
        section["durable"] = {"root": str(tmp_path / "shared")}
    return StorageConfig.from_dict(section, data_dir=str(tmp_path / "data"))


@contextlib.asynccontextmanager
async def _broker(config, tmp_path):
    metadata = EmbeddedMetadataStore(str(tmp_path / "metadata.db"))
    factory = StorageFactory(config, metadata, broker_id="b1")
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    url = f"http://127.0.0.1:{port}"
    broker = BrokerService(metadata, factory, broker_url=url, broker_id="b1")
    await broker.start()
    danube_services.add_to_server(server, broker)
    batch_lane.add_to_server(server, broker)
    admin_service.add_to_server(server, broker)
    await server.start()
    client = DanubeClient.builder().service_url(url).build()
    try:
        yield broker, client, admin_grpc.TopicAdminStub(client.connection().channel)
    finally:
        await client.close()
        await server.stop(None)
        with contextlib.suppress(Exception):
            await broker.stop()
        await metadata.close()


async def _publish(client, topic, count, name="p1"):
    producer = client.new_producer().with_topic(topic).with_name(name).with_reliable(True).build()
    await producer.create()
    offsets = [await producer.send_and_wait(b"%s-%d" % (topic.encode(), i)) for i in range(count)]
    await producer.close()
    return offsets


async def _export(broker, topic):
    """Everything written so far to the durable store (local mode exports lazily, the others on an
    interval: done here so both have segments to delete)."""
    storage = broker.storage_factory.get(topic)
    await storage.exporter.export_through(storage.next_offset - 1)
    return await asyncio.to_thread((await broker.storage_factory.backend()).list, topic_prefix(topic))


@pytest.mark.parametrize("mode", ["local", "shared_fs", "object_store"])
async def test_delete_removes_the_topics_files_and_nothing_else(mode, tmp_path, request):
    s3 = request.getfixturevalue("s3_bucket") if mode == "object_store" else None
    config = _config(mode, tmp_path, s3)
    async with _broker(config, tmp_path) as (broker, client, admin):
        factory = broker.storage_factory
        for topic, count in ((DOOMED, 20), (KEPT, 7), (SIMILAR, 3)):
            assert await _publish(client, topic, count) == list(range(count))
        live = client.new_producer().with_topic(DOOMED).with_name("live").with_reliable(True).build()
        await live.create()  # attached while the topic is deleted
        assert await live.send_and_wait(b"old") == 20
        doomed_objects = await _export(broker, DOOMED)
        kept_objects = await _export(broker, KEPT)
        similar_objects = await _export(broker, SIMILAR)
        assert doomed_objects and kept_objects and similar_objects
        backend = await factory.backend()
        wal = config.wal_dir(DOOMED)
        assert os.path.isdir(wal)
        # a WAL set aside by an earlier recovery is the topic's data too; a similar name's is not
        os.makedirs(os.path.join(os.path.dirname(wal), ".stale-doomed-1700000000000"))
        os.makedirs(os.path.join(os.path.dirname(wal), ".stale-doomed-1-1700000000000"))
        catalog = keys.storage_segments(config.metadata_prefix, DOOMED)
        assert await broker.metadata.get_prefix(catalog)

        fence = factory.get(DOOMED).owner_fence  # shared_fs: the owner epoch of the WAL directory
        await admin.DeleteTopic(admin_pb.TopicRequest(name=DOOMED))

        assert DOOMED not in broker.topics and factory.get(DOOMED) is None
        assert not os.path.exists(wal)
        assert stale_dirs(config.local_wal_root, DOOMED) == []
        assert [os.path.basename(p) for p in stale_dirs(config.local_wal_root, SIMILAR)] == [
            ".stale-doomed-1-1700000000000"
        ]
        assert await asyncio.to_thread(backend.list, topic_prefix(DOOMED)) == []
        if mode != "object_store":  # the durable directory of the topic is gone, not just emptied
            assert not os.path.exists(topic_dir(config.durable.root, DOOMED))
        if mode == "shared_fs":  # the owner epoch stays: a new incarnation outranks any old owner
            assert await broker.metadata.get(epoch_key(config.metadata_prefix, DOOMED)) is not None
        assert await broker.metadata.get_prefix(catalog) == []
        assert await broker.metadata.get_prefix(keys.topic_root(DOOMED) + "/") == []
        # the other topics keep every byte
        for topic, objects in ((KEPT, kept_objects), (SIMILAR, similar_objects)):
            assert os.path.isdir(config.wal_dir(topic))
            assert await asyncio.to_thread(backend.list, topic_prefix(topic)) == objects
        assert broker.topics[KEPT].storage.next_offset == 7
        assert broker.topics[SIMILAR].storage.next_offset == 3

        # a producer that comes back creates the topic anew: empty, offsets from 0
        consumer = (
            client.new_consumer()
            .with_topic(DOOMED)
            .with_consumer_name("c1")
            .with_subscription("s1")
            .with_reliable(True)
            .build()
        )
        await consumer.subscribe()
        # the producer that was attached comes back (CLOSE, then a new lookup) and creates it anew
        assert [await live.send_and_wait(DOOMED.encode() + b"-%d" % i) for i in range(2)] == [0, 1]
        await live.close()
        storage = broker.topics[DOOMED].storage
        assert (storage.first_offset, storage.next_offset) == (0, 2)
        if fence is not None:
            assert storage.owner_fence.epoch > fence.epoch
        got = []
        while len(got) < 2:
            batch = await consumer.receive_batch(timeout=30)
            assert batch is not None
            got += [(m.offset, bytes(m.payload)) for m in batch.messages()]
        assert got == [(0, DOOMED.encode() + b"-0"), (1, DOOMED.encode() + b"-1")]
        await consumer.close()

        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await admin.DeleteTopic(admin_pb.TopicRequest(name="/default/never-existed"))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND


async def test_delete_after_restart_removes_files_of_a_topic_not_open(tmp_path):
    """Deleting a topic this broker does not serve at the moment (after a restart) still frees it."""
    config = _config("local", tmp_path, None)
    async with _broker(config, tmp_path) as (broker, client, _admin):
        await _publish(client, DOOMED, 5)
    async with _broker(config, tmp_path) as (broker, client, admin):
        assert DOOMED not in broker.topics and os.path.isdir(config.wal_dir(DOOMED))
        await admin.DeleteTopic(admin_pb.TopicRequest(name=DOOMED))
        assert not os.path.exists(config.wal_dir(DOOMED))
        assert await _publish(client, DOOMED, 1) == [0]


async def test_opens_are_refused_while_the_storage_is_deleted(tmp_path):
    metadata = EmbeddedMetadataStore(str(tmp_path / "metadata.db"))
    config = _config("local", tmp_path, None)
    factory = StorageFactory(config, metadata, broker_id="b1", background=False)
    try:
        storage = await factory.open_topic(DOOMED)
        from danube import message_codec

        storage.append_frames(bytearray(message_codec.encode_payloads([b"old"] * 3, publish_time=1)))
        await storage.wait_durable(2)
        with pytest.raises(StorageError, match="still open") as still_open:
            await factory.delete_topic(DOOMED)  # not unloaded: refused, nothing removed
        assert still_open.value.retriable and os.path.isdir(config.wal_dir(DOOMED))

        release = asyncio.Event()
        unloading = asyncio.Event()

        async def unload():
            unloading.set()
            await release.wait()
            await storage.close()

        deleting = asyncio.create_task(factory.delete_topic(DOOMED, unload=unload))
        await unloading.wait()
        with pytest.raises(StorageError, match="being deleted") as refused:
            await factory.open_topic(DOOMED)  # a late producer or consumer: told to retry
        assert refused.value.retriable
        release.set()
        removed = await deleting
        assert config.wal_dir(DOOMED) in removed and not os.path.exists(config.wal_dir(DOOMED))
        again = await factory.open_topic(DOOMED)
        assert (again.first_offset, again.next_offset) == (0, 0)
    finally:
        await factory.close()
        await metadata.close()


def test_a_hostile_name_cannot_delete_outside_the_data_dir(tmp_path):
    root = tmp_path / "wal"
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "file").write_text("keep")
    (root / "default").mkdir(parents=True)
    for name in (
        "/default/..",
        "/../precious",
        "/default/../../precious",
        "default/x",
        "/default/.stale-x-1",
        "/default/x/../../precious",
        "/default",
        "/default/x\n",
    ):
        with pytest.raises(InvalidTopicNameError):
            remove_topic_data(str(root), name)
    # a topic directory that is a symbolic link: the link goes, never what it points to
    os.symlink(outside, root / "default" / "linked")
    assert remove_topic_data(str(root), "/default/linked") == [str(root / "default" / "linked")]
    assert (outside / "file").read_text() == "keep"
    # a set-aside copy is removed only by its own topic's name, and only inside the namespace
    (root / "default" / "t").mkdir()
    moved = set_aside(str(root), str(root / "default" / "t"))
    (root / "default" / "t-2").mkdir()
    assert stale_dirs(str(root), "/default/t-2") == []
    assert remove_topic_data(str(root), "/default/t-2") == [str(root / "default" / "t-2")]
    assert os.path.isdir(moved)
    assert remove_topic_data(str(root), "/default/t") == [moved]
    from danube.storage.paths import _check_stale_dir

    with pytest.raises(UnsafePathError):
        _check_stale_dir(str(root), "/default/t", str(outside / ".stale-t-1"))
    assert (outside / "file").read_text() == "keep"
