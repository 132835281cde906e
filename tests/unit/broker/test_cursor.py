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


def test_an_ack_of_one_whole_delivery_and_a_range_over_several_count_the_same():
    t = AckTracker(cursor=-1)
    for first in range(0, 12, 3):
        t.delivered(first, first + 2, 1, 100.0)
    assert t.ack_ranges([(3, 5)]) == 3  # one whole delivery
    assert t.ack_ranges([(3, 5)]) == 0  # again: nothing new
    assert t.ack_ranges([(0, 8)]) == 6  # over several, part of it acked already
    assert t.ack_ranges([(9, 9), (10, 11)]) == 3
    assert t.advance(12) and t.cursor == 11 and t.unacked == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["ack", "nack", "leave", "expire"]), st.integers(0, 39)), max_size=60))
def test_the_next_deadline_is_the_oldest_live_delivery(ops):
    """Dropped deliveries leave the deadline queue from its front: the next deadline is always the
    first live delivery's, and the queue holds no dead run at its front."""
    t = AckTracker(cursor=-1)
    deadlines = {}
    for i, first in enumerate(range(0, 40, 4)):
        t.delivered(first, first + 3, consumer_id=i % 2, deadline=float(i))
        deadlines[first] = float(i)
    live = {first: set(range(first, first + 4)) for first in deadlines}
    for op, offset in ops:
        first = offset - offset % 4
        if op == "ack":
            t.ack_ranges([(offset, offset)])
            live[first].discard(offset)
        elif op == "nack":
            t.take_back(offset)
            live[first].discard(offset)
        elif op == "leave":
            t.take_back_consumer(offset % 2)
            for f in live:
                if (f // 4) % 2 == offset % 2:
                    live[f].clear()
        else:
            now = deadlines[first]
            t.expired(now)
            for f in live:
                if deadlines[f] <= now:
                    live[f].clear()
        remaining = [deadlines[f] for f in sorted(live) if live[f]]
        assert t.next_deadline() == (remaining[0] if remaining else None)
        assert not t.order or t.order[0].remaining > 0
        assert t.unacked == sum(len(s) for s in live.values())


def _state(t: AckTracker):
    runs = {f: (r.first, r.last, r.consumer_id, r.remaining, sorted(r.settled or ())) for f, r in t._runs.items()}
    return (t.cursor, t.unacked, runs, list(t._firsts), [r.first for r in t.order], dict(t.attempts))


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=8),
    steps=st.lists(
        st.tuples(st.sampled_from(["ack", "take_back", "schedule", "block", "attempt"]), st.integers(0, 40)),
        max_size=6,
    ),
    probe=st.tuples(st.integers(0, 40), st.integers(0, 3)),
    tail=st.integers(0, 3),
)
def test_acking_the_oldest_delivery_in_one_call_is_the_same_as_ack_ranges_then_advance(sizes, steps, probe, tail):
    """``ack_oldest`` (the usual ack) leaves the tracker as ``ack_ranges`` plus ``advance`` do,
    or, when the range is not the oldest untouched delivery, changes nothing and says so (-1)."""
    import copy

    t = AckTracker(cursor=-1)
    first = 0
    for i, n in enumerate(sizes):
        t.delivered(first, first + n - 1, consumer_id=i % 2, deadline=100.0 + i)
        first += n
    next_unread = first + tail  # (fresh messages not delivered yet)
    for what, o in steps:
        if what == "ack":
            t.ack_ranges([(o, o)])
        elif what == "take_back" and t.take_back(o) is not None:
            t.schedule(o, ready_at=5.0)
        elif what == "schedule":
            t.pop_ready(now=10.0, limit=1)  # (a redelivery popped: its offset waits nowhere)
        elif what == "block" and t.take_back(o) is not None:
            t.blocked.add(o)
        elif what == "attempt":
            t.attempts[o] = 1
        t.advance(next_unread)
    # mostly a delivery's first offset (the oldest one first), sometimes any offset
    pick, extra = probe
    firsts = t._firsts
    lo = firsts[pick % 3 % len(firsts)] if firsts and pick < 30 else pick
    run = t._runs.get(lo)
    if run is not None and extra == 0:
        hi = run.last
    elif run is not None and pick % 2 and lo in firsts:  # several deliveries acked as one range
        ahead = firsts[min(firsts.index(lo) + extra, len(firsts) - 1)]
        hi = t._runs[ahead].last - (pick % 4 == 3)  # (sometimes short of a whole delivery)
    else:
        hi = lo + extra
    expected = copy.deepcopy(t)
    before = _state(t)
    n = t.ack_oldest(lo, hi, next_unread)
    if n < 0:
        assert _state(t) == before
        return
    want = expected.ack_ranges([(lo, hi)])
    expected.advance(next_unread)
    assert n == want > 0
    assert _state(t) == _state(expected)


def test_the_oldest_delivery_acked_in_one_call_moves_the_cursor_to_the_next_one_in_flight():
    t = AckTracker(cursor=-1)
    t.delivered(0, 1, 1, 100.0)
    t.delivered(2, 4, 1, 100.0)
    assert t.ack_oldest(2, 4, 5) == -1  # not the oldest
    assert t.ack_oldest(0, 0, 5) == -1  # not a whole delivery
    assert t.ack_oldest(0, 1, 5) == 2 and t.cursor == 1 and t.unacked == 3
    assert t.ack_oldest(2, 4, 5) == 3 and t.cursor == 4  # (up to the next offset to read)
    assert t.unacked == 0 and not t.order


def test_consecutive_deliveries_acked_as_one_range_are_acked_in_one_call():
    t = AckTracker(cursor=-1)
    t.delivered(0, 1, 1, 100.0)
    t.delivered(2, 4, 1, 100.0)
    t.delivered(5, 5, 1, 100.0)
    assert t.ack_oldest(0, 3, 6) == -1  # ends inside a delivery
    assert t.ack_oldest(0, 6, 6) == -1  # beyond what is in flight
    assert t.ack_ranges([(3, 3)]) == 1
    assert t.ack_oldest(0, 5, 6) == -1  # a delivery in the range was partly acked already
    assert t.unacked == 5 and t.cursor == -1
    t2 = AckTracker(cursor=-1)
    t2.delivered(0, 1, 1, 100.0)
    t2.delivered(2, 4, 1, 100.0)
    t2.delivered(5, 5, 1, 100.0)
    assert t2.ack_oldest(0, 4, 8) == 5 and t2.cursor == 4 and t2.unacked == 1 and len(t2.order) == 1
    assert t2.ack_oldest(5, 5, 8) == 1 and t2.cursor == 7 and not t2.order


def test_the_first_message_of_a_delivery_taken_back_and_delivered_again_is_tracked_apart():
    t = AckTracker(cursor=-1)
    t.delivered(0, 2, 1, 100.0)
    assert t.take_back(0) == 1  # (a nack of the delivery's first message)
    t.delivered(0, 0, 2, 200.0)  # its redelivery, to another consumer
    assert t.unacked == 3 and t.lowest_in_flight() == 0
    assert t.take_back_consumer(1) == [1, 2] and t.unacked == 1
    t.delivered(1, 2, 2, 300.0)
    assert t.ack_ranges([(0, 2)]) == 3 and t.unacked == 0
    assert t.advance(3) and t.cursor == 2
