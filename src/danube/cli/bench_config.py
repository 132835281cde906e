"""`danube bench`: what a run is (its settings, its topics, its client connections) and what it found.

Shared by the run (``bench.py``) and its consumer process (``bench_consumers.py``), which receives
the ``BenchConfig`` over a pipe.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

# Every payload starts with the time its send_batch call was made (perf_counter, 8 bytes).
STAMP = struct.Struct("<d")


@dataclass
class BenchConfig:
    service_url: str | None = None
    spawn_broker: bool = False
    sync: str = "interval"
    data_dir: str | None = None
    topic: str | None = None
    producers: int = 1
    consumers: int = 1
    message_size: int = 100
    batch_size: int = 1000
    rate: float = 0.0
    duration: float = 10.0
    reliable: bool = True
    subscription_type: str | None = None
    max_in_flight: int = 8
    max_batch_bytes: int = 1024 * 1024
    linger_ms: float = 1.0
    pace_ms: float = 2.0  # with a rate: one send_batch call per pace_ms (at most batch_size messages)
    progress: bool = True
    drain_timeout: float = 30.0
    consumer_process: bool = True  # consumers in a child process (False: in the bench's event loop)
    topics: int = 1  # producers and consumers spread round-robin over this many topics
    connections: int = 0  # client connections, shared round-robin (0: one per process)
    broker_pid: int | None = None  # read the broker's CPU time from /proc (set when spawned)
    client_processes: int = 1  # producer processes, each with its topics, connections and consumer process
    # In one of several producer processes: this process's topics are <topic>-<first_topic>.. (its slice)
    first_topic: int | None = None


def bench_topics(config: BenchConfig, base: str) -> list[str]:
    """The topics of a run: ``base`` itself, or ``base-0`` .. ``base-<N-1>`` with ``--topics N``; in one of
    several producer processes, its slice ``base-<first_topic>`` onwards."""
    if config.first_topic is not None:
        return [f"{base}-{config.first_topic + i}" for i in range(config.topics)]
    return [base] if config.topics <= 1 else [f"{base}-{i}" for i in range(config.topics)]


def split(total: int, weights: list[int]) -> list[int]:
    """``total`` split in proportion to ``weights``, summing to ``total`` (largest remainders first)."""
    whole = sum(weights)
    if whole <= 0:
        return [0] * len(weights)
    exact = [total * w / whole for w in weights]
    out = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: out[i] - exact[i])
    for i in by_remainder[: total - sum(out)]:
        out[i] += 1
    return out


def bench_clients(config: BenchConfig, count: int, share: float) -> list:
    """Client connections for ``count`` producers or consumers: this side's ``share`` of
    ``--connections`` (one when not given), at most one per producer/consumer."""
    from danube.client import DanubeClient

    n = 1 if config.connections <= 0 else max(1, min(count, round(config.connections * share)))
    return [DanubeClient.builder().service_url(config.service_url).build() for _ in range(n)]


def connection_shares(config: BenchConfig) -> tuple[float, float]:
    total = config.producers + config.consumers
    return config.producers / total, config.consumers / total


@dataclass
class BenchResult:
    config: dict
    offered: int = 0  # messages the paced schedule placed within --duration (0 without --rate)
    sent: int = 0
    acked: int = 0
    delivered: int = 0
    missing: int = 0  # sent but not delivered within the drain timeout
    delivered_of_sent: float | None = None  # delivered / sent, counted (None when nothing was sent)
    pacer_lag_ms: float = 0.0  # the most a paced call came after its scheduled time (a busy client)
    elapsed_s: float = 0.0
    publish_rate: float = 0.0  # acked messages / s
    end_to_end_rate: float = 0.0  # delivered messages / s, from the start to the last delivery
    publish_mb_s: float = 0.0
    ack_latency_ms: dict = field(default_factory=dict)
    deliver_latency_ms: dict = field(default_factory=dict)
    calls: int = 0  # send_batch calls
    calls_per_s: float = 0.0  # send_batch calls / s
    messages_per_call: int = 0
    machine: dict = field(default_factory=dict)  # load, CPU steal and pressure over the measured window
    broker_cpu_s: float | None = None  # the broker's user+system CPU over the run (with a broker pid)
    broker_cpu_us_per_msg: float | None = None  # ... per acked message
    broker_cpu_us_per_call: float | None = None  # ... per send_batch call
    broker_threads: int | None = None  # the broker's threads at the end of the run
    broker_cores: float | None = None  # the broker's CPU while calls were made, in cores
    client_processes: int = 1  # producer processes (each with its own consumer process)
    # The bench's own processes over the same window as the broker's CPU (producing until the last delivery)
    client_cpu_s: float | None = None  # producers + consumers (+ the parent of several producer processes)
    producer_cpu_s: float | None = None
    consumer_cpu_s: float | None = None
    client_cpu_us_per_msg: float | None = None  # ... per acked message
    client_cpu_us_per_call: float | None = None  # ... per send_batch call
    client_cores: float | None = None  # every bench process together while making calls, in cores
    producer_core_max: float | None = None  # the busiest producer process while producing, in cores
    consumer_core_max: float | None = None  # the busiest consumer process while producing, in cores
    machine_busy_pct: float | None = None  # all the machine's CPUs while producing (100 = every core busy)
    offered_rate: float = 0.0  # --rate (0: as fast as possible)
    setup_s: float = 0.0  # connecting, subscribing and creating producers, before the measured window
    sent_rate: float = 0.0  # messages handed to send_batch / s while making calls (until --duration ends)
    limited_by: str | None = None  # "client", "broker", "machine" or None (see bench_cpu.verdict)
    limit: str = ""  # the verdict in one sentence
    errors: list = field(default_factory=list)


def percentiles(samples: list[float]) -> dict:
    """p50/p90/p99/p99.9/max in milliseconds (samples in seconds)."""
    if not samples:
        return {}
    data = sorted(samples)
    n = len(data)

    def at(q: float) -> float:
        return round(data[min(n - 1, int(q * n))] * 1000, 3)

    return {
        "count": n,
        "p50": at(0.50),
        "p90": at(0.90),
        "p99": at(0.99),
        "p999": at(0.999),
        "max": round(data[-1] * 1000, 3),
        "mean": round(sum(data) / n * 1000, 3),
    }
