"""``Subscription.ack_ranges`` applies the ack of the one delivery in flight itself (no call of
``AckTracker.ack_oldest``): the tracker, the cursor, the counts and the dirty flag come out as the
tracker's general way (``ack_ranges`` then ``advance``) leaves them, whatever came before (acks,
nacks and redeliveries, dead runs left in the delivery order, redelivery attempts)."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from danube.broker import DispatchSettings, FailurePolicy, TopicPolicies
from danube.broker.memory_storage import MemoryTopicStorage
from danube.broker.topic import Topic
from tests.unit.broker.test_cursor import _state
from tests.unit.broker.test_push_fast_path import CountingSink


def _subscription(window: int):
    from danube.broker.subscription import Subscription

    sink = CountingSink()
    topic = Topic(
        "/default/one",
        reliable=True,
        storage=MemoryTopicStorage("/default/one", max_bytes=1 << 20),
        policies=TopicPolicies(),
        metrics=sink,
    )
    sub = Subscription(
        topic,
        "s",
        "exclusive",
        cursor=-1,
        failure_policy=FailurePolicy(ack_timeout_ms=600_000, base_redelivery_delay_ms=0, poison_policy="drop"),
        settings=DispatchSettings(max_unacked_messages=window),
        metrics=sink,
    )
    topic.subscriptions["s"] = sub
    return sub, sink


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=6),
    steps=st.lists(
        st.tuples(st.sampled_from(["ack", "take_back", "attempt", "ack_oldest"]), st.integers(0, 30)), max_size=8
    ),
    tail=st.integers(0, 3),
    probe=st.tuples(st.integers(0, 3), st.integers(-1, 1)),
    window=st.sampled_from([1, 4, 1000]),
)
def test_the_ack_of_the_one_delivery_in_flight_leaves_what_the_general_way_leaves(sizes, steps, tail, probe, window):
    sub, sink = _subscription(window)
    t = sub.tracker
    first = 0
    for i, n in enumerate(sizes):
        t.delivered(first, first + n - 1, consumer_id=1, deadline=1e12 + i)
        first += n
    sub.next_read = first + tail
    for what, o in steps:
        if what == "ack":
            t.ack_ranges([(o, o)])
        elif what == "ack_oldest" and t._firsts:
            t.ack_oldest(t._firsts[0], t._runs[t._firsts[0]].last, sub.next_read)
        elif what == "take_back":
            t.take_back(o)  # (not scheduled: the run's offsets stay taken back)
        elif what == "attempt":
            t.attempts[o] = 1
        t.advance(sub.next_read)
    if not t._firsts:
        return
    # the oldest run's range, sometimes one offset short or long (then not the inline case)
    lo = t._firsts[probe[0] % len(t._firsts)]
    hi = t._runs[lo].last + probe[1]
    expected = copy.deepcopy(t)
    want = expected.ack_ranges([(lo, hi)])
    expected.advance(sub.next_read)
    cursor = t.cursor
    sub.dirty = False
    got = sub.ack_ranges([(lo, hi)])
    assert got == want
    assert _state(t) == _state(expected)
    assert sub.dirty == (t.cursor != cursor)
    assert sink.rows["s"][2] == got
    assert all(r.remaining > 0 for r in t._runs.values())
    assert not t.order or t.order[0].remaining > 0  # (the first run in delivery order is live)


def test_the_last_ack_empties_the_tracker_and_forgets_the_attempts_below_the_cursor():
    sub, sink = _subscription(2)
    t = sub.tracker
    t.delivered(0, 1, 1, 1e12)
    t.delivered(2, 3, 1, 1e12)
    t.attempts.update({1: 2, 3: 1, 9: 1})
    sub.next_read = 6
    assert sub.ack_ranges([(0, 1)]) == 2 and t.cursor == 1 and t.attempts == {3: 1, 9: 1}
    assert sub.ack_ranges([(2, 3)]) == 2  # (the one in flight: the inline case)
    assert t.cursor == 5 and t.unacked == 0 and not t.order and not t._runs and not t._firsts
    assert t.attempts == {9: 1} and sub.dirty and sink.rows["s"][2] == 4
    assert sub.ack_ranges([(2, 3)]) == 0  # acked already: nothing
