"""The compiled HTTP/2 and gRPC message codec against its pure-Python twin.

Same bytes out of every encoder; the same results, or the same error (type, message and
fields), out of every parser, on well-formed streams cut anywhere and on hostile bytes:
truncated frames, lengths over the limit, bad padding, unknown frame types, random damage.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import danube._pure.h2codec as pure

try:
    import danube._core.h2codec as compiled
except ImportError:
    pytest.skip("danube._core.h2codec not built", allow_module_level=True)

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
STREAM_IDS = st.integers(min_value=0, max_value=2**32 - 1)  # the reserved bit too
KINDS = st.integers(0, 255)  # 10..255 are unknown types
FRAMES = st.lists(st.tuples(KINDS, st.integers(0, 255), STREAM_IDS, st.binary(max_size=120)), max_size=10)
BUDGET = st.integers(min_value=0, max_value=20)


def outcome(call, *args):
    """What a call did: its result, or the error with every field a caller reads."""
    try:
        return ("ok", call(*args))
    except Exception as exc:  # noqa: BLE001 - the error itself is what is compared
        fields = {k: getattr(exc, k, None) for k in ("code", "limit", "length")}
        return ("error", type(exc), str(exc), fields)


def both(name, *args):
    theirs = outcome(getattr(pure, name), *args)
    ours = outcome(getattr(compiled, name), *args)
    assert ours == theirs
    return ours


def wire_of(items):
    return b"".join(pure.frame(*item) for item in items)


def test_the_error_classes_are_shared():
    # a caller catches one class whichever twin danube._native picked
    for name in ("FrameError", "MessageTooLarge", "CompressedMessage"):
        assert getattr(compiled, name) is getattr(pure, name)


# ------------------------------------------------------------------ frames


@SETTINGS
@given(FRAMES, st.integers(0, 2000), st.integers(0, 200), BUDGET, BUDGET, st.integers(0, 500))
def test_parse_frames_agrees_on_streams_cut_anywhere(
    items, cut, max_frame_size, max_frames, max_headers, max_header_bytes
):
    data = bytearray(wire_of(items)[:cut])
    result = both("parse_frames", data, max_frame_size, max_frames, max_headers, max_header_bytes)
    if result[0] == "ok":
        parsed, used = result[1]
        assert used <= len(data) and len(parsed) <= max_frames
        # the frames taken are exactly the bytes taken (once the reserved bit is dropped from the ids)
        masked = wire_of([(kind, flags, stream_id & 0x7FFFFFFF, payload) for kind, flags, stream_id, payload in items])
        assert wire_of(parsed) == masked[:used]
        assert all(len(payload) <= max_frame_size for _, _, _, payload in parsed)
    else:
        assert result[3]["code"] == pure.FRAME_SIZE_ERROR


@SETTINGS
@given(FRAMES)
def test_parse_frames_takes_every_whole_frame_without_budgets(items):
    data = wire_of(items)
    parsed, used = compiled.parse_frames(bytearray(data), 16384)
    assert used == len(data)
    assert parsed == [(kind, flags, stream_id & 0x7FFFFFFF, payload) for kind, flags, stream_id, payload in items]


@SETTINGS
@given(st.binary(max_size=400), st.integers(0, 300), st.integers(1, 50))
def test_parse_frames_agrees_on_hostile_bytes(data, max_frame_size, max_frames):
    both("parse_frames", bytearray(data), max_frame_size, max_frames, 5, 1000)
    both("parse_frames", data, max_frame_size)  # any buffer, not only a bytearray


@SETTINGS
@given(st.integers(1, 2**24 - 1), st.integers(0, 16384), KINDS, st.binary(max_size=20))
def test_an_oversize_length_is_refused_from_the_header_alone(length, max_frame_size, kind, tail):
    header = pure.frame_header(kind, 0, 1, length)
    result = both("parse_frames", bytearray(header + tail), max_frame_size)
    if length > max_frame_size:
        assert result[:3] == (
            "error",
            pure.FrameError,
            f"a {length}-byte frame is over the {max_frame_size}-byte limit",
        )
        assert result[3]["code"] == pure.FRAME_SIZE_ERROR
    else:
        assert result == ("ok", ([], 0)) or len(tail) >= length


def test_parse_frames_keeps_a_truncated_frame_for_the_next_read():
    whole = pure.frame(pure.DATA, 1, 3, b"abcdef")
    for cut in range(len(whole)):
        assert compiled.parse_frames(bytearray(whole[:cut]), 16384) == ([], 0)
    assert compiled.parse_frames(bytearray(whole + whole[:4]), 16384) == ([(0, 1, 3, b"abcdef")], len(whole))


def test_parse_frames_budgets_stop_after_the_frame_that_spends_them():
    headers = pure.frame(pure.HEADERS, 4, 1, b"h" * 10)
    data = pure.frame(pure.DATA, 0, 1, b"d")
    buf = bytearray(data + headers + data + headers + data)
    for codec in (pure, compiled):
        assert len(codec.parse_frames(buf, 16384, 2)[0]) == 2
        assert len(codec.parse_frames(buf, 16384, 100, 1)[0]) == 2  # up to the first HEADERS
        assert len(codec.parse_frames(buf, 16384, 100, 100, 15)[0]) == 4  # 20 header bytes > 15
        assert len(codec.parse_frames(buf, 16384, 0)[0]) == 0


@SETTINGS
@given(st.binary(max_size=60), st.integers(0, 255))
def test_unpadded_agrees(payload, flags):
    both("unpadded", payload, flags)


@SETTINGS
@given(st.binary(max_size=60), st.integers(0, 255), st.integers(0, 255))
def test_bad_padding_is_a_protocol_error(data, pad, extra):
    payload = bytes([pad]) + data
    result = both("unpadded", payload, pure.PADDED | (extra & ~pure.PADDED))
    if pad >= len(payload):
        assert result[:3] == ("error", pure.FrameError, "the padding is as long as the frame or longer")
        assert result[3]["code"] == pure.PROTOCOL_ERROR
    else:
        assert result == ("ok", data[: len(data) - pad])
    assert both("unpadded", b"", pure.PADDED)[3]["code"] == pure.PROTOCOL_ERROR


@SETTINGS
@given(st.binary(max_size=40), st.sampled_from(["WINDOW_UPDATE", "RST_STREAM"]))
def test_settings_and_u32_payloads_agree(payload, what):
    both("parse_settings", payload)
    both("parse_u32", payload, what)


@SETTINGS
@given(KINDS, st.integers(0, 255), STREAM_IDS, st.binary(max_size=200), st.integers(0, 2**24 - 1))
def test_encoders_write_the_same_bytes(kind, flags, stream_id, payload, length):
    assert compiled.frame(kind, flags, stream_id, payload) == pure.frame(kind, flags, stream_id, payload)
    assert compiled.frame(kind, flags, stream_id, bytearray(payload)) == pure.frame(kind, flags, stream_id, payload)
    assert compiled.frame_header(kind, flags, stream_id, length) == pure.frame_header(kind, flags, stream_id, length)
    assert compiled.message_prefix(length * 200) == pure.message_prefix(length * 200)
    message_length = max(0, length - 5)
    assert compiled.data_header(stream_id, message_length) == pure.data_header(stream_id, message_length)
    assert pure.data_header(stream_id, message_length) == (
        pure.frame_header(0, 0, stream_id, message_length + 5) + pure.message_prefix(message_length)
    )


@pytest.mark.parametrize("args", [(256, 0, 1, 0), (0, 0, 2**32, 0), (0, 0, -1, 0), (0, 0, 1, 2**24), (0, 0, 1, -1)])
def test_out_of_range_header_fields_are_refused_by_both(args):
    for codec in (pure, compiled):
        with pytest.raises(Exception):  # noqa: B017 - struct.error (pure) or OverflowError (compiled)
            codec.frame_header(*args)
    for length in (-1, 2**32):
        for codec in (pure, compiled):
            with pytest.raises(OverflowError):
                codec.message_prefix(length)
    for length in (-1, -5, 2**24 - 5, 2**40):
        assert outcome(compiled.data_header, 1, length) == outcome(pure.data_header, 1, length)
        assert outcome(pure.data_header, 1, length)[0] == "error"


@SETTINGS
@given(
    STREAM_IDS.filter(lambda sid: sid < 2**32),
    st.one_of(st.binary(max_size=300), st.lists(st.binary(max_size=100), max_size=4)),
    st.integers(-10, 400),
    st.integers(-10, 400),
    st.integers(0, 400),
)
def test_frame_message_appends_the_same_frame_or_nothing(stream_id, body, stream_window, connection_window, limit):
    data = tuple(memoryview(part) for part in body) if isinstance(body, list) else body
    outs = ([b"before"], [b"before"])
    results = [
        outcome(codec.frame_message, out, stream_id, data, stream_window, connection_window, limit)
        for codec, out in zip((pure, compiled), outs)
    ]
    assert results[0] == results[1]
    wire = [b"".join(out) for out in outs]
    assert wire[0] == wire[1]
    whole = b"".join(body) if isinstance(body, list) else body
    total = len(whole) + 5
    if total <= min(stream_window, connection_window, limit):
        assert results[0] == ("ok", total)
        assert wire[0] == b"before" + pure.data_header(stream_id, len(whole)) + whole
        if isinstance(data, tuple):  # the parts themselves are queued, not copies
            assert len(outs[1]) == 2 + len(data) and all(a is b for a, b in zip(outs[1][2:], data))
    else:
        assert results[0] == ("ok", 0) and outs[1] == [b"before"]  # nothing appended


# A uint64 mostly, sometimes just outside (negative, 2^64) or not an int: the same error from both.
FIELD_VALUES = st.one_of(
    st.integers(0, 2**64 - 1),
    st.integers(0, 300),
    st.sampled_from([-1, 2**64, 1.0, None, True]),
)


@SETTINGS
@given(st.lists(FIELD_VALUES, max_size=17).map(tuple))
def test_uint_fields_are_the_same_bytes_or_the_same_error(fields):
    result = both("uint_fields", fields)
    if result[0] == "ok":
        # what protobuf writes for fields 1..n of type uint64: a one-byte tag and a varint each,
        # zeros left out
        expected = b""
        for number, value in enumerate(fields, 1):
            if value:
                expected += bytes([number << 3]) + varint(value)
        assert result[1] == expected


@SETTINGS
@given(
    STREAM_IDS,
    st.lists(st.integers(0, 2**64 - 1), max_size=6).map(tuple),
    st.integers(-10, 80),
    st.integers(0, 80),
    st.integers(0, 80),
)
def test_frame_fields_appends_one_buffer_or_nothing(stream_id, fields, stream_window, connection_window, limit):
    outs = ([b"before"], [b"before"])
    results = [
        outcome(codec.frame_fields, out, stream_id, fields, stream_window, connection_window, limit)
        for codec, out in zip((pure, compiled), outs)
    ]
    assert results[0] == results[1] and outs[0] == outs[1]
    message = pure.uint_fields(fields)
    total = len(message) + 5
    if total <= min(stream_window, connection_window, limit):
        assert results[0] == ("ok", total)
        assert outs[1] == [b"before", pure.data_header(stream_id, len(message)) + message]
    else:
        assert results[0] == ("ok", 0) and outs[1] == [b"before"]


def varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# ------------------------------------------------------------------ gRPC messages


def message(body: bytes, flag: int = 0) -> bytes:
    return bytes([flag]) + len(body).to_bytes(4, "big") + body


def chunks_of(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:])]


def feed_both(readers, chunk):
    results = [outcome(reader.feed, chunk) for reader in readers]
    assert results[0] == results[1]
    assert readers[0].pending == readers[1].pending
    return results[0]


@SETTINGS
@given(st.lists(st.binary(max_size=80), max_size=8), st.lists(st.integers(0, 800), max_size=12))
def test_messages_split_anywhere_come_out_whole(bodies, cuts):
    data = b"".join(message(body) for body in bodies)
    readers = [pure.MessageReader(80), compiled.MessageReader(80)]
    out = []
    for chunk in chunks_of(data, cuts):
        result = feed_both(readers, chunk)
        out.extend(result[1])
    assert out == bodies
    assert readers[1].pending == 0


@SETTINGS
@given(st.lists(st.binary(max_size=60), max_size=10), st.integers(0, 100))
def test_message_reader_agrees_on_hostile_chunks(chunks, limit):
    readers = [pure.MessageReader(limit), compiled.MessageReader(limit)]
    for chunk in chunks:
        # a refused feed leaves both readers as they were, so the next feeds still agree
        result = feed_both(readers, chunk)
        if result[0] == "error":
            assert result[1] in (pure.MessageTooLarge, pure.CompressedMessage)


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.integers(0, 10**6), st.binary(max_size=3), st.booleans())
def test_an_oversize_message_is_refused_from_its_prefix(length, limit, some_body, split):
    readers = [pure.MessageReader(limit), compiled.MessageReader(limit)]
    data = b"\x00" + length.to_bytes(4, "big") + some_body
    if split:  # the slow path: the prefix completes bytes the reader holds
        assert feed_both(readers, data[:2]) == ("ok", [])
        data = data[2:]
    result = feed_both(readers, data)
    if length > limit:
        assert result == (
            "error",
            pure.MessageTooLarge,
            f"received message larger than max ({length} vs. {limit})",
            {"code": None, "limit": limit, "length": length},
        )
        assert readers[1].pending == (2 if split else 0)


@pytest.mark.parametrize("flag", [1, 3, 0xFF])
def test_a_compressed_message_is_refused_and_reserved_bits_are_not(flag):
    for codec in (pure, compiled):
        reader = codec.MessageReader(100)
        with pytest.raises(pure.CompressedMessage):
            reader.feed(message(b"zip", flag))
        assert reader.pending == 0
        assert codec.MessageReader(100).feed(message(b"ok", flag & ~1)) == [b"ok"]


# ------------------------------------------------------------------ fuzz


def damage(rng: random.Random, data: bytes) -> bytes:
    raw = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        what = rng.random()
        if what < 0.4 and raw:
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        elif what < 0.6 and raw:
            del raw[rng.randrange(len(raw)) :]
        elif what < 0.8:
            raw[rng.randrange(len(raw) + 1) : 0] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 12)))
        else:  # a header claiming a huge length, or an unknown type
            raw += pure.frame_header(
                rng.choice([rng.randrange(256), 10, 0xFF]),
                rng.randrange(256),
                rng.randrange(2**32),
                rng.choice([16385, 2**24 - 1, rng.randrange(64)]),
            )
    return bytes(raw)


def test_fuzz_damaged_streams_give_the_same_frames_or_the_same_error():
    rng = random.Random(20261126)
    for _ in range(2000):
        items = [
            (rng.randrange(12), rng.randrange(256), rng.randrange(2**31), rng.randbytes(rng.randrange(40)))
            for _ in range(rng.randint(0, 6))
        ]
        data = damage(rng, wire_of(items))
        max_frame_size = rng.choice([16384, 64, 8])
        result = both(
            "parse_frames", bytearray(data), max_frame_size, rng.randint(1, 8), rng.randint(1, 3), rng.randint(1, 200)
        )
        if result[0] == "ok":
            for kind, flags, _, payload in result[1][0]:
                if kind in (pure.DATA, pure.HEADERS):
                    both("unpadded", payload, flags)
                both("parse_settings", payload)
                both("parse_u32", payload, "WINDOW_UPDATE")
        limit = rng.choice([0, 50, 1000])
        readers = [pure.MessageReader(limit), compiled.MessageReader(limit)]
        for chunk in chunks_of(data, [rng.randrange(len(data) + 1) for _ in range(3)]):
            feed_both(readers, chunk)
