"""CPU per unary gRPC call in the broker's HTTP/2 server alone (``danube.server.h2grpc``).

    python bench/h2_calls.py [--before /tmp/before/src] [--pure] [--calls 20000] [--per-read 8] [--rounds 3]
    python bench/h2_calls.py --callgrind [--pure] [--before /tmp/before/src]
    python bench/h2_calls.py --codec
    python bench/h2_calls.py --stream ...       (messages on one bidi stream instead of calls)
    python bench/h2_calls.py --stream --iterate ... (the handler reads and writes them itself)
    python bench/h2_calls.py --profile [--stream] (cProfile of the counted part, this tree)

No sockets and no broker: one ``GrpcConnection`` on a transport that drops what it is given, fed
reads that each carry ``--per-read`` whole calls the way a gRPC client pipelines them (HEADERS
with an HPACK block that indexes after the first call, DATA with one ``--message-size``-byte
message and END_STREAM, and a connection WINDOW_UPDATE giving back the previous response's
bytes), answered by an echo handler.  With ``--stream``, one bidi call instead, each read carrying
``--per-read`` request messages and the window for the previous answers, each message answered
at once from a message sink with ``write_nowait`` (as a consumer stream is fed); with ``--iterate`` too,
the handler's task reads them with ``async for`` and answers each with ``await context.write`` (as
the publish stream reads batches and writes acks).  What is measured is the process CPU time of the reads and
of the event loop turns that answer them, per call: frame parsing, the gRPC message cut, the
stream bookkeeping, HPACK, the handler task and the response's frames.  Each round runs the
trees in a fresh interpreter (``PYTHONPATH``), alternating which goes first; ``--pure`` adds this
tree with ``DANUBE_NO_EXTENSIONS=1`` (the codec's pure twin).

``--codec`` times the codec alone instead, compiled against its pure twin: one read of four
calls (12 frames) through ``parse_frames``, one whole message through ``MessageReader.feed``, and
a 100 kB message arriving in seven 16 KiB DATA payloads.

``--callgrind`` counts instructions instead (valgrind's callgrind, ~50x slower): each tree runs 480
and 1,280 calls, and the difference of the two totals over 800 is the
instructions per call, the interpreter's start and the warm-up cancelling out.  Unlike CPU time
on a shared machine, the count does not move with the load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")


def child(
    calls: int,
    per_read: int,
    message_size: int,
    skip_idle: bool = False,
    profile: bool = False,
    stream: bool = False,
    iterate: bool = False,
) -> dict:
    import asyncio

    import grpc
    import hpack

    from danube import _native
    from danube.server.h2grpc import H2Limits, H2Server, frames, wire
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

    async def echo(request: bytes, context) -> bytes:
        return request

    async def echo_stream(requests, context) -> None:
        # As a consumer stream answers: each request message is taken by a sink in the read, and
        # its answer written at once (write_nowait), no task woken per message.
        ended = asyncio.get_running_loop().create_future()

        def sink(message) -> None:
            if message is grpc.aio.EOF:
                ended.set_result(None)
            elif not context.write_nowait(message):
                raise AssertionError("the stream's answer had to wait for flow control")

        context.set_message_sink(sink)
        await ended

    async def echo_iterate(requests, context) -> None:
        # As the publish stream answers: its task reads the request messages and writes each answer.
        async for request in requests:
            await context.write(request)

    import uvloop

    loop = uvloop.new_event_loop()  # as the broker runs
    asyncio.set_event_loop(loop)
    server = H2Server(H2Limits(handshake_timeout=0, idle_timeout=0))
    server.loop = loop
    server.add_registered_method_handlers(
        "t.T",
        {
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
            "EchoStream": grpc.stream_stream_rpc_method_handler(echo_stream),
            "EchoIterate": grpc.stream_stream_rpc_method_handler(echo_iterate),
        },
    )
    connection = GrpcConnection(server)
    transport = DropTransport()
    connection.connection_made(transport)
    connection.data_received(frames.PREFACE + frames.settings([]))
    encoder = hpack.Encoder()
    headers = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/t.T/Echo"),
        (b":authority", b"broker"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        (b"user-agent", b"grpc-python/1.6"),
    ]
    body = wire.message_prefix(message_size) + bytes(message_size)
    reads = []
    stream_id = 1
    if stream:
        # One bidi call; then each read carries --per-read request messages in DATA frames, and
        # window given back for the previous read's answers, on the stream and the connection.
        path = b"/t.T/EchoIterate" if iterate else b"/t.T/EchoStream"
        stream_headers = [(n, path if n == b":path" else v) for n, v in headers]
        opening = frames.frame(frames.HEADERS, frames.END_HEADERS, 1, encoder.encode(stream_headers))
        given = per_read * (len(body) + 64)
        for i in range(0, calls, per_read):
            read = bytearray(opening if i == 0 else b"")
            for _ in range(per_read):
                read += frames.frame(frames.DATA, 0, 1, body)
            read += frames.window_update(0, given) + frames.window_update(1, given)
            reads.append(bytes(read))
    # Once every header is in the encoder's table, each block is the same few index bytes: the
    # repeated block is reused, so the client's HPACK encoding is no part of what is counted.
    block, steady = b"", False
    for _ in range(0, 0 if stream else calls, per_read):
        read = bytearray()
        for _ in range(per_read):
            if not steady:
                previous, block = block, encoder.encode(headers)
                steady = block == previous
            read += frames.frame(frames.HEADERS, frames.END_HEADERS, stream_id, block)
            read += frames.frame(frames.DATA, frames.END_STREAM, stream_id, body)
            read += frames.window_update(0, len(body) + 64)
            stream_id += 2
        reads.append(bytes(read))

    async def drive(batch: list[bytes], idle: bool = False) -> None:
        for read in batch:
            if not idle:
                connection.data_received(read)
            for _ in range(4):  # the handler task, its answer, the flush
                await asyncio.sleep(0)

    loop.run_until_complete(drive(reads[:50]))  # warm up (not counted)
    reads = reads[50:]
    done = len(reads) * per_read
    start_written = transport.written
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    start = time.process_time()
    loop.run_until_complete(drive(reads))
    cpu = time.process_time() - start
    if profiler is not None:
        import pstats

        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(35)
    # the empty loop turns' cost, to subtract
    start_idle = time.process_time()
    if not skip_idle:
        loop.run_until_complete(drive(reads, idle=True))
    idle = time.process_time() - start_idle
    answered = transport.written - start_written
    if stream:  # the client ends its stream: the handler returns
        connection.data_received(frames.frame(frames.DATA, frames.END_STREAM, 1, b""))
        loop.run_until_complete(drive([b""], idle=True))
    assert not connection._broken and answered > done * message_size, "the calls were not answered"
    loop.close()
    loaded = _native.extensions_loaded()
    codec = "compiled" if loaded.get("h2codec") else "pure twin" if "h2codec" in loaded else "none (Python)"
    key = "us_per_message" if stream else "us_per_call"
    return {"codec": codec, key: round((cpu - idle) * 1e6 / done, 2), "calls": done}


def codec_times() -> None:
    import timeit

    import danube._core.h2codec as compiled
    import danube._pure.h2codec as pure

    body = compiled.message_prefix(120) + bytes(120)
    one_call = compiled.frame(1, 4, 1, bytes(60)) + compiled.frame(0, 1, 1, body) + compiled.frame(8, 0, 0, b"\0\0\1\0")
    read = bytearray(one_call * 4)
    large_message = compiled.message_prefix(100_000) + bytes(100_000)
    chunks = [large_message[i : i + 16384] for i in range(0, len(large_message), 16384)]
    for codec in (pure, compiled):
        n = 20000
        parse_frames = codec.parse_frames
        parse = timeit.timeit(lambda p=parse_frames: p(read, 16384, 1000, 1000, 1 << 20), number=n) / n
        feed_one = codec.MessageReader(4 << 20).feed
        feed = timeit.timeit(lambda f=feed_one: f(body), number=n) / n
        reader = codec.MessageReader(4 << 20)

        def large(feed_some=reader.feed) -> None:
            for chunk in chunks:
                feed_some(chunk)

        big = timeit.timeit(large, number=n // 10) / (n // 10)
        print(
            f"{codec.__name__:<22} parse_frames (12 frames) {parse * 1e6:6.2f} us   "
            f"MessageReader.feed (1 message) {feed * 1e6:6.3f} us   (100 kB in 7 DATA) {big * 1e6:6.1f} us"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default=None, help="src dir of the tree to compare with")
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--per-read", type=int, default=8)
    ap.add_argument("--message-size", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pure", action="store_true", help="also run this tree on the pure-Python twins")
    ap.add_argument("--callgrind", action="store_true", help="count instructions per call (valgrind)")
    ap.add_argument("--codec", action="store_true", help="time the codec alone, compiled against pure")
    ap.add_argument("--stream", action="store_true", help="messages on one bidi stream instead of unary calls")
    ap.add_argument("--iterate", action="store_true", help="with --stream: read by the handler's task, not a sink")
    ap.add_argument("--profile", action="store_true", help="cProfile this tree's counted calls (to stderr)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--skip-idle", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child or args.profile:
        print(
            json.dumps(
                child(
                    args.calls,
                    args.per_read,
                    args.message_size,
                    args.skip_idle,
                    args.profile,
                    args.stream or args.iterate,
                    args.iterate,
                )
            )
        )
        return
    if args.codec:
        codec_times()
        return
    trees = [("after", SRC, {})]
    if args.pure:
        trees.append(("after (pure)", SRC, {"DANUBE_NO_EXTENSIONS": "1"}))
    if args.before:
        trees.append(("before", os.path.abspath(args.before), {}))
    got: dict[str, list[float]] = {name: [] for name, _, _ in trees}
    if args.callgrind:
        for name, tree, env in trees:
            totals = []
            for calls in (480, 1280):  # the 400 warm-up calls, then 80 or 880 counted
                out_file = f"/tmp/h2_calls-{os.getpid()}.callgrind"
                subprocess.run(
                    [
                        "valgrind",
                        "--tool=callgrind",
                        f"--callgrind-out-file={out_file}",
                        sys.executable,
                        os.path.abspath(__file__),
                        "--child",
                        "--skip-idle",
                        "--calls",
                        str(calls),
                        "--per-read",
                        str(args.per_read),
                        "--message-size",
                        str(args.message_size),
                        *(["--stream"] if args.stream or args.iterate else []),
                        *(["--iterate"] if args.iterate else []),
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                    env={**os.environ, "PYTHONPATH": tree, **env},
                )
                with open(out_file) as f:
                    totals.append(next(int(line.split()[1]) for line in f if line.startswith("totals:")))
                os.unlink(out_file)
            unit = "message" if args.stream or args.iterate else "call"
            print(f"{name:<14} {(totals[1] - totals[0]) / 800:10,.0f} instructions/{unit}", flush=True)
        return
    for i in range(args.rounds):
        for name, tree, env in trees if i % 2 == 0 else list(reversed(trees)):
            out = subprocess.run(
                [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--child",
                    "--calls",
                    str(args.calls),
                    "--per-read",
                    str(args.per_read),
                    "--message-size",
                    str(args.message_size),
                    *(["--stream"] if args.stream or args.iterate else []),
                    *(["--iterate"] if args.iterate else []),
                ],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "PYTHONPATH": tree, **env},
            )
            row = {"tree": name, "round": i + 1, **json.loads(out.stdout)}
            got[name].append(row["us_per_message" if args.stream or args.iterate else "us_per_call"])
            print(json.dumps(row), flush=True)
    for name, values in got.items():
        unit = "message" if args.stream or args.iterate else "call"
        print(f"{name:<14} median {statistics.median(values):7.2f} us/{unit}  (rounds {values})")


if __name__ == "__main__":
    main()
