"""Hostile input end to end: hostile topic and client names, poison frames, oversized names.

Through the real clients against a broker subprocess: Danube's `danube-client` 0.5.0 (its
own venv), the project's `danube.client` and `danube admin`.  Every case lists the file tree
around the data directory before and after and asserts nothing appeared outside a topic's
own directory.
"""

from __future__ import annotations

import asyncio
import os
import struct
import subprocess
import sys
import time

import grpc
import pytest

from danube import message_codec
from danube.client import DanubeClient, SubType
from danube.errors import InvalidArgumentError
from danube.proto.danube_batch import batch_pb2 as bpb
from danube.proto.danube_batch import batch_pb2_grpc as bpb_grpc
from danube.wal import Wal
from tests.support import danube_client_venv as dc
from tests.support.broker import running_broker

pytestmark = pytest.mark.timeout(300)

HOSTILE_TOPICS = ["/../..", "/./..", "/../x", "/default/..", "/default/."]
HOSTILE_NAMES = ["..", ".", ".hidden", "a/b", "a\nb"]
# Written by the broker on its own while a test runs: its log, the metadata store, the load
# reports' system topic.  Anything else new must be inside the topic directory a test names.
BROKER_OWN = ("data/broker.log", "data/metadata", "data/wal/system", "data/durable/system")


@pytest.fixture(scope="module")
def client_python():
    try:
        return dc.ensure_venv()
    except Exception as exc:  # noqa: BLE001 - no network / no package index
        pytest.skip(f"danube-client venv not available: {exc}")


@pytest.fixture()
def box(tmp_path):
    """A directory holding the broker's data dir, so writes into the data dir's parent show."""
    (tmp_path / "box" / "data").mkdir(parents=True)
    return tmp_path / "box"


@pytest.fixture()
def broker(box):
    with running_broker(data_dir=str(box / "data")) as b:
        yield b


def tree(root) -> set[str]:
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for entry in dirnames + filenames:
            out.add(os.path.relpath(os.path.join(dirpath, entry), root))
    return out


def new_entries(before: set[str], after: set[str], *allowed: str) -> list[str]:
    """Entries that appeared, except the broker's own files and the ``allowed`` directories
    (and their contents; their parents are allowed to appear with them)."""

    def ok(path: str) -> bool:
        for prefix in (*BROKER_OWN, *allowed):
            if path == prefix or path.startswith(prefix) or prefix.startswith(path + os.sep):
                return True
        return False

    return sorted(p for p in after - before if not ok(p))


def create_producer(broker, topic, *args) -> dict:
    return dc.run_script("create_producer.py", broker.url, topic, *args)


