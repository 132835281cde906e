"""The HTTP/2 limits in a real broker process (`danube broker`, native server, default limits
except where a flag says otherwise): its descriptors and RSS, read from /proc, stay bounded
under the hostile-client attacks below while a Danube HealthCheck call every 100 ms keeps succeeding.

Each broker is a subprocess on free loopback ports, stopped by its PID even on failure
(tests/support/broker.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time

import grpc
import h2.config
import h2.connection
import h2.exceptions
import hpack
import pytest

from danube.proto.danube import DanubeApi_pb2 as pb
from danube.proto.danube import DanubeApi_pb2_grpc as pb_grpc
from danube.proto.danube_admin import admin_pb2 as admin_pb
from danube.proto.danube_admin import admin_pb2_grpc as admin_grpc
from danube.server.h2grpc import frames, wire
from tests.support.broker import running_broker
from tests.support.waiting import async_wait_until

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc")

MiB = 1024 * 1024
HEALTH_PATH = b"/danube.HealthCheck/HealthCheck"


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@contextlib.asynccontextmanager
async def health_calls(target: str):
    """Danube's HealthCheck every 100 ms on its own connection, 3 s deadline each.

    3 s, not 1 s: the attacker, the broker and this client share two cores, and a broker without
    the bounds answered 1 call in 21 within 20 s, so the margin does not hide the failure."""
    results = {"ok": 0, "failed": []}
    stop = asyncio.Event()
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.HealthCheckStub(channel)
        await stub.HealthCheck(pb.HealthCheckRequest(request_id=1, id=1), timeout=10)

        async def run():
            while not stop.is_set():
                try:
                    await stub.HealthCheck(pb.HealthCheckRequest(request_id=2, id=1), timeout=3)
                    results["ok"] += 1
                except grpc.aio.AioRpcError as exc:
                    results["failed"].append(f"{exc.code()}: {exc.details()}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.1)

        task = asyncio.ensure_future(run())
        try:
            yield results
            before = results["ok"]
            deadline = time.monotonic() + 5
            while results["ok"] < before + 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await task
    assert not results["failed"], results["failed"]
    assert results["ok"] >= 3


def request_headers(encoder: hpack.Encoder, path: bytes = HEALTH_PATH) -> bytes:
    return encoder.encode(
        [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", path),
            (b":authority", b"x"),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ]
    )


async def test_connections_past_max_connections_are_refused_and_descriptors_stay_bounded():
    """19,930 idle connections filled the broker's descriptor table; with --max-connections 40
    the broker holds at most 40 client connections whatever is opened against it."""
    with running_broker("--max-connections", "40") as broker:
        async with health_calls(broker.target):
            base = descriptors(broker.proc.pid)
            socks = []
            try:
                for _ in range(400):
                    sock = socket.socket()
                    sock.setblocking(False)
                    with contextlib.suppress(BlockingIOError):
                        sock.connect(("127.0.0.1", broker.port))
                    socks.append(sock)
                await asyncio.sleep(1.0)
                most = descriptors(broker.proc.pid)
                assert most <= base + 40 + 5, (base, most)
            finally:
                for sock in socks:
                    sock.close()
        assert "h2 limit max_connections tripped" in broker.log()


async def test_rapid_reset_keeps_the_broker_small_and_answering():
    """796,500 HEADERS + RST_STREAM pairs took the broker from 53 to 1,073 MiB with 1 in 21
    health calls answered; 20 connections of 3,000 pairs each now get GOAWAY after the reset
    budget, and RSS stays put."""
    with running_broker() as broker:
        async with health_calls(broker.target):
            before = rss(broker.proc.pid)
            goaways = 0
            for _ in range(20):
                reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
                encoder = hpack.Encoder()
                out = [frames.PREFACE, frames.settings([])]
                body = pb.HealthCheckRequest(request_id=3, id=1).SerializeToString()
                for i in range(3000):
                    stream_id = 2 * i + 1
                    out.append(frames.frame(frames.HEADERS, frames.END_HEADERS, stream_id, request_headers(encoder)))
                    out.append(
                        frames.frame(frames.DATA, frames.END_STREAM, stream_id, wire.message_prefix(len(body)) + body)
                    )
                    out.append(frames.rst_stream(stream_id, frames.CANCEL))
                with contextlib.suppress(ConnectionError):
                    writer.write(b"".join(out))
                    await writer.drain()
                data = bytearray()
                with contextlib.suppress(ConnectionError, TimeoutError):
                    while chunk := await asyncio.wait_for(reader.read(1 << 16), 5):
                        data += chunk
                got, _ = frames.parse_frames(data, 1 << 24)
                goaways += any(
                    kind == frames.GOAWAY and payload[4:8] == frames.ENHANCE_YOUR_CALM.to_bytes(4, "big")
                    for kind, _, _, payload in got
                )
                writer.close()
            grown = rss(broker.proc.pid) - before
        assert goaways == 20
        assert grown < 64 * MiB, grown / MiB
        assert "h2 limit reset_burst tripped" in broker.log()


async def test_unfinished_large_messages_are_bounded_by_the_buffer_budget():
    """16 unfinished 64 MiB messages took 1 GiB; at the default limits one connection's
    unfinished messages stop at the 128 MiB budget + one 64 MiB message + the 32 MiB window."""
    with running_broker() as broker:
        async with health_calls(broker.target):
            before = rss(broker.proc.pid)
            reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
            conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
            conn.initiate_connection()
            ids = []
            for _ in range(16):
                stream_id = conn.get_next_available_stream_id()
                conn.send_headers(
                    stream_id,
                    [
                        (b":method", b"POST"),
                        (b":scheme", b"http"),
                        (b":path", HEALTH_PATH),
                        (b":authority", b"x"),
                        (b"content-type", b"application/grpc"),
                    ],
                )
                conn.send_data(stream_id, wire.message_prefix(64 * MiB - 16))
                ids.append(stream_id)
            sent = dict.fromkeys(ids, 0)
            chunk = b"\x00" * MiB
            quiet_since = time.monotonic()
            while time.monotonic() - quiet_since < 1.5:
                progressed = False
                for stream_id in ids:
                    with contextlib.suppress(h2.exceptions.StreamClosedError):
                        room = min(
                            conn.local_flow_control_window(stream_id),
                            conn.max_outbound_frame_size,
                            64 * MiB - 32 - sent[stream_id],
                        )
                        if room > 0:
                            conn.send_data(stream_id, chunk[:room])
                            sent[stream_id] += room
                            progressed = True
                writer.write(conn.data_to_send())
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    data = await asyncio.wait_for(reader.read(1 << 16), 0.1)
                    if not data:
                        break
                    conn.receive_data(data)
                if progressed:
                    quiet_since = time.monotonic()
            grown = rss(broker.proc.pid) - before
            total = sum(sent.values())
            writer.close()
            # Once the peer is gone, what it made the broker hold goes back (the heap is trimmed).
            deadline = time.monotonic() + 15
            while rss(broker.proc.pid) - before > 48 * MiB and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            left = rss(broker.proc.pid) - before
        assert left <= 48 * MiB, left / MiB
        assert total >= 128 * MiB  # it sent past the budget...
        # ...and the broker held no more than that: 224 MiB of request bytes, which the allocator
        # turns into up to about twice as much RSS (growing buffers, freed frames); 16 x 64 MiB
        # was the unbounded case.
        assert grown < 2 * (128 + 64 + 32) * MiB, grown / MiB


async def _unfinished_upload(port: int, streams: int, message: int, seconds: float):
    """One connection sending ``streams`` unary calls a ``message``-byte message each, as far as the
    broker's windows let it and never to the end; returns its writer and the bytes sent."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    sent = {}
    for _ in range(streams):
        stream_id = conn.get_next_available_stream_id()
        conn.send_headers(
            stream_id,
            [
                (b":method", b"POST"),
                (b":scheme", b"http"),
                (b":path", HEALTH_PATH),
                (b":authority", b"x"),
                (b"content-type", b"application/grpc"),
            ],
        )
        conn.send_data(stream_id, wire.message_prefix(message))
        sent[stream_id] = 0
    chunk = bytes(MiB)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for stream_id in sent:
            with contextlib.suppress(h2.exceptions.StreamClosedError):
                room = min(
                    conn.local_flow_control_window(stream_id),
                    conn.max_outbound_frame_size,
                    message - 1 - sent[stream_id],
                )
                if room > 0:
                    conn.send_data(stream_id, chunk[:room])
                    sent[stream_id] += room
        writer.write(conn.data_to_send())
        await writer.drain()
        with contextlib.suppress(TimeoutError):
            data = await asyncio.wait_for(reader.read(1 << 16), 0.1)
            if not data:
                break
            conn.receive_data(data)
    return writer, sum(sent.values())


