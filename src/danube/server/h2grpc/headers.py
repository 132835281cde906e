"""Request header blocks: HPACK decoding (the ``hpack`` library) with a per-connection memo.

A gRPC client repeats the same headers on every call, and after the first call its
HPACK encoder sends them as references into the connection's dynamic table, so the
block bytes repeat too.  Decoding such a block reads the table without changing it,
so its result can be reused for as long as the table stays as it was.  The memo keeps
only blocks whose decoding left the table untouched, and forgets everything as soon
as any block changes the table (an insertion, an eviction or a size update).
"""

from __future__ import annotations

import hpack
import hpack.exceptions

from danube.server.h2grpc.frames import COMPRESSION_ERROR, FrameError

_MEMO_ENTRIES = 64
# Typical gRPC request headers take 20-300 bytes once indexed; larger blocks are decoded every
# time, so the memo stays under 64 KiB per connection whatever a client sends.
_MEMO_BLOCK_BYTES = 1024


class HeaderBlockDecoder:
    __slots__ = ("_decoder", "_memo")

    def __init__(self, max_header_list_size: int) -> None:
        self._decoder = hpack.Decoder(max_header_list_size=max_header_list_size)
        self._memo: dict[bytes, list[tuple[bytes, bytes]]] = {}

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """The ``(name, value)`` byte pairs of ``block``; FrameError(COMPRESSION_ERROR) when
        it does not decode (the connection cannot go on: its HPACK state is lost)."""
        headers = self._memo.get(block)
        if headers is not None:
            return headers
        table = self._decoder.header_table
        entries = table.dynamic_entries
        before = (len(entries), id(entries[0]) if entries else 0, table.maxsize)
        try:
            decoded = self._decoder.decode(block, raw=True)
        except hpack.exceptions.HPACKError as exc:
            raise FrameError(COMPRESSION_ERROR, f"a header block does not decode: {exc}") from exc
        headers = [(name, value) for name, value in decoded]
        if (len(entries), id(entries[0]) if entries else 0, table.maxsize) != before:
            self._memo.clear()
        elif len(self._memo) < _MEMO_ENTRIES and len(block) <= _MEMO_BLOCK_BYTES:
            self._memo[block] = headers
        return headers
