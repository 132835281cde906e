"""Scalable topics end to end on one in-process broker (WAL storage, embedded metadata, real gRPC):
continuous keyed publishing through split, split again and merge back; an ordered and a queue
consumer side by side; per-key order, nothing lost, nothing duplicated; cursors carried over."""

import asyncio
import collections
import contextlib
import json

import grpc
import pytest

from danube.broker import BrokerService
from danube.client import DanubeClient
from danube.client.scalable import QUEUE, STREAM, ScalableConsumer, ScalableProducer
from danube.errors import TopicTerminatedError
from danube.metadata import keys
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.proto.danube_scalable import scalable_pb2 as pb
from danube.proto.danube_scalable import scalable_pb2_grpc as pb_grpc
from danube.server import batch_lane, danube_services, scalable_service
from danube.storage.config import StorageConfig
from danube.storage.factory import StorageFactory

T = "/default/orders"
KEYS = [f"key-{i}" for i in range(24)]


@contextlib.asynccontextmanager
async def broker_with_scalable(data_dir, grace=5.0, **options):
    metadata = EmbeddedMetadataStore(str(data_dir / "metadata.db"))
    factory = StorageFactory(
        StorageConfig.from_dict({"wal": {"sync": "never"}}, data_dir=str(data_dir)), metadata, broker_id="test"
    )
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    url = f"http://127.0.0.1:{port}"
    broker = BrokerService(metadata, factory, broker_url=url)
    await broker.start()
    danube_services.add_to_server(server, broker)
    batch_lane.add_to_server(server, broker)
    service = scalable_service.add_to_server(server, broker, grace_seconds=grace, **options)
    await server.start()
    client = DanubeClient.builder().service_url(url).build()
    try:
        yield broker, service, client, pb_grpc.ScalableTopicsStub(client.connection().channel)
    finally:
        await client.close()
        await service.stop()
        await server.stop(None)
        with contextlib.suppress(Exception):
            await broker.stop()
        await metadata.close()