async def test_unfinished_uploads_over_many_connections_hold_at_most_the_budget(tmp_path):
    """60 connections each sending 8 MiB of an unfinished 63 MiB message on 4 streams held 1,812 MiB
    under the 512 MiB budget (about 30 MiB a connection: windows granted up front); now window is
    granted from the budget, so 12 such connections under a 32 MiB budget hold about that (this
    process drives them and the health calls on one loop: more would starve its own client)."""
    config = tmp_path / "broker.yml"
    config.write_text(f"http2:\n  max_buffered_bytes_total: {32 * MiB}\n")
    with running_broker("--config", str(config)) as broker:
        async with health_calls(broker.target):
            before = rss(broker.proc.pid)
            peers = await asyncio.gather(*(_unfinished_upload(broker.port, 4, 63 * MiB, 3.0) for _ in range(12)))
            grown = rss(broker.proc.pid) - before
            sent = sum(p[1] for p in peers)
            for writer, _ in peers:
                writer.close()
            deadline = time.monotonic() + 15
            while rss(broker.proc.pid) - before > 32 * MiB and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            left = rss(broker.proc.pid) - before
        assert sent >= 16 * MiB, sent / MiB  # they got window, up to the budget...
        # ...and the broker held about the budget (32 MiB + 64 KiB a connection), which the allocator
        # turns into up to 2-2.5x as much RSS (77 MiB seen once on a fresh CI-like run); 12 x 32 MiB
        # windows were the unbounded case (the old code grew 256 MiB here), well above this bound.
        assert grown < 3 * (32 + 1) * MiB, grown / MiB
        assert left < 32 * MiB, left / MiB


