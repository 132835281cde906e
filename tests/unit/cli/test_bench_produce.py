"""`danube bench`'s produce loop: one pacing task steps every producer (fake producers, no servers)."""

from __future__ import annotations

import asyncio
import time

import pytest

from danube.cli.bench_config import STAMP
from danube.cli.bench_produce import Pacer


class FakeProducer:
    """Answers each send_batch after ``ack_s``; records what it was given and how many were in flight."""

    def __init__(self, ack_s: float, fail: bool = False) -> None:
        self.ack_s = ack_s
        self.fail = fail
        self.batches: list[list[bytes]] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def send_batch(self, payloads):
        if self.fail:
            raise RuntimeError("producer closed")
        loop = asyncio.get_running_loop()
        self.batches.append(list(payloads))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        fut = loop.create_future()

        def answer():
            self.in_flight -= 1
            fut.set_result(list(range(len(payloads))))

        loop.call_later(self.ack_s, answer)
        return fut

    async def flush(self) -> None:
        pass


def _run(pacer: Pacer, seconds: float) -> None:
    async def main():
        start = time.perf_counter()
        await pacer.run(start, start + seconds)

    asyncio.run(main())


def test_paced_calls_follow_the_rate_spread_over_every_producer():
    producers = [FakeProducer(0.002) for _ in range(10)]
    # 1,000 msg/s over 10 producers, 2 messages a call: one call every 20 ms per producer
    pacer = Pacer(producers, per_call=2, message_size=100, window=16, rate_per_producer=100.0)
    _run(pacer, 0.6)
    assert pacer.sent == pytest.approx(600, rel=0.15)
    assert pacer.calls * 2 == pacer.sent == pacer.acked
    assert len(pacer.ack_latencies) == pacer.calls and min(pacer.ack_latencies) >= 0.0019
    counts = [len(p.batches) for p in producers]
    assert max(counts) - min(counts) <= 1  # one evenly spaced schedule: every producer takes its turn
    batch = producers[0].batches[0]
    assert len(batch) == 2 and all(len(m) == 100 for m in batch)
    sent_at = STAMP.unpack_from(batch[0])[0]
    assert abs(time.perf_counter() - sent_at) < 5  # stamped with perf_counter, the consumers' clock
    assert pacer.in_flight == 0 and not pacer.errors


def test_a_full_window_holds_a_producer_back_and_it_makes_the_calls_up_later():
    slow = FakeProducer(0.080)
    fast = FakeProducer(0.001)
    # every 10 ms a call each, but the slow one has room for 2 calls and acks after 80 ms
    pacer = Pacer([slow, fast], per_call=1, message_size=8, window=2, rate_per_producer=100.0)
    _run(pacer, 0.5)
    assert slow.max_in_flight <= 2
    assert len(fast.batches) == pytest.approx(50, abs=6)
    assert 8 <= len(slow.batches) <= 16  # about 2 per 80 ms: the window, not the schedule, set its pace
    assert pacer.acked == pacer.sent == len(slow.batches) + len(fast.batches)


def test_as_fast_as_possible_each_producer_keeps_its_window_full():
    producers = [FakeProducer(0.005) for _ in range(3)]
    pacer = Pacer(producers, per_call=10, message_size=100, window=4, rate_per_producer=0.0)
    _run(pacer, 0.3)
    assert all(p.max_in_flight == 4 for p in producers)
    # 4 calls in flight per 5 ms ack: up to 240 calls per producer in 0.3 s; a loaded machine makes fewer
    assert all(len(p.batches) >= 20 for p in producers)
    assert pacer.acked == pacer.sent == 10 * pacer.calls


def test_a_failing_producer_is_reported_and_the_others_go_on():
    good, bad = FakeProducer(0.001), FakeProducer(0.001, fail=True)
    pacer = Pacer([good, bad], per_call=1, message_size=16, window=8, rate_per_producer=100.0)
    _run(pacer, 0.3)
    assert pacer.errors == ["send_batch: producer closed"]
    assert len(good.batches) >= 20 and pacer.acked == len(good.batches)


class BusyProducer(FakeProducer):
    """Holds the event loop for ``busy_s`` on every call: a client too slow for its schedule."""

    def __init__(self, ack_s: float, busy_s: float) -> None:
        super().__init__(ack_s)
        self.busy_s = busy_s

    async def send_batch(self, payloads):
        time.sleep(self.busy_s)  # the loop is busy: the calls fall behind the schedule
        return await super().send_batch(payloads)


def test_a_client_behind_its_schedule_sends_less_than_offered_and_says_how_late():
    producers = [BusyProducer(0.001, busy_s=0.002) for _ in range(4)]
    # 4 x 250 calls/s = one call per ms, but each takes 2 ms of the loop: half the pace at best
    pacer = Pacer(producers, per_call=1, message_size=16, window=1000, rate_per_producer=250.0)
    _run(pacer, 0.2)
    assert pacer.offered == 200  # calls at start + n ms for n < 200: the schedule of 0.2 s
    # what the loop could make (a pass makes every call due when it began, even past the deadline), but
    # no burst of the calls still due at the deadline
    assert pacer.sent == pacer.acked < pacer.offered
    assert pacer.lag_max >= 0.05  # the last calls came about 0.1 s after their time
    assert not pacer.errors


def test_a_pacer_on_time_reports_a_small_lag_and_offers_rate_times_duration():
    producers = [FakeProducer(0.001) for _ in range(5)]
    pacer = Pacer(producers, per_call=2, message_size=16, window=16, rate_per_producer=40.0)
    _run(pacer, 0.5)
    # 5 producers x 40 msg/s x 0.5 s, in calls of 2 messages
    assert pacer.offered == 100 and pacer.sent == pacer.acked == 100
    assert pacer.lag_max < 0.25  # well inside the run even on a loaded machine
