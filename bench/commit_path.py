"""The broker's commit path in one process, without the network or a client: N topics over real
WAL storage, each round one small publish per topic (``BrokerService.publish_nowait``), all
awaited; the process's and the event loop thread's CPU per publish call.

    python bench/commit_path.py [--sync always interval never] [--topics 100] [--rounds 200]
        [--before OTHER/src]

With ``--before`` each sync mode also runs on that source tree, alternating which goes first.
Every call here is its own durability round (the worst case for the per-commit work).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")


async def _measure(sync: str, topics: int, rounds: int) -> dict:
    from danube import message_codec
    from danube.broker import BrokerService, DispatchSettings
    from danube.metadata.embedded import EmbeddedMetadataStore
    from danube.storage.config import StorageConfig
    from danube.storage.factory import StorageFactory

    with tempfile.TemporaryDirectory() as d:
        metadata = EmbeddedMetadataStore(os.path.join(d, "metadata.db"))
        config = StorageConfig.from_dict({"wal": {"sync": sync}}, data_dir=d)
        broker = BrokerService(
            metadata, StorageFactory(config, metadata, broker_id="bench"), dispatch=DispatchSettings()
        )
        await broker.start()
        try:
            pids = [await broker.create_producer(f"/default/commit-{i}", f"p{i}", reliable=True) for i in range(topics)]
            batches = [
                b"".join(message_codec.encode_record(b"x" * 100, publish_time=1, producer_id=p) for _ in range(2))
                for p in pids
            ]

            async def round_() -> None:
                await asyncio.gather(*[broker.publish_nowait(p, bytearray(b)) for p, b in zip(pids, batches)])

            for _ in range(20):  # warm up
                await round_()
            cpu, loop_cpu, wall = time.process_time(), time.thread_time(), time.perf_counter()
            for _ in range(rounds):
                await round_()
            calls = rounds * topics
            return {
                "sync": sync,
                "process_us_call": round((time.process_time() - cpu) / calls * 1e6, 2),
                "loop_us_call": round((time.thread_time() - loop_cpu) / calls * 1e6, 2),
                "ms_round": round((time.perf_counter() - wall) / rounds * 1e3, 2),
            }
        finally:
            await broker.stop()
            await metadata.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sync", nargs="+", default=["always", "interval", "never"])
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--before", default=None, help="src dir of the tree to compare with")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child run: one sync mode
    args = ap.parse_args()
    if args.one:
        print(asyncio.run(_measure(args.one, args.topics, args.rounds)))
        return
    trees = [("after", SRC)] + ([("before", args.before)] if args.before else [])
    for i, sync in enumerate(args.sync):
        for name, src in trees if i % 2 == 0 else trees[::-1]:
            cmd = [sys.executable, __file__, "--one", sync, "--topics", str(args.topics), "--rounds", str(args.rounds)]
            out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": src})
            print(name, out.stdout.strip() or out.stderr[-400:], flush=True)


if __name__ == "__main__":
    main()
