"""CPU per call of the batch lane's publish path alone, in one process: no sockets (and, without
``--h2``, no HTTP/2).

    python bench/batch_lane_publish.py [--before /tmp/before/src] [--topics 100] [--calls 300]
        [--sync never] [--rounds 3] [--profile] [--h2]
    python bench/batch_lane_publish.py --callgrind [--before /tmp/before/src] [--topics 20] [--h2]

``--h2`` feeds the native HTTP/2 server instead of a stand-in call: the lane registered on an
``H2Server``, 8 ``GrpcConnection``s on a transport that drops what it is given, the streams
spread over them; each turn every connection gets one read with a DATA frame (one 2-message
``PublishRequest``) per stream and the window for the previous acks.  It counts the whole
publish half of a call: frame parsing, the gRPC message cut, the sink, the handler, the append,
the commit and the ack's framing.

A real ``BrokerService`` (local WAL at ``--sync``, sqlite metadata in a temporary directory) and
its ``BatchLaneService``; ``--topics`` Publish streams, one producer and topic each, each stream
fed through a stand-in for the native server's call (requests queued and the handler's reader
woken as ``h2grpc.ServerCall`` does; acks taken by ``write_nowait``).  Each turn of the event loop
feeds one 2-message ``PublishRequest`` to every stream (serialized, then read by the tree's own
Publish deserializer, as its server would hand it over), the shape of the many-topics bench (one
small call per topic at a time).  What is measured is the process CPU time from the first feed to
the last ack, per call: the handler's read and answer, the publish checks, the WAL append, the
commit and the ack's serialization; no subscriptions, so no delivery.  Each round runs each tree
in a fresh interpreter (``PYTHONPATH``), alternating which goes first.

``--callgrind`` counts instructions instead (valgrind's callgrind) on the event loop's thread: each
tree runs 20 and then 180 calls per topic after the same warm-up, and the difference of the two
totals over the 160 extra calls per topic is the instructions per call, the interpreter's start,
the broker's and the warm-up cancelling out.  With ``--h2`` both runs build the same 180 turns
of requests before the count (the client's encoding: about 17,000 instructions per call were
counted with the server's until session 19).  The count moves by about 3% from run to run on a
loaded machine (the broker's timers fire by the clock): compare several runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")


def child(topics: int, calls: int, sync: str, profile: bool, h2: bool = False, prepared: int = 0) -> dict:
    import asyncio
    import collections
    import tempfile
    import time

    import grpc
    import uvloop

    from danube import message_codec
    from danube.broker import BrokerService, DispatchSettings
    from danube.metadata.embedded import EmbeddedMetadataStore
    from danube.proto.danube_batch import batch_pb2 as pb
    from danube.server import batch_lane, batch_lane_publish
    from danube.storage.config import StorageConfig
    from danube.storage.factory import StorageFactory

    class Call:
        """What the Publish handler uses of ``h2grpc.ServerCall``."""

        sends_encoded = True

        def __init__(self) -> None:
            self.messages: collections.deque = collections.deque()
            self.waiter: asyncio.Future | None = None
            self.ended = False
            self.acks = 0

        def feed(self, message) -> None:
            self.messages.append(message)
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_result(None)

        def end(self) -> None:
            self.ended = True
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_result(None)

        def __aiter__(self):
            return self

        async def __anext__(self):
            while not self.messages:
                if self.ended:
                    raise StopAsyncIteration
                self.waiter = asyncio.get_running_loop().create_future()
                try:
                    await self.waiter
                finally:
                    self.waiter = None
            message = self.messages.popleft()
            if message is grpc.aio.EOF:
                raise StopAsyncIteration
            return message

        def write_nowait(self, message) -> bool:
            self.acks += 1
            return True

    async def main() -> dict:
        data = tempfile.mkdtemp(prefix="lane-bench-")
        metadata = EmbeddedMetadataStore(os.path.join(data, "metadata.db"))
        config = StorageConfig.from_dict({"wal": {"sync": sync}}, data_dir=data)
        broker = BrokerService(
            metadata,
            StorageFactory(config, metadata, broker_id="bench"),
            dispatch=DispatchSettings(cursor_flush_interval_ms=1000),
        )
        await broker.start()
        frames = message_codec.encode_payloads([b"x" * 100, b"y" * 100], publish_time=1, producer_id=0)
        if h2:
            return await through_h2(broker, metadata, frames)
        service = batch_lane.BatchLaneService(broker)
        # what the tree's server hands the handler: the request read by Publish's deserializer
        parse = getattr(batch_lane_publish, "parse_request", pb.PublishRequest.FromString)
        streams = []
        for i in range(topics):
            pid = await broker.create_producer(f"/default/lane-{i}", "p", reliable=True)
            call = Call()

            async def drive(call=call):
                async for _ack in service.Publish(call, call):
                    call.acks += 1

            streams.append((call, pid, asyncio.ensure_future(drive())))
        sequence = 0

        async def run(n: int) -> None:
            nonlocal sequence
            want = streams[0][0].acks + n
            for _ in range(n):
                sequence += 1
                for call, pid, _task in streams:
                    body = pb.PublishRequest(sequence=sequence, producer_id=pid, frames=frames).SerializeToString()
                    call.feed(parse(body))
                await asyncio.sleep(0)
            while any(call.acks < want for call, _pid, _task in streams):
                await asyncio.sleep(0 if sync == "never" else 0.001)

        await run(50)  # warm-up: files, caches, the first acks
        profiler = None
        if profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        t0 = time.process_time()
        await run(calls)
        cpu = time.process_time() - t0
        if profiler is not None:
            import pstats

            profiler.disable()
            pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(25)
        for call, _pid, _task in streams:
            call.end()
        await asyncio.gather(*(task for _call, _pid, task in streams))
        await broker.stop()
        await metadata.close()
        return {"us_per_call": cpu / (calls * topics) * 1e6}

    async def through_h2(broker, metadata, frames) -> dict:
        """The native server's whole publish half: each turn, every connection gets one read
        with a DATA frame (one 2-message PublishRequest) per stream and the window given back
        for the previous answers, as the many-topics bench's clients send them."""
        import hpack

        from danube.server.h2grpc import H2Limits, H2Server, wire
        from danube.server.h2grpc import frames as h2
        from danube.server.h2grpc.connection import GrpcConnection

        class DropTransport(asyncio.Transport):
            def __init__(self) -> None:
                super().__init__()
                self.written = 0

            def get_extra_info(self, name, default=None):
                return ("127.0.0.1", 5555) if name == "peername" else default

            def write(self, data) -> None:
                self.written += len(data)

            def get_write_buffer_size(self) -> int:
                return 0

            def is_closing(self) -> bool:
                return False

            def pause_reading(self) -> None:
                pass

            def resume_reading(self) -> None:
                pass

            def close(self) -> None:
                pass

            def abort(self) -> None:
                pass

        server = H2Server(H2Limits(handshake_timeout=0, idle_timeout=0))
        server.loop = asyncio.get_running_loop()
        batch_lane.add_to_server(server, broker)
        connections = []
        for _ in range(min(8, topics)):
            connection = GrpcConnection(server)
            transport = DropTransport()
            connection.connection_made(transport)
            connection.data_received(h2.PREFACE + h2.settings([]))
            connections.append((connection, transport, hpack.Encoder(), []))
        headers = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", b"/danube_batch.BatchLane/Publish"),
            (b":authority", b"broker"),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ]
        topic_objects = []
        for i in range(topics):
            pid = await broker.create_producer(f"/default/lane-{i}", "p", reliable=True)
            connection, _transport, encoder, streams = connections[i % len(connections)]
            stream_id = 2 * len(streams) + 1
            connection.data_received(h2.frame(h2.HEADERS, h2.END_HEADERS, stream_id, encoder.encode(headers)))
            streams.append((stream_id, pid))
            topic_objects.append(broker._producers[pid].topic)
        sequence = 0

        def read_for(streams) -> bytes:
            read = bytearray()
            for stream_id, pid in streams:
                body = pb.PublishRequest(sequence=sequence, producer_id=pid, frames=frames).SerializeToString()
                read += h2.frame(h2.DATA, 0, stream_id, wire.message_prefix(len(body)) + body)
            given = 64 * len(streams)
            read += h2.window_update(0, given)
            for stream_id, _pid in streams:
                read += h2.window_update(stream_id, 64)
            return bytes(read)

        def prepare(n: int) -> list:
            nonlocal sequence
            reads = []
            for _ in range(n):
                sequence += 1
                reads.append([read_for(streams) for _c, _t, _e, streams in connections])
            return reads

        async def run(reads: list) -> None:
            n = len(reads)
            want = topic_objects[0].readable_next + 2 * n
            for turn in reads:
                for (connection, _t, _e, _s), read in zip(connections, turn):
                    connection.data_received(read)
                await asyncio.sleep(0)
            while any(t.readable_next < want for t in topic_objects):
                await asyncio.sleep(0 if sync == "never" else 0.001)
            for _ in range(3):  # the acks' writes and the flush
                await asyncio.sleep(0)

        await run(prepare(50))
        # built before the count starts (the client's work), ``prepared`` turns of them whatever
        # ``calls`` is: the two runs of ``--callgrind`` build the same and their difference is
        # the server's alone
        reads = prepare(max(calls, prepared))[:calls]
        written = sum(t.written for _c, t, _e, _s in connections)
        profiler = None
        if profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        t0 = time.process_time()
        await run(reads)
        cpu = time.process_time() - t0
        if profiler is not None:
            import pstats

            profiler.disable()
            pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(40)
        acked = sum(t.written for _c, t, _e, _s in connections) - written
        assert acked >= calls * topics * 20, f"the publishes were not acked ({acked} bytes written)"
        assert not any(c._broken for c, _t, _e, _s in connections)
        await broker.stop()
        await metadata.close()
        return {"us_per_call": cpu / (calls * topics) * 1e6}

    return uvloop.run(main())


