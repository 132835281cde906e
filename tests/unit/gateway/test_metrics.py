"""The gateway's metrics: the exposition parser, histogram quantiles, the bounded embedded history's
rates, and the series bounds."""

from __future__ import annotations

import pytest

from danube.errors import InvalidArgumentError
from danube.gateway.metrics import (
    MAX_SERIES_POINTS,
    History,
    TopicSample,
    clamp_range,
    metrics_page_url,
    parse_exposition,
    parse_step,
    quantile,
)
from danube.server.metrics import PrometheusMetrics


def test_parse_exposition_reads_what_the_broker_exports():
    from prometheus_client import generate_latest

    m = PrometheusMetrics()
    m.published("/default/a", 10, 1000, 2.0)
    m.published("/default/a", 5, 500, 40.0)
    m.delivered("/default/a", "s1", 7, 700)
    m.delivered("/default/a", "s2", 3, 300)
    m.acked("/default/a", "s1", 4)
    text = generate_latest(m.registry).decode()
    sample = parse_exposition(text, "http://x/metrics", 1.0)
    t = sample.topics["/default/a"]
    assert (t.msg_in, t.bytes_in, t.msg_out, t.bytes_out) == (15, 1500, 10, 1000)
    assert t.subscriptions["s1"]["acks_total"] == 4
    assert sample.totals()["bytes_in_total"] == 1500
    assert 0 < quantile(t.latency_buckets, 0.5) <= quantile(t.latency_buckets, 0.99)


def test_quantile_interpolates_inside_a_bucket():
    buckets = [(1.0, 0), (2.0, 10), (4.0, 20), (float("inf"), 20)]
    assert quantile(buckets, 0.5) == 2.0
    assert quantile(buckets, 0.75) == 3.0
    assert quantile([], 0.5) == 0.0


def _sample(msg_in: float, backlog: float = 0) -> TopicSample:
    return TopicSample(msg_in=msg_in, msg_out=msg_in / 2, bytes_in=msg_in * 10, backlog=backlog)


def test_history_rates_over_the_last_minute_and_counter_restarts():
    h = History(retention_s=600, interval_s=5, max_topics=10)
    for i in range(30):  # 10 messages/s for 150 s
        h.record(1000 + 5 * i, {"/d/t": _sample(50 * i, backlog=i)})
    s = h.series("/d/t", 1100, 1145, 5)
    assert all(v == pytest.approx(10.0) for _, v in s["publish_rate_1m"])
    assert all(v == pytest.approx(5.0) for _, v in s["dispatch_rate_1m"])
    assert [t for t, _ in s["backlog_messages"]] == list(range(1100, 1146, 5))
    h.record(1150, {"/d/t": _sample(20)})  # the topic moved: its counter starts again
    assert h.series("/d/t", 1150, 1150, 5)["publish_rate_1m"][-1][1] >= 0


def test_history_is_bounded_in_topics_and_points():
    h = History(retention_s=20, interval_s=1, max_topics=3)
    for i in range(100):
        h.record(float(i), {f"/d/t{i % 5}": _sample(i)})
    assert len(h) == 3
    assert all(len(ring) <= h.max_points for ring in h._topics.values())
    h.record(1000.0, {"/d/new": _sample(1)})  # everything else is older than the retention
    assert len(h) == 1


def test_series_bounds_and_steps():
    assert parse_step("15s") == 15 and parse_step("1m") == 60 and parse_step("2") == 2
    for bad in ("0s", "-1m", "abc", "1x"):
        with pytest.raises(InvalidArgumentError):
            parse_step(bad)
    start, end = clamp_range(0, 10**12, 60, now=100_000)
    assert (start, end) == (100_000 - 24 * 3600, 100_000)
    with pytest.raises(InvalidArgumentError, match="points"):
        clamp_range(0, 10**12, 24 * 3600 / (MAX_SERIES_POINTS * 2), now=100_000)
    assert metrics_page_url("0.0.0.0:9040") == "http://127.0.0.1:9040/metrics"


def test_parse_exposition_reads_calls_errors_and_wal_syncs_and_the_hub_rates_calls(monkeypatch):
    """What the broker exports about its calls and WAL syncs, as the gateway's pages read it."""
    import asyncio
    import types

    import grpc
    from prometheus_client import generate_latest

    from danube.gateway.metrics import MetricsHub
    from danube.wal.flushstats import FlushLatency

    m = PrometheusMetrics()
    for code, n in (
        (grpc.StatusCode.OK, 7),
        (grpc.StatusCode.INVALID_ARGUMENT, 2),
        (grpc.StatusCode.INTERNAL, 1),
        (grpc.StatusCode.UNIMPLEMENTED, 1),
        (grpc.StatusCode.CANCELLED, 4),
    ):
        for _ in range(n):
            m.rpc.observe("/danube.ProducerService/SendMessage", code)
    latency = FlushLatency()
    for ms in (0.3, 0.4, 0.4, 2.0):
        latency.record(ms)
    wal = types.SimpleNamespace(flush_latency=latency, sync_count=4, next_offset=9, first_offset=0, durable_offset=8)
    topic = types.SimpleNamespace(
        name="/default/a",
        reliable=True,
        storage=types.SimpleNamespace(wal=wal, next_offset=9, first_offset=0),
        stats=lambda: types.SimpleNamespace(producers=1, consumers=0, subscriptions=[]),
    )
    m.attach(types.SimpleNamespace(topics={"/default/a": topic}))
    text = generate_latest(m.registry).decode()
    assert (
        'danube_broker_rpc_total{code="INVALID_ARGUMENT",method="send_message",result="error",service="producer"} 2.0'
    ) in text
    assert 'result="cancelled"' in text
    sample = parse_exposition(text, "http://x/metrics", 1.0)
    assert (sample.rpc_total, sample.rpc_errors, sample.rpc_server_errors) == (15, 4, 1)
    t = sample.topics["/default/a"]
    assert t.wal_flush_total == 4
    assert 0.25 < quantile(t.wal_flush_buckets, 0.5) <= 0.5 < quantile(t.wal_flush_buckets, 0.99) <= 2.5

    hub = MetricsHub(
        types.SimpleNamespace(
            history_s=60,
            scrape_interval_s=1,
            max_history_topics=10,
            request_timeout_s=1,
            prometheus_url=None,
            metrics_urls=(),
        )
    )
    assert hub.rpc_rate("b1") == 0.0
    clock = {"now": 0.0, "total": 0}

    def fake_get(url, timeout):
        return f'danube_broker_rpc_total{{service="s",method="m",result="ok",code="OK"}} {clock["total"]}\n'.encode()

    import danube.gateway.metrics as gm

    monkeypatch.setattr(gm, "_http_get", fake_get)
    monkeypatch.setattr(gm.time, "time", lambda: clock["now"])
    for now, total in ((100.0, 10), (110.0, 30), (130.0, 70)):  # scrapes: calls answered so far
        clock.update(now=now, total=total)
        asyncio.run(hub.scrape({"b1": "http://b1/metrics"}))
    assert hub.latest["b1"].rpc_total == 70
    assert hub.rpc_rate("b1") == pytest.approx((70 - 10) / 30)
