"""`danube bench`: how the shares of several producer processes are planned and merged (no servers)."""

from __future__ import annotations

from array import array

import pytest

from danube.cli.bench import BenchUsageError, check_client_processes
from danube.cli.bench_config import BenchConfig, BenchResult, bench_topics, percentiles, split
from danube.cli.bench_parts import PartResult, merge
from danube.cli.bench_workers import plan


def _part(**kw) -> PartResult:
    base = dict(start=100.0, sent_end=102.0, produced_end=102.0, last=102.5)
    base.update(kw)
    return PartResult(**base)


def test_split_sums_to_the_total_in_proportion():
    assert split(50, [500, 500]) == [25, 25]
    assert split(25, [1, 1]) in ([13, 12], [12, 13])
    assert sum(split(7, [3, 1, 1])) == 7 and split(7, [3, 1, 1])[0] >= 4
    assert split(3, [0, 0]) == [0, 0]


def test_plan_gives_each_process_its_own_topics_producers_consumers_rate_and_connections():
    config = BenchConfig(topics=1000, producers=1000, consumers=1000, rate=10_000, connections=50, client_processes=2)
    shares = plan(config)
    assert len(shares) == 2
    names = [bench_topics(s, "/default/b") for s in shares]
    assert names[0][0] == "/default/b-0" and names[1][0] == "/default/b-500" and names[1][-1] == "/default/b-999"
    assert set(names[0]).isdisjoint(names[1])
    assert sum(len(n) for n in names) == 1000
    assert sum(s.producers for s in shares) == 1000 and sum(s.consumers for s in shares) == 1000
    assert sum(s.rate for s in shares) == pytest.approx(10_000)
    assert sum(s.connections for s in shares) == 50
    assert all(s.client_processes == 1 and not s.progress for s in shares)


def test_plan_keeps_the_one_process_topic_of_every_producer():
    # 5 topics, 7 producers: round-robin puts producers 0 and 5 on topic 0, 1 and 6 on topic 1
    config = BenchConfig(topics=5, producers=7, consumers=5, rate=700, client_processes=2)
    shares = plan(config)
    assert [s.topics for s in shares] in ([3, 2], [2, 3])
    first = shares[0]
    assert first.producers == sum(1 for i in range(7) if i % 5 < first.topics)
    assert sum(s.producers for s in shares) == 7
    # every producer keeps the one-process rate per producer
    assert all(s.rate / s.producers == pytest.approx(100) for s in shares)


def test_merge_adds_counts_and_takes_percentiles_over_every_sample():
    slow = array("d", [0.100] * 10)
    fast = array("d", [0.001] * 990)
    parts = [
        _part(sent=600, acked=600, calls=300, delivered=600, deliver_latencies=fast, ack_latencies=array("d", [0.002])),
        _part(
            sent=400,
            acked=400,
            calls=200,
            delivered=400,
            start=100.5,
            sent_end=102.5,
            produced_end=103.0,
            last=104.0,
            deliver_latencies=slow,
            ack_latencies=array("d", [0.004]),
        ),
    ]
    result = BenchResult(config={})
    merge(parts, BenchConfig(), result)
    assert (result.sent, result.acked, result.delivered, result.calls) == (1000, 1000, 1000, 500)
    assert not result.errors
    # one window: the first start (100.0) to the last answer (103.0) and the last delivery (104.0)
    assert result.elapsed_s == pytest.approx(3.0)
    assert result.publish_rate == pytest.approx(1000 / 3.0, rel=1e-3)
    assert result.sent_rate == pytest.approx(1000 / 2.5, rel=1e-3)  # calls made until 102.5; acks waited for after
    assert result.end_to_end_rate == pytest.approx(1000 / 4.0, rel=1e-3)
    assert result.calls_per_s == pytest.approx(500 / 3.0, rel=1e-3)
    # the 10 slow samples are the top 1% of all 1,000: p99 is theirs, p90 the fast ones'
    merged = result.deliver_latency_ms
    assert merged["count"] == 1000
    assert merged == percentiles(list(fast) + list(slow))
    assert merged["p99"] == pytest.approx(100.0) and merged["p90"] == pytest.approx(1.0)
    assert result.ack_latency_ms["count"] == 2


