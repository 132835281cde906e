"""gRPC message framing and header values of the h2 server (danube.server.h2grpc.wire)."""

from __future__ import annotations

import itertools
import urllib.parse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube import message_codec as codec
from danube.errors import InvalidArgumentError
from danube.proto.danube import DanubeApi_pb2 as danube_pb
from danube.proto.danube_batch import batch_pb2 as batch_pb
from danube.server import batch_lane_wire
from danube.server import danube_services as services
from danube.server.h2grpc import wire


def decode_status_message(value: bytes) -> str:
    """The inverse of wire.encode_status_message, as a gRPC client decodes ``grpc-message``."""
    return urllib.parse.unquote_to_bytes(value).decode("utf-8", "replace")


def framed(messages: list[bytes]) -> bytes:
    return b"".join(wire.message_prefix(len(m)) + m for m in messages)


@given(messages=st.lists(st.binary(max_size=300), max_size=8), cuts=st.lists(st.integers(0, 4000), max_size=12))
def test_messages_come_out_whole_whatever_the_frame_boundaries(messages, cuts):
    data = framed(messages)
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    reader = wire.MessageReader(limit=1000)
    out = []
    for start, end in itertools.pairwise(points):
        out += reader.feed(data[start:end])
    assert out == messages
    assert reader.pending == 0


def test_a_partial_message_stays_pending():
    reader = wire.MessageReader(limit=100)
    data = framed([b"abcdef"])
    assert reader.feed(data[:7]) == []
    assert reader.pending == 7
    assert reader.feed(data[7:]) == [b"abcdef"]


def test_the_prefix_is_a_zero_flag_and_a_big_endian_length():
    assert wire.message_prefix(0x01020304) == b"\x00\x01\x02\x03\x04"


def test_an_oversized_message_is_refused_from_its_prefix_alone():
    reader = wire.MessageReader(limit=10)
    with pytest.raises(wire.MessageTooLarge) as info:
        reader.feed(wire.message_prefix(11))
    assert (info.value.length, info.value.limit) == (11, 10)
    assert "11 vs. 10" in str(info.value)


def test_a_message_at_the_limit_is_accepted():
    assert wire.MessageReader(limit=10).feed(framed([b"x" * 10])) == [b"x" * 10]


def test_a_compressed_message_is_refused():
    with pytest.raises(wire.CompressedMessage, match="grpc-encoding identity"):
        wire.MessageReader(limit=100).feed(b"\x01" + (3).to_bytes(4, "big") + b"abc")


@pytest.mark.parametrize(
    "value, seconds",
    [(b"1S", 1.0), (b"250m", 0.25), (b"3M", 180.0), (b"2H", 7200.0), (b"99999999u", 99.999999), (b"5n", 5e-9)],
)
def test_timeouts_parse_in_every_unit(value, seconds):
    assert wire.parse_timeout(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [b"", b"S", b"10", b"10x", b"123456789S", b"-1S", b"1.5S", b" 1S"])
def test_malformed_timeouts_are_refused_with_the_value(value):
    with pytest.raises(InvalidArgumentError, match="grpc-timeout"):
        wire.parse_timeout(value)


def test_status_messages_escape_percent_and_non_ascii():
    assert wire.encode_status_message("plain text") == b"plain text"
    assert wire.encode_status_message("100% sure") == b"100%25 sure"
    assert wire.encode_status_message("caf\u00e9\n") == b"caf%C3%A9%0A"


@given(st.text(max_size=200))
def test_status_messages_round_trip(message):
    encoded = wire.encode_status_message(message)
    assert all(0x20 <= b <= 0x7E for b in encoded)
    assert decode_status_message(encoded) == message.encode("utf-8", "replace").decode("utf-8", "replace")


# ---- messages written as Encoded parts (one shared payload buffer) read back as protobuf's own


@settings(deadline=None)
@given(
    payload=st.binary(max_size=300), attributes=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3)
)
def test_an_encoded_stream_message_parses_as_the_serialized_one(payload, attributes):
    class Broker:
        def producer_name(self, topic, producer_id):
            return "p"

    rec = codec.decode_batch(
        bytearray(codec.encode_record(payload, publish_time=7, producer_id=3, key="k", attributes=attributes or None))
    )[0]
    encoded = services._encoded_stream_message(Broker(), rec, "/d/t", "s", "http://b")
    assert type(encoded) is wire.Encoded and any(part is rec.payload for part in encoded)  # not copied
    plain = services._stream_message(Broker(), rec, "/d/t", "s", "http://b")
    assert danube_pb.StreamMessage.FromString(encoded.tobytes()) == plain


@settings(deadline=None)
@given(frames=st.binary(max_size=3000), counts=st.lists(st.integers(0, 1000), max_size=4))
def test_an_encoded_consume_batch_parses_as_the_serialized_one(frames, counts):
    batch = batch_pb.ConsumeBatch(first_offset=5, last_offset=9, count=5, redelivery_counts=counts)
    view = memoryview(frames)
    encoded = batch_lane_wire.encoded_batch(view, batch.SerializeToString())
    assert encoded.length == len(encoded.tobytes()) and encoded[1] is view
    batch.frames = frames
    assert batch_pb.ConsumeResponse.FromString(encoded.tobytes()) == batch_pb.ConsumeResponse(batch=batch)
