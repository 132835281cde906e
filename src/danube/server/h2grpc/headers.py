"""Request header blocks: HPACK decoding (the ``hpack`` library) with a per-connection memo.

A gRPC client repeats the same headers on every call, and after the first call its
HPACK encoder sends them as references into the connection's dynamic table, so the
block bytes repeat too.  Decoding such a block reads the table without changing it,
so its result can be reused for as long as the table stays as it was.  The memo keeps
only blocks whose decoding left the table untouched, and forgets everything as soon
as any block changes the table.  Each memo entry also keeps what the server reads of a request
(``RequestSummary``), so a repeated block costs one dict lookup, not a scan of its headers.

"Changes the table" is told by a counter the table itself bumps on every insertion
and every size change (evictions only happen through those two).  Comparing the
table's length and its first entry's identity, as an earlier version did, misses a
block that inserts two entries which each evict one: the length stays, and the new
first entry can be allocated where the evicted one was, with the same ``id`` -- the
memo then answered the previous request's headers.
"""

from __future__ import annotations

import hpack
import hpack.exceptions
import hpack.table

from danube.server.h2grpc.frames import COMPRESSION_ERROR, ENHANCE_YOUR_CALM, FrameError

_MEMO_ENTRIES = 64
# Typical gRPC request headers take 20-300 bytes once indexed; larger blocks are decoded every
# time, so the memo stays under 64 KiB per connection whatever a client sends.
_MEMO_BLOCK_BYTES = 1024


class _CountingTable(hpack.table.HeaderTable):
    """hpack's header table, counting the operations that change its dynamic part."""

    def __init__(self) -> None:
        super().__init__()
        self.changes = 0

    def add(self, name: bytes, value: bytes) -> None:
        self.changes += 1
        super().add(name, value)

    @property
    def maxsize(self) -> int:
        return self._maxsize

    @maxsize.setter
    def maxsize(self, newmax: int) -> None:
        self.changes += 1
        hpack.table.HeaderTable.maxsize.fset(self, newmax)  # type: ignore[attr-defined]  # a property: hpack's stubs say overload


# :method, :path (as text), content-type and grpc-timeout of a request (None when absent).
RequestSummary = tuple[bytes | None, str, bytes | None, bytes | None]


def summarize(headers: list[tuple[bytes, bytes]]) -> RequestSummary:
    method = path = content_type = timeout = None
    for name, value in headers:
        if name == b":path":
            path = value
        elif name == b":method":
            method = value
        elif name == b"content-type":
            content_type = value
        elif name == b"grpc-timeout":
            timeout = value
    return method, (path or b"").decode("utf-8", "replace"), content_type, timeout


class HeaderBlockDecoder:
    __slots__ = ("_decoder", "_memo", "_table")

    def __init__(self, max_header_list_size: int) -> None:
        self._decoder = hpack.Decoder(max_header_list_size=max_header_list_size)
        self._table = self._decoder.header_table = _CountingTable()
        self._memo: dict[bytes, tuple[list[tuple[bytes, bytes]], RequestSummary]] = {}

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """The ``(name, value)`` byte pairs of ``block``; FrameError(COMPRESSION_ERROR) when
        it does not decode, FrameError(ENHANCE_YOUR_CALM) when it decodes to more than the
        header list size limit (either way the connection cannot go on: its HPACK state is lost)."""
        return self.decode_request(block)[0]

    def decode_request(self, block: bytes) -> tuple[list[tuple[bytes, bytes]], RequestSummary]:
        """``decode``, with the block's ``RequestSummary``."""
        known = self._memo.get(block)
        if known is not None:
            return known
        table = self._table
        before = table.changes
        try:
            decoded = self._decoder.decode(block, raw=True)
        except hpack.exceptions.OversizedHeaderListError as exc:
            raise FrameError(
                ENHANCE_YOUR_CALM, f"a header list over the header list size limit: {exc}", limit="max_header_list_size"
            ) from exc
        except hpack.exceptions.HPACKError as exc:
            raise FrameError(COMPRESSION_ERROR, f"a header block does not decode: {exc}") from exc
        headers = [(name, value) for name, value in decoded]
        known = (headers, summarize(headers))
        if table.changes != before:
            self._memo.clear()
        elif len(self._memo) < _MEMO_ENTRIES and len(block) <= _MEMO_BLOCK_BYTES:
            self._memo[block] = known
        return known

    def clear(self) -> None:
        self._memo.clear()
