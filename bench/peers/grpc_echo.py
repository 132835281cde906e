"""Baseline: a bare grpc.aio unary echo server (no protobuf, identity serializers), run as
``python -m bench.peers.grpc_echo PORT``, and a client issuing unary calls with a window."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time

import grpc

from bench.peers.common import PeerResult, free_port, server_process

METHOD = "/bench.Echo/Echo"


async def serve(port: int) -> None:
    async def echo(request: bytes, context) -> bytes:
        return request

    handler = grpc.method_handlers_generic_handler(
        "bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)})
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


@contextlib.contextmanager
def echo_server():
    port = free_port()
    with server_process([sys.executable, "-m", "bench.peers.grpc_echo", str(port)], port):
        yield f"127.0.0.1:{port}"


async def unary_rate(call_once, *, duration: float, concurrency: int) -> tuple[int, float]:
    """Runs ``concurrency`` workers each awaiting one unary call after another; (calls, seconds)."""
    perf = time.perf_counter
    deadline = perf() + duration
    done = [0]

    async def worker():
        while perf() < deadline:
            await call_once()
            done[0] += 1

    start = perf()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done[0], perf() - start


async def run(address: str, *, message_size: int, duration: float, concurrency: int) -> PeerResult:
    channel = grpc.aio.insecure_channel(address)
    call = channel.unary_unary(METHOD)
    data = b"\x00" * message_size
    calls, seconds = await unary_rate(lambda: call(data), duration=duration, concurrency=concurrency)
    await channel.close()
    return PeerResult("grpc.aio unary echo", f"concurrency={concurrency}", sent=calls, delivered=calls,
                      seconds=round(seconds, 3), publish_rate=round(calls / seconds, 1),
                      end_to_end_rate=round(calls / seconds, 1), note="baseline for the unary Danube protocol")


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(int(sys.argv[1])))
