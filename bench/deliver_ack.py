"""The broker's delivery and ack path in one process, without the network: per 2-message call.

    python bench/deliver_ack.py [--topics 100] [--calls 40000] [--batch 2] [--publish-only] [--profile]
    python bench/deliver_ack.py --before /other/tree/src [--runs 3] ...   # both trees in turn
    python bench/deliver_ack.py --opcodes --calls 1000 [--src /other/tree/src]  # bytecodes, by function

A BrokerService over local storage (sync never) with ``--topics`` topics, each with one
producer and one exclusive consumer whose receive waits with a push callback (as a batch-lane
Consume stream does).  Each call publishes ``--batch`` messages to the next topic (round robin); the
commit wakes the subscription, which pushes the delivery to the callback; the callback encodes
it as a batch-lane Consume stream does (``batch_lane_wire``) and its acks
go through an ``AckBatcher`` (as a stream's ack requests do) and are applied at the turn's end.
Prints the CPU time per call of the whole loop, and the wall time per call of the subscription
side alone (the commit's ``notify_subscriptions`` plus the ack flushes).  ``--publish-only``: the
same calls with no consumer (what delivery and acks add is the difference; under callgrind that
difference is free of the machine's load).  ``--profile`` prints cProfile's top (``SORT=ncalls``
``TOP=60`` in the environment: by another key, more rows).  ``--before SRC`` runs the bench of
this tree against the broker of another tree's ``src`` and of this one in turn and prints both;
with ``--callgrind`` it counts instructions instead (``--calls`` and twice as many, with and
without consumers: the delivery and ack path's instructions per call, whatever the load).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import pstats
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# (--src DIR: the tree whose broker runs; set by --before for its runs of the other tree)
SRC = sys.argv[sys.argv.index("--src") + 1] if "--src" in sys.argv else os.path.join(os.path.dirname(HERE), "src")
sys.path.insert(0, SRC)

from danube import message_codec  # noqa: E402
from danube.broker import BrokerService, DispatchSettings, FailurePolicy, TopicPolicies  # noqa: E402
from danube.broker.acks import AckBatcher  # noqa: E402
from danube.broker.topic import Topic  # noqa: E402
from danube.metadata.embedded import EmbeddedMetadataStore  # noqa: E402
from danube.server.metrics import PrometheusMetrics  # noqa: E402
from danube.storage.config import StorageConfig  # noqa: E402
from danube.storage.factory import StorageFactory  # noqa: E402


def delivery_encoder():
    """The batch lane's encoding of a fresh delivery in the tree under test (an older tree has
    no ``encoded_delivery``: its two calls then)."""
    from danube.server import batch_lane_wire as wire

    if hasattr(wire, "encoded_delivery"):
        return wire.encoded_delivery
    return lambda frames, first, last, count: wire.encoded_batch(frames, wire.batch_fields(first, last, count))


def _no_cursor_flush(settings: DispatchSettings) -> DispatchSettings:
    """``settings`` with the cursors persisted once an hour: none during a run.  (A flush comes
    every so many seconds of wall time, and under callgrind, on a loaded machine, a run lasts
    minutes of it: the instructions of its flushes would follow the load, not the code.  The
    limit of the setting is 5 s, so it is set past its check.)"""
    object.__setattr__(settings, "cursor_flush_interval_ms", 3_600_000)
    return settings


async def run(topics: int, calls: int, profile: bool, publish_only: bool = False, batch: int = 2) -> None:
    with tempfile.TemporaryDirectory() as data:
        metadata = EmbeddedMetadataStore(os.path.join(data, "metadata.db"))
        config = StorageConfig.from_dict({"wal": {"sync": "never"}}, data_dir=data)
        broker = BrokerService(
            metadata,
            StorageFactory(config, metadata, broker_id="bench"),
            dispatch=_no_cursor_flush(DispatchSettings(cursor_flush_interval_ms=5_000)),
            failure_policy=FailurePolicy(),
            policies=TopicPolicies(),
            metrics=PrometheusMetrics(),  # (the server's sink: its counters cost what they cost there)
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

        encode = delivery_encoder()
        for i in range(topics):
            name = f"/default/many-{i}"
            producers.append(await broker.create_producer(name, f"p{i}", reliable=True))
            if publish_only:
                continue
            cid = await broker.subscribe(name, "s", f"c{i}", sub_type="exclusive")

            def push(*args, cid=cid):
                if len(args) == 1:  # (an older tree's push hands a Delivery)
                    d = args[0]
                    args = (d.frames, d.first_offset, d.last_offset, d.count)
                frames, first, last, count = args
                encode(frames, first, last, count)  # (what the stream writes; the write itself not)
                delivered[0] += count
                acks.add(cid, [(first, last)], on_error)
                return 1 << 30, 1 << 40

            receives.append(
                asyncio.ensure_future(broker.receive(cid, max_messages=1 << 30, max_bytes=1 << 40, push=push))
            )
        await asyncio.sleep(0.05)
        buf = bytes(message_codec.encode_payloads([b"x" * 100] * batch))
        # The start-up's objects out of the collector's way: a full collection walks them all
        # (millions of instructions), and whether one falls inside the loop would otherwise swing
        # the per-call count by more than delivery and ack cost (the loop's own garbage is still
        # collected as the server's is).
        gc.collect()
        gc.freeze()
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
            pstats.Stats(profiler).sort_stats(os.environ.get("SORT", "tottime")).print_stats(
                int(os.environ.get("TOP", "30"))
            )


def compare(args: argparse.Namespace, rest: list[str]) -> None:
    """Runs this tree and the ``--before`` tree in turn, ``--runs`` times each, as subprocesses
    (each imports its own tree), and prints their figures side by side."""
    import re
    import subprocess

    figures: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
    for _ in range(args.runs):
        for label, src in (("before", args.before), ("after", SRC)):
            env = {**os.environ, "PYTHONPATH": src}
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), *rest, "--src", src],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            m = re.search(r"whole loop ([0-9.]+) us/call .*subscription side ([0-9.]+) us/call", out)
            assert m, out
            figures[label].append((float(m.group(1)), float(m.group(2))))
            print(f"{label:6} {out.strip()}", flush=True)
    for label, runs in figures.items():
        print(
            f"{label:6} median whole loop {sorted(r[0] for r in runs)[len(runs) // 2]:.2f} us/call  "
            f"subscription side {sorted(r[1] for r in runs)[len(runs) // 2]:.2f} us/call"
        )


def instructions(src: str, rest: list[str]) -> int:
    """Instructions one run of this bench made under callgrind (whatever the machine's load)."""
    import re
    import subprocess

    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "callgrind.out")
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no", sys.executable]
            + [os.path.abspath(__file__), *rest, "--src", src],
            env={**os.environ, "PYTHONPATH": src, "PYTHONHASHSEED": "0"},  # (sets and dicts: alike every run)
            check=True,
            capture_output=True,
        )
        with open(out) as f:
            totals = re.search(r"^summary:\s+(\d+)", f.read(), re.M)
    assert totals, "callgrind wrote no summary"
    return int(totals.group(1))


