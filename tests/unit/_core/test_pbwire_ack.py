"""The Consume stream's ack requests read from their bytes (``pbwire.read_ack``, compiled and pure
twin) against protobuf's own reading of the same bytes: whatever it reads, protobuf reads the
same ack from them; what it leaves (None), protobuf reads or refuses itself."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from hypothesis import example, given, settings
from hypothesis import strategies as st

import danube._pure.pbwire as pure
from danube.proto.danube_batch import batch_pb2 as pb

try:
    import danube._core.pbwire as compiled
except ImportError:  # (the pure run: the twin is checked alone)
    compiled = None

IMPLS = [pure] if compiled is None else [pure, compiled]
U64 = st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 127, 128, 16383, 16384, 2**63, 2**64 - 1]))
# (past 64 bits too: protobuf drops the bits beyond)
WIDE = st.one_of(U64, st.integers(2**64, 2**70 - 1))


def varint(value: int, pad: int = 0) -> bytes:
    """``value`` as a varint, ``pad`` bytes longer than it need be (protobuf reads those too)."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value or pad:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
        if not value:
            while pad > 1:
                out.append(0x80)
                pad -= 1
            out.append(0)
            return bytes(out)


PAD = st.sampled_from([0, 0, 0, 1, 2, 6])


@st.composite
def wire_varint(draw) -> bytes:
    return varint(draw(WIDE), draw(PAD))


@st.composite
def offset_range(draw) -> bytes:
    fields = draw(
        st.lists(
            st.one_of(
                st.tuples(st.sampled_from([b"\x08", b"\x10"]), wire_varint()).map(b"".join),
                st.sampled_from([b"\x18\x01", b"\x88\x00\x05", b"\x0a\x00"]),  # unknown, long tag, wrong type
            ),
            max_size=4,
        )
    )
    return b"".join(fields)


@st.composite
def length_delimited(draw, tag: bytes, body) -> bytes:
    data = draw(body)
    return tag + varint(len(data), draw(st.sampled_from([0, 0, 0, 1, 4]))) + data


@st.composite
def ack_batch(draw) -> bytes:
    fields = draw(
        st.lists(
            st.one_of(
                st.tuples(st.just(b"\x08"), wire_varint()).map(b"".join),
                length_delimited(b"\x12", offset_range()),
                st.sampled_from([b"\x18\x00", b"\x10\x05", b"\x92\x00\x00"]),
            ),
            max_size=6,
        )
    )
    return b"".join(fields)


@st.composite
def consume_request_bytes(draw) -> bytes:
    """Requests as protobuf writes them (every kind) and as it may read them (fields merged,
    repeated, longer encodings, unknown fields), joined."""
    written = st.one_of(
        st.builds(
            lambda cid, ranges: pb.ConsumeRequest(
                ack=pb.AckBatch(consumer_id=cid, ranges=[pb.OffsetRange(first=f, last=la) for f, la in ranges])
            ).SerializeToString(),
            U64,
            st.lists(st.tuples(U64, U64), max_size=4),
        ),
        st.builds(lambda n: pb.ConsumeRequest(credit=pb.Credit(messages=n, bytes=n)).SerializeToString(), U64),
        st.builds(lambda n: pb.ConsumeRequest(nack=pb.NackRequest(offset=n)).SerializeToString(), U64),
        st.builds(lambda n: pb.ConsumeRequest(consumer_id=n).SerializeToString(), U64),
        st.just(pb.ConsumeRequest(subscribe=pb.SubscribeSpec(topic="/default/t")).SerializeToString()),
    )
    parts = st.one_of(written, length_delimited(b"\x22", ack_batch()), st.binary(max_size=3))
    return b"".join(draw(st.lists(parts, min_size=1, max_size=4)))


def protobuf_reads(data: bytes) -> pb.ConsumeRequest | None:
    try:
        return pb.ConsumeRequest.FromString(data)
    except DecodeError:
        return None


def check_against_protobuf(data: bytes) -> None:
    want = protobuf_reads(data)
    got = [impl.read_ack(data) for impl in IMPLS]
    assert len({repr(g) for g in got}) == 1, got  # the twins agree
    read = got[0]
    if read is not None:
        assert want is not None and want.WhichOneof("kind") == "ack"
        assert read.consumer_id == want.ack.consumer_id
        assert read.ranges == [(r.first, r.last) for r in want.ack.ranges]
        assert read.checked == all(0 <= r.last - r.first < 1_000_000 for r in want.ack.ranges)
        assert read.WhichOneof("kind") == "ack" and read.ack is read
    for impl in IMPLS:  # the deserializer: the ack, or protobuf's reading (or its refusal)
        if want is None:
            with pytest.raises(DecodeError):
                impl.consume_request(data)
        else:
            parsed = impl.consume_request(data)
            assert repr(parsed) == repr(read) if read is not None else parsed == want


@settings(max_examples=1500, deadline=None)
@given(data=consume_request_bytes())
@example(data=b"")
@example(data=b"\x22\x00")
@example(data=b"\x22\x02\x12\x00")
@example(data=b"\x22\x0c\x08" + b"\xff" * 10 + b"\x01")  # a varint of 11 bytes
@example(data=b"\x22\x0b\x08" + b"\xff" * 9 + b"\x7f")  # 10 bytes, bits past the 64th
@example(data=b"\x22\x05\x12\x03\x08\x01")  # a range running past its ack
def test_an_ack_is_read_as_protobuf_reads_it(data):
    check_against_protobuf(data)


@settings(max_examples=800, deadline=None)
@given(data=consume_request_bytes(), cut=st.integers(0, 64), flip=st.integers(0, 255))
def test_damaged_bytes_are_left_to_protobuf_or_read_as_it_reads_them(data, cut, flip):
    # truncated, and one byte changed: the reader never takes what protobuf refuses
    check_against_protobuf(data[: max(0, len(data) - cut)])
    if data:
        i = cut % len(data)
        check_against_protobuf(data[:i] + bytes((flip,)) + data[i + 1 :])


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=64))
def test_any_bytes(data):
    check_against_protobuf(data)


@settings(max_examples=300, deadline=None)
@given(cid=U64, ranges=st.lists(st.tuples(U64, U64), max_size=5))
def test_every_ack_a_client_writes_is_read_here(cid, ranges):
    data = pb.ConsumeRequest(
        ack=pb.AckBatch(consumer_id=cid, ranges=[pb.OffsetRange(first=f, last=la) for f, la in ranges])
    ).SerializeToString()
    for impl in IMPLS:
        read = impl.read_ack(data)
        assert read is not None and read.consumer_id == cid and read.ranges == ranges
        assert read.checked == all(0 <= la - f < pure.MAX_ACK_SPAN for f, la in ranges)
        assert impl.read_ack(memoryview(data)).ranges == ranges  # (any buffer)


@pytest.mark.parametrize("impl", IMPLS)
def test_an_ack_request_answers_only_the_kind_oneof(impl):
    read = impl.read_ack(b"\x22\x00")
    assert read.WhichOneof("kind") == "ack"
    with pytest.raises(ValueError):
        read.WhichOneof("other")
