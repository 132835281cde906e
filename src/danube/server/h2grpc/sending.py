"""The send side of a connection: response messages framed as DATA within HTTP/2 flow control,
and the bound on bytes waiting for a peer's socket.

A mixin of ``GrpcConnection`` (one object per connection, no indirection on the hot path).
Three bounds keep a peer that does not read from making the server hold its responses:

- per stream: a write frames at most ``max_send_frame_bytes`` (or the peer's smaller frame
  size) before it checks the connection's room again, so a stream has at most one frame
  queued whatever the size of its message (the message itself stays one buffer, shared by
  every stream that sends it when the handler hands over ``wire.Encoded`` parts);
- per connection: past ``max_send_queued_bytes`` framed but unflushed, or written to the
  transport but not taken by the socket (the transport's high-water mark), writers wait for
  it to drain; a peer that reads none of it for ``write_stall_timeout`` is dropped;
- in all: past ``max_send_queued_bytes_total`` over all connections' transports, a connection
  that already has a backlog waits for the others to drain.

A handler waiting in a write does not ask the broker for more, so a stalled subscription
stops being fed, as when its credits run out.
"""

from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING

from danube.server.h2grpc import frames, wire

if TYPE_CHECKING:
    from danube.server.h2grpc.server import H2Server

# Flush the socket inside the write loop once this much is queued, instead of at the end of the
# loop iteration, so large messages stream out while they are being framed.
_FLUSH_NOW_BYTES = 256 * 1024
# A writer waiting on the server-wide bound looks again this often even without news.
_GLOBAL_RECHECK_S = 0.2
# A response's headers and the trailers of a call that ended OK: the same for every call.
RESPONSE_BLOCK = frames.encode_header_block([(b":status", b"200"), (b"content-type", b"application/grpc")])
OK_TRAILERS_BLOCK = frames.encode_header_block([(b"grpc-status", b"0")])
_END_HEADERS = frames.END_HEADERS
_Encoded = wire.Encoded
_PREFIX_SIZE = wire.PREFIX_SIZE
_frame_message = frames.frame_message
_frame_fields = frames.frame_fields
_frame = frames.frame
_HEADERS = frames.HEADERS
_END_TRAILERS = frames.END_HEADERS | frames.END_STREAM