def run_admin(broker, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "danube.cli.main",
            "admin",
            "--endpoint",
            f"http://127.0.0.1:{broker.admin_port}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def raw_frame(key: bytes | None, attrs=(), *, producer_id: int = 0, payload: bytes = b"p") -> bytes:
    """A checksum-valid frame with any bytes as key and attributes (the encoders take only text)."""
    body = bytearray(
        struct.pack("<QQBBHH", 1, producer_id, 1 if key is not None else 0, 0, len(attrs), len(key or b""))
    )
    body += key or b""
    for name, value in attrs:
        body += struct.pack("<H", len(name)) + name + struct.pack("<I", len(value)) + value
    body += payload
    len_field = struct.pack("<I", len(body))
    return (
        struct.pack("<QI", 0, message_codec.crc32c(bytes(body), message_codec.crc32c(len_field)))
        + len_field
        + bytes(body)
    )


# ---------------------------------------------------------------- names: danube-client


@pytest.mark.parametrize("topic", HOSTILE_TOPICS)
def test_danube_client_producer_on_a_hostile_topic_is_refused_and_writes_nothing(client_python, broker, box, topic):
    before = tree(box)
    result = create_producer(broker, topic, "--reliable")
    assert result["error"] is not None and result["error"].startswith("INVALID_ARGUMENT: "), result
    assert "invalid topic name" in result["error"]
    assert new_entries(before, tree(box)) == []


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_danube_client_hostile_producer_and_subscription_names_are_refused(client_python, broker, box, name):
    create_producer(broker, "/default/names", "--reliable")  # the topic exists
    before = tree(box)
    result = create_producer(broker, "/default/names", "--reliable", "--name", name)
    assert result["error"] is not None and result["error"].startswith("INVALID_ARGUMENT: invalid producer name")
    consumed = dc.run_script("consume.py", broker.url, "/default/names", name, "--idle-timeout", "1")
    assert consumed["error"].startswith("INVALID_ARGUMENT: invalid subscription name"), consumed
    assert new_entries(before, tree(box), "data/wal/default/names") == []


def test_danube_client_gets_a_short_status_for_a_100kb_name(client_python, broker, box, tmp_path):
    huge = tmp_path / "huge"
    huge.write_text("/default/" + "x" * 100_000, encoding="utf-8")
    before = tree(box)
    result = create_producer(broker, "ignored", "--topic-file", str(huge), "--reliable")
    assert result["error"].startswith("INVALID_ARGUMENT: invalid topic name '/default/xxx"), result["error"][:200]
    assert result["details_bytes"] < 1024 and "(100009 bytes)" in result["error"]
    huge.write_text("p" * 100_000, encoding="utf-8")
    result = create_producer(broker, "/default/huge-name", "--name-file", str(huge), "--reliable")
    assert result["error"].startswith("INVALID_ARGUMENT: invalid producer name"), result["error"][:200]
    assert result["details_bytes"] < 1024
    assert new_entries(before, tree(box), "data/wal/default/huge-name") == []


# ---------------------------------------------------------------- names: danube.client


async def _own_client_attempts(url: str) -> list[str]:
    client = DanubeClient.builder().service_url(url).build()
    refused = []
    try:
        for topic in HOSTILE_TOPICS:
            producer = client.new_producer().with_topic(topic).with_name("p").build()
            with pytest.raises(InvalidArgumentError, match="invalid topic name"):
                await producer.create()
            refused.append(topic)
        good = client.new_producer().with_topic("/default/own").with_name("p").build()
        await good.create()
        await good.close()
        for name in HOSTILE_NAMES:
            consumer = (
                client.new_consumer()
                .with_topic("/default/own")
                .with_consumer_name("c")
                .with_subscription(name)
                .with_subscription_type(SubType.Shared)
                .build()
            )
            with pytest.raises(InvalidArgumentError, match="invalid subscription name"):
                await consumer.subscribe()
            consumer = (
                client.new_consumer()
                .with_topic("/default/own")
                .with_consumer_name(name)
                .with_subscription("s")
                .with_subscription_type(SubType.Shared)
                .build()
            )
            with pytest.raises(InvalidArgumentError, match="invalid consumer name"):
                await consumer.subscribe()
            refused.append(name)
    finally:
        await client.close()
    return refused


def test_danube_client_of_this_project_is_refused_the_same_way(broker, box):
    before = tree(box)
    refused = asyncio.run(_own_client_attempts(broker.url))
    assert refused == HOSTILE_TOPICS + HOSTILE_NAMES
    assert new_entries(before, tree(box), "data/wal/default/own") == []


# ---------------------------------------------------------------- names: danube admin


@pytest.mark.parametrize("topic", HOSTILE_TOPICS)
def test_admin_unload_of_a_hostile_topic_is_refused(broker, box, topic):
    before = tree(box)
    done = run_admin(broker, "topics", "unload", topic)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "invalid_argument: invalid topic name" in done.stderr.lower()
    after = tree(box)
    assert new_entries(before, after) == [] and new_entries(after, before) == []  # nothing new, nothing gone


def test_admin_unload_of_default_dot_leaves_every_topic_of_the_namespace(client_python, box):
    """The reported data loss: `/default/.` unloaded rmtree'd data/wal/default."""
    with running_broker(data_dir=str(box / "data")) as b:
        dc.run_script("produce.py", b.url, "/default/victim", "--count", "1", "--reliable", "--prefix", "warm")
        # the subscription exists before the 50 (a new one starts at the latest offset)
        dc.run_script("consume.py", b.url, "/default/victim", "keep", "--idle-timeout", "0.5")
        sent = dc.run_script("produce.py", b.url, "/default/victim", "--count", "50", "--reliable")["sent"]
        before = tree(box)
        for topic in ("/default/.", "/default/..", "/../.."):
            done = run_admin(b, "topics", "unload", topic)
            assert done.returncode == 1 and "invalid topic name" in done.stderr
        assert tree(box) >= {p for p in before if p.startswith("data/wal/default/victim")}
        b.restart()
        got = dc.run_script("consume.py", b.url, "/default/victim", "keep", "--count", "50", "--idle-timeout", "10")
        assert [r[0] for r in got["received"]] == sent, got["error"]
        opened = [line for line in b.log().splitlines() if "/default/victim: storage open" in line]
        assert opened and "recovered from empty" not in opened[-1], opened


# ---------------------------------------------------------------- the poison frame


def _publish_raw(broker, producer_id: int | None, buf: bytes) -> bpb.PublishAck:
    async def go():
        async with grpc.aio.insecure_channel(broker.target) as channel:
            stub = bpb_grpc.BatchLaneStub(channel)
            if producer_id is None:
                spec = bpb.ProducerSpec(topic="/default/poison", producer_name="raw", reliable=True)
                request = bpb.PublishRequest(sequence=1, create=spec, frames=buf)
            else:
                request = bpb.PublishRequest(sequence=1, producer_id=producer_id, frames=buf)

            async def one():
                yield request

            return [ack async for ack in stub.Publish(one())][0]

    return asyncio.run(go())


@pytest.mark.parametrize(
    "bad",
    [
        raw_frame(b"\xff\xfe"),
        raw_frame(b"k", [(b"\xc3\x28", b"v")]),
        raw_frame(b"k", [(b"n", b"\xed\xa0\x80")]),
        raw_frame(b"k", producer_id=2**64 - 1),
    ],
    ids=["key", "attribute-name", "attribute-value", "producer-id"],
)
def test_a_poison_frame_is_refused_whole_and_the_topic_stays_readable(client_python, broker, box, tmp_path, bad):
    first = _publish_raw(broker, None, message_codec.encode_payloads([b"m0"], publish_time=1))
    assert first.status.code == 0 and first.count == 1, first
    ready = tmp_path / "subscribed"
    proc = dc.start_script(
        "consume.py",
        broker.url,
        "/default/poison",
        "s",
        "--count",
        "2",
        "--idle-timeout",
        "15",
        "--ready-file",
        str(ready),
    )
    deadline = time.monotonic() + 30
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # subscribed (a new subscription starts at the latest offset)
    before = tree(box)
    good = message_codec.encode_payloads([b"m1"], publish_time=1)
    ack = _publish_raw(broker, first.producer_id, good + bad + good)
    assert ack.status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0], ack
    assert "batch refused, nothing stored: frame 1" in ack.status.message
    ack = _publish_raw(broker, first.producer_id, message_codec.encode_payloads([b"m2", b"m3"], publish_time=1))
    assert ack.status.code == 0 and (ack.first_offset, ack.last_offset) == (1, 2)
    out, err = proc.communicate(timeout=60)
    result = dc.parse_result("consume.py", proc.returncode, out, err)
    assert [r[0] for r in result["received"]] == ["m2", "m3"], (result, err[-2000:])
    assert new_entries(before, tree(box), "data/wal/default/poison") == []


