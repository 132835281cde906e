"""Protobuf's varint as the server and the client write it by hand, against protobuf's own."""

from __future__ import annotations

from google.protobuf.internal import encoder
from hypothesis import given
from hypothesis import strategies as st

from danube.proto.danube_batch import batch_pb2 as pb
from danube.protowire import varint

U64 = st.integers(0, 2**64 - 1)


@given(U64)
def test_varint_is_protobufs(value):
    assert varint(value) == encoder._VarintBytes(value)


@given(value=U64)
def test_varint_is_what_a_message_field_holds(value):
    assert b"\x08" + varint(value) == pb.OffsetRange(first=value).SerializeToString() or value == 0
