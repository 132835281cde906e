"""One HTTP/2 connection of the client's own transport: an ``asyncio.Protocol``, no threads.

The peer's frames are parsed by the compiled codec (``frames.py``) in ``data_received`` and
handed to the streams (``call.py``) on the same loop turn; what the calls write in a loop turn
leaves in one ``transport.write``.  Flow control is honoured both ways: a writer waits for
WINDOW_UPDATE and never sends past the stream's or the connection's window; the receive windows
are given back as the calls' readers take their messages (a stream) or as DATA arrives (the
connection, whose streams are each bounded by their own window).

A peer that breaks HTTP/2, or passes a bound of ``H2ClientLimits``, ends the connection with
GOAWAY and a reason; its calls fail with UNAVAILABLE and that reason, as when the connection is
lost.  Memory held for a peer is bounded: one frame of at most ``max_frame_size`` being
received, a header block of at most ``max_header_block``, and per stream its receive window.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Protocol

import grpc
import hpack

from danube.client.h2 import frames
from danube.client.h2.limits import H2ClientLimits
from danube.client.h2.status import rpc_error

log = logging.getLogger(__name__)

FrameError = frames.FrameError
_DATA = frames.DATA
_END_STREAM = frames.END_STREAM
_PADDED = frames.PADDED
_frame_message = frames.frame_message
_HPACK_ERRORS = (hpack.HPACKError, IndexError, ValueError)


class Stream(Protocol):
    """What the connection needs of a call on one of its streams."""

    stream_id: int
    send_window: int

    def on_headers(self, headers: list, end_stream: bool) -> None: ...
    def on_data(self, payload: bytes, flow_length: int, end_stream: bool) -> None: ...
    def on_reset(self, code: int) -> None: ...
    def fail(self, error: grpc.aio.AioRpcError) -> None: ...


class H2Connection(asyncio.Protocol):
    def __init__(self, authority: str, limits: H2ClientLimits) -> None:
        self.loop = asyncio.get_running_loop()
        self.authority = authority
        self.limits = limits
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._out: list = []
        self._flush_scheduled = False
        self._streams: dict[int, Stream] = {}
        self._next_id = 1
        # what the peer lets us send (its SETTINGS and WINDOW_UPDATEs)
        self.send_window = frames.DEFAULT_WINDOW
        self.peer_initial_window = frames.DEFAULT_WINDOW
        self.send_frame_limit = frames.DEFAULT_MAX_FRAME_SIZE
        self.peer_max_streams = 2**31 - 1
        self._settings_seen = False
        # what we let the peer send on the connection, and what we owe it back
        self._recv_window = limits.connection_window
        self._recv_owed = 0
        self._recv_update_at = limits.connection_window // 4
        self._decoder = hpack.Decoder(max_header_list_size=limits.max_header_block)
        self._continuing: tuple[int, int, list, int] | None = None  # stream, flags, pieces, size
        self._waiters: list[asyncio.Future] = []  # writers and openers waiting for window/room
        self.write_paused = False  # the transport's buffer is full (an attribute: read on every write)
        self._control_backlog = 0
        self.going_away = False
        self.closed = False
        self.error: grpc.aio.AioRpcError | None = None
        self._heard = True
        self._pinged = False
        self._keepalive: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ used by calls

    @property
    def usable(self) -> bool:
        """New calls may open streams here."""
        return not self.closed and not self.going_away

    def has_room(self) -> bool:
        return len(self._streams) < self.peer_max_streams

    def open_stream(self, stream: Stream, block: bytes) -> None:
        """Gives ``stream`` the next stream id and queues its HEADERS (the caller saw ``has_room``)."""
        stream_id = self._next_id
        self._next_id += 2
        if self._next_id > frames.MAX_WINDOW:
            self.going_away = True  # out of stream ids: the next call opens another connection
        stream.stream_id = stream_id
        stream.send_window = self.peer_initial_window
        self._streams[stream_id] = stream
        self._out.append(frames.headers_frames(stream_id, block, False, self.send_frame_limit))
        self._schedule_flush()

    def send_now(self, stream: Stream, data: bytes) -> bool:
        """A message in one DATA frame queued for this turn's write when it fits the windows and
        the frame size (True); else False, nothing queued."""
        size = _frame_message(
            self._out, stream.stream_id, data, stream.send_window, self.send_window, self.send_frame_limit
        )
        if not size:
            return False
        stream.send_window -= size
        self.send_window -= size
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)
        return True

    async def send(self, stream: Stream, data: bytes, still_open) -> None:
        """A message in as many DATA frames as the windows and frame size need, waiting for
        WINDOW_UPDATE when either window is spent; ``still_open()`` is checked at each wait."""
        pieces = memoryview(frames.message_prefix(len(data)) + data)
        sent, total = 0, len(pieces)
        while sent < total:
            if not still_open():
                raise asyncio.InvalidStateError("the call ended before its request was sent")
            size = min(total - sent, stream.send_window, self.send_window, self.send_frame_limit)
            if size <= 0:
                self._flush()
                await self.wait()
                continue
            stream.send_window -= size
            self.send_window -= size
            self._out.append(frames.frame_header(_DATA, 0, stream.stream_id, size))
            self._out.append(pieces[sent : sent + size])
            sent += size
        self._schedule_flush()

    def end_stream(self, stream_id: int) -> None:
        """Half-closes the request side (an empty DATA frame with END_STREAM)."""
        self._out.append(frames.frame(_DATA, _END_STREAM, stream_id))
        self._schedule_flush()

    def window_update(self, stream_id: int, increment: int) -> None:
        self._out.append(frames.window_update(stream_id, increment))
        self._schedule_flush()

    def reset_stream(self, stream_id: int, code: int) -> None:
        self.forget(stream_id)
        if not self.closed:
            self._out.append(frames.rst_stream(stream_id, code))
            self._schedule_flush()

    def forget(self, stream_id: int) -> None:
        """The stream is over on both sides: its slot is free."""
        if self._streams.pop(stream_id, None) is not None:
            self.wake()
            if self.going_away and not self._streams:
                self.loop.call_soon(self.close)

    async def wait(self) -> None:
        """Until the windows, the stream count or the socket's backlog move (or the connection ends)."""
        waiter = self.loop.create_future()
        self._waiters.append(waiter)
        await waiter

    async def drained(self) -> None:
        """Until the socket takes what is queued for it, when the peer is slow to read."""
        while self.write_paused and not self.closed:
            await self.wait()

    def wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def close(self) -> None:
        """Ends the connection: its calls fail with CANCELLED (as grpc.aio's on channel close)."""
        if self.closed:
            return
        if self._transport is not None:
            self._out.append(frames.goaway(0, frames.NO_ERROR))
            self._flush()
        self._end(rpc_error(grpc.StatusCode.CANCELLED, "Channel closed!"))

    # ------------------------------------------------------------ transport events

    def connection_made(self, transport) -> None:
        self._transport = transport
        limits = self.limits
        self._out.append(
            frames.PREFACE
            + frames.settings(
                [
                    (frames.ENABLE_PUSH, 0),
                    (frames.INITIAL_WINDOW_SIZE, limits.stream_window),
                    (frames.MAX_FRAME_SIZE, limits.max_frame_size),
                    (frames.MAX_HEADER_LIST_SIZE, limits.max_header_block),
                ]
            )
        )
        if limits.connection_window > frames.DEFAULT_WINDOW:
            self._out.append(frames.window_update(0, limits.connection_window - frames.DEFAULT_WINDOW))
        self._flush()
        if limits.keepalive_s:
            self._keepalive = self.loop.call_later(limits.keepalive_s, self._keepalive_tick)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self._heard = True
        buffer = self._buffer
        buffer += data
        try:
            parsed, used = frames.parse_frames(buffer, self.limits.max_frame_size)
            if used:
                del buffer[:used]
            for kind, flags, stream_id, payload in parsed:
                if self.closed:
                    return
                if kind != _DATA or self._continuing is not None or not self._settings_seen:
                    self._on_frame(kind, flags, stream_id, payload)
                    continue
                # DATA, the frame of every message, taken here: no call per frame before its
                # stream's (a DATA frame _on_frame gets breaks one of its first two rules)
                length = len(payload)
                self._recv_window -= length
                if self._recv_window < 0:
                    raise FrameError(frames.FLOW_CONTROL_ERROR, "the server sent past the connection's receive window")
                self._recv_owed += length
                if self._recv_owed >= self._recv_update_at:
                    self._recv_window += self._recv_owed
                    self.window_update(0, self._recv_owed)
                    self._recv_owed = 0
                stream = self._streams.get(stream_id)
                if stream is None:
                    self._known(stream_id, "DATA")  # raises for a stream the client never opened
                    continue
                stream.on_data(
                    payload if not flags & _PADDED else frames.unpadded(payload, flags), length, flags & _END_STREAM
                )
        except FrameError as exc:
            self._connection_error(exc.code, str(exc))

    def connection_lost(self, exc) -> None:
        reason = f" ({exc})" if exc else ""
        self._end(rpc_error(grpc.StatusCode.UNAVAILABLE, f"the connection to {self.authority} was lost{reason}"))

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._control_backlog = 0
        self.wake()

    def eof_received(self) -> bool:
        return False  # the transport closes: connection_lost fails what is still open

    # ------------------------------------------------------------ frames from the peer

    def _on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continuing is not None and kind != frames.CONTINUATION:
            raise FrameError(frames.PROTOCOL_ERROR, "a header block was interrupted by another frame")
        if not self._settings_seen and kind != frames.SETTINGS:
            raise FrameError(frames.PROTOCOL_ERROR, "the server's preface must start with SETTINGS")
        # DATA is taken by data_received: one that gets here broke a rule above
        if kind == frames.HEADERS:
            self._on_headers(flags, stream_id, payload)
        elif kind == frames.CONTINUATION:
            self._on_continuation(flags, stream_id, payload)
        elif kind == frames.WINDOW_UPDATE:
            self._on_window_update(stream_id, payload)
        elif kind == frames.SETTINGS:
            self._on_settings(flags, stream_id, payload)
        elif kind == frames.PING:
            self._on_ping(flags, stream_id, payload)
        elif kind == frames.RST_STREAM:
            if stream_id == 0:
                raise FrameError(frames.PROTOCOL_ERROR, "RST_STREAM on stream 0")
            code = frames.parse_u32(payload, "RST_STREAM")
            stream = self._streams.pop(stream_id, None)
            if stream is not None:
                self.wake()
                stream.on_reset(code)
        elif kind == frames.GOAWAY:
            self._on_goaway(stream_id, payload)
        elif kind == frames.PUSH_PROMISE:
            raise FrameError(frames.PROTOCOL_ERROR, "PUSH_PROMISE although the client disabled push")
        # PRIORITY and unknown frame types are ignored (RFC 9113 section 4.1)

    def _known(self, stream_id: int, what: str) -> Stream | None:
        """The open stream ``stream_id`` names, or None when it is over; an error for a stream
        that was never opened (or one the server could not open)."""
        stream = self._streams.get(stream_id)
        if stream is None and (stream_id == 0 or stream_id >= self._next_id or not stream_id & 1):
            raise FrameError(frames.PROTOCOL_ERROR, f"{what} on stream {stream_id}, which the client never opened")
        return stream

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        payload = frames.unpadded(payload, flags)
        if flags & frames.PRIORITY_FLAG:
            if len(payload) < 5:
                raise FrameError(frames.FRAME_SIZE_ERROR, "a HEADERS frame too short for its priority fields")
            payload = payload[5:]
        if stream_id == 0:
            raise FrameError(frames.PROTOCOL_ERROR, "HEADERS on stream 0")
        self._check_block_size(len(payload))
        if flags & frames.END_HEADERS:
            self._header_block(stream_id, flags, payload)
        else:
            self._continuing = (stream_id, flags, [payload], len(payload))

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        continuing = self._continuing
        if continuing is None or continuing[0] != stream_id:
            raise FrameError(frames.PROTOCOL_ERROR, "CONTINUATION without a header block to continue")
        first_flags, pieces, size = continuing[1], continuing[2], continuing[3] + len(payload)
        self._check_block_size(size)
        pieces.append(payload)
        if flags & frames.END_HEADERS:
            self._continuing = None
            self._header_block(stream_id, first_flags, b"".join(pieces))
        else:
            self._continuing = (stream_id, first_flags, pieces, size)

    def _check_block_size(self, size: int) -> None:
        if size > self.limits.max_header_block:
            raise FrameError(
                frames.PROTOCOL_ERROR,
                f"a response header block over the client's {self.limits.max_header_block}-byte limit",
            )

    def _header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        try:  # every block is decoded, even a finished stream's: the HPACK table is the connection's
            headers = list(self._decoder.decode(block, raw=True))
        except _HPACK_ERRORS as exc:
            raise FrameError(frames.COMPRESSION_ERROR, f"a response header block does not decode: {exc}") from None
        stream = self._known(stream_id, "HEADERS")
        if stream is not None:
            stream.on_headers(headers, bool(flags & _END_STREAM))

    def _on_window_update(self, stream_id: int, payload: bytes) -> None:
        increment = frames.parse_u32(payload, "WINDOW_UPDATE") & frames.MAX_WINDOW
        if stream_id == 0:
            if increment == 0:
                raise FrameError(frames.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0 on the connection")
            self.send_window += increment
            if self.send_window > frames.MAX_WINDOW:
                raise FrameError(frames.FLOW_CONTROL_ERROR, "a WINDOW_UPDATE took the connection's window past 2^31-1")
            self.wake()
            return
        stream = self._known(stream_id, "WINDOW_UPDATE")
        if stream is None:
            return
        if increment == 0 or stream.send_window + increment > frames.MAX_WINDOW:
            code = frames.PROTOCOL_ERROR if increment == 0 else frames.FLOW_CONTROL_ERROR
            self.reset_stream(stream_id, code)
            stream.fail(
                rpc_error(grpc.StatusCode.INTERNAL, f"the server sent a bad WINDOW_UPDATE (HTTP/2 error {code})")
            )
            return
        stream.send_window += increment
        self.wake()

    def _on_settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise FrameError(frames.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & frames.ACK:
            if payload:
                raise FrameError(frames.FRAME_SIZE_ERROR, "a SETTINGS ACK with a payload")
            return
        for key, value in frames.parse_settings(payload):
            if key == frames.INITIAL_WINDOW_SIZE:
                if value > frames.MAX_WINDOW:
                    raise FrameError(frames.FLOW_CONTROL_ERROR, f"SETTINGS_INITIAL_WINDOW_SIZE {value} is over 2^31-1")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self._streams.values():
                    stream.send_window += delta
                    if stream.send_window > frames.MAX_WINDOW:
                        raise FrameError(frames.FLOW_CONTROL_ERROR, "SETTINGS took a stream's window past 2^31-1")
            elif key == frames.MAX_FRAME_SIZE:
                if not frames.DEFAULT_MAX_FRAME_SIZE <= value <= frames.LARGEST_FRAME_SIZE:
                    raise FrameError(frames.PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value} is outside 2^14..2^24-1")
                self.send_frame_limit = value
            elif key == frames.MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
            elif key == frames.ENABLE_PUSH and value != 0:
                raise FrameError(frames.PROTOCOL_ERROR, "a server may not enable push")
        self._settings_seen = True
        self._control(frames.SETTINGS_ACK)
        self.wake()

    def _on_ping(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise FrameError(frames.PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise FrameError(frames.FRAME_SIZE_ERROR, f"a PING payload must be 8 bytes, got {len(payload)}")
        if flags & frames.ACK:
            self._pinged = False
        else:
            self._control(frames.ping(payload, ack=True))

    def _on_goaway(self, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise FrameError(frames.PROTOCOL_ERROR, "GOAWAY on a stream")
        last, code, debug = frames.parse_goaway(payload)
        self.going_away = True
        why = f"the server at {self.authority} is going away (HTTP/2 code {code}{': ' if debug else ''}" + (
            debug[:256].decode("utf-8", "replace") + ")"
        )
        for sid in [sid for sid in self._streams if sid > last]:
            stream = self._streams.pop(sid)
            stream.fail(rpc_error(grpc.StatusCode.UNAVAILABLE, f"{why}; the call was not processed"))
        self.wake()
        if not self._streams:
            self.close()

    # ------------------------------------------------------------ internals

    def _control(self, data: bytes) -> None:
        """A reply the peer's frames caused: bounded while the peer does not read ours."""
        if self.write_paused:
            self._control_backlog += 1
            if self._control_backlog > self.limits.max_control_backlog:
                raise FrameError(
                    frames.ENHANCE_YOUR_CALM, "the server sends control frames but does not read the replies"
                )
        self._out.append(data)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out = self._out
        if not out:
            return
        self._out = []
        transport = self._transport
        if transport is not None and not self.closed:
            transport.write(out[0] if len(out) == 1 else b"".join(out))

    def _keepalive_tick(self) -> None:
        self._keepalive = None
        if self.closed:
            return
        limits = self.limits
        delay = limits.keepalive_s
        if self._heard:
            self._heard = self._pinged = False
        elif self._pinged:
            self._connection_error(
                frames.NO_ERROR, f"the server did not answer a PING within {limits.keepalive_timeout_s:g} s"
            )
            return
        else:
            self._pinged = True
            self._out.append(frames.ping(os.urandom(8)))
            self._schedule_flush()
            delay = limits.keepalive_timeout_s
        self._keepalive = self.loop.call_later(delay, self._keepalive_tick)

    def _connection_error(self, code: int, reason: str) -> None:
        log.warning("HTTP/2 connection to %s: %s (error code %d); closing it", self.authority, reason, code)
        if self._transport is not None:
            self._out.append(frames.goaway(0, code, reason.encode("utf-8", "replace")[:256]))
            self._flush()
        self._end(rpc_error(grpc.StatusCode.UNAVAILABLE, f"HTTP/2 connection to {self.authority}: {reason}"))

    def _end(self, error: grpc.aio.AioRpcError) -> None:
        """The connection is over: every open call fails with ``error``; buffers are dropped."""
        if self.closed:
            return
        self.closed = True
        self.error = error
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()
        self._buffer = bytearray()
        self._out = []
        self._continuing = None
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.fail(error)
        self.wake()