async def test_streams_opened_over_many_connections_are_capped():
    """102,400 open streams over 100 connections took 915 MiB; now each connection gets 4,096 and
    the broker as a whole about 16,384 (its fair-share rule), and RSS stays small."""
    with running_broker() as broker:
        async with health_calls(broker.target):
            before = rss(broker.proc.pid)
            peers = []
            try:
                for _ in range(100):
                    reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
                    encoder = hpack.Encoder()
                    out = [frames.PREFACE, frames.settings([])]
                    for i in range(1024 if peers else 5000):  # the first peer goes past its own limit
                        out.append(
                            frames.frame(
                                frames.HEADERS,
                                frames.END_HEADERS,
                                2 * i + 1,
                                encoder.encode(
                                    [
                                        (b":method", b"POST"),
                                        (b":scheme", b"http"),
                                        (b":path", HEALTH_PATH),
                                        (b":authority", b"x"),
                                        (b"content-type", b"application/grpc"),
                                        (b"x-n", str(i).encode()),
                                    ]
                                ),
                            )
                        )
                    writer.write(b"".join(out))
                    await writer.drain()
                    if not peers:  # its own limit trips before the broker's total does
                        await async_wait_until(
                            lambda: "h2 limit max_concurrent_streams tripped" in broker.log(), timeout=30
                        )
                    peers.append((reader, writer))
                await asyncio.sleep(1.0)
                grown = rss(broker.proc.pid) - before
            finally:
                for _, writer in peers:
                    writer.close()
        assert grown < 160 * MiB, grown / MiB
        log = broker.log()
        assert "h2 limit max_concurrent_streams tripped" in log
        assert "h2 limit max_streams_total tripped" in log


# ---------------------------------------------------------------- full-length measurements (opt in)