def compare_instructions(args: argparse.Namespace) -> None:
    """Instructions per call of delivery and ack (a run with consumers less one without, each
    the difference of ``--calls`` and twice as many calls: start-up and shutdown cancel out), for
    the ``--before`` tree and this one."""
    n = args.calls
    base = ["--topics", str(args.topics), "--batch", str(args.batch)]
    for label, src in (("before", args.before), ("after", SRC)):
        per: dict[str, float] = {}
        for shape, extra in (("whole", []), ("publish only", ["--publish-only"])):
            short = instructions(src, base + ["--calls", str(n)] + extra)
            long = instructions(src, base + ["--calls", str(2 * n)] + extra)
            per[shape] = (long - short) / n
        print(
            f"{label:6} instructions per call: whole loop {per['whole']:,.0f}  publish only "
            f"{per['publish only']:,.0f}  delivery and ack {per['whole'] - per['publish only']:,.0f}",
            flush=True,
        )


def read_acks(count: int, way: str) -> None:
    """Reads ``count`` stream ack requests (one range each, as a client acks a delivery) as a
    Consume stream's control callback gets them: ``way`` "protobuf" (``ConsumeRequest`` parsed by
    protobuf, its ``kind``, consumer id and range read from the message) or "pbwire" (the batch
    lane's ``consume_request`` deserializer, the tree's own)."""
    from danube.proto.danube_batch import batch_pb2 as pb
    from danube.server.batch_lane_consume import AckRequest, consume_request  # (every way: the same imports)

    datas = [
        pb.ConsumeRequest(ack=pb.AckBatch(ranges=[pb.OffsetRange(first=o, last=o + 1)])).SerializeToString()
        for o in range(1_000_000, 1_000_000 + 2 * count, 2)
    ]
    pairs = []
    if way == "none":
        return
    if way == "protobuf":
        parse = pb.ConsumeRequest.FromString
        for data in datas:
            request = parse(data)
            if request.WhichOneof("kind") == "ack":
                ack = request.ack
                ranges = ack.ranges
                if ack.consumer_id == 0 and len(ranges) == 1:
                    r = ranges[0]
                    pairs.append([(r.first, r.last)])
    else:
        for data in datas:
            request = consume_request(data)
            if type(request) is AckRequest and request.consumer_id == 0 and request.checked:
                pairs.append(request.ranges)
    assert len(pairs) == count


