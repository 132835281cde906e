"""bench/many_topics.py --syscalls: the loop thread's syscalls per call from ``perf stat -I`` output.

Only the intervals wholly inside the measured window count (the setup's connects and the drain
would otherwise read as per-call cost), and the calls are those of the counted intervals."""

from __future__ import annotations

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))


def _bench():
    spec = importlib.util.spec_from_file_location("many_topics_bench", os.path.join(ROOT, "bench", "many_topics.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _perf_lines(per_interval: dict[float, tuple[int, int, int]]) -> list[str]:
    lines = ["# started on Fri Nov 27 21:52:09 2026\n", "\n"]
    for stamp, (reads, writes, polls) in per_interval.items():
        for name, count in (("read", reads), ("write", writes), ("epoll_pwait", polls)):
            lines.append(f"     {stamp:.9f},{count},,syscalls:sys_enter_{name},250000000,100.00,,\n")
    return lines


def test_counts_only_the_intervals_inside_the_window():
    bench = _bench()
    lines = _perf_lines(
        {
            0.25: (9000, 9000, 9000),  # the setup: outside
            0.5: (100, 200, 10),
            0.75: (300, 400, 30),
            1.0: (5000, 5000, 5000),  # the drain: outside
        }
    )
    got = bench.per_call_counts(lines, begin=0.25, end=0.8, calls_per_s=1000.0)
    # two intervals of 250 calls each
    assert got == {"reads_per_call": 0.8, "writes_per_call": 1.2, "epoll_pwaits_per_call": 0.08}


def test_uncounted_events_and_an_empty_window():
    bench = _bench()
    lines = ["     0.500000000,<not counted>,,syscalls:sys_enter_read,0,100.00,,\n"]
    assert bench.per_call_counts(lines, begin=0.0, end=10.0, calls_per_s=1000.0) == {}
    assert bench.per_call_counts(_perf_lines({0.5: (1, 1, 1)}), begin=1.0, end=2.0, calls_per_s=1000.0) == {}
