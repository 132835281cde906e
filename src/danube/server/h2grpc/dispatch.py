"""Frames from the client: the read loop, one handler per frame type, the streams' states, and the
stream errors a client's frames cause.

A mixin of ``GrpcConnection`` (``connection.py``), like its send side (``sending.py``) and its
receive budget (``budget.py``): one object per connection, so the per-frame path has no extra
indirection.  The read loop parses every whole frame of a read at once (the codec
``frames.parse_frames``) and hands each to its handler; HEADERS, DATA and WINDOW_UPDATE come
first, being what every call sends.  A stream error answers RST_STREAM (``_reset_call``); a
connection error raises ``FrameError``, which ``_process`` turns into GOAWAY.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import grpc

from danube.errors import DanubeError
from danube.server import status as status_map
from danube.server.h2grpc import frames, wire
from danube.server.h2grpc.call import ServerCall
from danube.server.h2grpc.frames import FrameError
from danube.server.h2grpc.headers import HeaderBlockDecoder, RequestSummary
from danube.server.rpc_counts import UNKNOWN_METHOD

if TYPE_CHECKING:
    from danube.server.h2grpc.budget import RequestBudget
    from danube.server.h2grpc.connection import GrpcConnection
    from danube.server.h2grpc.limits import H2Limits
    from danube.server.h2grpc.server import H2Server

log = logging.getLogger(__name__)

# Why reading is paused (bits): the per-read frame budget ran out, or replies are piling up
# for a peer that does not read.
PAUSED_FOR_BUDGET = 1
PAUSED_FOR_BACKLOG = 2
_PAUSE_READING_ABOVE = 64 * 1024  # bytes left in the read buffer after a read's budget
# A client's RST_STREAM on a stream it opened less than this long before costs a reset token.
_HELD_STREAM_S = 1.0
_HEADER_FRAMES = (frames.HEADERS, frames.CONTINUATION)
# Module constants, not attribute lookups, on the per-frame path.
_DATA = frames.DATA
_HEADERS = frames.HEADERS
_WINDOW_UPDATE = frames.WINDOW_UPDATE
_CONTINUATION = frames.CONTINUATION
_END_STREAM = frames.END_STREAM
_END_HEADERS = frames.END_HEADERS
_PADDED = frames.PADDED
_PRIORITY_FLAG = frames.PRIORITY_FLAG
_unpadded = frames.unpadded
_parse_u32 = frames.parse_u32


class Stream:
    """HTTP/2 state of one stream: its windows and which sides have ended."""

    __slots__ = ("local_closed", "opened", "recv_unacked", "recv_window", "remote_closed", "send_window")

    def __init__(self, send_window: int, recv_window: int, opened: float) -> None:
        self.opened = opened  # loop time: a client's reset of a young stream is charged
        self.send_window = send_window
        self.recv_window = recv_window
        self.recv_unacked = 0
        self.remote_closed = False
        self.local_closed = False


class FrameDispatch:
    # Set by GrpcConnection.__init__ (declared here for the type checker).
    loop: asyncio.AbstractEventLoop
    peer: str
    progress: int
    control_queued: int
    _server: H2Server
    _budget: RequestBudget
    _limits: H2Limits
    _transport: asyncio.Transport | None
    _buffer: bytearray
    _calls: dict[int, ServerCall]
    _streams: dict[int, Stream]
    _preface_seen: bool
    _handshake_done: bool
    _header_decoder: HeaderBlockDecoder
    _continuing: tuple[int, int, list[bytes]] | None
    _continuing_bytes: int
    _continuing_frames: int
    _last_stream_id: int
    _max_block: int
    _recv_window: int
    _recv_target: int
    _send_window: int
    _peer_initial_window: int
    _peer_max_frame_size: int
    _frame_limit: int
    _pending_window_delta: int
    _more_scheduled: bool
    _flush_scheduled: bool
    _out: list
    _window_waiters: collections.deque
    _stream_waiters: dict
    _read_paused: int
    _write_paused: bool
    _broken: bool
    _going_away: bool
    _starved: set
    _reset_tokens: float
    _reset_stamp: float
    # Defined by the connection and its other halves.
    _on_first_frame: Callable[[tuple], None]
    _connection_error: Callable[..., None]
    _close_if_idle: Callable[[], None]
    _send_headers: Callable[..., bool]
    _reset: Callable[[int, int], None]
    _queue_control: Callable[[bytes], None]
    _pause_reading: Callable[[int], None]
    _resume_reading: Callable[[int], None]
    _flush: Callable[[], None]
    _wake_writers: Callable[[], None]
    _pass_window: Callable[[], None]
    _wake_stream_writers: Callable[[int], None]
    _shed: Callable[[], None]
    return_credit: Callable[[int, int], None]
    grant_window: Callable[[], None]
    _stream_credit_due: Callable[[int, Stream], None]
    _recv_unacked: int
    _stream_window_half: int
    send_status: Callable[..., None]

    def _process(self, data: bytes | None = None) -> None:
        """Handles the whole frames in the buffer, up to ``max_frames_per_read`` of them; with
        more left, reading pauses and the rest waits for the next loop iteration.  ``data``: a
        read that arrived with the buffer empty, parsed where it is (what it leaves over is
        buffered), so a read of whole frames is not copied into the buffer and out again."""
        buffer = self._buffer
        limits = self._limits
        parsed = ()
        try:
            if not self._preface_seen and not self._read_preface():
                return
            parsed, used = frames.parse_frames(
                buffer if data is None else data,
                limits.max_frame_size,
                limits.max_frames_per_read,
                limits.max_requests_per_read,
                limits.max_header_bytes_per_read,
            )
            if data is None:
                if used:
                    del buffer[:used]
            elif used < len(data):
                buffer += data[used:]
            if not self._handshake_done and parsed:
                self._on_first_frame(parsed[0])
            for kind, flags, stream_id, payload in parsed:
                if self._continuing is not None and kind != _CONTINUATION:
                    raise FrameError(frames.PROTOCOL_ERROR, "a header block was interrupted by another frame")
                if kind == _DATA:
                    self._on_data(flags, stream_id, payload)
                elif kind == _HEADERS:
                    self._on_headers(flags, stream_id, payload)
                elif kind == _WINDOW_UPDATE:
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
                self._pause_reading(PAUSED_FOR_BUDGET)
            if not self._more_scheduled:
                self._more_scheduled = True
                self.loop.call_soon(self._process_more)
        if self.control_queued and self._write_paused:
            self._pause_reading(PAUSED_FOR_BACKLOG)
        if self._out and not self._flush_scheduled:
            # Not written now: what the calls this read woke write in their turns joins it in
            # one socket write (the flush is queued behind their wake-ups).
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _process_more(self) -> None:
        self._more_scheduled = False
        if self._broken or self._transport is None:
            return
        self._process()
        if not self._more_scheduled:
            self._resume_reading(PAUSED_FOR_BUDGET)

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

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise FrameError(frames.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self._recv_window -= size
        self._budget.windows -= size
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
        call = self._calls.get(stream_id)
        if call is None or call.on_data(_unpadded(payload, flags) if flags & _PADDED else payload, size):
            if size:
                # The credit goes back now: ``return_credit`` inline, this being every DATA
                # frame's path (WINDOW_UPDATEs still go out only once half a window is spent).
                self._recv_unacked += size
                if self._recv_window <= self._recv_target // 2:
                    self.grant_window()
                stream.recv_unacked += size
                if stream.recv_window <= self._stream_window_half:
                    self._stream_credit_due(stream_id, stream)
        if call is not None and self._starved and self._recv_window < self._recv_target // 4:
            self._shed()
        if flags & _END_STREAM:
            self._remote_end(stream_id, stream)

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise FrameError(frames.PROTOCOL_ERROR, "HEADERS on stream 0")
        block = _unpadded(payload, flags) if flags & _PADDED else payload
        if flags & _PRIORITY_FLAG:
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
        if flags & _END_HEADERS:
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
        headers, summary = self._header_decoder.decode_request(block)  # always: it keeps the HPACK state in step
        limits = self._limits
        if len(headers) > limits.max_header_count:
            raise FrameError(
                frames.ENHANCE_YOUR_CALM,
                f"a header block of {len(headers)} headers (at most {limits.max_header_count})",
                limit="max_header_count",
            )
        streams = self._streams
        stream = streams.get(stream_id)
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
        ended = bool(flags & _END_STREAM)
        server = self._server
        open_here = len(streams)
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
        stream = Stream(self._peer_initial_window, limits.stream_window, self.loop.time())
        stream.remote_closed = ended
        streams[stream_id] = stream
        server.open_streams += 1
        self._on_request(stream_id, headers, summary, ended)
        if ended:
            call = self._calls.get(stream_id)
            if call is not None:
                call.on_remote_end()

    def _on_priority(self, stream_id: int, payload: bytes) -> None:
        """PRIORITY is advisory and this server does not prioritise; only its form is checked."""
        if stream_id == 0:
            raise FrameError(frames.PROTOCOL_ERROR, "PRIORITY on stream 0")
        if len(payload) != 5:
            self._reset_call(stream_id, frames.FRAME_SIZE_ERROR)
        elif int.from_bytes(payload[:4], "big") & 0x7FFFFFFF == stream_id:
            self._reset_call(stream_id, frames.PROTOCOL_ERROR)

    def _on_window_update(self, stream_id: int, payload: bytes) -> None:
        increment = _parse_u32(payload, "WINDOW_UPDATE") & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise FrameError(frames.PROTOCOL_ERROR, "a connection WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > frames.MAX_WINDOW:
                raise FrameError(frames.FLOW_CONTROL_ERROR, "the connection's window went over 2^31-1")
            if self._window_waiters:
                self._pass_window()
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
            if self._stream_waiters:
                self._wake_stream_writers(stream_id)

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
        # Only a reset soon after the open is Rapid Reset's pattern; a client may end at once
        # every stream it has held for a while (closing all its subscriptions).
        if (call is not None and stream is None) or (
            stream is not None and self.loop.time() - stream.opened < _HELD_STREAM_S
        ):
            self._charge_reset("the client reset")

    def _on_goaway(self, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise FrameError(frames.PROTOCOL_ERROR, "GOAWAY on a stream")
        code = int.from_bytes(payload[4:8], "big") if len(payload) >= 8 else frames.NO_ERROR
        log.debug("client %s sent GOAWAY (error code %d)", self.peer, code)
        self._going_away = True
        self._close_if_idle()

    def _remote_end(self, stream_id: int, stream: Stream) -> None:
        stream.remote_closed = True
        if stream.local_closed and self._streams.get(stream_id) is stream:
            del self._streams[stream_id]
            self._server.open_streams -= 1
        call = self._calls.get(stream_id)
        if call is not None:
            call.on_remote_end()

    # ------------------------------------------------------------ requests

    def _on_request(self, stream_id: int, headers: list, summary: RequestSummary, ended: bool) -> None:
        method, path_text, content_type, timeout_value = summary
        if method != b"POST":
            self._plain_http_answer(stream_id, b"405")
            return
        if content_type is None or not content_type.startswith(b"application/grpc"):
            self._plain_http_answer(stream_id, b"415")
            return
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
            cast("GrpcConnection", self),  # the mixin's only class
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
