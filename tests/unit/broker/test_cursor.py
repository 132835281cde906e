from hypothesis import given, settings
from hypothesis import strategies as st

from danube.broker.cursor import AckTracker, to_ranges


def test_to_ranges_collapses_any_order():
    assert to_ranges([5, 3, 4, 9, 9, 1]) == [(1, 1), (3, 5), (9, 9)]
    assert to_ranges(range(10, 20)) == [(10, 19)]
    assert to_ranges([]) == []


def test_out_of_order_acks_move_cursor_only_over_contiguous_offsets():
    t = AckTracker(cursor=-1)
    t.delivered(0, 9, consumer_id=1, deadline=100.0)
    t.ack_ranges([(5, 9)])
    assert not t.advance(10) and t.cursor == -1
    t.ack_ranges([(0, 3)])
    assert t.advance(10) and t.cursor == 3
    t.ack_ranges([(4, 4)])
    t.advance(10)
    assert t.cursor == 9 and t.unacked == 0


def test_nacked_offset_holds_the_cursor_until_acked():
    t = AckTracker(cursor=-1)
    t.delivered(0, 4, 1, 100.0)
    assert t.take_back(2) == 1
    t.schedule(2, ready_at=5.0)
    t.ack_ranges([(0, 1), (3, 4)])
    t.advance(5)
    assert t.cursor == 1
    assert t.pop_ready(now=1.0, limit=10) == []
    assert t.pop_ready(now=6.0, limit=10) == [2]
    t.delivered(2, 2, 1, 100.0)
    t.ack_ranges([(2, 2)])
    t.advance(5)
    assert t.cursor == 4


def test_consumer_leaving_returns_its_offsets():
    t = AckTracker(cursor=9)
    t.delivered(10, 14, 1, 100.0)
    t.delivered(15, 19, 2, 100.0)
    t.ack_ranges([(11, 11)])
    assert t.take_back_consumer(1) == [10, 12, 13, 14]
    assert t.unacked == 5


def test_expired_runs_are_taken_back():
    t = AckTracker(cursor=-1)
    t.delivered(0, 1, 1, deadline=1.0)
    t.delivered(2, 3, 1, deadline=9.0)
    assert t.next_deadline() == 1.0
    assert t.expired(now=2.0) == [0, 1]
    assert t.unacked == 2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=49), max_size=80), st.integers(min_value=1, max_value=10))
def test_cursor_is_always_last_contiguous_acked(acks, run):
    t = AckTracker(cursor=-1)
    for first in range(0, 50, run):
        t.delivered(first, min(first + run, 50) - 1, 1, 100.0)
    acked = set()
    for a in acks:
        t.ack_ranges([(a, a)])
        acked.add(a)
        t.advance(50)
        expected = -1
        while expected + 1 in acked:
            expected += 1
        assert t.cursor == expected
    assert t.unacked == 50 - len(acked)