async def collect(consumer, expected, seen, timeout=60.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(seen) < expected and loop.time() < deadline:
        message = await consumer.receive(timeout=0.5)
        if message is None:
            continue
        seen.append((message.routing_key, int(message.payload.split(b":")[1]), message.topic))
        await consumer.ack(message)


async def test_split_split_merge_with_keyed_publishing(tmp_path):
    async with broker_with_scalable(tmp_path) as (broker, service, client, admin):
        await admin.CreateScalableTopic(pb.CreateScalableTopicRequest(topic=T, num_segments=1))
        ordered = await ScalableConsumer(client, T, "ordered", "c1", kind=STREAM).subscribe()
        queue = await ScalableConsumer(client, T, "work", "q1", kind=QUEUE).subscribe()
        await asyncio.wait_for(ordered.assignment_changed.wait(), 10)
        producer = await ScalableProducer(client, T, "p1").create()
        sent = collections.Counter()
        stop = asyncio.Event()

        async def publish():
            i = 0
            while not stop.is_set():
                key = KEYS[i % len(KEYS)]
                await producer.send(f"{key}:{sent[key]}".encode(), key=key)
                sent[key] += 1
                i += 1
                if i % 50 == 0:
                    await asyncio.sleep(0.001)

        got_ordered, got_queue = [], []
        publisher = asyncio.create_task(publish())
        readers = [
            asyncio.create_task(collect(ordered, 10**9, got_ordered, 3600)),
            asyncio.create_task(collect(queue, 10**9, got_queue, 3600)),
        ]
        await asyncio.sleep(0.5)
        one = json.loads((await admin.SplitSegment(pb.SplitSegmentRequest(topic=T, segment_id=0))).metadata_json)
        assert sorted(int(k) for k in one["segments"]) == [0, 1, 2]
        await asyncio.sleep(0.5)
        await admin.SplitSegment(pb.SplitSegmentRequest(topic=T, segment_id=1))
        await asyncio.sleep(0.5)
        three = json.loads(
            (await admin.MergeSegments(pb.MergeSegmentsRequest(topic=T, segment_id1=3, segment_id2=4))).metadata_json
        )
        assert [s["segmentId"] for s in three["segments"].values() if s["state"] == "ACTIVE"] == [2, 5]
        await asyncio.sleep(0.5)
        stop.set()
        await publisher
        await producer.flush()
        total = sum(sent.values())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while (len(got_ordered) < total or len(got_queue) < total) and loop.time() < deadline:
            await asyncio.sleep(0.1)
        for task in readers:
            task.cancel()
        print(
            "total",
            total,
            "reroutes",
            producer.reroutes,
            "ordered",
            len(got_ordered),
            "queue",
            len(got_queue),
            "segments",
            collections.Counter(t for _, _, t in got_ordered),
        )
        assert total > 500

        for name, got in (("ordered", got_ordered), ("queue", got_queue)):
            per_key = collections.defaultdict(list)
            for key, seq, _ in got:
                per_key[key].append(seq)
            for key in KEYS:  # nothing lost, nothing duplicated
                assert sorted(per_key[key]) == list(range(sent[key])), (name, key)
        for key in KEYS:  # the ordered consumer kept each key's order through split, split, merge
            seqs = [seq for k, seq, _ in got_ordered if k == key]
            assert seqs == sorted(seqs), key
        assert len({topic for _, _, topic in got_ordered}) >= 4  # it read parents and children

        described = json.loads((await admin.DescribeScalableTopic(pb.ScalableTopicRequest(topic=T))).json)
        for seg in described["segments"]:  # every subscription's cursor exists on every segment
            subs = seg["stats"].get("subscriptions", {})
            if seg["stats"].get("served_here"):
                assert {"ordered", "work"} <= set(subs), seg["topic"]
        plain = client.new_producer().with_topic(f"{T}.seg.0000-ffff-0").with_name("plain").build()
        await plain.create()  # a sealed segment refuses a plain producer too
        with pytest.raises(TopicTerminatedError, match="terminated") as refused:
            await plain.send_and_wait(b"late")
        assert not refused.value.retriable and broker.topics[f"{T}.seg.0000-ffff-0"].terminated
        await plain.close()
        await producer.close()
        await ordered.close()
        await queue.close()


async def test_consumer_reconnect_within_and_after_the_grace_period(tmp_path):
    async with broker_with_scalable(tmp_path, grace=1.5) as (broker, service, client, admin):
        await admin.CreateScalableTopic(pb.CreateScalableTopicRequest(topic=T, num_segments=4))
        a = await ScalableConsumer(client, T, "s", "a").subscribe()
        b = await ScalableConsumer(client, T, "s", "b").subscribe()

        async def settled(consumer, ids):
            for _ in range(200):
                if consumer.assignment is not None and consumer.assignment.segment_ids == ids:
                    return
                await asyncio.sleep(0.05)
            raise AssertionError(f"{consumer.name}: {consumer.assignment} != {ids}")

        await settled(a, [0, 2])
        await settled(b, [1, 3])
        await a.close()  # a's connection drops; it comes back within the grace period
        await asyncio.sleep(0.5)
        a = await ScalableConsumer(client, T, "s", "a").subscribe()
        await settled(a, [0, 2])
        assert b.assignment.segment_ids == [1, 3]
        await a.close()  # and now it stays away: its segments go to b
        await asyncio.sleep(2.0)
        await settled(b, [0, 1, 2, 3])
        sessions = json.loads((await admin.ListSubscriptions(pb.ScalableTopicRequest(topic=T))).json)
        assert sessions["s"]["consumers"] == {"b": [0, 1, 2, 3]}
        await b.close()


async def test_admin_cli_scalable_topics(tmp_path):
    import sys

    async with broker_with_scalable(tmp_path) as (broker, service, client, admin):
        endpoint = broker.broker_url

        async def cli(*args):
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "danube.cli.admin",
                "--endpoint",
                endpoint,
                "-o",
                "json",
                *args,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await proc.communicate()
            assert proc.returncode == 0, err.decode()
            return json.loads(out)

        created = await cli("scalable-topics", "create", T, "--segments", "2")
        assert created["layout"]["nextSegmentId"] == 2
        assert await cli("scalable-topics", "list") == [T]
        split = await cli("scalable-topics", "split", T, "1")
        assert split["epoch"] == 1 and split["segments"]["1"]["childIds"] == [2, 3]
        merged = await cli("scalable-topics", "merge", T, "2", "3")
        assert merged["segments"]["4"]["parentIds"] == [2, 3]
        await cli("scalable-topics", "create-subscription", T, "billing")
        described = await cli("scalable-topics", "describe", T)
        assert described["activeSegments"] == [0, 4] and "billing" in described["subscriptions"]
        subs = await cli("scalable-topics", "subscriptions", T)
        assert subs["billing"]["type"] == "stream"
        assert (await cli("scalable-topics", "delete", T))["deleted"] is True
        assert await cli("scalable-topics", "list") == []


async def test_delete_removes_every_segments_stored_data(tmp_path):
    """`scalable-topics delete`: every segment topic (active and sealed) is unloaded, forgotten and
    its WAL directory removed; an ordinary topic beside it keeps its files; the name can be reused."""
    import os

    async with broker_with_scalable(tmp_path) as (broker, service, client, admin):
        await admin.CreateScalableTopic(pb.CreateScalableTopicRequest(topic=T, num_segments=1))
        producer = await ScalableProducer(client, T, "p1").create()
        for i in range(40):
            await producer.send_and_wait(f"{KEYS[i % len(KEYS)]}:{i}".encode(), key=KEYS[i % len(KEYS)])
        await admin.SplitSegment(pb.SplitSegmentRequest(topic=T, segment_id=0))
        for i in range(40):
            await producer.send_and_wait(f"{KEYS[i % len(KEYS)]}:{i}".encode(), key=KEYS[i % len(KEYS)])
        await producer.close()
        plain = client.new_producer().with_topic("/default/plain").with_name("plain").with_reliable(True).build()
        await plain.create()
        await plain.send_and_wait(b"stays")
        config = broker.storage_factory.config
        layout = json.loads((await admin.GetScalableTopic(pb.ScalableTopicRequest(topic=T))).metadata_json)
        names = [
            f"{T}.seg.{s['hashRange']['start']:04x}-{s['hashRange']['end']:04x}-{s['segmentId']}"
            for s in layout["segments"].values()
        ]
        assert len(names) == 3 and all(os.path.isdir(config.wal_dir(n)) for n in names)

        assert (await admin.DeleteScalableTopic(pb.ScalableTopicRequest(topic=T))).deleted

        for name in names:
            assert name not in broker.topics
            assert not os.path.exists(config.wal_dir(name)), name
            assert await broker.metadata.get_prefix(f"/topics/default/{name.rsplit('/', 1)[1]}/") == []
        assert (
            os.path.isdir(config.wal_dir("/default/plain")) and broker.topics["/default/plain"].storage.next_offset == 1
        )
        await plain.close()
        # the name is free again: a new scalable topic starts empty
        await admin.CreateScalableTopic(pb.CreateScalableTopicRequest(topic=T, num_segments=1))
        again = await ScalableProducer(client, T, "p2").create()
        sid, offset = await again.send_and_wait(b"k:0", key="k")
        assert (sid, offset) == (0, 0)
        await again.close()


async def test_a_drained_sealed_segment_is_pruned_and_its_data_deleted(tmp_path):
    """Split under an ordered and a queue subscription; once both read the sealed parent to its end
    (and the retention passed) the leader prunes it: out of the layout, its topic and WAL gone; the
    consumers keep reading the children, nothing lost."""
    import os

    prune = {"prune_interval": 0.1, "sealed_retention": 0.5}
    async with broker_with_scalable(tmp_path, prune=prune) as (broker, service, client, admin):
        await admin.CreateScalableTopic(pb.CreateScalableTopicRequest(topic=T, num_segments=1))
        ordered = await ScalableConsumer(client, T, "ordered", "c1", kind=STREAM).subscribe()
        queue = await ScalableConsumer(client, T, "work", "q1", kind=QUEUE).subscribe()
        await asyncio.wait_for(ordered.assignment_changed.wait(), 10)
        producer = await ScalableProducer(client, T, "p1").create()
        got_ordered, got_queue = [], []
        readers = [
            asyncio.create_task(collect(ordered, 10**9, got_ordered, 3600)),
            asyncio.create_task(collect(queue, 10**9, got_queue, 3600)),
        ]
        for i in range(60):
            await producer.send_and_wait(f"{KEYS[i % len(KEYS)]}:{i}".encode(), key=KEYS[i % len(KEYS)])
        parent = f"{T}.seg.0000-ffff-0"
        parent_wal = broker.storage_factory.config.wal_dir(parent)
        assert os.path.isdir(parent_wal)
        await admin.SplitSegment(pb.SplitSegmentRequest(topic=T, segment_id=0))
        for i in range(60, 120):
            await producer.send_and_wait(f"{KEYS[i % len(KEYS)]}:{i}".encode(), key=KEYS[i % len(KEYS)])

        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        layout = None
        while loop.time() < deadline:
            layout = json.loads((await admin.GetScalableTopic(pb.ScalableTopicRequest(topic=T))).metadata_json)
            pruned = "0" not in layout["segments"] and await broker.metadata.get(keys.scalable_operation(T)) is None
            if pruned and len(got_ordered) >= 120 and len(got_queue) >= 120:
                break  # the prune finished: out of the layout, then its topic deleted, then the record
            await asyncio.sleep(0.1)
        assert sorted(layout["segments"]) == ["1", "2"], layout
        assert all(s["parentIds"] == [] for s in layout["segments"].values())
        assert parent not in broker.topics and not os.path.exists(parent_wal)
        assert await broker.metadata.get_prefix(f"/topics/default/{parent.rsplit('/', 1)[1]}/") == []
        assert await broker.metadata.get(keys.scalable_operation(T)) is None
        for got in (got_ordered, got_queue):  # everything, once
            assert sorted(int(seq) for _, seq, _ in got) == list(range(120))
        for key in KEYS:
            seqs = [seq for k, seq, _ in got_ordered if k == key]
            assert seqs == sorted(seqs), key
        # and the topic goes on: more messages through the children
        for i in range(120, 140):
            await producer.send_and_wait(f"{KEYS[i % len(KEYS)]}:{i}".encode(), key=KEYS[i % len(KEYS)])
        deadline = loop.time() + 30
        while (len(got_ordered) < 140 or len(got_queue) < 140) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        assert len(got_ordered) == len(got_queue) == 140
        assert parent not in broker.topics  # no client brought the pruned segment back
        for task in readers:
            task.cancel()
        await producer.close()
        await ordered.close()
        await queue.close()


async def test_a_queue_consumer_that_comes_back_after_a_split_reads_the_sealed_parents_rest(tmp_path):
    """PIP-468's queue consumers attach to every segment, ACTIVE and SEALED: a queue consumer that
    subscribes again after a split still gets what its subscription left in the sealed parent; it
    lets go of a sealed segment once drained, and of a pruned one."""
    prune = {"prune_interval": 0.1, "sealed_retention": 0.3}
    async with broker_with_scalable(tmp_path, prune=prune) as (broker, service, client, admin):
        await admin.CreateScalableTopic(pb.CreateScalableTopicRequest(topic=T, num_segments=1))
        first = await ScalableConsumer(client, T, "work", "q1", kind=QUEUE).subscribe()
        await first.close()  # the subscription exists; nobody reads it for now
        producer = await ScalableProducer(client, T, "p1").create()
        for i in range(30):
            await producer.send_and_wait(f"{KEYS[i % len(KEYS)]}:{i}".encode(), key=KEYS[i % len(KEYS)])
        await admin.SplitSegment(pb.SplitSegmentRequest(topic=T, segment_id=0))
        for i in range(30, 50):
            await producer.send_and_wait(f"{KEYS[i % len(KEYS)]}:{i}".encode(), key=KEYS[i % len(KEYS)])
        again = await ScalableConsumer(client, T, "work", "q1", kind=QUEUE).subscribe()
        got = []
        await collect(again, 50, got, timeout=30)
        assert sorted(seq for _, seq, _ in got) == list(range(50))
        assert {t for _, _, t in got} >= {f"{T}.seg.0000-ffff-0"}
        parent = f"{T}.seg.0000-ffff-0"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while loop.time() < deadline:  # drained: let go of, then pruned
            layout = json.loads((await admin.GetScalableTopic(pb.ScalableTopicRequest(topic=T))).metadata_json)
            if "0" not in layout["segments"] and parent not in broker.topics:
                break
            await asyncio.sleep(0.1)
        assert "0" not in layout["segments"] and parent not in broker.topics
        await asyncio.sleep(0.5)  # layout pushes after the prune do not bring it back
        assert parent not in broker.topics
        await producer.close()
        await again.close()
