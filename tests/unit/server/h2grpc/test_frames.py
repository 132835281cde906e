"""HTTP/2 frame codec (danube.server.h2grpc.frames) against hyperframe and hpack, independent
implementations of the same RFCs."""

from __future__ import annotations

import hpack
import hyperframe.frame as hf
import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube.server.h2grpc import frames
from danube.server.h2grpc.frames import FrameError

stream_ids = st.integers(min_value=0, max_value=2**31 - 1)
any_frame = st.tuples(st.integers(0, 255), st.integers(0, 255), stream_ids, st.binary(max_size=300))


@given(st.lists(any_frame, max_size=8), st.integers(min_value=0, max_value=4000))
def test_parse_returns_exactly_the_whole_frames_before_the_cut(items, cut):
    wire = b"".join(frames.frame(*item) for item in items)
    cut = min(cut, len(wire))
    parsed, used = frames.parse_frames(bytearray(wire[:cut]), 16384)
    whole, offset = [], 0
    for item in items:
        size = frames.HEADER_SIZE + len(item[3])
        if offset + size > cut:
            break
        whole.append(item)
        offset += size
    assert parsed == whole
    assert used == offset


@given(st.integers(0, 255), stream_ids, st.binary(max_size=100))
def test_the_reserved_bit_of_the_stream_id_is_ignored(flags, stream_id, payload):
    raw = bytearray(frames.frame(frames.DATA, flags, stream_id, payload))
    raw[5] |= 0x80
    assert frames.parse_frames(raw, 16384)[0] == [(frames.DATA, flags, stream_id, payload)]


@given(st.integers(0, 255), st.integers(1, 2**31 - 1), st.binary(max_size=200))
def test_data_frames_match_hyperframe(flags, stream_id, payload):
    ours = frames.frame(frames.DATA, flags & frames.END_STREAM, stream_id, payload)
    theirs = hf.DataFrame(stream_id, data=payload, flags={"END_STREAM"} if flags & 1 else set()).serialize()
    assert ours == theirs
    parsed, length = hf.Frame.parse_frame_header(memoryview(ours[:9]))
    assert (parsed.type, parsed.stream_id, length) == (frames.DATA, stream_id, len(payload))


@given(
    st.integers(1, 2**31 - 1), st.integers(1, 2**31 - 1), st.integers(0, 0xFFFFFFFF), st.binary(max_size=8, min_size=8)
)
def test_control_frames_match_hyperframe(stream_id, increment, code, opaque):
    assert frames.window_update(stream_id, increment) == hf.WindowUpdateFrame(stream_id, increment).serialize()
    assert frames.rst_stream(stream_id, code) == hf.RstStreamFrame(stream_id, error_code=code).serialize()
    assert (
        frames.goaway(stream_id, code, b"why")
        == hf.GoAwayFrame(0, last_stream_id=stream_id, error_code=code, additional_data=b"why").serialize()
    )
    assert frames.frame(frames.PING, frames.ACK, 0, opaque) == hf.PingFrame(0, opaque, flags={"ACK"}).serialize()
    assert frames.SETTINGS_ACK == hf.SettingsFrame(0, flags={"ACK"}).serialize()


@given(st.lists(st.tuples(st.integers(1, 6), st.integers(0, 2**32 - 1)), max_size=6, unique_by=lambda p: p[0]))
def test_settings_round_trip_and_match_hyperframe(pairs):
    raw = frames.settings(pairs)
    assert raw == hf.SettingsFrame(0, settings=dict(pairs)).serialize()
    parsed, _ = frames.parse_frames(bytearray(raw), 16384)
    assert frames.parse_settings(parsed[0][3]) == pairs


def test_a_frame_over_the_limit_is_refused_from_its_header_alone():
    header = frames.frame_header(frames.DATA, 0, 1, 20000)
    with pytest.raises(FrameError) as caught:
        frames.parse_frames(bytearray(header), 16384)
    assert caught.value.code == frames.FRAME_SIZE_ERROR
    assert "20000" in str(caught.value)


