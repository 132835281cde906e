"""`danube bench --topics N --connections N` (functional: every message acked and delivered)."""

from __future__ import annotations

import asyncio

from danube.cli.bench import BenchConfig, bench_topics, format_result, run_bench
from tests.support.broker import running_broker


def test_topics_and_connections_spread_producers_and_consumers():
    with running_broker() as broker:
        config = BenchConfig(service_url=broker.url, topics=3, connections=4, duration=1.0, batch_size=100,
                             progress=False, consumer_process=False, drain_timeout=20)
        result = asyncio.run(run_bench(config))
    assert not result.errors, result.errors
    assert result.acked > 0 and result.delivered == result.acked
    assert (config.producers, config.consumers) == (3, 3)
    assert bench_topics(config, "/default/t") == ["/default/t-0", "/default/t-1", "/default/t-2"]
    assert "over 4 connection(s)" in format_result(result)
