"""The real danube-client 0.5.0 with more consumers than a connection used to carry.

The client keeps one gRPC channel, so one HTTP/2 connection, per broker, and every consumer holds a
ReceiveMessages stream on it for good; its transport honours the broker's
SETTINGS_MAX_CONCURRENT_STREAMS by holding further calls until a stream ends.  With the old limit
of 256 a client with 256 consumers could not send, ack or health-check any more; the default is now
4,096 (``http2.max_concurrent_streams``, docs/broker.md).

Each test starts its own broker and runs tests/e2e/danube_client_scripts/many_consumers.py in the
client's venv.
"""

from __future__ import annotations

import asyncio
import time

import hpack
import pytest

from danube.server.h2grpc import frames
from tests.support import danube_client_venv as dc
from tests.support.broker import running_broker

pytestmark = pytest.mark.timeout(300)

HEALTH_PATH = b"/danube.HealthCheck/HealthCheck"


@pytest.fixture(scope="session")
def client_python():
    try:
        return dc.ensure_venv()
    except Exception as exc:  # noqa: BLE001 - no network / no package index
        pytest.skip(f"danube-client venv not available: {exc}")


def config_with_limit(tmp_path, limit: int) -> str:
    path = tmp_path / "broker.yml"
    path.write_text(f"http2:\n  max_concurrent_streams: {limit}\n")
    return str(path)


def many_consumers(broker, topics: int, subscriptions: int, seconds: float) -> dict:
    return dc.run_script(
        "many_consumers.py",
        broker.url,
        "/default/wide",
        "--topics",
        str(topics),
        "--subscriptions",
        str(subscriptions),
        "--messages",
        "2",
        "--seconds",
        str(seconds),
        timeout=seconds + 120,
    )


def assert_every_consumer_received_its_topic(result: dict, topics: int, subscriptions: int) -> None:
    assert result["error"] is None, result["error"]
    assert (result["producers"], result["subscribed"], result["sent"]) == (topics, topics * subscriptions, 2 * topics)
    assert result["complete"] == topics * subscriptions
    for t in range(topics):
        for s in range(subscriptions):
            topic = f"/default/wide-{t}"
            assert result["received"][f"{topic}|s{s}"] == [f"{topic}:0", f"{topic}:1"]
    assert result["connections"] == 1  # the library's one connection carried them all


def h2_trips(log: str) -> list[str]:
    return [line for line in log.splitlines() if "h2 limit" in line]


async def open_streams(port: int, count: int) -> tuple[int | None, list]:
    """A raw HTTP/2 client that ignores the server's limit: ``count`` HealthCheck calls whose
    requests never finish (so each stream stays open), then a PING.  Returns the advertised
    SETTINGS_MAX_CONCURRENT_STREAMS and the frames received until the PING's answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        encoder = hpack.Encoder()
        out = [frames.PREFACE, frames.settings([])]
        for i in range(count):
            block = encoder.encode(
                [
                    (b":method", b"POST"),
                    (b":scheme", b"http"),
                    (b":path", HEALTH_PATH),
                    (b":authority", b"x"),
                    (b"content-type", b"application/grpc"),
                ]
            )
            out.append(frames.frame(frames.HEADERS, frames.END_HEADERS, 2 * i + 1, block))
        out.append(frames.frame(frames.PING, 0, 0, b"lastping"))
        writer.write(b"".join(out))
        buffer, got = bytearray(), []
        while not any(f[0] == frames.PING and f[1] & frames.ACK for f in got):
            chunk = await asyncio.wait_for(reader.read(65536), 15)
            if not chunk:
                break
            buffer += chunk
            parsed, used = frames.parse_frames(buffer, 1 << 24)
            del buffer[:used]
            got += parsed
        settings = next(payload for kind, flags, _, payload in got if kind == frames.SETTINGS and not flags)
        return dict(frames.parse_settings(settings)).get(frames.MAX_CONCURRENT_STREAMS), got
    finally:
        writer.close()


def test_one_client_carries_300_consumers_and_their_producers_on_one_connection(client_python):
    """100 topics, 3 subscriptions each, a producer per topic, all in one client: every consumer
    subscribes and gets its topic's messages, acked, over the one connection."""
    with running_broker("--sync", "never") as broker:
        advertised, _ = asyncio.run(open_streams(broker.port, 0))
        assert advertised == 4096
        result = many_consumers(broker, topics=100, subscriptions=3, seconds=120)
        assert_every_consumer_received_its_topic(result, 100, 3)
        assert h2_trips(broker.log()) == []


def test_a_configured_limit_is_advertised_and_a_stream_past_it_refused(client_python, tmp_path):
    """RFC 9113 5.1.2: the limit goes out in SETTINGS; a client that opens a stream past it gets
    RST_STREAM REFUSED_STREAM for that stream alone.  The danube-client does not go past it: its
    transport holds the calls beyond it, so with more consumers than the limit it stalls."""
    with running_broker("--sync", "never", "--config", config_with_limit(tmp_path, 8)) as broker:
        advertised, got = asyncio.run(open_streams(broker.port, 9))
        assert advertised == 8
        resets = [
            (stream_id, int.from_bytes(p[:4], "big")) for kind, _, stream_id, p in got if kind == frames.RST_STREAM
        ]
        assert resets == [(17, frames.REFUSED_STREAM)]  # the 9th stream; the first 8 stay open
        assert not any(kind == frames.GOAWAY for kind, *_ in got)
        deadline = time.monotonic() + 10
        while not any("max_concurrent_streams" in line for line in h2_trips(broker.log())):
            assert time.monotonic() < deadline, broker.log()
            time.sleep(0.05)

        # 9 consumers hold all 8 streams and one more waits: sends and acks wait behind it for good
        # (which of them got a stream before the receive streams took them all is a race).
        result = many_consumers(broker, topics=3, subscriptions=3, seconds=8)
        assert result["subscribed"] == 9, result
        assert result["error"] in ("sending: not done within 8.0s", "receiving: not done within 8.0s"), result
        assert result["complete"] < 9
        # the client never went past the limit: the only refusal is the raw client's
        assert sum("max_concurrent_streams" in line for line in h2_trips(broker.log())) == 1


@pytest.mark.slow
def test_at_the_old_limit_of_256_the_same_client_stalls(client_python, tmp_path):
    """What 300 consumers in one client did before the default was raised (about 30 s)."""
    with running_broker("--sync", "never", "--config", config_with_limit(tmp_path, 256)) as broker:
        result = many_consumers(broker, topics=100, subscriptions=3, seconds=20)
        assert result["subscribed"] == 300
        assert result["error"] in ("sending: not done within 20.0s", "receiving: not done within 20.0s"), result
        assert result["complete"] < 300
        assert h2_trips(broker.log()) == []  # held by the client, never refused


@pytest.mark.slow
def test_a_client_closing_1200_consumers_at_once_keeps_its_connection(client_python):
    """More consumers than the reset budget's burst (1,000), closed together: ending streams held
    for a while is not Rapid Reset (about 40 s)."""
    with running_broker("--sync", "never") as broker:
        result = many_consumers(broker, topics=300, subscriptions=4, seconds=200)
        assert_every_consumer_received_its_topic(result, 300, 4)
        time.sleep(2)  # the client's resets reach the broker after the script has printed
        assert h2_trips(broker.log()) == []
