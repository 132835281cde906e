"""1,000 concurrent client connections on one broker, each served, and what happens
past ``--max-connections``.  Functional, bounded in time (not a benchmark).

Each connection is a raw HTTP/2 connection (the ``h2`` library, asyncio streams) that keeps
open while the others connect, then creates a producer on one of 20 reliable topics with
Danube's ``CreateProducer`` and checks the answer.  The broker is a subprocess
(tests/support/broker.py) with ``--max-connections 1000``; the 1,001st connection is served,
and the connection idle longest is closed to make room (GOAWAY NO_ERROR).  Refusal when every
connection has a call open: tests/integration/test_h2_limits.py.
"""

from __future__ import annotations

import asyncio
import os

import h2.config
import h2.connection
import h2.events
import pytest

from danube.proto.danube import DanubeApi_pb2 as pb
from danube.server.limits import raise_nofile_limit
from tests.support.broker import running_broker

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc")

CONNECTIONS = 1000
TOPICS = 20


def _grpc_message(msg) -> bytes:
    body = msg.SerializeToString()
    return b"\0" + len(body).to_bytes(4, "big") + body


class Conn:
    def __init__(self, reader, writer) -> None:
        self.reader, self.writer = reader, writer
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.h2.initiate_connection()
        self.writer.write(self.h2.data_to_send())

    async def events(self, timeout: float = 20.0):
        data = await asyncio.wait_for(self.reader.read(65536), timeout)
        if not data:
            raise ConnectionError("closed by the broker")
        events = self.h2.receive_data(data)
        out = self.h2.data_to_send()
        if out:
            self.writer.write(out)
        return events

    async def call(self, path: str, request) -> tuple[bytes, dict]:
        sid = self.h2.get_next_available_stream_id()
        self.h2.send_headers(
            sid,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", "broker"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ],
        )
        self.h2.send_data(sid, _grpc_message(request), end_stream=True)
        self.writer.write(self.h2.data_to_send())
        body, trailers = b"", {}
        while True:
            for ev in await self.events():
                if isinstance(ev, h2.events.DataReceived) and ev.stream_id == sid:
                    body += ev.data
                    self.h2.acknowledge_received_data(ev.flow_controlled_length, sid)
                elif isinstance(ev, h2.events.TrailersReceived) and ev.stream_id == sid:
                    trailers = {k.decode(): v.decode() for k, v in ev.headers}
                elif isinstance(ev, h2.events.ResponseReceived) and ev.stream_id == sid:
                    trailers.update({k.decode(): v.decode() for k, v in ev.headers})
                elif isinstance(ev, h2.events.StreamEnded) and ev.stream_id == sid:
                    return body, trailers
                elif isinstance(ev, h2.events.ConnectionTerminated):
                    raise ConnectionError(f"GOAWAY {ev.error_code}: {ev.additional_data!r}")


async def test_a_thousand_connections_each_served_and_the_next_refused_clearly():
    raise_nofile_limit()
    with running_broker("--max-connections", str(CONNECTIONS)) as broker:
        conns: list[Conn] = []
        try:
            sem = asyncio.Semaphore(100)

            async def connect():
                async with sem:
                    reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
                    conns.append(Conn(reader, writer))

            await asyncio.wait_for(asyncio.gather(*(connect() for _ in range(CONNECTIONS))), 60)

            # all 1,000 are open at once; each one now creates a producer
            async def produce(i: int, conn: Conn):
                async with sem:
                    req = pb.ProducerRequest(
                        request_id=i,
                        producer_name=f"p{i}",
                        topic_name=f"/default/many-conn-{i % TOPICS}",
                        dispatch_strategy=pb.DispatchStrategy.Reliable,
                    )
                    body, trailers = await conn.call("/danube.ProducerService/CreateProducer", req)
                    assert trailers.get("grpc-status") == "0", (i, trailers)
                    resp = pb.ProducerResponse.FromString(body[5:])
                    return resp.producer_id

            ids = await asyncio.wait_for(asyncio.gather(*(produce(i, c) for i, c in enumerate(conns))), 120)
            assert len(set(ids)) == CONNECTIONS
            # one more is served: the connection idle longest (all are idle now) makes room
            reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
            extra = Conn(reader, writer)
            req = pb.ProducerRequest(
                request_id=CONNECTIONS,
                producer_name="extra",
                topic_name="/default/many-conn-0",
                dispatch_strategy=pb.DispatchStrategy.Reliable,
            )
            _, trailers = await extra.call("/danube.ProducerService/CreateProducer", req)
            assert trailers.get("grpc-status") == "0", trailers
            extra.writer.close()
        finally:
            for c in conns:
                c.writer.close()
        assert "closed to make room for a new one" in broker.log()
        with open(broker.log_path) as f:  # raised to the hard limit at start, and said so
            assert "file descriptor limit" in f.read()