async def test_a_fan_out_of_one_large_message_to_streams_that_do_not_read_stays_small():
    """One connection opened its windows, held 100 ReceiveMessages streams and never read; one
    8 MiB message took the broker from 57 MiB to 3,274 MiB (a copy of the message per stream,
    each queued whole for the socket).  Now the streams share the stored payload and the bytes
    queued for that connection are bounded: the broker grows by less than 64 MiB."""
    with running_broker() as broker:
        options = [("grpc.max_send_message_length", 64 * MiB)]
        async with grpc.aio.insecure_channel(broker.target, options=options) as channel:
            producers = pb_grpc.ProducerServiceStub(channel)
            consumers = pb_grpc.ConsumerServiceStub(channel)
            topic = "/default/fan-out"
            producer = await producers.CreateProducer(
                pb.ProducerRequest(request_id=1, producer_name="p", topic_name=topic), timeout=30
            )
            ids = [
                (
                    await consumers.Subscribe(
                        pb.ConsumerRequest(
                            request_id=i,
                            topic_name=topic,
                            consumer_name=f"c{i}",
                            subscription=f"s{i}",
                            subscription_type=pb.ConsumerRequest.Exclusive,
                        ),
                        timeout=30,
                    )
                ).consumer_id
                for i in range(100)
            ]
            async with health_calls(broker.target):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.setblocking(False)
                loop = asyncio.get_running_loop()
                await loop.sock_connect(sock, ("127.0.0.1", broker.port))
                encoder = hpack.Encoder()
                out = [
                    frames.PREFACE,
                    frames.settings([(frames.INITIAL_WINDOW_SIZE, 2**31 - 1), (frames.MAX_FRAME_SIZE, 2**24 - 1)]),
                    frames.window_update(0, 2**31 - 1 - 65535),
                ]
                for n, consumer_id in enumerate(ids):
                    body = pb.ReceiveRequest(request_id=1, consumer_id=consumer_id).SerializeToString()
                    out.append(
                        frames.frame(
                            frames.HEADERS,
                            frames.END_HEADERS,
                            2 * n + 1,
                            request_headers(encoder, b"/danube.ConsumerService/ReceiveMessages"),
                        )
                    )
                    out.append(
                        frames.frame(frames.DATA, frames.END_STREAM, 2 * n + 1, wire.message_prefix(len(body)) + body)
                    )
                try:
                    await loop.sock_sendall(sock, b"".join(out))
                    await asyncio.sleep(1.0)
                    before = rss(broker.proc.pid)
                    await producers.SendMessage(
                        pb.StreamMessage(
                            request_id=2,
                            msg_id=pb.MsgID(producer_id=producer.producer_id, topic_name=topic),
                            payload=bytes(8 * MiB),
                            publish_time=1,
                        ),
                        timeout=30,
                    )
                    peak = 0
                    for _ in range(30):
                        peak = max(peak, rss(broker.proc.pid))
                        await asyncio.sleep(0.1)
                finally:
                    sock.close()
        assert peak - before < 64 * MiB, (peak - before) / MiB


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_concurrent_admin_listings_do_not_starve_the_client_port():
    """1,000 concurrent `topics list` calls on a 1,000-topic broker took 31 s of CPU and failed the
    client port's health check; now concurrent listings share one build (started after they
    arrived, so none misses a topic), and 1,000 calls on 200 topics cost about a second."""
    with running_broker() as broker:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.admin_port}") as channel:
            topics = admin_grpc.TopicAdminStub(channel)
            names = [f"/default/listed-{i:03d}" for i in range(200)]
            for group in range(0, len(names), 20):
                await asyncio.gather(
                    *(
                        topics.CreateTopic(admin_pb.NewTopicRequest(name=n), timeout=30)
                        for n in names[group : group + 20]
                    )
                )
            async with health_calls(broker.target):
                spent = cpu_seconds(broker.proc.pid)
                got = await asyncio.gather(
                    *(
                        topics.ListNamespaceTopics(admin_pb.NamespaceRequest(name="default"), timeout=60)
                        for _ in range(1000)
                    )
                )
                spent = cpu_seconds(broker.proc.pid) - spent
            assert all(sorted(t.name for t in r.topics) == names for r in got)
            await topics.CreateTopic(admin_pb.NewTopicRequest(name="/default/listed-new"), timeout=30)
            listed = await topics.ListNamespaceTopics(admin_pb.NamespaceRequest(name="default"), timeout=30)
            assert "/default/listed-new" in {t.name for t in listed.topics}
        assert spent < 3, spent


