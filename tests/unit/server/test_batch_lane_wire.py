"""An ack request's ranges as the broker takes them (``ack_pairs``): pairs and the count of
offsets named, or a clear error for a range that ends before it starts or spans too much."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.errors import InvalidArgumentError
from danube.proto.danube_batch import batch_pb2 as pb
from danube.server.batch_lane_wire import ack_pairs

OFFSETS = st.integers(0, 2**64 - 1)
RANGE = st.one_of(
    st.tuples(OFFSETS, st.integers(0, 5)).map(lambda t: (t[0], min(t[0] + t[1], 2**64 - 1))),
    st.tuples(OFFSETS, OFFSETS),
)


def _spec(pairs: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], int] | str:
    """What the request means, from its pairs alone."""
    for first, last in pairs:
        if last < first:
            return "ends before it starts"
        if last - first >= 1_000_000:
            return "spans more than"
    return list(pairs), sum(last - first + 1 for first, last in pairs)


@settings(max_examples=200, deadline=None)
@given(pairs=st.lists(RANGE, max_size=4))
def test_ack_ranges_are_taken_as_the_request_names_them(pairs):
    request = pb.AckBatch(consumer_id=0, ranges=[pb.OffsetRange(first=f, last=last) for f, last in pairs])
    want = _spec(pairs)
    if isinstance(want, str):
        with pytest.raises(InvalidArgumentError, match=want):
            ack_pairs(request.ranges)
    else:
        assert ack_pairs(request.ranges) == want


def test_one_range_of_a_million_offsets_is_refused_and_one_less_is_taken():
    one = pb.AckBatch(ranges=[pb.OffsetRange(first=10, last=10 + 999_999)]).ranges
    assert ack_pairs(one) == ([(10, 1_000_009)], 1_000_000)
    with pytest.raises(InvalidArgumentError, match="spans more than 1,000,000"):
        ack_pairs(pb.AckBatch(ranges=[pb.OffsetRange(first=10, last=10 + 1_000_000)]).ranges)
    with pytest.raises(InvalidArgumentError, match="ends before it starts"):
        ack_pairs(pb.AckBatch(ranges=[pb.OffsetRange(first=5, last=4)]).ranges)
