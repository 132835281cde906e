"""`danube bench --topics N --connections N` (functional: every message acked and delivered)."""

from __future__ import annotations

import asyncio

import pytest

from danube.cli.bench import BenchConfig, bench_topics, format_result, run_bench
from tests.support.broker import running_broker
from tests.support.waiting import async_wait_until


def test_topics_and_connections_spread_producers_and_consumers():
    with running_broker() as broker:
        config = BenchConfig(
            service_url=broker.url,
            topics=3,
            connections=4,
            duration=1.0,
            batch_size=100,
            progress=False,
            consumer_process=False,
            drain_timeout=20,
        )
        result = asyncio.run(run_bench(config))
    assert not result.errors, result.errors
    assert result.acked > 0 and result.delivered == result.acked
    assert (config.producers, config.consumers) == (3, 3)
    assert bench_topics(config, "/default/t") == ["/default/t-0", "/default/t-1", "/default/t-2"]
    assert "over 4 connection(s)" in format_result(result)


def _established_to(port: int) -> int:
    """Established TCP connections to 127.0.0.1:``port`` seen in /proc/net/tcp{,6} (client ends)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            remote, state = fields[2], fields[3]
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


@pytest.mark.parametrize("transport, per_client", [("grpc", 1), ("h2", 2)])
def test_every_client_has_a_connection_of_its_own(transport, per_client):
    # grpc shares one connection per address among a process's channels unless told not to: the
    # bench's --connections was then one connection, whose stream limit held a thousand consumers.
    # On the h2 transport a client has two: grpc.aio's for its unary calls, its own for its streams.
    from danube.client import DanubeClient

    async def run(url: str, port: int) -> int:
        clients = [DanubeClient.builder().service_url(url).with_transport(transport).build() for _ in range(3)]
        producers = []
        try:
            for i, client in enumerate(clients):
                producer = client.new_producer().with_topic(f"/default/own-conn-{i}").with_name(f"p{i}").build()
                await producer.create()
                producers.append(producer)
            await async_wait_until(lambda: _established_to(port) >= 3 * per_client, 10, "the clients' connections")
            return _established_to(port)
        finally:
            for producer in producers:
                await producer.close()
            for client in clients:
                await client.close()

    with running_broker() as broker:
        assert asyncio.run(run(broker.url, broker.port)) == 3 * per_client
