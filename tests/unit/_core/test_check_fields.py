"""check_fields: what a subscriber needs of a frame (UTF-8 key and attributes, the producer id).

The compiled check runs against its pure twin on frames built from raw bytes (any
byte string as key, attribute name or value), on damaged buffers, and against
Python's own UTF-8 decoder.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import danube._pure.frame as pure
from tests.support.frames import raw_frame

try:
    import danube._core.frame as compiled
except ImportError:
    pytest.skip("danube._core.frame not built", allow_module_level=True)

TWINS = [pytest.param(pure, id="pure"), pytest.param(compiled, id="compiled")]
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
U64 = st.integers(min_value=0, max_value=2**64 - 1)
# Mostly text, sometimes arbitrary bytes (invalid UTF-8, overlongs, surrogates, > U+10FFFF).
RAW = st.one_of(
    st.text(max_size=12).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.binary(max_size=12),
    st.sampled_from(
        [
            b"\xc0\xaf",
            b"\xed\xa0\x80",
            b"\xf4\x90\x80\x80",
            b"\xe0\x80\xaf",
            b"\xf0\x8f\xbf\xbf",
            b"abcdefgh\xff",
            b"\xe2\x82",
            b"\xef\xbf\xbf",
            b"\xf4\x8f\xbf\xbf",
            b"\xc2\x80",
        ]
    ),
)


def valid_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def expected_reason(key, attrs, producer_id, expected_producer):
    if expected_producer is not None and producer_id not in (expected_producer, 0):
        return pure.FIELDS_WRONG_PRODUCER
    if key is not None and not valid_utf8(key):
        return pure.FIELDS_KEY_NOT_UTF8
    for name, value in attrs:
        if not valid_utf8(name):
            return pure.FIELDS_ATTR_NAME_NOT_UTF8
        if not valid_utf8(value):
            return pure.FIELDS_ATTR_VALUE_NOT_UTF8
    return pure.FIELDS_OK


FRAME_SPEC = st.tuples(
    st.none() | RAW, st.lists(st.tuples(RAW, RAW), max_size=3), st.sampled_from([0, 1, 2, 2**64 - 1])
)


@SETTINGS
@given(specs=st.lists(FRAME_SPEC, min_size=1, max_size=6), expected=st.none() | st.sampled_from([1, 2]))
def test_both_twins_find_the_first_frame_a_subscriber_could_not_decode(specs, expected):
    frames = [raw_frame(key, attrs, producer_id=pid) for key, attrs, pid in specs]
    buf = b"".join(frames)
    want = (-1, pure.FIELDS_OK)
    pos = 0
    for (key, attrs, pid), frame in zip(specs, frames):
        reason = expected_reason(key, attrs, pid, expected)
        if reason != pure.FIELDS_OK:
            want = (pos, reason)
            break
        pos += len(frame)
    assert pure.check_fields(buf, expected) == want
    assert compiled.check_fields(buf, expected) == want
    assert compiled.check_fields(bytearray(buf), expected) == want
    assert compiled.check_fields(memoryview(buf), expected) == want


@SETTINGS
@given(data=st.binary(max_size=64).map(lambda b: b"\x00" * 22 + b))
def test_the_utf8_check_is_pythons_decoder(data):
    """A key of any bytes: valid exactly when bytes.decode('utf-8') accepts it."""
    key = data[22:]
    buf = raw_frame(key, [])
    want = (-1, pure.FIELDS_OK) if valid_utf8(key) else (0, pure.FIELDS_KEY_NOT_UTF8)
    assert compiled.check_fields(buf) == want
    assert pure.check_fields(buf) == want


@SETTINGS
@given(
    specs=st.lists(FRAME_SPEC, min_size=1, max_size=3),
    cut=st.integers(min_value=0, max_value=400),
    flips=st.lists(
        st.tuples(st.integers(min_value=0, max_value=400), st.integers(min_value=0, max_value=255)), max_size=4
    ),
)
def test_damaged_buffers_give_the_same_answer_from_both_twins(specs, cut, flips):
    buf = bytearray(b"".join(raw_frame(key, attrs, producer_id=pid) for key, attrs, pid in specs))
    for at, value in flips:
        if at < len(buf):
            buf[at] = value
    buf = bytes(buf[:cut]) if cut < len(buf) else bytes(buf)
    assert compiled.check_fields(buf) == pure.check_fields(buf)
    assert compiled.check_fields(buf, 2) == pure.check_fields(buf, 2)


@pytest.mark.parametrize("codec", TWINS)
def test_a_poison_key_is_found_in_the_middle_of_a_batch(codec):
    good = codec.encode_record(b"a", key="k", attributes={"x": "y"}, producer_id=9)
    bad = raw_frame(b"\xff\xfe", [], producer_id=9)
    assert codec.check_fields(good + bad + good, 9) == (len(good), codec.FIELDS_KEY_NOT_UTF8)
    assert codec.check_fields(good + good, 9) == (-1, codec.FIELDS_OK)
    assert codec.check_fields(good, 10) == (0, codec.FIELDS_WRONG_PRODUCER)
    unset = codec.encode_record(b"a", producer_id=0)
    assert codec.check_fields(unset, 10) == (-1, codec.FIELDS_OK)
    assert codec.check_fields(b"") == (-1, codec.FIELDS_OK)
    assert codec.check_fields(good[:20]) == (0, codec.FIELDS_BAD_LAYOUT)
    assert codec.check_fields(raw_frame(None, [(b"n", b"\xc3")])) == (0, codec.FIELDS_ATTR_VALUE_NOT_UTF8)
    assert codec.check_fields(raw_frame(None, [(b"\x80", b"v")])) == (0, codec.FIELDS_ATTR_NAME_NOT_UTF8)


@pytest.mark.parametrize("codec", TWINS)
def test_a_producer_id_outside_u64_is_refused(codec):
    with pytest.raises(OverflowError):
        codec.check_fields(b"", 2**64)
    with pytest.raises(OverflowError):
        codec.check_fields(b"", -1)