def test_a_poison_record_already_stored_goes_to_the_failure_policy(client_python, box, tmp_path):
    """A record stored before publish checked it: delivery drops it (poison_policy drop) and
    goes on instead of failing every retry with UNKNOWN."""
    config = tmp_path / "broker.yml"
    config.write_text("failure_policy:\n  poison_policy: drop\n", encoding="utf-8")
    with running_broker("--config", str(config), data_dir=str(box / "data")) as b:
        dc.run_script("produce.py", b.url, "/default/stored", "--count", "1", "--reliable", "--prefix", "a")
        proc = dc.start_script("consume.py", b.url, "/default/stored", "s", "--count", "1", "--idle-timeout", "2")
        proc.communicate(timeout=60)  # the subscription exists, cursor at offset 0
        b.stop()
        with Wal.open(os.path.join(b.data_dir, "wal", "default", "stored")) as wal:
            assert wal.append_frames(bytearray(raw_frame(b"\xff\xfe", payload=b"poison"))) == (1, 1)
        b.start()
        dc.run_script("produce.py", b.url, "/default/stored", "--count", "2", "--reliable", "--prefix", "b")
        got = dc.run_script("consume.py", b.url, "/default/stored", "s", "--count", "2", "--idle-timeout", "10")
        assert got["error"] is None
        assert [r[0] for r in got["received"]] == ["b-0", "b-1"]
        assert [r[2] for r in got["received"]] == [2, 3]
        assert "message 1 of /default/stored cannot be delivered on subscription s" in b.log()
