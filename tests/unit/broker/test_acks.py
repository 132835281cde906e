"""Acks gathered over one loop turn and applied once per consumer (danube.broker.acks)."""

import asyncio

import pytest

from danube.broker.acks import AckBatcher


class Recorder:
    def __init__(self, fail_for=()):
        self.calls = []
        self.fail_for = set(fail_for)

    def __call__(self, consumer_id, ranges):
        self.calls.append((consumer_id, list(ranges)))
        if consumer_id in self.fail_for:
            raise RuntimeError(f"consumer {consumer_id} gone")


async def turn():
    await asyncio.sleep(0)


async def test_one_apply_per_consumer_and_turn_with_every_range_in_order():
    apply = Recorder()
    acks = AckBatcher(apply)
    errors = []
    for i in range(5):
        acks.add(1, [(2 * i, 2 * i + 1)], lambda *e: errors.append(e))
        acks.add(2, [(10 + i, 10 + i)], lambda *e: errors.append(e))
    assert apply.calls == []  # nothing before the end of the turn
    await turn()
    assert sorted(apply.calls) == [
        (1, [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]),
        (2, [(10, 10), (11, 11), (12, 12), (13, 13), (14, 14)]),
    ]
    assert acks.flushes == 1 and acks.applied == 2
    assert errors == []
    acks.add(1, [(20, 20)], lambda *e: errors.append(e))  # the next turn is a new batch
    await turn()
    assert apply.calls[-1] == (1, [(20, 20)]) and acks.flushes == 2


async def test_flush_consumer_applies_its_acks_before_what_comes_next():
    apply = Recorder()
    acks = AckBatcher(apply)
    acks.add(1, [(0, 0)], lambda *e: None)
    acks.add(2, [(5, 5)], lambda *e: None)
    acks.flush_consumer(1)
    assert apply.calls == [(1, [(0, 0)])]
    await turn()
    assert apply.calls == [(1, [(0, 0)]), (2, [(5, 5)])]


async def test_an_error_reaches_every_stream_that_sent_ranges_and_spares_the_others():
    apply = Recorder(fail_for={7})
    acks = AckBatcher(apply)
    heard_a, heard_b, heard_c = [], [], []

    def a(exc, cid, ranges):
        heard_a.append((str(exc), cid, list(ranges)))

    def b(exc, cid, ranges):
        heard_b.append(cid)

    def c(exc, cid, ranges):
        heard_c.append(cid)

    acks.add(7, [(1, 1)], a)
    acks.add(7, [(2, 2)], b)
    acks.add(7, [(3, 3)], a)  # the same stream again: told once
    acks.add(8, [(4, 4)], c)
    await turn()
    assert heard_a == [("consumer 7 gone", 7, [(1, 1), (2, 2), (3, 3)])]
    assert heard_b == [7]
    assert heard_c == []  # consumer 8's acks were applied
    assert (8, [(4, 4)]) in apply.calls


@pytest.mark.parametrize("n", [1, 100])
async def test_the_flush_is_scheduled_once_per_turn(n):
    apply = Recorder()
    acks = AckBatcher(apply)
    loop = asyncio.get_running_loop()
    scheduled = []
    real = loop.call_soon

    def spy(cb, *args, **kw):
        if getattr(cb, "__self__", None) is acks:
            scheduled.append(cb)
        return real(cb, *args, **kw)

    loop.call_soon = spy
    try:
        for i in range(n):
            acks.add(i % 3, [(i, i)], lambda *e: None)
    finally:
        loop.call_soon = real
    assert len(scheduled) == 1
    await turn()
    assert sum(len(r) for _c, r in apply.calls) == n