def run_tree(tree: str, args) -> float:
    cmd = [sys.executable, __file__, "--child", "--topics", str(args.topics), "--calls", str(args.calls)]
    cmd += ["--sync", args.sync] + (["--h2"] if args.h2 else [])
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": tree}, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"{tree}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["us_per_call"]


def instructions_per_call(tree: str, args) -> float:
    """The event loop's thread only (``--separate-threads``: the WAL's and the metadata store's
    threads run on their own clocks, which made the count move by a few per cent from run to
    run), with a fixed hash seed."""
    totals = []
    extra = 160  # calls per topic counted: a run's own noise (about 1M instructions) stays under 1%
    for calls in (20, 20 + extra):
        out_file = f"/tmp/batch_lane_publish-{os.getpid()}.callgrind"
        cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out_file}"]
        cmd += [sys.executable, __file__, "--child", "--topics", str(args.topics), "--calls", str(calls)]
        cmd += ["--sync", args.sync] + (["--h2", "--prepared", str(20 + extra)] if args.h2 else [])
        env = {**os.environ, "PYTHONPATH": tree, "PYTHONHASHSEED": "0"}
        subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
        main_thread = f"{out_file}-01"
        with open(main_thread) as f:
            totals.append(next(int(line.split()[1]) for line in f if line.startswith("totals:")))
        for name in os.listdir("/tmp"):
            if name.startswith(os.path.basename(out_file)):
                os.unlink(os.path.join("/tmp", name))
    return (totals[1] - totals[0]) / (extra * args.topics)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default=None, help="src dir of the tree to compare with")
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--calls", type=int, default=300, help="calls per topic")
    ap.add_argument("--sync", default="never", choices=["never", "interval", "always"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="cProfile of this tree's counted part (stderr)")
    ap.add_argument("--callgrind", action="store_true", help="count instructions per call (valgrind)")
    ap.add_argument("--h2", action="store_true", help="through the native HTTP/2 server (8 connections)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--prepared", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.topics, args.calls, args.sync, args.profile, args.h2, args.prepared)))
        return
    if args.profile:
        sys.path.insert(0, SRC)
        print(json.dumps(child(args.topics, args.calls, args.sync, True, args.h2)))
        return
    trees = [("after", SRC)] + ([("before", os.path.abspath(args.before))] if args.before else [])
    if args.callgrind:
        counted: dict[str, float] = {}
        for name, tree in trees:
            counted[name] = instructions_per_call(tree, args)
            print(f"{name}: {counted[name]:,.0f} instructions per call ({args.topics} topics, sync={args.sync})")
        if args.before:
            print(f"after/before: {counted['after'] / counted['before']:.2f}")
        return
    got: dict[str, list[float]] = {name: [] for name, _ in trees}
    for r in range(args.rounds):
        for name, tree in trees if r % 2 == 0 else list(reversed(trees)):
            got[name].append(run_tree(tree, args))
            print(f"round {r + 1} {name}: {got[name][-1]:.1f} us per call", flush=True)
    for name, values in got.items():
        print(f"{name}: median {statistics.median(values):.1f} us per call ({args.topics} topics, sync={args.sync})")
    if args.before:
        print(f"after/before: {statistics.median(got['after']) / statistics.median(got['before']):.2f}")


if __name__ == "__main__":
    main()
