"""Load reports on a broker: LoadReports on /system/load_reports, read back by an ordinary consumer.

The server starts the reporter (danube.server.app, tests/unit/server/test_app_load_reports.py);
here one runs against a BrokerService directly."""

import asyncio

import pytest

from danube import message_codec
from danube.cluster.load_report import LOAD_REPORTS_TOPIC, REPORT_ATTRIBUTES, LoadReport, LoadReporter
from danube.errors import FrameFormatError, InvalidArgumentError, NotFoundError
from tests.unit.broker.conftest import stop

pytestmark = pytest.mark.timeout(30)
T = "/default/loaded"


async def _reports(broker, cid, want, timeout=10.0):
    """Receive LoadReports (acking them) until ``want(report)`` holds; returns every report seen."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    seen = []
    while True:
        remaining = deadline - loop.time()
        assert remaining > 0, f"no matching load report in {timeout} s; saw {seen[-3:]}"
        d = await asyncio.wait_for(broker.receive(cid, max_messages=100, max_bytes=1 << 20), remaining)
        records = list(message_codec.iter_records(d.frames))
        await broker.ack(cid, [r.offset for r in records])
        for r in records:
            assert r.routing_key == broker.broker_id
            assert dict(r.attributes) == REPORT_ATTRIBUTES
            seen.append(LoadReport.from_json(r.payload))
        if any(want(rep) for rep in seen):
            return seen


def _topic(report, name):
    return next((t for t in report.topics if t.topic_name == name), None)


async def test_reports_carry_the_broker_id_and_per_topic_counters(make_broker):
    b = await make_broker(broker_id="broker-7")
    reporter = LoadReporter(b, 0.2)
    reporter.start()
    try:
        assert reporter.running
        # the first report is written at start; the system topic is then an ordinary reliable topic
        for _ in range(200):
            if LOAD_REPORTS_TOPIC in b.topics:
                break
            await asyncio.sleep(0.02)
        assert b.topics[LOAD_REPORTS_TOPIC].reliable
        reader = await b.subscribe(LOAD_REPORTS_TOPIC, "reader", "r", reliable=None)

        pid = await b.create_producer(T, "p", reliable=True)
        await b.subscribe(T, "s", "slow")  # never acks: its backlog is what was published
        # a report that saw the topic before anything was published: the baseline of its rates
        await _reports(b, reader, lambda rep: _topic(rep, T) is not None)
        await b.publish(pid, bytearray(message_codec.encode_payloads([b"x" * 100] * 50)))

        seen = await _reports(b, reader, lambda rep: _topic(rep, T).backlog_messages == 50)
        assert {rep.broker_id for rep in seen} == {"broker-7"}
        report = seen[-1]
        t = _topic(report, T)
        assert (t.producer_count, t.consumer_count, t.subscription_count) == (1, 1, 1)
        # the interval of this report covers the publish: 50 messages of > 100 bytes
        assert t.message_rate > 0 and t.byte_rate >= 100 * t.message_rate
        assert report.total_lag_messages == 50
        assert report.total_message_rate >= t.message_rate
        assert reporter.failures == 0
    finally:
        await reporter.stop()
        await stop(b)
    assert not reporter.running


async def test_stats_are_keyed_by_topic_with_the_reporter_counter_names(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    await broker.subscribe(T, "s", "c")
    data = bytearray(message_codec.encode_payloads([b"a", b"bb"]))
    nbytes = len(data)
    await broker.publish(pid, data)
    stats = broker.stats()
    assert list(stats.topics) == [T]
    t = stats.topics[T]
    assert (
        t.messages_in_total,
        t.bytes_in_total,
        t.producer_count,
        t.consumer_count,
        t.subscription_count,
        t.backlog_messages,
    ) == (2, nbytes, 1, 1, 1, 2)


async def test_publish_system_creates_a_reliable_topic_without_a_producer(broker):
    frames_buf = bytearray(message_codec.encode_payloads([b"one", b"two"], key="k"))
    assert await broker.publish_system("/system/things", frames_buf) == (0, 1)
    t = broker.topics["/system/things"]
    assert t.reliable and t.producers == {}
    assert await broker.publish_system("/system/things", bytes(message_codec.encode_payloads([b"three"]))) == (2, 2)
    cid = await broker.subscribe("/system/things", "s", "c", reliable=None)
    assert cid and broker.stats().topics["/system/things"].messages_in_total == 3


async def test_publish_system_rejects_other_topics_and_bad_frames(broker):
    with pytest.raises(InvalidArgumentError, match="not a system topic"):
        await broker.publish_system("/default/t", bytearray(message_codec.encode_payloads([b"x"])))
    with pytest.raises(NotFoundError):
        await broker.subscribe("/default/t", "s", "c", reliable=None)  # nothing was created
    bad = bytearray(message_codec.encode_payloads([b"x"]))
    bad[-1] ^= 0xFF
    with pytest.raises(FrameFormatError):
        await broker.publish_system("/system/things", bad)
    assert await broker.publish_system("/system/things", bytearray(message_codec.encode_payloads([b"ok"]))) == (0, 0)


async def test_the_broker_does_not_report_on_itself(make_broker):
    b = await make_broker()
    await asyncio.sleep(0.1)
    assert LOAD_REPORTS_TOPIC not in b.topics
    await stop(b)
