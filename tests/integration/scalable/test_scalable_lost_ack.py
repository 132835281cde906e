"""A batch stored in a segment right before its seal whose ack never reaches the producer (the
broker that stored it died, e.g. a controller leader that sealed its own segment and crashed).

The producer resends the batch, the sealed segment refuses the resend, and the scalable producer
must not re-route it to the children: the segment already holds it.  It asks the segment what it
stored of its own (``StoredMessages``) and re-sends only the rest, so the ordered consumer still
gets every message once, in per-key order.  The lost ack is made deterministic here: the step
hook arms the parent so the next batch is appended, the parent is flagged terminated right after
it, and the batch is answered with a retriable error instead of its ack (the producer follows the
topic and resends, as after a crash)."""

from __future__ import annotations

import asyncio
import collections

import grpc
import pytest

from danube.client.scalable import STREAM, ScalableConsumer, ScalableProducer
from danube.errors import NotServedHereError
from danube.proto.danube_scalable import scalable_pb2 as pb
from tests.integration.scalable.test_scalable_inprocess import KEYS, T, broker_with_scalable, collect

PARENT = f"{T}.seg.0000-ffff-0"


class LostAck:
    """Armed at the split's step ``terminate_marked``: the parent's next batch is stored, the seal
    lands right after it, and its ack is replaced by a retriable refusal."""

    def __init__(self) -> None:
        self.broker = None
        self.fired = asyncio.Event()
        self.stored: tuple[int, int] | None = None

    async def hook(self, step: str) -> None:
        if step != "terminate_marked" or self.fired.is_set():
            return
        topic = self.broker.topics[PARENT]
        original = topic.publish_nowait

        def publish_nowait(producer, buf, answer=None, tag=0):
            committed = original(producer, buf)
            del topic.publish_nowait  # once
            topic.sizes_ok_up_to = sizes_ok_up_to
            topic.terminated = True  # the seal follows this batch at once

            async def ack_lost():
                self.stored = await committed
                self.fired.set()
                raise NotServedHereError("the broker went away before the ack (test)")

            lost = asyncio.ensure_future(ack_lost())
            if answer is None:
                return lost
            topic.commits.answer_when_done(producer, lost, answer, tag)  # (the batch lane's per-call path)
            return None

        topic.publish_nowait = publish_nowait
        # The broker appends a batch within this bound itself, not through the topic's
        # publish_nowait (the per-call fast path); 0 sends the next batch through the hook above
        sizes_ok_up_to = topic.sizes_ok_up_to
        topic.sizes_ok_up_to = 0
        await asyncio.wait_for(self.fired.wait(), 10)


async def test_a_batch_stored_before_the_seal_whose_ack_was_lost_is_not_sent_again(tmp_path):
    trap = LostAck()
    async with broker_with_scalable(tmp_path, step_hook=trap.hook) as (broker, service, client, admin):
        trap.broker = broker
        await admin.CreateScalableTopic(pb.CreateScalableTopicRequest(topic=T, num_segments=1))
        ordered = await ScalableConsumer(client, T, "ordered", "c1", kind=STREAM).subscribe()
        await asyncio.wait_for(ordered.assignment_changed.wait(), 10)
        producer = await ScalableProducer(client, T, "p1").create()
        sent = collections.Counter()
        results = {}
        stop = asyncio.Event()

        async def publish():
            i = 0
            while not stop.is_set():
                key = KEYS[i % len(KEYS)]
                results[(key, sent[key])] = await producer.send(f"{key}:{sent[key]}".encode(), key=key)
                sent[key] += 1
                i += 1
                if i % 20 == 0:
                    await asyncio.sleep(0.001)

        got: list = []
        publisher = asyncio.create_task(publish())
        reader = asyncio.create_task(collect(ordered, 10**9, got, 3600))
        await asyncio.sleep(0.3)
        await admin.SplitSegment(pb.SplitSegmentRequest(topic=T, segment_id=0))
        await asyncio.sleep(0.3)
        stop.set()
        await publisher
        await asyncio.wait_for(producer.flush(), 30)
        total = sum(sent.values())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while len(got) < total and loop.time() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # a duplicate would arrive after the last original
        reader.cancel()
        assert trap.stored is not None, "the lost ack was not staged"
        per_key = collections.defaultdict(list)
        for key, seq, _ in got:
            per_key[key].append(seq)
        for key in KEYS:
            assert per_key[key] == list(range(sent[key])), key  # in order, none lost, none twice
        first, last = trap.stored
        # the batch whose ack was lost was found in the parent and kept there, not sent twice
        assert producer.found_stored == last - first + 1
        in_parent = sorted(offset for sid, offset in (f.result() for f in results.values()) if sid == 0)
        assert in_parent[-(last - first + 1) :] == list(range(first, last + 1))
        assert {topic for _, _, topic in got} >= {PARENT}
        await producer.close()
        await ordered.close()


@pytest.mark.parametrize("after, since, expected", [(-1, 0, "all"), ("mid", 0, "upper"), (-1, "future", "none")])
async def test_stored_messages_of_a_producer_in_a_sealed_segment(tmp_path, after, since, expected):
    async with broker_with_scalable(tmp_path) as (broker, service, client, admin):
        await admin.CreateScalableTopic(pb.CreateScalableTopicRequest(topic=T, num_segments=1))
        mine = client.new_producer().with_topic(PARENT).with_name("mine").build()
        other = client.new_producer().with_topic(PARENT).with_name("other").build()
        await mine.create()
        await other.create()
        offsets = []
        for i in range(10):
            offsets.append(await mine.send_and_wait(f"m{i}".encode()))
            await other.send_and_wait(f"o{i}".encode())
        request = pb.StoredMessagesRequest(segment_topic=PARENT, producer_id=mine.producer_ids[0])
        with pytest.raises(grpc.aio.AioRpcError) as refused:  # only a sealed segment's answer is final
            await admin.StoredMessages(request)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not sealed" in refused.value.details()
        await admin.SplitSegment(pb.SplitSegmentRequest(topic=T, segment_id=0))
        request.after_offset = offsets[4] if after == "mid" else after
        request.since_publish_time = 2**62 if since == "future" else since
        reply = await admin.StoredMessages(request)
        want = {"all": offsets, "upper": offsets[5:], "none": []}[expected]
        assert list(reply.offsets) == want
        await mine.close()
        await other.close()
