"""One client connection: HTTP/2 (``frames.py``, ``headers.py``) on an event-loop transport.

This module dispatches the peer's frames and keeps the streams' states; the send side
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
import logging
from typing import TYPE_CHECKING, cast

import grpc

from danube.errors import DanubeError
from danube.server import status as status_map
from danube.server.h2grpc import frames, wire
from danube.server.h2grpc.budget import ReceiveBudget
from danube.server.h2grpc.call import ServerCall
from danube.server.h2grpc.frames import FrameError
from danube.server.h2grpc.headers import HeaderBlockDecoder
from danube.server.h2grpc.sending import SendSide
from danube.server.rpc_counts import UNKNOWN_METHOD

if TYPE_CHECKING:
    from danube.server.h2grpc.server import H2Server

log = logging.getLogger(__name__)

_RESPONSE_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]
_RESPONSE_BLOCK = frames.encode_header_block(_RESPONSE_HEADERS)
_OK_TRAILERS_BLOCK = frames.encode_header_block([(b"grpc-status", b"0")])
# How long a connection closed for an error may take to send its GOAWAY before it is aborted.
_LINGER_S = 2.0
# Why reading is paused (bits): the per-read frame budget ran out, or replies are piling up
# for a peer that does not read.
_PAUSED_FOR_BUDGET = 1
_PAUSE_READING_ABOVE = 64 * 1024  # bytes left in the read buffer after a read's budget
_PAUSED_FOR_BACKLOG = 2
_HEADER_FRAMES = (frames.HEADERS, frames.CONTINUATION)


def _header_pairs(metadata) -> list[tuple[bytes, bytes]]:
    """grpc.aio-style metadata (str keys; str or bytes values) as header byte pairs."""
    return [(key.encode("ascii"), value if isinstance(value, bytes) else value.encode()) for key, value in metadata]


class _Stream:
    """HTTP/2 state of one stream: its windows and which sides have ended."""

    __slots__ = ("local_closed", "recv_unacked", "recv_window", "remote_closed", "send_window")

    def __init__(self, send_window: int, recv_window: int) -> None:
        self.send_window = send_window
        self.recv_window = recv_window
        self.recv_unacked = 0
        self.remote_closed = False
        self.local_closed = False


class GrpcConnection(SendSide, ReceiveBudget, asyncio.Protocol):
    # What tests and the server read: the request bytes this connection's calls hold for
    # unfinished or unread messages, and how many control frames wait for a paused socket.
    buffered: int
    control_queued: int

    def __init__(self, server: H2Server) -> None:
        self._server = server
        # The server makes connections once it listens, its loop set (some unit tests make one without).
        self.loop = cast(asyncio.AbstractEventLoop, server.loop)
        limits = server.limits
        self._limits = limits
        self._transport: asyncio.Transport | None = None
        self._calls: dict[int, ServerCall] = {}
        self._streams: dict[int, _Stream] = {}
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
        self._window_waiters: list[asyncio.Future] = []
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
                    (frames.MAX_CONCURRENT_STREAMS, limits.max_concurrent_streams),
                    (frames.INITIAL_WINDOW_SIZE, limits.stream_window),
                    (frames.MAX_FRAME_SIZE, limits.max_frame_size),
                    (frames.MAX_HEADER_LIST_SIZE, limits.max_header_list_size),
                ]
            )
        )
        self._server.recv_windows += self._recv_window
        if self._recv_target > frames.DEFAULT_WINDOW:
            self._recv_unacked = self._recv_target - frames.DEFAULT_WINDOW
            self.grant_window()
        self._flush()

    def data_received(self, data: bytes) -> None:
        if self._broken:
            return
        self._buffer += data
        self._process()

    def _process(self) -> None:
        """Handles the whole frames in the buffer, up to ``max_frames_per_read`` of them; with
        more left, reading pauses and the rest waits for the next loop iteration."""
        buffer = self._buffer
        limits = self._limits
        parsed = ()
        try:
            if not self._preface_seen and not self._read_preface():
                return
            parsed, used = frames.parse_frames(
                buffer,
                limits.max_frame_size,
                limits.max_frames_per_read,
                limits.max_requests_per_read,
                limits.max_header_bytes_per_read,
            )
            if used:
                del buffer[:used]
            if not self._handshake_done and parsed:
                self._on_first_frame(parsed[0])
            for kind, flags, stream_id, payload in parsed:
                if self._continuing is not None and kind != frames.CONTINUATION:
                    raise FrameError(frames.PROTOCOL_ERROR, "a header block was interrupted by another frame")
                if kind == frames.DATA:
                    self._on_data(flags, stream_id, payload)
                elif kind == frames.HEADERS:
                    self._on_headers(flags, stream_id, payload)
                elif kind == frames.WINDOW_UPDATE:
                    self._on_window_update(stream_id, payload)
                elif kind == frames.PING:
                    self._on_ping(flags, stream_id, payload)
                elif kind == frames.SETTINGS:
                    self._on_settings(flags, stream_id, payload)
                elif kind == frames.RST_STREAM:
                    self._on_rst_stream(stream_id, payload)
                elif kind == frames.CONTINUATION:
                    self._on_continuation(flags, stream_id, payload)
                elif kind == frames.GOAWAY:
                    self._on_goaway(stream_id, payload)
                elif kind == frames.PRIORITY:
                    self._on_priority(stream_id, payload)
                elif kind == frames.PUSH_PROMISE:
                    raise FrameError(frames.PROTOCOL_ERROR, "a client must not send PUSH_PROMISE")
                # Unknown frame types are ignored, as HTTP/2 asks.
            if self.control_queued > limits.max_queued_control_frames:
                raise FrameError(
                    frames.ENHANCE_YOUR_CALM,
                    f"over {limits.max_queued_control_frames} control frames queued for a peer that does not read",
                    limit="max_queued_control_frames",
                )
            if self._pending_window_delta:
                self._apply_window_delta()
        except FrameError as exc:
            self._connection_error(exc.code, str(exc), exc.limit)
            return
        if len(parsed) >= limits.max_frames_per_read or (
            parsed and parsed[-1][0] in _HEADER_FRAMES and len(buffer) >= frames.HEADER_SIZE
        ):
            # The read's budget (frames, or requests: HEADERS cost a decode and maybe a call)
            # may be spent: let the loop serve the others, then go on.  Reading pauses only when
            # much is left over, so the buffer stays bounded whatever the peer sends.
            if len(buffer) > _PAUSE_READING_ABOVE:
                self._pause_reading(_PAUSED_FOR_BUDGET)
            if not self._more_scheduled:
                self._more_scheduled = True
                self.loop.call_soon(self._process_more)
        if self.control_queued and self._write_paused:
            self._pause_reading(_PAUSED_FOR_BACKLOG)
        self._flush()

    def _process_more(self) -> None:
        self._more_scheduled = False
        if self._broken or self._transport is None:
            return
        self._process()
        if not self._more_scheduled:
            self._resume_reading(_PAUSED_FOR_BUDGET)

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
            self._server.recv_windows -= self._recv_window
            self._recv_window = 0
            self._server.window_starved.discard(self)
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
        self._resume_reading(_PAUSED_FOR_BACKLOG)
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        if self._transport is not None:
            self._record_backlog(self._transport.get_write_buffer_size())
        self._server.wake_senders()
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    # ------------------------------------------------------------ frames from the client

    def _read_preface(self) -> bool:
        buffer = self._buffer
        size = min(len(buffer), len(frames.PREFACE))
        if buffer[:size] != frames.PREFACE[:size]:
            raise FrameError(frames.PROTOCOL_ERROR, "the connection does not start with the HTTP/2 preface")
        if size < len(frames.PREFACE):
            return False
        del buffer[:size]
        self._preface_seen = True
        return True

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

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise FrameError(frames.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self._recv_window -= size
        self._server.recv_windows -= size
        if self._recv_window < 0:
            raise FrameError(frames.FLOW_CONTROL_ERROR, "DATA beyond the connection's flow-control window")
        stream = self._streams.get(stream_id)
        if stream is None or stream.remote_closed:
            if stream_id > self._last_stream_id:
                raise FrameError(frames.PROTOCOL_ERROR, f"DATA on stream {stream_id}, which was never opened")
            self.return_credit(stream_id, size)  # a call already over: give the window back, drop the bytes
            if stream is not None:  # DATA after the client's END_STREAM
                self._reset_call(stream_id, frames.STREAM_CLOSED)
            return
        stream.recv_window -= size
        if stream.recv_window < 0:
            self.return_credit(stream_id, size)
            self._reset_call(stream_id, frames.FLOW_CONTROL_ERROR)
            return
        data = frames.unpadded(payload, flags)
        call = self._calls.get(stream_id)
        if call is not None:
            call.on_data(data, size)
            if self._starved and self._recv_window < self._recv_target // 4:
                self._shed()
        else:
            self.return_credit(stream_id, size)
        if flags & frames.END_STREAM:
            self._remote_end(stream_id, stream)

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise FrameError(frames.PROTOCOL_ERROR, "HEADERS on stream 0")
        block = frames.unpadded(payload, flags)
        if flags & frames.PRIORITY_FLAG:
            if len(block) < 5:
                raise FrameError(frames.FRAME_SIZE_ERROR, "HEADERS too short for its priority fields")
            if int.from_bytes(block[:4], "big") & 0x7FFFFFFF == stream_id:
                # A stream error in RFC 9113 5.3.1, which an endpoint may treat as a connection error
                # (5.4.1): simpler than decoding a block only to keep the HPACK state in step.
                raise FrameError(frames.PROTOCOL_ERROR, f"stream {stream_id} depends on itself")
            block = block[5:]
        if len(block) > self._max_block:
            raise FrameError(
                frames.ENHANCE_YOUR_CALM,
                "a header block over twice the header list size limit",
                limit="max_header_list_size",
            )
        if flags & frames.END_HEADERS:
            self._on_header_block(stream_id, flags, block)
        else:
            self._continuing = (stream_id, flags, [block])
            self._continuing_bytes = len(block)
            self._continuing_frames = 0

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        continuing = self._continuing
        if continuing is None or continuing[0] != stream_id:
            raise FrameError(frames.PROTOCOL_ERROR, "CONTINUATION without a header block to continue")
        continuing[2].append(payload)
        self._continuing_bytes += len(payload)
        self._continuing_frames += 1
        limits = self._limits
        if self._continuing_bytes > limits.max_header_list_size * 2:
            raise FrameError(
                frames.ENHANCE_YOUR_CALM,
                "a header block over twice the header list size limit",
                limit="max_header_list_size",
            )
        if self._continuing_frames > limits.max_continuation_frames:
            raise FrameError(
                frames.ENHANCE_YOUR_CALM,
                f"a header block in more than {limits.max_continuation_frames} CONTINUATION frames",
                limit="max_continuation_frames",
            )
        if flags & frames.END_HEADERS:
            self._continuing = None
            self._on_header_block(stream_id, continuing[1], b"".join(continuing[2]))

    def _on_header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        headers = self._header_decoder.decode(block)  # always: it keeps the HPACK state in step
        if len(headers) > self._limits.max_header_count:
            raise FrameError(
                frames.ENHANCE_YOUR_CALM,
                f"a header block of {len(headers)} headers (at most {self._limits.max_header_count})",
                limit="max_header_count",
            )
        stream = self._streams.get(stream_id)
        if stream is not None:
            if stream.remote_closed:
                self._reset_call(stream_id, frames.STREAM_CLOSED)
                return
            # Trailers from the client: gRPC has no use for them beyond the end of the stream.
            if not flags & frames.END_STREAM:
                raise FrameError(frames.PROTOCOL_ERROR, "trailers without END_STREAM")
            self._remote_end(stream_id, stream)
            return
        if stream_id <= self._last_stream_id or not stream_id & 1:
            raise FrameError(
                frames.PROTOCOL_ERROR,
                f"a client cannot open stream {stream_id} "
                f"(after stream {self._last_stream_id}; client streams are odd)",
            )
        self._last_stream_id = stream_id
        ended = bool(flags & frames.END_STREAM)
        limits = self._limits
        server = self._server
        open_here = len(self._streams)
        if (
            self._going_away
            or open_here >= limits.max_concurrent_streams
            or (
                server.open_streams >= limits.max_streams_total
                and open_here * server.connections >= limits.max_streams_total
            )
        ):
            # Past max_streams_total only a connection under its fair share opens streams, so a
            # few busy peers cannot lock out the rest (the total stays under twice the limit).
            self._refuse(stream_id)
            return
        if self._pending_window_delta:
            self._apply_window_delta()
        stream = _Stream(self._peer_initial_window, limits.stream_window)
        stream.remote_closed = ended
        self._streams[stream_id] = stream
        server.open_streams += 1
        self._on_request(stream_id, headers, ended)
        if ended and stream_id in self._calls:
            self._calls[stream_id].on_remote_end()

    def _on_priority(self, stream_id: int, payload: bytes) -> None:
        """PRIORITY is advisory and this server does not prioritise; only its form is checked."""
        if stream_id == 0:
            raise FrameError(frames.PROTOCOL_ERROR, "PRIORITY on stream 0")
        if len(payload) != 5:
            self._reset_call(stream_id, frames.FRAME_SIZE_ERROR)
        elif int.from_bytes(payload[:4], "big") & 0x7FFFFFFF == stream_id:
            self._reset_call(stream_id, frames.PROTOCOL_ERROR)

    def _on_window_update(self, stream_id: int, payload: bytes) -> None:
        increment = frames.parse_u32(payload, "WINDOW_UPDATE") & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise FrameError(frames.PROTOCOL_ERROR, "a connection WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > frames.MAX_WINDOW:
                raise FrameError(frames.FLOW_CONTROL_ERROR, "the connection's window went over 2^31-1")
        else:
            if self._pending_window_delta:
                self._apply_window_delta()
            stream = self._streams.get(stream_id)
            if stream is None:
                if stream_id > self._last_stream_id:
                    raise FrameError(
                        frames.PROTOCOL_ERROR, f"WINDOW_UPDATE on stream {stream_id}, which was never opened"
                    )
                return  # a stream that is over: a late update is harmless
            if increment == 0:
                self._reset_call(stream_id, frames.PROTOCOL_ERROR)
                return
            stream.send_window += increment
            if stream.send_window > frames.MAX_WINDOW:
                self._reset_call(stream_id, frames.FLOW_CONTROL_ERROR)
                return
        self._wake_writers()

    def _on_ping(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise FrameError(frames.PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise FrameError(frames.FRAME_SIZE_ERROR, f"a PING payload must be 8 bytes, got {len(payload)}")
        if not flags & frames.ACK:
            self._queue_control(frames.frame(frames.PING, frames.ACK, 0, payload))

    def _on_settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise FrameError(frames.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & frames.ACK:
            if payload:
                raise FrameError(frames.FRAME_SIZE_ERROR, "a SETTINGS ACK with a payload")
            return
        limit = self._limits.max_settings_entries
        if len(payload) > 6 * limit:
            raise FrameError(
                frames.ENHANCE_YOUR_CALM,
                f"a SETTINGS frame of {len(payload) // 6} entries (at most {limit})",
                limit="max_settings_entries",
            )
        window = None
        for key, value in frames.parse_settings(payload):
            if key == frames.INITIAL_WINDOW_SIZE:
                if value > frames.MAX_WINDOW:
                    raise FrameError(frames.FLOW_CONTROL_ERROR, f"SETTINGS_INITIAL_WINDOW_SIZE {value} is over 2^31-1")
                window = value
            elif key == frames.MAX_FRAME_SIZE:
                if not frames.DEFAULT_MAX_FRAME_SIZE <= value <= 16777215:
                    raise FrameError(
                        frames.PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value} is outside 16384..16777215"
                    )
                self._peer_max_frame_size = value
                self._frame_limit = min(value, self._limits.max_send_frame_bytes)
            elif key == frames.ENABLE_PUSH and value > 1:
                raise FrameError(frames.PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH {value} is not 0 or 1")
            # HEADER_TABLE_SIZE bounds an encoder table this server does not use; the others
            # describe the client as a server, which it is not here.
        if window is not None and window != self._peer_initial_window:
            if self._streams:  # applied to them at the end of this read (_apply_window_delta)
                self._pending_window_delta += window - self._peer_initial_window
            self._peer_initial_window = window
        self._queue_control(frames.SETTINGS_ACK)
        self._wake_writers()

    def _apply_window_delta(self) -> None:
        delta, self._pending_window_delta = self._pending_window_delta, 0
        for stream in self._streams.values():
            stream.send_window += delta
            if stream.send_window > frames.MAX_WINDOW:
                # RFC 9113 6.9.2: a SETTINGS change that takes a window past 2^31-1 is a
                # connection error.
                raise FrameError(
                    frames.FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE took a stream's window over 2^31-1"
                )

    def _on_rst_stream(self, stream_id: int, payload: bytes) -> None:
        frames.parse_u32(payload, "RST_STREAM")
        if stream_id == 0:
            raise FrameError(frames.PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if stream_id > self._last_stream_id:
            raise FrameError(frames.PROTOCOL_ERROR, f"RST_STREAM on stream {stream_id}, which was never opened")
        stream = self._streams.pop(stream_id, None)
        call = self._calls.get(stream_id)
        if stream is not None:
            self._server.open_streams -= 1
        if call is not None:
            call.on_reset()
        if stream is not None or call is not None:
            self._charge_reset("the client reset")

    def _on_goaway(self, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise FrameError(frames.PROTOCOL_ERROR, "GOAWAY on a stream")
        code = int.from_bytes(payload[4:8], "big") if len(payload) >= 8 else frames.NO_ERROR
        log.debug("client %s sent GOAWAY (error code %d)", self.peer, code)
        self._going_away = True
        self._close_if_idle()

    def _remote_end(self, stream_id: int, stream: _Stream) -> None:
        stream.remote_closed = True
        if stream.local_closed and self._streams.get(stream_id) is stream:
            del self._streams[stream_id]
            self._server.open_streams -= 1
        call = self._calls.get(stream_id)
        if call is not None:
            call.on_remote_end()

    # ------------------------------------------------------------ requests

    def _on_request(self, stream_id: int, headers: list, ended: bool) -> None:
        method = path = content_type = timeout_value = None
        for name, value in headers:
            if name == b":path":
                path = value
            elif name == b":method":
                method = value
            elif name == b"content-type":
                content_type = value
            elif name == b"grpc-timeout":
                timeout_value = value
        if method != b"POST":
            self._plain_http_answer(stream_id, b"405")
            return
        if content_type is None or not content_type.startswith(b"application/grpc"):
            self._plain_http_answer(stream_id, b"415")
            return
        path_text = (path or b"").decode("utf-8", "replace")
        handler = self._server.find_handler(path_text, headers)
        if handler is None:
            if self._server.on_status is not None:  # not by its path: client input is no label
                self._server.on_status(UNKNOWN_METHOD, grpc.StatusCode.UNIMPLEMENTED)
            self.send_status(
                stream_id,
                grpc.StatusCode.UNIMPLEMENTED,
                f"Method not found: {path_text}",
                (),
                trailers_only=True,
                reset_after=not ended,
            )
            return
        timeout = None
        if timeout_value is not None:
            try:
                timeout = wire.parse_timeout(timeout_value)
            except DanubeError as exc:
                if self._server.on_status is not None:
                    self._server.on_status(path_text, status_map.status_for(exc))
                self.send_status(
                    stream_id,
                    status_map.status_for(exc),
                    status_map.message_for(exc),
                    (),
                    trailers_only=True,
                    reset_after=not ended,
                )
                return
        call = ServerCall(
            self,
            stream_id,
            path_text,
            handler,
            headers,
            receive_limit=self._limits.max_receive_message_length,
            timeout=timeout,
        )
        self._calls[stream_id] = call
        if handler.request_streaming:
            call.start()

    def _plain_http_answer(self, stream_id: int, status: bytes) -> None:
        self._send_headers(stream_id, frames.encode_header_block([(b":status", status)]), end_stream=True)
        stream = self._streams.get(stream_id)
        if stream is not None and not stream.remote_closed:
            self._reset(stream_id, frames.NO_ERROR)

    # ------------------------------------------------------------ used by calls

    def forget(self, stream_id: int) -> None:
        self._calls.pop(stream_id, None)
        self.progress += 1
        if not self._calls:
            self.idle_since = self.loop.time()
        if self._going_away and not self._calls and self._transport is not None:
            self.loop.call_soon(self._close_if_idle)

    def send_response_headers(self, stream_id: int, metadata: tuple = ()) -> None:
        block = _RESPONSE_BLOCK
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
            block = _OK_TRAILERS_BLOCK
        else:
            headers = [(b"grpc-status", str(code.value[0]).encode())]
            if details:
                headers.append((b"grpc-message", wire.encode_status_message(details)))
            block = frames.encode_header_block(headers + _header_pairs(trailing))
            if trailers_only:
                block = _RESPONSE_BLOCK + block
        if not self._send_headers(stream_id, block, end_stream=True):
            return
        if reset_after:
            # The client is still sending: tell it to stop (the status above stands).
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

    def _reset_call(self, stream_id: int, code: int) -> None:
        """A stream error caused by the client: RST_STREAM, and the call is cancelled."""
        log.info("resetting stream %d from %s: HTTP/2 error code %d", stream_id, self.peer, code)
        self._reset(stream_id, code)
        call = self._calls.get(stream_id)
        if call is not None:
            call.on_reset()
        self._charge_reset("a stream error")

    def _refuse(self, stream_id: int) -> None:
        """A stream over a stream limit (or after GOAWAY): RST_STREAM REFUSED_STREAM."""
        self._queue_control(frames.rst_stream(stream_id, frames.REFUSED_STREAM))
        if self._going_away:
            return  # the client raced our GOAWAY: nothing to hold against it
        limits = self._limits
        if len(self._streams) >= limits.max_concurrent_streams:
            self._server.trip("max_concurrent_streams", self.peer, f"stream {stream_id} refused")
        else:
            self._server.trip("max_streams_total", self.peer, f"stream {stream_id} refused")
        self._charge_reset("a refused stream")

    def _charge_reset(self, what: str) -> None:
        """One stream reset against the reset budget (a token bucket): past it, GOAWAY
        ENHANCE_YOUR_CALM (HTTP/2 Rapid Reset, CVE-2023-44487)."""
        limits = self._limits
        now = self.loop.time()
        tokens = self._reset_tokens + (now - self._reset_stamp) * limits.resets_per_second
        if tokens > limits.reset_burst:
            tokens = limits.reset_burst
        self._reset_stamp = now
        self._reset_tokens = tokens - 1
        if tokens < 1:
            raise FrameError(
                frames.ENHANCE_YOUR_CALM,
                f"too many stream resets ({what}): over {limits.reset_burst} at once or {limits.resets_per_second}/s",
                limit="reset_burst",
            )

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
