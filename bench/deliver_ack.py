"""The broker's delivery and ack path in one process, without the network: per 2-message call.

    python bench/deliver_ack.py [--topics 100] [--calls 40000] [--batch 2] [--publish-only] [--profile]

A BrokerService over local storage (sync never) with ``--topics`` topics, each with one
producer and one exclusive consumer whose receive waits with a push callback (as a batch-lane
Consume stream does).  Each call publishes ``--batch`` messages to the next topic (round robin); the
commit wakes the subscription, which pushes the delivery to the callback; the callback's acks
go through an ``AckBatcher`` (as a stream's ack requests do) and are applied at the turn's end.
Prints the CPU time per call of the whole loop, and the wall time per call of the subscription
side alone (the commit's ``notify_subscriptions`` plus the ack flushes).  ``--publish-only``: the
same calls with no consumer (what delivery and acks add is the difference; under callgrind that
difference is free of the machine's load).  ``--profile`` prints cProfile's top.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

from danube import message_codec  # noqa: E402
from danube.broker import BrokerService, DispatchSettings, FailurePolicy, TopicPolicies  # noqa: E402
from danube.broker.acks import AckBatcher  # noqa: E402
from danube.broker.topic import Topic  # noqa: E402
from danube.metadata.embedded import EmbeddedMetadataStore  # noqa: E402
from danube.storage.config import StorageConfig  # noqa: E402
from danube.storage.factory import StorageFactory  # noqa: E402


async def run(topics: int, calls: int, profile: bool, publish_only: bool = False, batch: int = 2) -> None:
    with tempfile.TemporaryDirectory() as data:
        metadata = EmbeddedMetadataStore(os.path.join(data, "metadata.db"))
        config = StorageConfig.from_dict({"wal": {"sync": "never"}}, data_dir=data)
        broker = BrokerService(
            metadata,
            StorageFactory(config, metadata, broker_id="bench"),
            # (cursors persisted every 5 s, the longest: under callgrind, where a call takes 50x
            # longer, the per-second work would otherwise weigh on every call)
            dispatch=DispatchSettings(cursor_flush_interval_ms=5_000),
            failure_policy=FailurePolicy(),
            policies=TopicPolicies(),
        )
        await broker.start()
        spent = [0.0]
        clock = time.perf_counter
        notify = Topic.notify_subscriptions

        def timed_notify(topic: Topic) -> None:
            t0 = clock()
            notify(topic)
            spent[0] += clock() - t0

        Topic.notify_subscriptions = timed_notify  # type: ignore[method-assign]

        def apply(consumer_id: int, ranges: list[tuple[int, int]]) -> None:
            broker.ack_ranges_now(consumer_id, ranges)

        class TimedAcks(AckBatcher):
            __slots__ = ()

            def flush(self) -> None:
                t0 = clock()
                super().flush()
                spent[0] += clock() - t0

        acks = TimedAcks(apply)
        receives = []
        producers = []
        delivered = [0]

        def on_error(exc, consumer_id, ranges) -> None:
            raise exc

        for i in range(topics):
            name = f"/default/many-{i}"
            producers.append(await broker.create_producer(name, f"p{i}", reliable=True))
            if publish_only:
                continue
            cid = await broker.subscribe(name, "s", f"c{i}", sub_type="exclusive")

            def push(delivery, cid=cid):
                delivered[0] += delivery.count
                acks.add(cid, [(delivery.first_offset, delivery.last_offset)], on_error)
                return 1 << 30, 1 << 40

            receives.append(
                asyncio.ensure_future(broker.receive(cid, max_messages=1 << 30, max_bytes=1 << 40, push=push))
            )
        await asyncio.sleep(0.05)
        buf = bytes(message_codec.encode_payloads([b"x" * 100] * batch))
        profiler = cProfile.Profile() if profile else None
        window = topics  # calls in flight at once (one per topic)
        started = time.thread_time()  # (CPU time of this thread: other processes do not count)
        if profiler is not None:
            profiler.enable()
        for lo in range(0, calls, window):
            futs = [broker.publish_nowait(producers[i % topics], bytearray(buf)) for i in range(lo, lo + window)]
            await asyncio.gather(*futs)
            await asyncio.sleep(0)
        await asyncio.sleep(0)
        if profiler is not None:
            profiler.disable()
        cpu = time.thread_time() - started
        n = (calls + window - 1) // window * window
        assert delivered[0] == (0 if publish_only else batch * n), (delivered[0], n)
        for topic in broker.topics.values():  # every delivery acked: the cursor at the end
            for sub in topic.subscriptions.values():
                assert sub.tracker.unacked == 0 and sub.cursor == topic.readable_next - 1, (sub.name, sub.cursor)
        print(
            f"topics {topics}  calls {n}  whole loop {cpu / n * 1e6:.2f} us/call (CPU)  "
            f"subscription side {spent[0] / n * 1e6:.2f} us/call (wall)"
        )
        for r in receives:
            r.cancel()
        await asyncio.gather(*receives, return_exceptions=True)
        await broker.stop()
        await metadata.close()
        if profiler is not None:
            pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--calls", type=int, default=40_000)
    ap.add_argument("--batch", type=int, default=2, help="messages per call")
    ap.add_argument("--publish-only", action="store_true", help="no consumers: the publish side alone")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    asyncio.run(run(args.topics, args.calls, args.profile, args.publish_only, args.batch))


if __name__ == "__main__":
    main()