def compare_ack_reads(args: argparse.Namespace) -> None:
    """Instructions per ack request read, each way: a run reading ``--calls`` requests less one
    that only makes them (``none``)."""
    base = instructions(SRC, ["--read-acks", "none", "--calls", str(args.calls)])
    for way in ("protobuf", "pbwire"):
        spent = instructions(SRC, ["--read-acks", way, "--calls", str(args.calls)]) - base
        print(f"{way:8} instructions per ack request read: {spent / args.calls:,.0f}", flush=True)


def count_opcodes(topics: int, calls: int, batch: int) -> None:
    """Bytecodes the interpreter ran per call in the measured loop, by function: a run with
    consumers less one without (``sys.settrace`` with opcode events, on only inside the loop;
    deterministic, and fast beside callgrind, but blind to C work)."""
    import collections

    real_thread_time = time.thread_time

    def one(publish_only: bool) -> collections.Counter:
        counts: collections.Counter = collections.Counter()

        def tracer(frame, event, arg):
            frame.f_trace_opcodes = True
            key = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}"

            def local(frame, event, arg):
                if event == "opcode":
                    counts[key] += 1
                return local

            return local

        marks = [0]

        def marker() -> float:  # (``run`` reads the clock right before and after its loop)
            marks[0] += 1
            sys.settrace(tracer if marks[0] == 1 else None)
            return real_thread_time()

        time.thread_time = marker  # type: ignore[assignment]
        try:
            asyncio.run(run(topics, calls, False, publish_only, batch))
        finally:
            sys.settrace(None)
            time.thread_time = real_thread_time  # type: ignore[assignment]
        return counts

    whole, publish = one(False), one(True)
    print(f"bytecodes per call that delivery and ack add: {(sum(whole.values()) - sum(publish.values())) / calls:.0f}")
    added = {k: (v - publish.get(k, 0)) / calls for k, v in whole.items()}
    for key, n in sorted(added.items(), key=lambda kv: -kv[1])[:25]:
        if n >= 1:
            print(f"{n:8.1f}  {key}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--calls", type=int, default=40_000)
    ap.add_argument("--batch", type=int, default=2, help="messages per call")
    ap.add_argument("--publish-only", action="store_true", help="no consumers: the publish side alone")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--before", metavar="SRC", help="another tree's src: run both in turn and compare")
    ap.add_argument("--runs", type=int, default=3, help="runs of each tree with --before")
    ap.add_argument(
        "--callgrind", action="store_true", help="with --before: instructions per call (callgrind), not times"
    )
    ap.add_argument("--src", help=argparse.SUPPRESS)
    ap.add_argument("--opcodes", action="store_true", help="bytecodes per call that delivery and ack add")
    ap.add_argument(
        "--read-acks",
        choices=("protobuf", "pbwire", "none", "compare"),
        help="only read --calls ack requests one way (none: only make them); compare: instructions of each",
    )
    args = ap.parse_args()
    if args.read_acks == "compare":
        compare_ack_reads(args)
        return
    if args.read_acks:
        read_acks(args.calls, args.read_acks)
        return
    if args.opcodes:
        count_opcodes(args.topics, args.calls, args.batch)
        return
    if args.before and args.callgrind:
        compare_instructions(args)
        return
    if args.before:
        rest = ["--topics", str(args.topics), "--calls", str(args.calls), "--batch", str(args.batch)]
        rest += ["--publish-only"] if args.publish_only else []
        compare(args, rest)
        return
    asyncio.run(run(args.topics, args.calls, args.profile, args.publish_only, args.batch))


if __name__ == "__main__":
    main()
