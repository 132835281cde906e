"""The compiled reader of the batch lane's ``PublishRequest`` against its pure twin and
protobuf's own parse: the same fields from any bytes protobuf reads, the same refusals."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import danube._pure.publish_request as pure
from danube.errors import MalformedRequestError
from tests.support.publish_requests import damaged, deep_groups, fields_of, hand_written, reference, requests

compiled = pytest.importorskip("danube._core.publish_request")


def both(data):
    out = []
    for impl in (compiled, pure):
        try:
            out.append(fields_of(impl.parse(data)))
        except MalformedRequestError:
            out.append(None)
    return out


@settings(max_examples=200, deadline=None)
@given(data=st.one_of(requests(), hand_written(), damaged(), st.binary(max_size=40)))
def test_the_twins_and_protobuf_read_the_same_fields_or_all_refuse(data):
    want = reference(data)
    assert both(data) == [want, want]


# field number 0 inside a skipped group: upb reads it there (and refuses it in the message itself)
@pytest.mark.parametrize(
    "hex_bytes",
    [
        "08000b080005000000000c",
        "0b05000000000c",
        "0b03040c",
        "0b040c",
        "0b02000c",
        "0b8000000c",
        "0500000000",
        "0b000c",
        "0b030c",
    ],
)
def test_field_number_zero_is_read_inside_a_skipped_group_and_refused_outside_it(hex_bytes):
    data = bytes.fromhex(hex_bytes)
    want = reference(data)
    assert both(data) == [want, want]


@settings(max_examples=50, deadline=None)
@given(data=requests())
def test_any_buffer_reads_as_its_bytes(data):
    assert fields_of(compiled.parse(memoryview(data))) == fields_of(compiled.parse(bytearray(data))) == reference(data)


def test_the_fields_are_plain_attributes_of_the_types_the_handler_expects():
    request = compiled.parse(b"\x08\x07\x10\x09\x22\x02ab")
    assert (request.sequence, request.producer_id, request.frames, request.create) == (7, 9, b"ab", None)
    assert type(request.frames) is bytes and type(request.sequence) is int
    with pytest.raises(AttributeError):
        request.frames = b"other"  # type: ignore[misc]


@pytest.mark.parametrize("depth", [100, 101])
def test_group_depth_is_refused_alike(depth):
    data = deep_groups(depth)
    assert both(data) == [reference(data)] * 2


def _request(**fields) -> bytes:
    from danube.proto.danube_batch import batch_pb2 as pb

    return pb.PublishRequest(**fields).SerializeToString()


@pytest.mark.parametrize("impl", [compiled, pure], ids=["compiled", "pure"])
def test_the_frames_of_a_producer_named_by_id_are_checked_at_the_read(impl):
    from danube._pure import frame as pure_frame

    good = pure_frame.encode_payloads([b"a", b"bc"], publish_time=1, producer_id=0)
    other = pure_frame.encode_payloads([b"x"], publish_time=1, producer_id=5)
    request = impl.parse(_request(sequence=1, producer_id=9, frames=good))
    assert type(request.frames).__name__ == "CheckedFrames" and request.frames == good
    assert (request.frames.producer_id, request.frames.frame_count, request.frames.fields_position) == (9, 2, -1)
    # a field a subscriber could not decode is kept on the copy for the broker, not refused here
    wrong = impl.parse(_request(sequence=1, producer_id=9, frames=good + other))
    assert type(wrong.frames).__name__ == "CheckedFrames" and wrong.frames.fields_position == len(good)
    torn = good[:-1]
    flipped = bytearray(good)
    flipped[-1] ^= 1
    for frames in (torn, bytes(flipped), b"\x00" * 3):  # what check_batch refuses: the bytes, unchecked
        request = impl.parse(_request(sequence=1, producer_id=9, frames=frames))
        assert type(request.frames) is bytes and request.frames == frames
    # no producer id, or one created by the request: the bytes (checked by the lane for the id it gets)
    spec = {"topic": "/default/t", "producer_name": "p"}
    from danube.proto.danube_batch import batch_pb2 as pb

    for data in (_request(sequence=1, frames=good), _request(create=pb.ProducerSpec(**spec), frames=good)):
        assert type(impl.parse(data).frames) is bytes
    assert impl.parse(_request(sequence=1, producer_id=9)).frames == b""
