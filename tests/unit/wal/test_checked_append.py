"""The WAL appends the publish path's checked copy (message_codec.check_batch) as any batch:
stamped in place, read back whole; its frames are not validated again only while it is the
length that was checked, and everything else is validated as before."""

from __future__ import annotations

import pytest

from danube import message_codec
from danube.errors import CorruptFrameError, FrameFormatError


def test_a_checked_batch_is_stamped_in_place_and_read_back(open_wal):
    wal = open_wal()
    wal.append(b"x")
    batch = message_codec.encode_payloads([b"a", b"b"], producer_id=7)
    checked = message_codec.check_batch(batch, 7)
    assert type(checked) is message_codec.CheckedFrames
    assert wal.append_frames(checked) == (1, 2)
    assert [r.offset for r in message_codec.decode_batch(checked)] == [1, 2]  # the caller sees its offsets
    assert [(r.offset, r.payload, r.producer_id) for r in wal.read(1)] == [(1, b"a", 7), (2, b"b", 7)]


@pytest.mark.parametrize("change", ["grown", "shrunk"])
def test_a_checked_batch_whose_length_changed_is_validated_again(open_wal, change):
    wal = open_wal()
    wal.append(b"keep")
    checked = message_codec.check_batch(message_codec.encode_payloads([b"a", b"b"]), 0)
    if change == "grown":
        checked += b"\x01" * 30  # a torn frame after the checked ones
    else:
        del checked[-3:]
    with pytest.raises((CorruptFrameError, FrameFormatError)):
        wal.append_frames(checked)
    assert wal.next_offset == 1  # nothing of it stored


def test_a_batch_not_checked_is_still_validated(open_wal):
    wal = open_wal()
    bad = bytearray(message_codec.encode_payloads([b"a"]))
    bad[-1] ^= 0xFF
    with pytest.raises(CorruptFrameError):
        wal.append_frames(bad)
    assert wal.next_offset == 0
