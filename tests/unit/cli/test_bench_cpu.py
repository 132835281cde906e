"""`danube bench`: the client's CPU accounting and the verdict on what limited a run (no servers)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from danube.cli import bench_cpu
from danube.cli.bench_cpu import CpuMark, span, verdict

# says "go" once started, spins 0.2 s of CPU, says "done", then sleeps until killed
_SPIN = (
    "import time\nprint('go', flush=True)\ninput()\nt = time.process_time()\n"
    "while time.process_time() - t < 0.2: pass\nprint('done', flush=True)\ntime.sleep(30)"
)


def _spinner() -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _SPIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "go\n"
    return proc


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")
def test_marks_count_this_process_and_its_children_but_not_an_excluded_one():
    busy, excluded = _spinner(), _spinner()
    try:
        start = bench_cpu.mark(exclude=excluded.pid)
        assert busy.pid in start.others and excluded.pid not in start.others
        for proc in (busy, excluded):
            proc.stdin.write("\n")
            proc.stdin.flush()
        t = time.process_time()
        while time.process_time() - t < 0.1:  # this process's own CPU
            pass
        for proc in (busy, excluded):
            assert proc.stdout.readline() == "done\n"
        end = bench_cpu.mark(exclude=excluded.pid)
        used = span(start, end, wall_s=2.0)
        assert used.own_s >= 0.08
        assert excluded.pid not in end.others  # it spun as much as the busy one but is not counted
        # pytest may have other children of its own (a server of an earlier test still exiting),
        # so the busy child's share is checked by its pid, and the totals only as bounds
        busy_s = end.others[busy.pid] - start.others[busy.pid]
        assert 0.15 <= busy_s <= 0.4
        assert used.children_s >= busy_s
        assert busy_s / 2.0 <= used.children_core_max + 1e-9 <= used.children_s / 2.0 + 2e-9
    finally:
        for proc in (busy, excluded):
            proc.kill()
            proc.wait()
            proc.stdin.close()
            proc.stdout.close()


def test_span_counts_a_late_child_from_zero_and_drops_a_gone_one():
    start = CpuMark(own=1.0, others={10: 5.0, 11: 2.0}, machine=(100, 400))
    end = CpuMark(own=1.5, others={10: 6.0, 12: 0.5}, machine=(300, 600))
    used = span(start, end, wall_s=2.0)
    assert used.own_s == pytest.approx(0.5) and used.own_core == pytest.approx(0.25)
    assert used.children_s == pytest.approx(1.5)
    assert used.children_core_max == pytest.approx(0.5)
    assert bench_cpu.machine_busy_pct(start, end) == 100.0
    assert bench_cpu.machine_busy_pct(start, CpuMark(1.5, {}, None)) is None


def _verdict(**kw):
    base = dict(
        offered_rate=25_000,
        sent_rate=25_000,
        delivered_rate=25_000,
        producer_core=0.3,
        consumer_core=0.3,
        machine_busy=50.0,
        client_cores=0.6,
        broker_cores=0.5,
        cores=2,
    )
    base.update(kw)
    return verdict(**base)


def test_a_run_that_offered_and_delivered_its_rate_has_no_limit():
    assert _verdict() == (None, "")


def test_a_busy_producer_process_short_of_the_rate_is_the_client_limit():
    who, why = _verdict(sent_rate=9_000, delivered_rate=9_000, producer_core=0.98, machine_busy=99.0)
    assert who == "client"
    assert "the client was the limit" in why and "9,000 of the 25,000 msg/s" in why and "98% of a core" in why


def test_a_saturated_machine_short_of_the_rate_is_a_client_limit_when_the_client_took_the_cpu():
    who, why = _verdict(sent_rate=12_000, delivered_rate=12_000, producer_core=0.6, machine_busy=97.0, client_cores=1.3)
    assert who == "client" and "97% busy" in why and "1.30 cores" in why and "broker 0.50" in why


def test_a_machine_saturated_by_other_processes_is_named_as_such():
    who, why = _verdict(delivered_rate=3_000, machine_busy=100.0, client_cores=0.5, broker_cores=0.3)
    assert who == "machine" and "other processes 1.20" in why


def test_an_idle_client_short_of_the_rate_waited_for_the_broker():
    who, why = _verdict(sent_rate=12_000, delivered_rate=12_000, producer_core=0.3, machine_busy=60.0)
    assert who == "broker" and "acks" in why


def test_deliveries_short_of_the_rate_blame_a_busy_consumer_process_or_the_broker():
    assert _verdict(delivered_rate=10_000, consumer_core=0.95)[0] == "client"
    who, why = _verdict(delivered_rate=10_000, consumer_core=0.2)
    assert who == "broker" and why.startswith("the broker was the limit: 10,000 of the 25,000 msg/s")


def test_as_fast_as_possible_a_busy_process_is_named():
    who, why = _verdict(offered_rate=0, sent_rate=400_000, producer_core=0.99)
    assert who == "client" and "producer process" in why
    assert _verdict(offered_rate=0, sent_rate=400_000, producer_core=0.5) == (None, "")
