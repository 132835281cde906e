"""The broker's commit path in one process, without the network or a client: N topics over real
WAL storage, each round one small publish per topic (``BrokerService.publish_nowait``), all
awaited; the process's and the event loop thread's CPU per publish call.

    python bench/commit_path.py [--sync always interval never] [--topics 100] [--rounds 200]
        [--before OTHER/src]

With ``--before`` each sync mode also runs on that source tree, alternating which goes first.
Every call here is its own durability round (the worst case for the per-commit work).

    python bench/commit_path.py --callgrind [--sync never always] [--topics 100] [--rounds 20]
        [--before OTHER/src]

counts instructions instead, whatever the machine's load: the group's rounds are run one at a
time on a thread of this bench while the event loop's thread blocks until the round is done (the
group's own thread is never started, so which logs a round covers does not depend on timing, and
no thread waits for the GIL: its timed waits would make the count follow the machine's load).
The answers still go through the loop's self-pipe and come back in a later turn, as from the
group's thread.  Every publish is answered by callback (the batch lane's path); each figure is
the difference of ``--rounds`` and twice as many rounds, per topic-round (start-up cancels out),
for the whole process, the event loop's thread and the rounds' thread.  Read the rounds' thread:
the loop's figure also holds the broker's timers (each topic's maintenance task), which follow
wall time, so on a loaded machine it grows with the load (by tens of thousands of
instructions per topic-round at load average 12).
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


async def _manual(sync: str, topics: int, rounds: int) -> None:
    """``rounds`` rounds of one answered publish per topic, the group's rounds run one at a
    time on this bench's own thread (see the module docstring)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from danube import message_codec
    from danube.broker import BrokerService, DispatchSettings
    from danube.metadata.embedded import EmbeddedMetadataStore
    from danube.storage.config import StorageConfig
    from danube.storage.factory import StorageFactory
    from danube.wal import sync_group

    group = sync_group.SyncGroup()
    group._thread = threading.current_thread()  # (never started: the bench runs the rounds)
    sync_group._GROUPS[True] = group
    rounds_thread = ThreadPoolExecutor(1)

    def run_round() -> None:
        group._round(group._next_round())

    with tempfile.TemporaryDirectory() as d:
        metadata = EmbeddedMetadataStore(os.path.join(d, "metadata.db"))
        config = StorageConfig.from_dict({"wal": {"sync": sync}}, data_dir=d)
        broker = BrokerService(
            metadata, StorageFactory(config, metadata, broker_id="bench"), dispatch=DispatchSettings()
        )
        await broker.start()
        answered = [0]

        def answer(tag: int, producer_id: int, first: int, last: int, error: BaseException | None) -> None:
            assert error is None, error
            answered[0] += 1

        try:
            pids = [await broker.create_producer(f"/default/commit-{i}", f"p{i}", reliable=True) for i in range(topics)]
            batches = [
                b"".join(message_codec.encode_record(b"x" * 100, publish_time=1, producer_id=p) for _ in range(2))
                for p in pids
            ]
            for _ in range(rounds):
                target = answered[0] + topics
                for p, b in zip(pids, batches):
                    broker.publish_nowait(p, bytearray(b), answer, 0)
                while answered[0] < target:
                    if group._urgent:
                        rounds_thread.submit(run_round).result()  # (blocking: see the docstring)
                    else:
                        await asyncio.sleep(0)
        finally:
            await broker.stop()
            await metadata.close()
            rounds_thread.shutdown()


def _instructions(src: str, rest: list[str]) -> dict[str, int]:
    """Instructions of one run under callgrind: the whole process, the main (event loop) thread,
    and the rest (the rounds' thread and any other)."""
    import glob
    import re

    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "cg.out")
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no"]
            + ["--separate-threads=yes", sys.executable, os.path.abspath(__file__), *rest],
            env={**os.environ, "PYTHONPATH": src},
            check=True,
            capture_output=True,
        )
        per: dict[str, int] = {"loop": 0, "other": 0}
        for name in glob.glob(out + "-*"):  # (one file per thread; ``out`` itself stays empty)
            with open(name) as f:
                m = re.search(r"^summary:\s+(\d+)", f.read(), re.M)
            assert m, name
            per["loop" if name.endswith("-01") else "other"] += int(m.group(1))
        per["total"] = per["loop"] + per["other"]
        return per


def compare_instructions(args: argparse.Namespace) -> None:
    trees = [("after", SRC)] + ([("before", args.before)] if args.before else [])
    n, topics = args.rounds, args.topics
    for sync in args.sync:
        for name, src in trees:
            base = ["--manual", sync, "--topics", str(topics)]
            short = _instructions(src, base + ["--rounds", str(n)])
            long = _instructions(src, base + ["--rounds", str(2 * n)])
            per = {k: round((long[k] - short[k]) / (n * topics)) for k in short}
            print(
                f"{name:6} sync={sync:8} instructions per topic-round: total {per['total']:,}  "
                f"event loop thread {per['loop']:,}  rounds thread {per['other']:,}",
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sync", nargs="+", default=["always", "interval", "never"])
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--before", default=None, help="src dir of the tree to compare with")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child run: one sync mode
    ap.add_argument("--callgrind", action="store_true", help="count instructions (see the docstring)")
    ap.add_argument("--manual", default=None, help=argparse.SUPPRESS)  # a child run under callgrind
    args = ap.parse_args()
    if args.manual:
        asyncio.run(_manual(args.manual, args.topics, args.rounds))
        return
    if args.callgrind:
        compare_instructions(args)
        return
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
