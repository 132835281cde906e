"""HTTP/2 frames as this server reads and writes them: the vocabulary both sides share
(``danube.h2frames``, where the byte layouts and the header-block encoding are described) and what
only a server writes, its answers' header blocks and the small answers framed in one codec call.
"""

from __future__ import annotations

from functools import partial

from danube.h2frames import *  # noqa: F403 - the shared vocabulary, named here for the server's modules
from danube.h2frames import _codec
from danube.h2frames import encode_header_block as _encode_header_block

# The HPACK static table entries (RFC 7541 appendix A) a gRPC server's answers can use.
_STATIC_INDEXED = {
    (b":status", b"200"): 8,
    (b":status", b"204"): 9,
    (b":status", b"206"): 10,
    (b":status", b"304"): 11,
    (b":status", b"400"): 12,
    (b":status", b"404"): 13,
    (b":status", b"500"): 14,
}

# An answer's header block: ``:status`` by its static index, the rest as literals.
encode_header_block = partial(_encode_header_block, static_indexed=_STATIC_INDEXED)

# A message of unsigned varint fields 1, 2, ... (a protobuf message of uint64 fields, zeros
# omitted), alone, and framed as ``frame_message`` frames it but into one buffer: a small
# answer (an ack) without a message object and with one allocation.
uint_fields = _codec.uint_fields
frame_fields = _codec.frame_fields
