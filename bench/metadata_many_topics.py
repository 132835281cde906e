"""What a thousand topics cost the broker's metadata store, in process (no servers, no lock needed).

    python bench/metadata_many_topics.py [--topics 1000] [--rounds 30] [--runs 2] [--before /tmp/before/src]

For each tree (this one, and the one under ``--before``, alternating, each run in a fresh process
with that tree first on ``sys.path``): a ``BrokerService`` on the embedded store and storage with
``--sync never`` in a temporary directory; ``--topics`` producers and subscriptions created
concurrently, as a thousand clients connecting together do (``setup_s``: wall time, mostly the
store's synced commits); then ``--rounds`` cursor flushes with every subscription's cursor moved
(``flush_us_per_cursor``: the process's CPU per cursor written, event loop and sqlite thread;
``flush_ms``: wall time of one flush), medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")


async def measure(topics: int, rounds: int) -> dict:
    from danube.broker import BrokerService, DispatchSettings
    from danube.metadata.embedded import EmbeddedMetadataStore
    from danube.storage.config import StorageConfig
    from danube.storage.factory import StorageFactory

    with tempfile.TemporaryDirectory() as d:
        metadata = EmbeddedMetadataStore(os.path.join(d, "metadata.db"))
        config = StorageConfig.from_dict({"wal": {"sync": "never"}}, data_dir=d)
        broker = BrokerService(
            metadata,
            StorageFactory(config, metadata, broker_id="bench"),
            dispatch=DispatchSettings(cursor_flush_interval_ms=5000),
        )
        await broker.start()
        assert broker._flush_task is not None
        broker._flush_task.cancel()  # flushes are made by hand below

        async def one(i: int) -> None:
            name = f"/default/t{i}"
            await broker.create_producer(name, "p", reliable=True)
            await broker.subscribe(name, "s", "c")

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(topics)))
        setup_s = time.perf_counter() - t0
        subs = [s for t in broker.topics.values() for s in t.subscriptions.values()]
        cpu, wall = [], []
        for _ in range(rounds):
            for s in subs:
                s.dirty = True
            c0, w0 = time.process_time(), time.perf_counter()
            written = await broker.flush_cursors()
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - w0)
            assert written == len(subs), (written, len(subs))
        await broker.stop()
        await metadata.close()
    return {
        "topics": topics,
        "setup_s": round(setup_s, 2),
        "flush_us_per_cursor": round(statistics.median(cpu) * 1e6 / len(subs), 1),
        "flush_ms": round(statistics.median(wall) * 1e3, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--before", default=None, help="src dir of the tree to compare with")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:  # this process's sys.path already starts with the tree to measure
        print(json.dumps(asyncio.run(measure(args.topics, args.rounds))))
        return
    trees = [("after", SRC)] + ([("before", os.path.abspath(args.before))] if args.before else [])
    for run in range(args.runs):
        for name, tree in trees if run % 2 == 0 else list(reversed(trees)):
            out = subprocess.run(
                [sys.executable, __file__, "--child", "--topics", str(args.topics), "--rounds", str(args.rounds)],
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONPATH": tree},
                check=True,
            )
            print(json.dumps({"tree": name, "run": run + 1, **json.loads(out.stdout)}), flush=True)


if __name__ == "__main__":
    main()
