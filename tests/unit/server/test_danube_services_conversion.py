"""Danube's ReceiveMessages: a record it cannot decode goes to the failure policy, the rest is sent."""

from __future__ import annotations

import struct

from danube import message_codec
from danube.server.danube_services import _decodable_records


class RecordingBroker:
    def __init__(self) -> None:
        self.rejected: list[tuple[int, int, str]] = []

    def reject_delivery(self, consumer_id: int, offset: int, problem: str) -> None:
        self.rejected.append((consumer_id, offset, problem))


def stamped(buf: bytes, base: int) -> bytearray:
    out = bytearray(buf)
    message_codec.stamp_offsets(out, base)
    return out


def poison_frame() -> bytes:
    body = struct.pack("<QQBBHH", 1, 0, 1, 0, 0, 2) + b"\xff\xfe" + b"payload"
    len_field = struct.pack("<I", len(body))
    return struct.pack("<QI", 0, message_codec.crc32c(body, message_codec.crc32c(len_field))) + len_field + body


def test_a_clean_delivery_is_decoded_whole():
    broker = RecordingBroker()
    buf = stamped(message_codec.encode_payloads([b"a", b"b"]), 10)
    assert [bytes(r.payload) for r in _decodable_records(broker, 7, buf)] == [b"a", b"b"]
    assert broker.rejected == []


def test_an_undecodable_record_is_rejected_with_its_offset_and_the_others_are_kept():
    broker = RecordingBroker()
    buf = stamped(message_codec.encode_payloads([b"a"]) + poison_frame() + message_codec.encode_payloads([b"c"]), 10)
    records = _decodable_records(broker, 7, buf)
    assert [(r.offset, bytes(r.payload)) for r in records] == [(10, b"a"), (12, b"c")]
    assert [(cid, offset) for cid, offset, _ in broker.rejected] == [(7, 11)]
    assert "UnicodeDecodeError" in broker.rejected[0][2]