def test_merge_reports_missing_deliveries_once_for_the_whole_run():
    parts = [_part(sent=10, acked=10, delivered=10), _part(sent=10, acked=10, delivered=7, errors=["lost one"])]
    result = BenchResult(config={})
    merge(parts, BenchConfig(drain_timeout=5), result)
    assert result.delivered == 17
    assert result.errors == ["lost one", "only 17 of 20 acked messages were delivered within 5s"]


def test_merge_adds_client_cpu_and_keeps_the_busiest_process():
    parts = [
        _part(acked=1000, calls=500, producer_cpu_s=1.0, consumer_cpu_s=0.5, producer_core=0.95, consumer_core=0.2),
        _part(acked=1000, calls=500, producer_cpu_s=0.8, consumer_cpu_s=0.7, producer_core=0.40, consumer_core=0.3),
    ]
    parts[0].machine_busy_pct, parts[1].machine_busy_pct = 97.0, 99.0
    parts[0].sending_cpu_s, parts[1].sending_cpu_s = 1.2, 0.8  # both sent for 2 s (100.0 to 102.0)
    result = BenchResult(config={})
    merge(parts, BenchConfig(), result, coordinator_cpu_s=0.1)
    assert result.client_processes == 2
    assert result.producer_cpu_s == pytest.approx(1.8) and result.consumer_cpu_s == pytest.approx(1.2)
    assert result.client_cpu_s == pytest.approx(3.1)
    assert result.client_cpu_us_per_msg == pytest.approx(3.1e6 / 2000)
    assert result.client_cpu_us_per_call == pytest.approx(3.1e6 / 1000)
    assert result.producer_core_max == pytest.approx(0.95) and result.consumer_core_max == pytest.approx(0.3)
    assert result.machine_busy_pct == 99.0
    assert result.client_cores == pytest.approx(1.0)


def test_more_processes_than_topics_is_refused_with_a_sentence():
    with pytest.raises(BenchUsageError, match="needs at least 3 topics"):
        check_client_processes(BenchConfig(topics=2, client_processes=3))
    with pytest.raises(BenchUsageError, match="at least 1"):
        check_client_processes(BenchConfig(client_processes=0))
    check_client_processes(BenchConfig(topics=3, client_processes=3))
    check_client_processes(BenchConfig(topics=1, client_processes=1))


def test_merged_client_cpu_is_never_below_its_rounded_parts():
    # 0.1236 + 0.1236 rounds to 0.247 whole, but the parts print as 0.124 and 0.124
    parts = [_part(acked=10, calls=5, producer_cpu_s=0.1236, consumer_cpu_s=0.1236, sending_cpu_s=0.1)]
    result = BenchResult(config={})
    merge(parts, BenchConfig(), result, coordinator_cpu_s=0.0)
    assert result.producer_cpu_s == 0.124 and result.consumer_cpu_s == 0.124
    assert result.client_cpu_s >= result.producer_cpu_s + result.consumer_cpu_s


def test_merge_counts_offered_sent_and_missing_messages_rather_than_rates():
    parts = [
        _part(sent=500, acked=500, delivered=500, offered=500, pacer_lag_s=0.002),
        _part(sent=480, acked=480, delivered=470, offered=500, pacer_lag_s=0.030, start=100.0, last=109.0),
    ]
    result = BenchResult(config={})
    merge(parts, BenchConfig(drain_timeout=5), result)
    assert (result.offered, result.sent, result.delivered, result.missing) == (1000, 980, 970, 10)
    assert result.delivered_of_sent == pytest.approx(970 / 980, abs=1e-5)
    assert result.pacer_lag_ms == pytest.approx(30.0)
    assert "only 970 of 980 acked messages were delivered within 5s" in result.errors


def test_nothing_missing_when_every_message_arrives_late():
    # a long tail pulls the start-to-last-delivery rate down; the count shows nothing was lost
    parts = [_part(sent=1000, acked=1000, delivered=1000, offered=1000, start=100.0, sent_end=101.0, last=102.0)]
    result = BenchResult(config={})
    merge(parts, BenchConfig(), result)
    assert result.missing == 0 and result.delivered_of_sent == 1.0 and not result.errors
    assert result.end_to_end_rate == pytest.approx(500.0)