@given(st.binary(max_size=100), st.integers(0, 255))
def test_padding_is_removed(data, pad):
    assert frames.unpadded(bytes([pad]) + data + b"\x00" * pad, frames.PADDED) == data
    assert frames.unpadded(data, 0) == data


@pytest.mark.parametrize("payload", [b"", b"\x05abc", b"\x04abc"])
def test_padding_as_long_as_the_frame_is_a_protocol_error(payload):
    with pytest.raises(FrameError) as caught:
        frames.unpadded(payload, frames.PADDED)
    assert caught.value.code == frames.PROTOCOL_ERROR


@pytest.mark.parametrize("payload, what", [(b"\x00" * 5, "SETTINGS"), (b"\x00" * 3, "WINDOW_UPDATE")])
def test_payloads_of_the_wrong_size_are_frame_size_errors(payload, what):
    with pytest.raises(FrameError) as caught:
        if what == "SETTINGS":
            frames.parse_settings(payload)
        else:
            frames.parse_u32(payload, what)
    assert caught.value.code == frames.FRAME_SIZE_ERROR
    assert what in str(caught.value)


header_names = st.binary(min_size=1, max_size=300).map(lambda b: b.lower())
header_lists = st.lists(st.tuples(header_names, st.binary(max_size=400)), max_size=10)


@given(header_lists)
def test_header_blocks_decode_with_hpack_to_what_was_encoded(headers):
    assert hpack.Decoder().decode(frames.encode_header_block(headers), raw=True) == headers


def test_static_table_pairs_take_one_byte():
    assert frames.encode_header_block([(b":status", b"200")]) == b"\x88"


@given(st.binary(min_size=0, max_size=2000), st.integers(1, 2**31 - 1), st.booleans())
def test_a_large_header_block_continues_in_continuation_frames(block, stream_id, end_stream):
    raw = frames.headers_frames(stream_id, block, end_stream, 512)
    parsed, used = frames.parse_frames(bytearray(raw), 512)
    assert used == len(raw)
    assert parsed[0][0] == frames.HEADERS
    assert all(kind == frames.CONTINUATION for kind, *_ in parsed[1:])
    assert [bool(flags & frames.END_HEADERS) for _, flags, _, _ in parsed] == [False] * (len(parsed) - 1) + [True]
    assert bool(parsed[0][1] & frames.END_STREAM) == end_stream
    assert {sid for _, _, sid, _ in parsed} == {stream_id}
    assert b"".join(payload for *_, payload in parsed) == block


@given(st.lists(any_frame, max_size=12), st.integers(1, 12), st.integers(1, 12))
def test_parse_stops_at_the_frame_budget_and_after_the_last_headers_it_allows(items, max_frames, max_headers):
    wire = b"".join(frames.frame(*item) for item in items)
    parsed, used = frames.parse_frames(bytearray(wire), 16384, max_frames, max_headers)
    expected, headers = [], 0
    for item in items:
        if len(expected) == max_frames or headers == max_headers:
            break
        expected.append(item)
        headers += item[0] == frames.HEADERS
    assert parsed == expected
    assert used == sum(frames.HEADER_SIZE + len(item[3]) for item in expected)


@given(
    st.lists(
        st.tuples(st.sampled_from([frames.HEADERS, frames.CONTINUATION, frames.DATA]), st.binary(max_size=300)),
        min_size=1,
        max_size=30,
    ),
    st.integers(min_value=1, max_value=2000),
)
def test_a_read_stops_at_the_frame_that_spends_its_header_bytes(items, budget):
    buffer = bytearray(b"".join(frames.frame(kind, 0, 1, payload) for kind, payload in items))
    parsed, used = frames.parse_frames(buffer, 1 << 14, max_header_bytes=budget)
    header_bytes = [len(p) for kind, _, _, p in parsed if kind in (frames.HEADERS, frames.CONTINUATION)]
    # Every frame but the last leaves budget; the read goes on to the end when the budget lasts.
    assert sum(header_bytes[:-1]) < budget or not header_bytes
    if len(parsed) < len(items):
        assert parsed[-1][0] in (frames.HEADERS, frames.CONTINUATION) and sum(header_bytes) >= budget
    assert used == sum(frames.HEADER_SIZE + len(p) for _, _, _, p in parsed)
