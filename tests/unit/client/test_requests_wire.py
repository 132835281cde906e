"""The ack request the client encodes itself is byte for byte what protobuf writes, and passes
through the Consume streams' serializer unchanged."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from danube.client.requests_wire import ack_request, passing_bytes
from danube.proto.danube_batch import batch_pb2 as pb

U64 = st.integers(0, 2**64 - 1)


@settings(max_examples=300, deadline=None)
@given(ranges=st.lists(st.tuples(U64, U64), max_size=20))
def test_ack_request_is_what_protobuf_serializes(ranges):
    expected = pb.ConsumeRequest(
        ack=pb.AckBatch(consumer_id=0, ranges=[pb.OffsetRange(first=f, last=last) for f, last in ranges])
    )
    encoded = ack_request(ranges)
    assert encoded == expected.SerializeToString()
    decoded = pb.ConsumeRequest.FromString(encoded)
    assert decoded.WhichOneof("kind") == "ack"
    assert [(r.first, r.last) for r in decoded.ack.ranges] == list(ranges)


def test_the_serializer_passes_bytes_and_serializes_messages():
    serialize = passing_bytes(pb.ConsumeRequest)
    credit = pb.ConsumeRequest(credit=pb.Credit(messages=3, bytes=4))
    assert serialize(credit) == credit.SerializeToString()
    ack = ack_request([(1, 2)])
    assert serialize(ack) is ack
