"""The unary comparison: danube's Danube-protocol path vs a bare grpc.aio echo server.

Preferred driver: the REAL ``danube-client`` 0.5.0 in its own venv (``tests/support/
danube_client_venv.py``), running ``unary_driver.py`` as a subprocess: one ``producer.send`` per
message, ``concurrency`` calls in flight.  Three targets, interleaved in rounds in one run:

- ``grpc.aio echo (raw)``: ``/bench.Echo/Echo`` with identity serializers, no client library;
- ``grpc.aio echo (Danube API)``: the same bare server answering Danube's ``SendMessage`` at
  once, driven by ``danube-client`` exactly like the broker (same client cost per call);
- ``danube broker``: ``SendMessage`` on a reliable topic, answered once durable.

When the venv cannot be made (no network), ``drive_in_process`` runs the same targets with
this repo's generated stubs (``DanubeApi_pb2_grpc``) instead, and the result says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import grpc

from bench.peers.grpc_echo import unary_rate

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "unary_driver.py")


def client_venv_python() -> tuple[str | None, str]:
    """(python of the danube-client venv or None, why not)."""
    try:
        from tests.support import danube_client_venv

        return danube_client_venv.ensure_venv(), ""
    except Exception as exc:  # noqa: BLE001 - offline or no venv module: fall back, and say so
        return None, f"{type(exc).__name__}: {str(exc)[:200]}"


def drive_with_client(
    python: str,
    target: str,
    address: str,
    *,
    message_size: int,
    duration: float,
    concurrency: int,
    warmup: float = 0.5,
    topic: str = "/default/unary-bench",
) -> dict:
    """One run of ``unary_driver.py`` in the client venv; its JSON result."""
    from tests.support.danube_client_venv import script_env

    cmd = [
        python,
        DRIVER,
        target,
        address,
        "--concurrency",
        str(concurrency),
        "--duration",
        str(duration),
        "--warmup",
        str(warmup),
        "--message-size",
        str(message_size),
        "--topic",
        topic,
    ]
    proc = subprocess.run(cmd, env=script_env(), capture_output=True, text=True, timeout=duration + 120, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"unary driver {target} {address} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(lines[-1])


async def drive_in_process(
    target: str,
    address: str,
    *,
    message_size: int,
    duration: float,
    concurrency: int,
    topic: str = "/default/unary-bench",
) -> dict:
    """The fallback driver: this repo's stubs, one unary call per message, same worker loop."""
    from danube.client.client import address_of
    from danube.proto.danube import DanubeApi_pb2 as pb
    from danube.proto.danube import DanubeApi_pb2_grpc as pb_grpc

    data = b"\x00" * message_size
    if target == "raw":
        channel = grpc.aio.insecure_channel(address)
        call = channel.unary_unary("/bench.Echo/Echo")

        def send_one():
            return call(data)
    else:
        channel = grpc.aio.insecure_channel(address_of(address))
        stub = pb_grpc.ProducerServiceStub(channel)
        answer = await stub.CreateProducer(
            pb.ProducerRequest(
                request_id=1, producer_name="unary-driver", topic_name=topic, dispatch_strategy=pb.Reliable
            )
        )
        producer_id = answer.producer_id
        request_ids = iter(range(2, 1 << 62))

        def send_one():
            return stub.SendMessage(
                pb.StreamMessage(
                    request_id=next(request_ids),
                    msg_id=pb.MsgID(producer_id=producer_id, topic_name=topic),
                    payload=data,
                    publish_time=int(time.time() * 1000),
                    producer_name="unary-driver",
                )
            )

    try:
        await unary_rate(send_one, duration=0.5, concurrency=concurrency)  # warm-up, not counted
        calls, seconds = await unary_rate(send_one, duration=duration, concurrency=concurrency)
    finally:
        await channel.close()
    return {"calls": calls, "seconds": round(seconds, 3), "rate": round(calls / seconds, 1), "call_latency_ms": {}}
