"""The broker core's CPU per message with many topics and small batches, without gRPC.

    python bench/broker_core_topics.py [--topics 1 100] [--sync never] [--per-call 2]
        [--messages 40000] [--profile]

One process: ``BrokerService`` on a ``StorageFactory`` (WAL ``--sync``), N topics with one producer
and one exclusive consumer each.  Every round, each topic's producer publishes ``--per-call``
messages (100 B) as one batch, and each consumer receives that delivery and acks it as a range,
as the batch lane does, until ``--messages`` were delivered.  Prints the process CPU per message and
per publish call for each topic count (process_time: the machine's load moves it far less than
wall time).  ``--profile`` prints the top functions by own time (cProfile) of the last topic count.

What it leaves out: the HTTP/2 and gRPC layers (``danube bench`` measures the whole broker).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from danube import message_codec  # noqa: E402
from danube.broker import BrokerService, DispatchSettings  # noqa: E402
from danube.metadata.embedded import EmbeddedMetadataStore  # noqa: E402
from danube.storage.config import StorageConfig  # noqa: E402
from danube.storage.factory import StorageFactory  # noqa: E402


async def run(topics: int, sync: str, per_call: int, messages: int, profile: bool) -> dict:
    with tempfile.TemporaryDirectory() as d:
        md = EmbeddedMetadataStore(f"{d}/m.db")
        factory = StorageFactory(StorageConfig.from_dict({"wal": {"sync": sync}}, data_dir=d), md, broker_id="b")
        broker = BrokerService(md, factory, dispatch=DispatchSettings(max_unacked_messages=1 << 30))
        await broker.start()
        names = [f"/default/core-{i}" for i in range(topics)]
        pids = [await broker.create_producer(n, f"p{i}", reliable=True) for i, n in enumerate(names)]
        cids = [await broker.subscribe(n, "s", f"c{i}") for i, n in enumerate(names)]
        payload = bytes(message_codec.encode_payloads([b"x" * 100] * per_call))
        calls = -(-messages // per_call) // topics
        total = calls * topics * per_call
        got = 0
        done = asyncio.Event()

        async def consume(cid: int) -> None:
            nonlocal got
            while True:
                dl = await broker.receive(cid, max_messages=10_000, max_bytes=1 << 22)
                got += dl.count
                await broker.ack_ranges(cid, [(dl.first_offset, dl.last_offset)])
                if got >= total:
                    done.set()

        async def produce() -> None:
            # a round: one call per topic, then the consumers take what it delivered (as paced
            # producers do: each delivery carries one call's messages)
            for _ in range(calls):
                await asyncio.gather(*(broker.publish(pid, bytearray(payload)) for pid in pids))
                for _ in range(3):
                    await asyncio.sleep(0)

        tasks = [asyncio.ensure_future(consume(c)) for c in cids]
        prof = cProfile.Profile() if profile else None
        c0, t0 = time.process_time(), time.perf_counter()
        if prof:
            prof.enable()
        await produce()
        await done.wait()
        if prof:
            prof.disable()
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await broker.stop()
        await md.close()
        out = {
            "topics": topics,
            "sync": sync,
            "per_call": per_call,
            "messages": total,
            "cpu_us_per_msg": round(cpu / total * 1e6, 2),
            "cpu_us_per_call": round(cpu / (calls * topics) * 1e6, 2),
            "wall_s": round(wall, 2),
        }
        if prof:
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
            out["profile"] = buf.getvalue()
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topics", type=int, nargs="+", default=[1, 100])
    ap.add_argument("--sync", default="never", choices=["always", "interval", "never"])
    ap.add_argument("--per-call", type=int, default=2)
    ap.add_argument("--messages", type=int, default=40_000)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    import uvloop

    for i, n in enumerate(args.topics):
        result = uvloop.run(run(n, args.sync, args.per_call, args.messages, args.profile and i == len(args.topics) - 1))
        profile = result.pop("profile", None)
        print(json.dumps(result), flush=True)
        if profile:
            print(profile)


if __name__ == "__main__":
    main()
