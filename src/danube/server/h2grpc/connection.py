"""One client connection: HTTP/2 (the ``h2`` state machine) on an event-loop transport.

Everything runs on the broker's event loop: no extra threads, no hand-off per call.
Responses of many calls finished in one loop iteration leave in one socket write.
HTTP/2 flow control is honoured both ways: a handler writing faster than the client
reads waits for WINDOW_UPDATE (and for the transport to drain), and a streaming
request the handler does not read stops getting window back (see ``call.py``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import grpc
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from h2.errors import ErrorCodes
from hyperframe.frame import GoAwayFrame

from danube.errors import DanubeError
from danube.server import status as status_map
from danube.server.h2grpc import wire
from danube.server.h2grpc.call import ServerCall

if TYPE_CHECKING:
    from danube.server.h2grpc.server import H2Server

log = logging.getLogger(__name__)

# h2's per-header validation and normalisation cost about a sixth of a unary call here.  The
# server reads only :method, :path, content-type and grpc-timeout and answers a clear status
# when they are missing or wrong; other headers become metadata as they came.  Our own
# response headers are fixed and well-formed.
_H2_CONFIG = h2.config.H2Configuration(
    client_side=False, header_encoding=None,
    validate_inbound_headers=False, normalize_inbound_headers=False,
    validate_outbound_headers=False, normalize_outbound_headers=False)

_RESPONSE_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]
# Flush the socket inside the write loop once this much is queued, instead of at the
# end of the loop iteration, so large messages stream out while they are being framed.
_FLUSH_NOW_BYTES = 256 * 1024


class GrpcConnection(asyncio.Protocol):
    def __init__(self, server: "H2Server") -> None:
        self._server = server
        self.loop = server.loop
        self._h2 = h2.connection.H2Connection(config=_H2_CONFIG)
        self._transport: asyncio.Transport | None = None
        self._calls: dict[int, ServerCall] = {}
        self._flush_scheduled = False
        self._window_waiters: list[asyncio.Future] = []
        self._drain_waiter: asyncio.Future | None = None
        self._write_paused = False
        self._going_away = False
        self._lost = False
        self.peer = "unknown"

    # ------------------------------------------------------------ transport events

    def connection_made(self, transport) -> None:
        self._transport = transport
        peername = transport.get_extra_info("peername")
        if isinstance(peername, tuple) and len(peername) >= 2:
            family = "ipv6" if ":" in str(peername[0]) else "ipv4"
            self.peer = f"{family}:{peername[0]}:{peername[1]}"
        limits = self._server.limits
        conn = self._h2
        conn.local_settings = h2.settings.Settings(client=False, initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: limits.stream_window,
            h2.settings.SettingCodes.MAX_FRAME_SIZE: limits.max_frame_size,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: limits.max_header_list_size,
        })
        # Settings given as initial values count as already in force, so h2 never applies them
        # on the peer's ACK: the inbound frame limit has to be set by hand.
        conn.max_inbound_frame_size = limits.max_frame_size
        conn.incoming_buffer.max_frame_size = limits.max_frame_size
        conn.initiate_connection()
        conn.increment_flow_control_window(limits.connection_window - 65535)
        self._flush()
        self._server.connection_opened(self)

    def data_received(self, data: bytes) -> None:
        try:
            events = self._h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            # h2 has queued a GOAWAY naming the error; send it and hang up.
            log.info("closing the connection from %s: HTTP/2 protocol error: %s", self.peer, exc)
            self._flush()
            if self._transport is not None:
                self._transport.close()
            return
        calls = self._calls
        for event in events:
            kind = type(event)
            if kind is h2.events.DataReceived:
                call = calls.get(event.stream_id)
                if call is not None:
                    call.on_data(event.data, event.flow_controlled_length)
                else:  # a call already answered: give the window back and drop the bytes
                    self.acknowledge(event.stream_id, event.flow_controlled_length)
            elif kind is h2.events.RequestReceived:
                self._on_request(event)
            elif kind is h2.events.StreamEnded:
                call = calls.get(event.stream_id)
                if call is not None:
                    call.on_remote_end()
            elif kind is h2.events.StreamReset:
                call = calls.get(event.stream_id)
                if call is not None:
                    call.on_reset()
            elif kind is h2.events.WindowUpdated or kind is h2.events.RemoteSettingsChanged:
                self._wake_writers()
            elif kind is h2.events.ConnectionTerminated:
                log.debug("client %s sent GOAWAY (%s)", self.peer, event.error_code)
                self._going_away = True
                if not calls and self._transport is not None:
                    self._flush()
                    self._transport.close()
        self._flush()

    def connection_lost(self, exc) -> None:
        self._lost = True
        self._transport = None
        for call in list(self._calls.values()):
            call.on_reset()
        self._calls.clear()
        self._wake_writers()
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)
        self._server.connection_closed(self)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    # ------------------------------------------------------------ requests

    def _on_request(self, event: h2.events.RequestReceived) -> None:
        stream_id = event.stream_id
        headers = event.headers
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
        if self._going_away:
            self._reset(stream_id, ErrorCodes.REFUSED_STREAM)
            return
        if method != b"POST":
            self._plain_http_answer(stream_id, b"405")
            return
        if content_type is None or not content_type.startswith(b"application/grpc"):
            self._plain_http_answer(stream_id, b"415")
            return
        path_text = (path or b"").decode("utf-8", "replace")
        handler = self._server.find_handler(path_text, headers)
        if handler is None:
            self.send_status(stream_id, grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {path_text}",
                             (), trailers_only=True, reset_after=not event.stream_ended)
            return
        timeout = None
        if timeout_value is not None:
            try:
                timeout = wire.parse_timeout(timeout_value)
            except DanubeError as exc:
                self.send_status(stream_id, status_map.status_for(exc), status_map.message_for(exc), (),
                                 trailers_only=True, reset_after=not event.stream_ended)
                return
        call = ServerCall(self, stream_id, path_text, handler, headers,
                          receive_limit=self._server.limits.max_receive_message_length, timeout=timeout)
        self._calls[stream_id] = call
        if handler.request_streaming:
            call.start()

    def _plain_http_answer(self, stream_id: int, status: bytes) -> None:
        try:
            self._h2.send_headers(stream_id, [(b":status", status)], end_stream=True)
        except h2.exceptions.ProtocolError:
            return
        self._schedule_flush()

    # ------------------------------------------------------------ used by calls

    def forget(self, stream_id: int) -> None:
        self._calls.pop(stream_id, None)
        if self._going_away and not self._calls and self._transport is not None:
            self.loop.call_soon(self._close_if_idle)

    def acknowledge(self, stream_id: int, size: int) -> None:
        if size and not self._lost:
            self._h2.acknowledge_received_data(size, stream_id)
            self._schedule_flush()

    def send_response_headers(self, stream_id: int, metadata: tuple = ()) -> None:
        headers = _RESPONSE_HEADERS
        if metadata:
            headers = headers + [(key.encode("ascii"), value if isinstance(value, bytes) else value.encode())
                                 for key, value in metadata]
        try:
            self._h2.send_headers(stream_id, headers)
        except h2.exceptions.StreamClosedError:
            return  # the client reset the stream; its call is being cancelled
        self._schedule_flush()

    async def send_message(self, stream_id: int, data: bytes) -> None:
        """One length-prefixed message, within the stream's and the connection's window."""
        conn = self._h2
        payload = wire.message_prefix(len(data)) + data
        total = len(payload)
        if (total <= conn.max_outbound_frame_size and not self._write_paused
                and self._window(stream_id) >= total):
            conn.send_data(stream_id, payload)
            self._schedule_flush()
            return
        view = memoryview(payload)
        sent = unflushed = 0
        while sent < total:
            if self._lost:
                raise asyncio.CancelledError("the connection is gone")
            window = self._window(stream_id)
            size = min(total - sent, window, conn.max_outbound_frame_size)
            if size <= 0:
                await self._wait_for_window()
                continue
            conn.send_data(stream_id, view[sent:sent + size])
            sent += size
            unflushed += size
            if unflushed >= _FLUSH_NOW_BYTES:
                self._flush()
                unflushed = 0
            if self._write_paused:
                await self._drained()
        self._schedule_flush()

    def send_status(self, stream_id: int, code: grpc.StatusCode, details: str, trailing: tuple, *,
                    trailers_only: bool, reset_after: bool) -> None:
        """The call's end: ``grpc-status`` (and message) in trailers, or trailers-only when no
        response headers went out."""
        headers = [(b"grpc-status", str(code.value[0]).encode())]
        if details:
            headers.append((b"grpc-message", wire.encode_status_message(details)))
        for key, value in trailing:
            headers.append((key.encode("ascii"), value if isinstance(value, bytes) else value.encode()))
        if trailers_only:
            headers = _RESPONSE_HEADERS + headers
        try:
            self._h2.send_headers(stream_id, headers, end_stream=True)
            if reset_after:
                # The client is still sending: tell it to stop (the status above stands).
                self._h2.reset_stream(stream_id, ErrorCodes.NO_ERROR)
        except h2.exceptions.ProtocolError:
            return  # the stream is already closed (client reset or connection lost)
        self._schedule_flush()

    # ------------------------------------------------------------ server shutdown

    def go_away(self) -> None:
        """Refuse new calls (GOAWAY); close once the calls in flight are answered."""
        if self._going_away or self._transport is None:
            return
        self._going_away = True
        self._flush()
        # By hand, not h2's close_connection(): that one moves the state machine to CLOSED,
        # after which the calls in flight could not send their answers.
        goaway = GoAwayFrame(stream_id=0, last_stream_id=self._h2.highest_inbound_stream_id, error_code=0)
        self._transport.write(goaway.serialize())
        self._close_if_idle()

    def cancel_calls(self) -> None:
        for call in list(self._calls.values()):
            call.abandon()

    def close(self) -> None:
        if self._transport is not None:
            self._flush()
            self._transport.close()

    @property
    def busy(self) -> bool:
        return bool(self._calls)

    # ------------------------------------------------------------ internals

    def _close_if_idle(self) -> None:
        if not self._calls and self._transport is not None:
            self._flush()
            self._transport.close()

    def _reset(self, stream_id: int, code: ErrorCodes) -> None:
        try:
            self._h2.reset_stream(stream_id, code)
        except h2.exceptions.ProtocolError:
            return
        self._schedule_flush()

    def _window(self, stream_id: int) -> int:
        try:
            return self._h2.local_flow_control_window(stream_id)
        except h2.exceptions.StreamClosedError as exc:
            raise asyncio.CancelledError("the client closed the stream") from exc

    async def _wait_for_window(self) -> None:
        self._flush()
        waiter = self.loop.create_future()
        self._window_waiters.append(waiter)
        await waiter

    def _wake_writers(self) -> None:
        waiters, self._window_waiters = self._window_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _drained(self) -> None:
        self._flush()
        if not self._write_paused or self._lost:
            return
        if self._drain_waiter is None or self._drain_waiter.done():
            self._drain_waiter = self.loop.create_future()
        await self._drain_waiter

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        data = self._h2.data_to_send()
        if data and self._transport is not None:
            self._transport.write(data)
