"""The message codec: messages (records) encoded, validated and decoded in the native frame format.

One format end to end: what a producer sends, what the WAL stores, what a durable segment holds
and what Spark decodes. Not to be confused with ``danube.server.h2grpc.frames`` (HTTP/2 frames).

The byte layout is documented at the top of ``danube/_pure/frame.py`` (the one
description; the compiled codec's field positions are in ``danube/_core/frame.pxd``).
This module exposes whichever implementation ``danube._native`` selected.
"""

from __future__ import annotations

from danube import _native

_impl = _native.load("frame")

HEADER_SIZE = _impl.HEADER_SIZE
MIN_BODY = _impl.MIN_BODY
MAX_BODY = _impl.MAX_BODY
SCAN_END = _impl.SCAN_END
SCAN_ZERO = _impl.SCAN_ZERO
SCAN_TORN = _impl.SCAN_TORN
SCAN_CORRUPT = _impl.SCAN_CORRUPT
Record = _impl.Record
crc32c = _impl.crc32c
crc32c_implementation = _impl.crc32c_implementation
encode_record = _impl.encode_record
encode_payloads = _impl.encode_payloads
encode_records = _impl.encode_records
decode_frame = _impl.decode_frame
iter_records = _impl.iter_records
decode_batch = _impl.decode_batch
validate = _impl.validate
scan = _impl.scan
stamp_offsets = _impl.stamp_offsets
frame_positions = _impl.frame_positions
frames_within = _impl.frames_within
find_offset = _impl.find_offset
routing_keys = _impl.routing_keys
decode_columns = _impl.decode_columns
check_fields = _impl.check_fields
check_batch = _impl.check_batch
CheckedFrames = _impl.CheckedFrames
FIELDS_OK = _impl.FIELDS_OK
FIELDS_BAD_LAYOUT = _impl.FIELDS_BAD_LAYOUT
FIELDS_KEY_NOT_UTF8 = _impl.FIELDS_KEY_NOT_UTF8
FIELDS_ATTR_NAME_NOT_UTF8 = _impl.FIELDS_ATTR_NAME_NOT_UTF8
FIELDS_ATTR_VALUE_NOT_UTF8 = _impl.FIELDS_ATTR_VALUE_NOT_UTF8
FIELDS_WRONG_PRODUCER = _impl.FIELDS_WRONG_PRODUCER

# What check_fields found, in words (for error messages and logs; this module's own, so not in
# __all__, which lists what both codec twins provide).
FIELDS_PROBLEMS = {
    FIELDS_BAD_LAYOUT: "its lengths or flags do not hold together",
    FIELDS_KEY_NOT_UTF8: "its routing key is not valid UTF-8",
    FIELDS_ATTR_NAME_NOT_UTF8: "an attribute name is not valid UTF-8",
    FIELDS_ATTR_VALUE_NOT_UTF8: "an attribute value is not valid UTF-8",
    FIELDS_WRONG_PRODUCER: "its producer id is neither the publishing producer's nor 0 (not set)",
}

__all__ = [
    "HEADER_SIZE",
    "MIN_BODY",
    "MAX_BODY",
    "SCAN_END",
    "SCAN_ZERO",
    "SCAN_TORN",
    "SCAN_CORRUPT",
    "Record",
    "crc32c",
    "crc32c_implementation",
    "encode_record",
    "encode_payloads",
    "encode_records",
    "decode_frame",
    "iter_records",
    "decode_batch",
    "validate",
    "scan",
    "stamp_offsets",
    "frame_positions",
    "frames_within",
    "find_offset",
    "routing_keys",
    "decode_columns",
    "check_fields",
    "check_batch",
    "CheckedFrames",
    "FIELDS_OK",
    "FIELDS_BAD_LAYOUT",
    "FIELDS_KEY_NOT_UTF8",
    "FIELDS_ATTR_NAME_NOT_UTF8",
    "FIELDS_ATTR_VALUE_NOT_UTF8",
    "FIELDS_WRONG_PRODUCER",
]
