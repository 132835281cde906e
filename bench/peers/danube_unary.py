"""danube through the Danube protocol as danube-client uses it: one unary SendMessage per message."""

from __future__ import annotations

import time

import grpc

from bench.peers.common import PeerResult
from bench.peers.grpc_echo import unary_rate


async def run(service_url: str, *, message_size: int, duration: float, concurrency: int,
              reliable: bool = True) -> PeerResult:
    from danube.client.client import address_of
    from danube.proto.danube import DanubeApi_pb2 as pb
    from danube.proto.danube import DanubeApi_pb2_grpc as pb_grpc

    channel = grpc.aio.insecure_channel(address_of(service_url))
    stub = pb_grpc.ProducerServiceStub(channel)
    topic = f"/default/unary-{int(time.time() * 1000)}"
    answer = await stub.CreateProducer(pb.ProducerRequest(
        request_id=1, producer_name="unary-bench", topic_name=topic,
        dispatch_strategy=pb.Reliable if reliable else pb.NonReliable))
    producer_id = answer.producer_id
    data = b"\x00" * message_size
    request_ids = iter(range(1, 1 << 62))

    def send_one():
        return stub.SendMessage(pb.StreamMessage(
            request_id=next(request_ids), msg_id=pb.MsgID(producer_id=producer_id, topic_name=topic),
            payload=data, publish_time=int(time.time() * 1000), producer_name="unary-bench"))

    calls, seconds = await unary_rate(send_one, duration=duration, concurrency=concurrency)
    await channel.close()
    return PeerResult("danube unary SendMessage", f"concurrency={concurrency}", sent=calls, delivered=0,
                      seconds=round(seconds, 3), publish_rate=round(calls / seconds, 1),
                      end_to_end_rate=round(calls / seconds, 1),
                      note="one Danube-protocol unary call per message, acked after durability")
