"""Baseline: a bare grpc.aio unary echo server, run as ``python -m bench.peers.grpc_echo PORT``.

It answers two ways, on one port, with no work beyond the call itself:

- ``/bench.Echo/Echo``: identity serializers, the request bytes come back (the raw baseline);
- Danube's ``ProducerService.SendMessage``: answered at once with the request's ``request_id``
  (plus the ``CreateProducer``, ``TopicLookup`` and ``HealthCheck`` answers a Danube client
  needs to connect), so the real ``danube-client`` can drive it exactly as it drives the broker.
  The difference between this and the broker is then the broker's own cost per call.

``unary_rate`` drives any unary call with a window of workers (the in-repo drivers use it;
``unary_driver.py`` is the same loop for the ``danube-client`` venv).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time

import grpc

from bench.peers.common import PeerResult, free_port, server_process

METHOD = "/bench.Echo/Echo"


def _danube_echo_handlers(port: int) -> list:
    from danube.proto.danube import DanubeApi_pb2 as pb
    from danube.proto.danube import DanubeApi_pb2_grpc as pb_grpc

    url = f"http://127.0.0.1:{port}"

    class Producers(pb_grpc.ProducerServiceServicer):
        async def CreateProducer(self, request, context):
            return pb.ProducerResponse(
                request_id=request.request_id, producer_id=1, producer_name=request.producer_name
            )

        async def SendMessage(self, request, context):
            return pb.MessageResponse(request_id=request.request_id)

    class Discovery(pb_grpc.DiscoveryServicer):
        async def TopicLookup(self, request, context):
            return pb.TopicLookupResponse(
                request_id=request.request_id,
                response_type=pb.TopicLookupResponse.Connect,
                connect_url=url,
                broker_url=url,
            )

        async def TopicPartitions(self, request, context):
            return pb.TopicPartitionsResponse(request_id=request.request_id, partitions=[request.topic])

    class Health(pb_grpc.HealthCheckServicer):
        async def HealthCheck(self, request, context):
            return pb.HealthCheckResponse(status=pb.HealthCheckResponse.OK)

    return [
        (pb_grpc.add_ProducerServiceServicer_to_server, Producers()),
        (pb_grpc.add_DiscoveryServicer_to_server, Discovery()),
        (pb_grpc.add_HealthCheckServicer_to_server, Health()),
    ]


async def serve(port: int) -> None:
    async def echo(request: bytes, context) -> bytes:
        return request

    handler = grpc.method_handlers_generic_handler("bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)})
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    for add, servicer in _danube_echo_handlers(port):
        add(servicer, server)
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
    return PeerResult(
        "grpc.aio unary echo",
        f"concurrency={concurrency}",
        sent=calls,
        delivered=calls,
        seconds=round(seconds, 3),
        publish_rate=round(calls / seconds, 1),
        end_to_end_rate=round(calls / seconds, 1),
        note="baseline for the unary Danube protocol",
    )


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(int(sys.argv[1])))
