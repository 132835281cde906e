"""The pure twin of the batch lane's request reader reads what protobuf reads and refuses
what protobuf refuses (``tests/unit/_core/test_publish_request.py`` adds the compiled reader)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

import danube._pure.publish_request as pure
from danube.errors import InvalidArgumentError, MalformedRequestError
from tests.support.publish_requests import damaged, deep_groups, fields_of, hand_written, reference, requests, varint


def read(data: bytes):
    try:
        return fields_of(pure.parse(data))
    except MalformedRequestError:
        return None


@settings(max_examples=150, deadline=None)
@given(data=requests())
def test_a_request_protobuf_wrote_reads_as_protobuf_reads_it(data):
    assert reference(data) is not None
    assert read(data) == reference(data)


@settings(max_examples=150, deadline=None)
@given(data=hand_written())
def test_fields_in_any_order_repeated_or_unknown_read_as_protobuf_reads_them(data):
    assert read(data) == reference(data)


@settings(max_examples=150, deadline=None)
@given(data=damaged())
def test_damaged_bytes_are_refused_exactly_when_protobuf_refuses_them(data):
    assert read(data) == reference(data)


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"\x08\x80", "varint runs past the end"),
        (b"\x08" + b"\xff" * 10 + b"\x01", "varint longer than 10 bytes"),
        (b"\x22\x05ab", "length 5 past the end"),
        (b"\x22" + varint(2**31), "past the end"),
        (b"\x0e", "wire type 6"),
        (b"\x00\x01", "field number 0"),
        (b"\x4c", "end of a group never started"),
        (b"\x4b\x54", "group 9 ended by field 10"),
        (b"\xf8\xff\xff\xff\x1f\x01", "tag above 2**32"),
        (deep_groups(101), "groups nested deeper than 100"),
        (b"\x1a\x03\x0a\x01\xff", "create does not parse"),
    ],
)
def test_hostile_bytes_are_refused_saying_what_is_wrong(data, said):
    assert reference(data) is None
    with pytest.raises(MalformedRequestError, match="malformed PublishRequest: .*" + said.replace("*", r"\*")) as info:
        pure.parse(data)
    assert isinstance(info.value, InvalidArgumentError)


def test_groups_nest_as_deep_as_protobuf_lets_them():
    assert read(deep_groups(100)) == reference(deep_groups(100)) != None  # noqa: E711
    inner = deep_groups(99)
    create = b"\x1a" + varint(len(inner)) + inner
    assert read(create) is not None and reference(create) is not None
    inner = deep_groups(100)  # one level less inside the embedded message
    create = b"\x1a" + varint(len(inner)) + inner
    assert read(create) is None and reference(create) is None
