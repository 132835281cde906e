"""Scalable topics free their storage on a real cluster (etcd, 3 broker subprocesses, durable
segments in one S3 bucket on a moto server): a split parent that every subscription drained is
pruned by the controller leader and deleted at whichever broker owns it; `delete` removes every
segment's WAL directory (on each broker's disk), durable objects and metadata."""

from __future__ import annotations

import asyncio
import os

import grpc
import pytest
import yaml

from danube.client import DanubeClient
from danube.client.scalable import QUEUE, ScalableConsumer, ScalableProducer
from danube.metadata import keys
from danube.metadata.etcd import EtcdMetadataStore
from danube.model.segment_layout import SegmentLayout, segment_topic_name
from danube.proto.danube_scalable import scalable_pb2 as pb
from danube.proto.danube_scalable import scalable_pb2_grpc as pb_grpc
from tests.support.cluster import local_cluster, lookup
from tests.support.etcd import requires_etcd
from tests.support.s3 import s3_bucket, s3_server  # noqa: F401
from tests.support.waiting import async_wait_until

pytestmark = [requires_etcd, pytest.mark.timeout(300)]

T = "/default/cleanup"
KEYS = [f"key-{i}" for i in range(24)]


def wal_dirs(base: str, name: str) -> list[str]:
    """Every directory of segment topic ``name`` (or a set-aside copy) on any broker's disk."""
    short = name.rsplit("/", 1)[1]
    return sorted(
        os.path.join(d, e)
        for d, dirs, _ in os.walk(base)
        for e in dirs
        if e == short or e.startswith(f".stale-{short}-")
    )


def objects(s3, name: str) -> list[str]:
    prefix = f"danube/default/{name.rsplit('/', 1)[1]}/"
    return [o["Key"] for o in s3.client().list_objects_v2(Bucket=s3.bucket, Prefix=prefix).get("Contents", [])]


async def scenario(cluster, s3, base: str) -> None:
    procs = cluster.procs
    channel = grpc.aio.insecure_channel(procs[0].url.split("://", 1)[-1])
    admin = pb_grpc.ScalableTopicsStub(channel)
    store = EtcdMetadataStore(cluster.etcd.url)
    pclient = DanubeClient.builder().service_url(procs[1].url).build()
    cclient = DanubeClient.builder().service_url(procs[2].url).build()
    try:
        await admin.CreateScalableTopic(pb.CreateScalableTopicRequest(topic=T, num_segments=3), timeout=30)
        queue = await ScalableConsumer(cclient, T, "work", "q1", kind=QUEUE).subscribe()
        producer = await ScalableProducer(pclient, T, "p1").create()
        got: list[int] = []

        async def read():
            while True:
                message = await queue.receive(timeout=0.5)
                if message is not None:
                    got.append(int(message.payload.split(b":")[1]))
                    await queue.ack(message)

        reader = asyncio.create_task(read())
        for i in range(90):
            await producer.send_and_wait(f"{KEYS[i % 24]}:{i}".encode(), key=KEYS[i % 24])
        await async_wait_until(lambda: len(got) >= 90, 60, "the first 90 messages", 0.2)
        first = SegmentLayout.from_json((await admin.GetScalableTopic(pb.ScalableTopicRequest(topic=T))).metadata_json)
        parent = segment_topic_name(T, first.segment(0))
        owners = {
            segment_topic_name(T, s): (await lookup(procs[0].url, segment_topic_name(T, s)))[1]
            for s in first.active_segments
        }
        print("segment owners", owners)
        assert wal_dirs(base, parent)

        # split 0; once the queue subscription drained it, the leader prunes it (retention 0.5 s)
        await admin.SplitSegment(pb.SplitSegmentRequest(topic=T, segment_id=0), timeout=60)
        for i in range(90, 150):
            await producer.send_and_wait(f"{KEYS[i % 24]}:{i}".encode(), key=KEYS[i % 24])

        async def pruned():
            layout = SegmentLayout.from_json(
                (await admin.GetScalableTopic(pb.ScalableTopicRequest(topic=T))).metadata_json
            )
            return 0 not in layout.segments and await store.get(keys.scalable_operation(T)) is None and layout

        layout = await async_wait_until(pruned, 60, "the drained parent's prune", 0.2)
        assert sorted(layout.segments) == [1, 2, 3, 4]
        assert wal_dirs(base, parent) == [] and objects(s3, parent) == []
        assert await store.get_prefix(keys.topic_root(parent) + "/") == []
        await async_wait_until(lambda: len(got) >= 150, 60, "all 150 messages", 0.2)
        assert sorted(got) == list(range(150))  # nothing lost to the prune

        # delete: every segment's files on every broker and in the bucket, and its metadata
        names = [segment_topic_name(T, s) for s in layout.segments.values()]
        await async_wait_until(
            lambda: all(objects(s3, n) for n in names if n in owners), 60, "the export of the active segments", 0.2
        )
        assert all(wal_dirs(base, n) for n in names)
        reader.cancel()
        await producer.close()
        await queue.close()
        reply = await pb_grpc.ScalableTopicsStub(cclient.connection().channel).DeleteScalableTopic(
            pb.ScalableTopicRequest(topic=T), timeout=60
        )
        assert reply.deleted
        for name in names:
            assert wal_dirs(base, name) == [], name
            assert objects(s3, name) == [], name
            assert await store.get_prefix(keys.topic_root(name) + "/") == [], name
            ns, short = name[1:].split("/")
            for p in procs:
                assert await store.get(f"/cluster/brokers/{p.broker_id}/{ns}/{short}") is None
        assert await store.get(keys.scalable_topic(T)) is None
    finally:
        await pclient.close()
        await cclient.close()
        await channel.close()
        await store.close()


def test_prune_and_delete_free_the_storage_on_every_broker(tmp_path, s3_bucket):  # noqa: F811
    # small WAL files rotated by age too: exported (only rotated files are) within a second
    config = {
        "storage": {
            "mode": "object_store",
            "export_interval_seconds": 0.3,
            "wal": {"max_file_mb": 4 / 1024, "max_file_age_seconds": 0.5},
            "durable": s3_bucket.storage_section("danube"),
        },
        "scalable_topics": {"prune_interval_seconds": 0.2, "sealed_retention_seconds": 0.5},
    }
    path = tmp_path / "broker.yml"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)  # it holds the S3 keys: the broker refuses a file others can read
    base = str(tmp_path / "cluster")
    with local_cluster(base, config=str(path)) as cluster:
        asyncio.run(scenario(cluster, s3_bucket, base))