async def _flood(port: int, payload: bytes, seconds: float, *, read: bool, reconnect: bool) -> tuple[int, int]:
    """Sends ``payload`` over and over for ``seconds`` (on new connections when the broker hangs
    up and ``reconnect``); how many times it went out, and over how many connections."""
    sent = connections = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        connections += 1
        drain = asyncio.ensure_future(_discard(reader)) if read else None
        try:
            writer.write(frames.PREFACE + frames.settings([]))
            while time.monotonic() < deadline and not reader.at_eof() and not writer.is_closing():
                writer.write(payload)
                await asyncio.wait_for(writer.drain(), max(0.01, deadline - time.monotonic()))
                sent += 1
        except (ConnectionError, TimeoutError):
            pass
        finally:
            if drain is not None:
                drain.cancel()
            writer.close()
        if not reconnect:
            break
    return sent, connections


async def _discard(reader) -> None:
    with contextlib.suppress(ConnectionError):
        while await reader.read(1 << 16):
            pass


def _rapid_reset_payload(pairs: int) -> bytes:
    encoder = hpack.Encoder()
    body = pb.HealthCheckRequest(request_id=3, id=1).SerializeToString()
    out = []
    for i in range(pairs):
        out.append(frames.frame(frames.HEADERS, frames.END_HEADERS, 2 * i + 1, request_headers(encoder)))
        out.append(frames.frame(frames.DATA, frames.END_STREAM, 2 * i + 1, wire.message_prefix(len(body)) + body))
        out.append(frames.rst_stream(2 * i + 1, frames.CANCEL))
    return b"".join(out)


def _continuation_payload() -> bytes:
    return (
        frames.frame(frames.HEADERS, 0, 1, request_headers(hpack.Encoder()))
        + frames.frame(frames.CONTINUATION, 0, 1) * 20000
    )


MEASURED = {
    # name: (payload, seconds, read, reconnect)
    "rapid reset (HEADERS+DATA+RST_STREAM pairs)": (lambda: _rapid_reset_payload(5000), 20, True, True),
    "empty CONTINUATION frames": (_continuation_payload, 10, True, True),
    "SETTINGS flood, socket not read": (lambda: frames.settings([]) * 8000, 10, False, True),
    "PING flood, replies read": (lambda: frames.frame(frames.PING, 0, 0, b"pingpong") * 4000, 10, True, True),
    "SETTINGS of 2,000 INITIAL_WINDOW_SIZE entries": (
        lambda: frames.settings([(frames.INITIAL_WINDOW_SIZE, 1000 + i) for i in range(2000)]),
        10,
        True,
        True,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MEASURED))
async def test_measure_attack(name):
    """Each attack at full length against a broker at its defaults: RSS growth and the
    HealthCheck calls answered meanwhile (printed; run with -m slow -s)."""
    make, seconds, read, reconnect = MEASURED[name]
    payload = make()
    with running_broker() as broker:
        async with health_calls(broker.target) as health:
            before = rss(broker.proc.pid)
            peak = before

            async def watch():
                nonlocal peak
                while True:
                    peak = max(peak, rss(broker.proc.pid))
                    await asyncio.sleep(0.05)

            watcher = asyncio.ensure_future(watch())
            try:
                sent, connections = await _flood(broker.port, payload, seconds, read=read, reconnect=reconnect)
            finally:
                watcher.cancel()
            await asyncio.sleep(1.0)
            after = rss(broker.proc.pid)
        trips = sorted(
            {line.split("h2 limit ")[1].split()[0] for line in broker.log().splitlines() if "h2 limit " in line}
        )
        print(
            f"\n{name}: {seconds} s, payload x{sent} over {connections} connection(s); RSS {before / MiB:.0f} MiB -> peak {peak / MiB:.0f}, "
            f"after {after / MiB:.0f}; health calls {health['ok']} ok, {len(health['failed'])} failed; "
            f"limits tripped: {', '.join(trips) or 'none'}"
        )
        assert peak - before < 128 * MiB
