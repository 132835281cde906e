"""One client connection: HTTP/2 (``frames.py``, ``headers.py``) on an event-loop transport.

This module holds the connection's life (handshake, timers, pauses, closing) and what calls
and the server use; the peer's frames and the streams' states (``dispatch.py``), the send side
(``sending.py``: DATA within the windows, the send-queue bounds) and the receive side
(``budget.py``: window granted from the server-wide request budget) are mixins of the
same class, so the hot path has no extra indirection.

Everything runs on the broker's event loop: no extra threads, no hand-off per call.
Responses of many calls finished in one loop iteration leave in one socket write.
HTTP/2 flow control is honoured both ways: a handler writing faster than the client
reads waits for WINDOW_UPDATE (and for the socket to drain), and a streaming
request the handler does not read stops getting window back (see ``call.py``).

The HTTP/2 layer here is the part of RFC 9113 a gRPC server needs, written for this
server instead of taken from a general library: a gRPC call costs a handful of frames,
and a general state machine per frame cost more than the broker's own work per call
(docs/benchmarks.md, "An HTTP/2 layer of its own").  A stream error answers RST_STREAM; a
connection error answers GOAWAY with the error code and a reason, and closes the connection.

Against hostile peers every resource a connection can make the server hold is bounded
(``limits.H2Limits``, one field per bound): streams (per connection and in all),
stream resets per second, CONTINUATION frames per header block, headers per block and
header bytes decoded per read, SETTINGS entries per frame, control frames and response
bytes queued for a peer that does not read, frames handled per read, request bytes
buffered for unfinished messages, the time to send the preface, and time without
progress.  The checks are counters on paths that already do work per frame; the
unary and batch-lane hot paths (HEADERS, DATA, WINDOW_UPDATE) gained a few integer
operations, nothing more.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import grpc

from danube.server.h2grpc import frames, wire
from danube.server.h2grpc.budget import ReceiveBudget
from danube.server.h2grpc.call import ServerCall
from danube.server.h2grpc.dispatch import PAUSED_FOR_BACKLOG, FrameDispatch, Stream
from danube.server.h2grpc.frames import FrameError
from danube.server.h2grpc.headers import HeaderBlockDecoder
from danube.server.h2grpc.sending import OK_TRAILERS_BLOCK, RESPONSE_BLOCK, SendSide

if TYPE_CHECKING:
    from danube.server.h2grpc.server import H2Server

log = logging.getLogger(__name__)

# How long a connection closed for an error may take to send its GOAWAY before it is aborted.
_LINGER_S = 2.0


def _header_pairs(metadata) -> list[tuple[bytes, bytes]]:
    """grpc.aio-style metadata (str keys; str or bytes values) as header byte pairs."""
    return [(key.encode("ascii"), value if isinstance(value, bytes) else value.encode()) for key, value in metadata]


class GrpcConnection(FrameDispatch, SendSide, ReceiveBudget, asyncio.Protocol):
    # What tests and the server read: the request bytes this connection's calls hold for
    # unfinished or unread messages, and how many control frames wait for a paused socket.
    buffered: int
    control_queued: int

    def __init__(self, server: H2Server) -> None:
        self._server = server
        self._budget = server.budget
        # The server makes connections once it listens, its loop set (some unit tests make one without).
        self.loop = cast(asyncio.AbstractEventLoop, server.loop)
        limits = server.limits
        self._limits = limits
        self._transport: asyncio.Transport | None = None
        self._calls: dict[int, ServerCall] = {}
        self._streams: dict[int, Stream] = {}
        self._buffer = bytearray()
        self._preface_seen = False
        self._header_decoder = HeaderBlockDecoder(limits.max_header_list_size)
        # A header block split over CONTINUATION frames: (stream id, HEADERS flags, fragments),
        # and its size so far.
        self._continuing: tuple[int, int, list[bytes]] | None = None
        self._continuing_bytes = 0
        self._continuing_frames = 0
        self._last_stream_id = 0
        # What the client may send us (its receive side is our limits) ...
        # Beyond the initial window, granted from the server's budget (budget.py): what is
        # owed to the peer and not granted yet waits in _recv_unacked.
        self._recv_window = frames.DEFAULT_WINDOW
        self._recv_unacked = 0
        self._recv_target = max(frames.DEFAULT_WINDOW, min(limits.initial_connection_window, limits.connection_window))
        self._recv_moved = 0  # window granted since the target last grew
        self._stream_window_half = limits.stream_window // 2  # a stream's WINDOW_UPDATE goes out below it
        # ... and what we may send it (its SETTINGS and WINDOW_UPDATEs).
        self._send_window = frames.DEFAULT_WINDOW
        self._peer_initial_window = frames.DEFAULT_WINDOW
        self._peer_max_frame_size = frames.DEFAULT_MAX_FRAME_SIZE
        # A change of the client's SETTINGS_INITIAL_WINDOW_SIZE not yet applied to the open
        # streams: applied once per read, not once per SETTINGS frame (a flood of them would
        # cost (frames x streams) otherwise).
        self._pending_window_delta = 0
        self._out: list = []
        self._out_bytes = 0  # bytes in _out
        self._send_recorded = 0  # bytes the transport held for the socket at the last look
        self._send_limit = limits.max_send_queued_bytes
        self._frame_limit = min(frames.DEFAULT_MAX_FRAME_SIZE, limits.max_send_frame_bytes)
        self._blocked: set[int] = set()  # streams whose writer waits on the peer
        self._flush_scheduled = False
        # Writers waiting for window (sending.py): for the connection's, in line, with the window
        # promised to those woken that have not run yet; for their stream's, by stream.
        self._window_waiters: collections.deque[tuple[asyncio.Future, int, int]] = collections.deque()
        self._window_promised = 0
        self._stream_waiters: dict[int, list[asyncio.Future]] = {}
        self._drain_waiter: asyncio.Future | None = None
        self._write_paused = False
        self._going_away = False
        self._lost = False
        self._broken = False
        self._admitted = False
        self._closing: asyncio.Transport | None = None  # a transport lingering after our GOAWAY
        self.peer = "unknown"
        self.peer_address = ""  # the peer's IP: what max_connections_per_peer counts
        # Bumped on every call opened or ended and every whole message in or out: the idle
        # check's measure of progress, and when it last moved (for eviction at the cap).
        self.progress = 0
        self.idle_since = server.loop.time() if server.loop is not None else 0.0
        # Limits (limits.H2Limits) and their counters.
        self.buffered = 0
        self.max_buffered = limits.max_buffered_bytes
        self._max_block = limits.max_header_list_size * 2  # header block bytes, before decoding
        self._favoured = None
        self._starved: set = set()  # calls holding flow-control credit back for the buffer budget
        self.control_queued = 0
        self._read_paused = 0
        self._more_scheduled = False
        self._handshake_done = False
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._stall_timer: asyncio.TimerHandle | None = None
        self._idle_mark = -1
        self._idle_ticks = 0
        self._reset_tokens = float(limits.reset_burst)
        self._reset_stamp = 0.0

    # ------------------------------------------------------------ transport events

    def connection_made(self, transport) -> None:
        self._transport = transport
        peername = transport.get_extra_info("peername")
        if isinstance(peername, tuple) and len(peername) >= 2:
            family = "ipv6" if ":" in str(peername[0]) else "ipv4"
            self.peer = f"{family}:{peername[0]}:{peername[1]}"
            self.peer_address = str(peername[0])
        limits = self._limits
        if not self._server.admit(self):
            # Over the connection cap: the server preface, GOAWAY, and the descriptor is freed.
            self._broken = True
            transport.write(frames.settings([]) + frames.goaway(0, frames.ENHANCE_YOUR_CALM, b"too many connections"))
            transport.close()
            return
        self._admitted = True
        self._reset_stamp = self.idle_since = self.loop.time()
        if limits.handshake_timeout:
            self._handshake_timer = self.loop.call_later(limits.handshake_timeout, self._on_handshake_timeout)
        self._queue(
            frames.settings(
                [
                    # No connection gets more than the server's total (the fair-share rule).
                    (frames.MAX_CONCURRENT_STREAMS, min(limits.max_concurrent_streams, limits.max_streams_total)),
                    (frames.INITIAL_WINDOW_SIZE, limits.stream_window),
                    (frames.MAX_FRAME_SIZE, limits.max_frame_size),
                    (frames.MAX_HEADER_LIST_SIZE, limits.max_header_list_size),
                ]
            )
        )
        self._budget.windows += self._recv_window
        if self._recv_target > frames.DEFAULT_WINDOW:
            self._recv_unacked = self._recv_target - frames.DEFAULT_WINDOW
            self.grant_window()
        self._flush()

    def data_received(self, data: bytes) -> None:
        if self._broken:
            return
        if self._buffer or not self._preface_seen:
            self._buffer += data
            self._process()
        else:
            self._process(data)

    def connection_lost(self, exc) -> None:
        self._lost = True
        self._transport = None
        self._closing = None
        self._broken = True
        for timer in (self._handshake_timer, self._idle_timer, self._stall_timer):
            if timer is not None:
                timer.cancel()
        self._handshake_timer = self._idle_timer = self._stall_timer = None
        self._out_bytes = 0
        self._record_backlog(0)
        for call in list(self._calls.values()):
            call.on_reset()
        self._calls.clear()
        if self._admitted:
            self._server.open_streams -= len(self._streams)
            self._budget.windows -= self._recv_window
            self._recv_window = 0
            self._budget.window_starved.discard(self)
        self._streams.clear()
        self._starved.clear()
        self._favoured = None
        # Whatever the peer left behind goes with the connection.
        self._buffer = bytearray()
        self._out = []
        self._continuing = None
        self._header_decoder.clear()
        self._wake_writers()
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)
        if self._admitted:
            self._server.connection_closed(self)

    def pause_writing(self) -> None:
        self._write_paused = True
        timeout = self._limits.write_stall_timeout
        if self._stall_timer is None and timeout and not self._broken:
            self._stall_timer = self.loop.call_later(timeout, self._on_write_stall)

    def resume_writing(self) -> None:
        self._write_paused = False
        self.control_queued = 0
        self._resume_reading(PAUSED_FOR_BACKLOG)
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        if self._transport is not None:
            self._record_backlog(self._transport.get_write_buffer_size())
        self._server.wake_senders()
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    # ------------------------------------------------------------ frames from the client

    def _on_first_frame(self, first: tuple) -> None:
        kind, flags = first[0], first[1]
        if kind != frames.SETTINGS or flags & frames.ACK:
            raise FrameError(frames.PROTOCOL_ERROR, "the client's preface must start with SETTINGS")
        self._handshake_done = True
        self._server.ready(self)
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        if self._limits.idle_timeout:
            self._idle_timer = self.loop.call_later(self._limits.idle_timeout / 4, self._idle_check)

    def _on_write_stall(self) -> None:
        """The peer made us queue replies or responses and has not read enough of them to drain the
        backlog since: it is dropped (its writers, waiting for room, are cancelled with it)."""
        self._stall_timer = None
        if self._transport is None or not self._write_paused:
            return
        self._connection_error(
            frames.ENHANCE_YOUR_CALM,
            f"the peer has not read what the server queued for it for {self._limits.write_stall_timeout:g} s",
            "write_stall_timeout",
        )

    def _on_handshake_timeout(self) -> None:
        self._handshake_timer = None
        if self._handshake_done or self._broken:
            return
        self._connection_error(
            frames.NO_ERROR,
            f"no HTTP/2 preface and SETTINGS within {self._limits.handshake_timeout:g} s",
            "handshake_timeout",
        )

    def _idle_check(self) -> None:
        """Every quarter of ``idle_timeout``: a connection that made no progress (no call opened or
        ended, no whole message in or out) for four checks in a row (idle_timeout to 1.25 x
        idle_timeout) gets GOAWAY NO_ERROR, whatever streams it holds -- unless one of its calls
        waits on its handler, not on the peer (see ``ServerCall.waits_on_server``)."""
        self._idle_timer = None
        if self._broken or self._going_away or self._transport is None:
            return
        mark = self.progress + self._last_stream_id
        if mark != self._idle_mark or any(
            call.waits_on_server and call.stream_id not in self._blocked for call in self._calls.values()
        ):
            self._idle_mark = mark
            self._idle_ticks = 0
        else:
            self._idle_ticks += 1
            if self._idle_ticks >= 4:
                self._server.trip(
                    "idle_timeout",
                    self.peer,
                    f"no progress for {self._limits.idle_timeout:g} s ({len(self._calls)} call(s) open)",
                )
                self._going_away = True
                self._queue(frames.goaway(self._last_stream_id, frames.NO_ERROR, b"idle"))
                self._flush()
                self._close_transport()
                return
        self._idle_timer = self.loop.call_later(self._limits.idle_timeout / 4, self._idle_check)

    # ------------------------------------------------------------ used by calls

    @property
    def status_observer(self) -> Callable[[str, Any], None] | None:
        """Called with (method path, status code) for every call answered, or None."""
        return self._server.on_status

    def forget(self, stream_id: int) -> None:
        self._calls.pop(stream_id, None)
        self.progress += 1
        if not self._calls:
            self.idle_since = self.loop.time()
        if self._going_away and not self._calls and self._transport is not None:
            self.loop.call_soon(self._close_if_idle)

    def send_response_headers(self, stream_id: int, metadata: tuple = ()) -> None:
        block = RESPONSE_BLOCK
        if metadata:
            block += frames.encode_header_block(_header_pairs(metadata))
        self._send_headers(stream_id, block, end_stream=False)

    def send_status(
        self,
        stream_id: int,
        code: grpc.StatusCode,
        details: str,
        trailing: tuple,
        *,
        trailers_only: bool,
        reset_after: bool,
    ) -> None:
        """The call's end: ``grpc-status`` (and message) in trailers, or trailers-only when no
        response headers went out."""
        if code is grpc.StatusCode.OK and not details and not trailing and not trailers_only:
            block = OK_TRAILERS_BLOCK
        else:
            headers = [(b"grpc-status", str(code.value[0]).encode())]
            if details:
                headers.append((b"grpc-message", wire.encode_status_message(details)))
            block = frames.encode_header_block(headers + _header_pairs(trailing))
            if trailers_only:
                block = RESPONSE_BLOCK + block
        if not self._send_headers(stream_id, block, end_stream=True):
            return
        if reset_after:
            # The client is still sending: tell it to stop (the status above stands).
            self._reset(stream_id, frames.NO_ERROR)

    def stop_stream(self, stream_id: int) -> None:
        """A call answered while its client still sends: RST_STREAM NO_ERROR tells it to stop
        (the answer stands)."""
        self._reset(stream_id, frames.NO_ERROR)

    # ------------------------------------------------------------ server shutdown

    def go_away(self) -> None:
        """Refuse new calls (GOAWAY); close once the calls in flight are answered."""
        if self._going_away or self._transport is None:
            return
        self._going_away = True
        self._queue(frames.goaway(self._last_stream_id, frames.NO_ERROR))
        self._flush()
        self._close_if_idle()

    def abort(self) -> None:
        """Drops the connection at once (the server needs its place): no GOAWAY, no linger."""
        self._broken = True
        transport = self._transport or self._closing
        if transport is not None:
            transport.abort()

    def evict(self) -> None:
        """Closed to make room for a new connection at the cap: one that has not sent its preface
        is dropped, an idle one gets GOAWAY NO_ERROR first (its client reconnects when it needs to)."""
        if not self._handshake_done or self._transport is None:
            self.abort()
            return
        self._going_away = True
        self._queue(frames.goaway(self._last_stream_id, frames.NO_ERROR, b"idle: closed to make room"))
        self._flush()
        self._close_transport()

    def refresh_backlog(self) -> None:
        if self._transport is not None:
            self._record_backlog(self._transport.get_write_buffer_size())

    def cancel_calls(self) -> None:
        for call in list(self._calls.values()):
            call.abandon()

    def close(self) -> None:
        if self._transport is not None:
            self._flush()
            self._transport.close()
        elif self._closing is not None:
            self._closing.abort()

    @property
    def busy(self) -> bool:
        return bool(self._calls)

    # ------------------------------------------------------------ internals

    def _send_headers(self, stream_id: int, block: bytes, *, end_stream: bool) -> bool:
        """HEADERS on an open stream (False, and nothing sent, when the stream is over)."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.local_closed:
            return False
        self._queue(frames.headers_frames(stream_id, block, end_stream, self._peer_max_frame_size))
        if end_stream:
            stream.local_closed = True
            if stream.remote_closed:
                del self._streams[stream_id]
                self._server.open_streams -= 1
        self._schedule_flush()
        return True

    def _reset(self, stream_id: int, code: int) -> None:
        if self._streams.pop(stream_id, None) is not None:
            self._server.open_streams -= 1
        self._queue_control(frames.rst_stream(stream_id, code))
        self._schedule_flush()

    def _queue_control(self, data: bytes) -> None:
        """A reply the peer's frames caused (PING or SETTINGS ACK, RST_STREAM): counted while
        the socket is paused, so a peer that does not read cannot make them pile up."""
        self._out.append(data)
        if self._write_paused:
            self.control_queued += 1

    def _pause_reading(self, why: int) -> None:
        if not self._read_paused and self._transport is not None:
            self._transport.pause_reading()
        self._read_paused |= why

    def _resume_reading(self, why: int) -> None:
        if self._read_paused & why:
            self._read_paused &= ~why
            if not self._read_paused and self._transport is not None and not self._broken:
                self._transport.resume_reading()

    def _connection_error(self, code: int, reason: str, limit: str | None = None) -> None:
        if limit is not None:
            self._server.trip(limit, self.peer, f"{reason}; GOAWAY with HTTP/2 error code {code}")
        else:
            log.info("closing the connection from %s: HTTP/2 error code %d: %s", self.peer, code, reason)
        self._broken = True
        self._buffer.clear()
        self._continuing = None
        for call in list(self._calls.values()):  # their handlers stop now, not after the linger
            call.on_reset()
        self._queue(frames.goaway(self._last_stream_id, code, reason.encode("utf-8", "replace")[:256]))
        self._flush()
        self._close_transport()

    def _close_transport(self) -> None:
        """Ends the connection after what is queued (its GOAWAY) is written: FIN, then what the
        peer still sends is read and dropped until it closes too, for at most a short linger --
        closing with unread input would answer RST, and the peer could lose the GOAWAY.  A peer
        that does not read (writing paused) gets the socket aborted at once."""
        transport = self._transport
        if transport is None:
            return
        self._broken = True
        if self._write_paused or not transport.can_write_eof():
            transport.abort()
            return
        transport.write_eof()
        self._read_paused = 0
        transport.resume_reading()
        # Nothing more is written: the transport is only kept to abort it after the linger.
        self._transport = None
        self._closing = transport
        self.loop.call_later(_LINGER_S, self._abort_if_open)

    def eof_received(self) -> None:
        """The peer is done sending: the transport closes once our side is written out."""
        return None

    def _abort_if_open(self) -> None:
        if self._closing is not None:
            self._closing.abort()

    def _close_if_idle(self) -> None:
        if not self._calls and self._transport is not None:
            self._flush()
            self._transport.close()