class SendSide:
    # Set by GrpcConnection.__init__ (declared here for the type checker).
    loop: asyncio.AbstractEventLoop
    _server: H2Server
    _out: list
    _out_bytes: int
    _send_recorded: int
    _send_limit: int
    _frame_limit: int
    _streams: dict
    _send_window: int
    _peer_max_frame_size: int
    _write_paused: bool
    _lost: bool
    _flush_scheduled: bool
    _window_waiters: collections.deque
    _window_promised: int
    _stream_waiters: dict
    _drain_waiter: asyncio.Future | None
    _blocked: set
    _transport: asyncio.Transport | None
    progress: int

    # ------------------------------------------------------------ messages

    async def send_message(self, stream_id: int, data) -> None:
        """One length-prefixed message (bytes, or ``wire.Encoded`` parts sent as they are), within
        the stream's and the connection's window and the send-queue bounds."""
        if self._send_whole(stream_id, data):
            return
        encoded = type(data) is _Encoded
        length = data.length if encoded else len(data)
        total = _PREFIX_SIZE + length
        pieces = collections.deque([wire.message_prefix(length)])
        if encoded:
            pieces.extend(memoryview(part).cast("B") for part in data)
        else:
            pieces.append(memoryview(data).cast("B"))
        sent = 0
        out = self._out
        try:
            while sent < total:
                if self._lost:
                    raise asyncio.CancelledError("the connection is gone")
                stream = self._streams.get(stream_id)
                if stream is None or stream.local_closed:
                    raise asyncio.CancelledError("the client closed the stream")
                if not self._may_queue():
                    self._blocked.add(stream_id)
                    if self._window_waiters:
                        self._pass_window()
                    await self._send_room()
                    continue
                size = min(total - sent, stream.send_window, self._send_window, self._frame_limit)
                if size <= 0:
                    self._blocked.add(stream_id)
                    await self._wait_for_window(stream_id, stream.send_window <= 0, total - sent)
                    continue
                stream.send_window -= size
                self._send_window -= size
                out = self._out
                out.append(frames.frame_header(frames.DATA, 0, stream_id, size))
                need = size
                while need:
                    piece = pieces[0]
                    if len(piece) <= need:
                        out.append(piece)
                        need -= len(piece)
                        pieces.popleft()
                    else:
                        out.append(piece[:need])
                        pieces[0] = piece[need:]
                        need = 0
                sent += size
                self._out_bytes += size
                if self._out_bytes >= _FLUSH_NOW_BYTES:
                    self._flush()
        finally:
            self._blocked.discard(stream_id)
            if self._window_waiters:
                self._pass_window()  # what this writer was woken for and did not use
        self.progress += 1
        self._schedule_flush()

    def send_whole_answer(self, stream_id: int, data) -> bool:
        """A unary call's whole answer when it ended OK: response headers, the message in one DATA
        frame and the OK trailers, queued at once (True) when the message fits as ``send_now``
        needs.  False, nothing sent, when the caller must go the long way (``send_message``, then
        the status), or the stream is gone."""
        out = self._out
        out.append(_frame(_HEADERS, _END_HEADERS, stream_id, RESPONSE_BLOCK))
        if not self._send_whole(stream_id, data):
            out.pop()
            return False
        out.append(_frame(_HEADERS, _END_TRAILERS, stream_id, OK_TRAILERS_BLOCK))
        stream = self._streams[stream_id]
        stream.local_closed = True
        if stream.remote_closed:
            del self._streams[stream_id]
            self._server.open_streams -= 1
        return True

    def _send_whole(self, stream_id: int, data) -> bool:
        """The one place a message goes out as a single DATA frame: when it fits the stream's and
        the connection's windows, the peer's frame size and the send-queue bounds, it is queued
        for this turn's write (True); else False, nothing done."""
        return self._send_framed(_frame_message, stream_id, data)

    def send_fields_now(self, stream_id: int, fields: tuple) -> bool:
        """``send_now`` of a message of unsigned varint fields (``frames.uint_fields``: an ack),
        encoded and framed by one codec call into one buffer, with the same windows and bounds."""
        return self._send_framed(_frame_fields, stream_id, fields)

    def _send_framed(self, framer, stream_id: int, payload) -> bool:
        """``framer`` (a codec call) appends ``payload`` as one DATA frame when the windows, the
        frame size and the send-queue bounds allow; the windows and the turn's write follow."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.local_closed or self._write_paused or self._out_bytes >= self._send_limit:
            return False
        server = self._server
        if server.send_queued > server.max_send_queued_total:
            return False
        total = framer(self._out, stream_id, payload, stream.send_window, self._send_window, self._frame_limit)
        if not total:
            return False
        stream.send_window -= total
        self._send_window -= total
        self._out_bytes += total
        self.progress += 1
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)
        return True

    # ``send_message`` when it can finish without waiting (the message fits the windows and the
    # send-queue bounds, in one frame): queued for this turn's write, True.  False, nothing done,
    # when the caller must await ``send_message`` instead (or the stream is gone).  The same
    # method, under the name calls use: no extra call per streamed message.
    send_now = _send_whole

    def _may_queue(self) -> bool:
        """Whether a writer may frame more now: the connection is under its bound, and the server
        under its total or this connection has nothing waiting (each gets its turn)."""
        if self._write_paused or self._out_bytes >= self._send_limit:
            return False
        server = self._server
        return server.send_queued <= server.max_send_queued_total or (self._send_recorded == 0 and self._out_bytes == 0)

    async def _send_room(self) -> None:
        """Waits until ``_may_queue`` may be true again."""
        self._flush()
        if self._lost:
            return
        if self._write_paused:
            await self._drained()
            return
        server = self._server
        if server.send_queued > server.max_send_queued_total:
            server.refresh_send_queued()
            if server.send_queued > server.max_send_queued_total and self._send_recorded:
                await server.wait_send_room(_GLOBAL_RECHECK_S)

    # ------------------------------------------------------------ flow control

    # A writer out of window waits on its stream's window (woken by that stream's WINDOW_UPDATE)
    # or on the connection's, in line: a connection WINDOW_UPDATE wakes only as many writers as
    # it can serve a frame each, so a peer cannot make each of its updates (however small) wake
    # every stream's writer.  A woken writer is promised up to a frame of the window until it
    # runs; the window it leaves unused goes to the next in line (``_pass_window``).

    async def _wait_for_window(self, stream_id: int, on_stream: bool, remaining: int) -> None:
        self._flush()
        waiter = self.loop.create_future()
        if on_stream:
            self._stream_waiters.setdefault(stream_id, []).append(waiter)
            if self._window_waiters:
                self._pass_window()
        else:
            entry = (waiter, stream_id, remaining)
            self._window_waiters.append(entry)
        try:
            await waiter
        finally:
            if waiter.done() and not waiter.cancelled():
                self._window_promised -= waiter.result()
            elif on_stream:
                waiting = self._stream_waiters.get(stream_id)
                if waiting is not None and waiter in waiting:
                    waiting.remove(waiter)
                    if not waiting:
                        del self._stream_waiters[stream_id]
            else:
                try:
                    self._window_waiters.remove(entry)
                except ValueError:
                    pass

    def _pass_window(self) -> None:
        """Wakes the writers waiting for the connection's window, in order, as many as the window
        not yet promised serves (a frame each at most; a writer whose stream has no window is
        woken at no charge: it goes on to wait on its stream)."""
        waiters = self._window_waiters
        available = self._send_window - self._window_promised
        streams = self._streams
        limit = self._frame_limit
        while waiters and available > 0:
            waiter, stream_id, remaining = waiters.popleft()
            if waiter.done():
                continue
            stream = streams.get(stream_id)
            charge = 0 if stream is None else max(0, min(limit, stream.send_window, remaining, available))
            self._window_promised += charge
            available -= charge
            waiter.set_result(charge)

    def _wake_stream_writers(self, stream_id: int) -> None:
        for waiter in self._stream_waiters.pop(stream_id, ()):
            if not waiter.done():
                waiter.set_result(0)

    def _wake_writers(self) -> None:
        """Every waiting writer looks again (the streams' windows all moved, or the connection is gone)."""
        waiting, self._stream_waiters = self._stream_waiters, {}
        for waiters in waiting.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(0)
        waiters, self._window_waiters = self._window_waiters, collections.deque()
        for waiter, _, _ in waiters:
            if not waiter.done():
                waiter.set_result(0)

    async def _drained(self) -> None:
        self._flush()
        if not self._write_paused or self._lost:
            return
        if self._drain_waiter is None or self._drain_waiter.done():
            self._drain_waiter = self.loop.create_future()
        await self._drain_waiter

    # ------------------------------------------------------------ the socket

    def _queue(self, data: bytes) -> None:
        self._out.append(data)

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
        self._out_bytes = 0
        transport = self._transport
        if transport is not None:
            transport.write(out[0] if len(out) == 1 else b"".join(out))
            self._record_backlog(transport.get_write_buffer_size())

    def _record_backlog(self, size: int) -> None:
        """What the transport holds for the socket now, in the server's total."""
        recorded = self._send_recorded
        if size != recorded:
            self._send_recorded = size
            self._server.send_queued += size - recorded
