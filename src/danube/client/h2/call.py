"""A stream-stream call on the client's HTTP/2 transport, shaped like grpc.aio's.

``write``, ``done_writing``, ``read``, ``cancel``, ``code``, ``details``, the metadata getters
and async iteration behave as ``grpc.aio.StreamStreamCall``'s do for the client's streams; a
failed call raises a real ``grpc.aio.AioRpcError``.  ``read_batch`` returns every response that
has arrived, in one call: a stream's reader takes what one socket read brought in one loop turn
instead of one message per turn.  With ``on_messages`` set, the responses are handed to it in
the socket read that brought them, and ``read_batch`` only waits for the call's end.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

import grpc

from danube.client.h2 import frames
from danube.client.h2.limits import H2ClientLimits
from danube.client.h2.status import EMPTY, http_status_problem, metadata_of, reset_code, rpc_error, status_of

log = logging.getLogger(__name__)

_OK = grpc.StatusCode.OK
_CANCELLED = grpc.StatusCode.CANCELLED
_PREFIX = frames.PREFIX_SIZE


class Connection(Protocol):
    """What a call needs of its connection (``connection.H2Connection``)."""

    @property
    def usable(self) -> bool: ...
    @property
    def write_paused(self) -> bool: ...

    def has_room(self) -> bool: ...
    def open_stream(self, stream: Any, block: bytes) -> None: ...
    def send_now(self, stream: Any, data: bytes) -> bool: ...
    async def send(self, stream: Any, data: bytes, still_open: Callable[[], bool]) -> None: ...
    def end_stream(self, stream_id: int) -> None: ...
    def window_update(self, stream_id: int, increment: int) -> None: ...
    def reset_stream(self, stream_id: int, code: int) -> None: ...
    def forget(self, stream_id: int) -> None: ...
    async def wait(self) -> None: ...
    async def drained(self) -> None: ...


class Channel(Protocol):
    """Where a call gets a connection with room for one more stream."""

    limits: H2ClientLimits

    async def connection(self) -> Connection: ...


class H2StreamCall:
    def __init__(
        self,
        channel: Channel,
        block: bytes,
        serializer: Callable[[Any], bytes],
        deserializer: Callable[[bytes], Any],
    ) -> None:
        limits = channel.limits
        self._loop = asyncio.get_running_loop()
        self._channel = channel
        self._block = block
        self._serialize = serializer
        self._deserialize = deserializer
        self._max_send = limits.max_send_message
        self.stream_id = 0
        self.send_window = 0
        self._recv_window = limits.stream_window
        self._owed = 0  # receive window to give back once it is worth a WINDOW_UPDATE
        self._update_at = limits.stream_window // 4
        self._reader = frames.MessageReader(limits.max_message)
        self._messages: list[bytes] = []
        # takes the responses as they arrive, on the connection's read (see on_data), when set
        self.on_messages: Callable[[list], None] | None = None
        self._read_waiter: asyncio.Future | None = None
        self._done_waiter: asyncio.Future | None = None
        self._conn: Connection | None = None
        self._headers_seen = False
        self._local_closed = False  # END_STREAM or RST_STREAM sent
        self._remote_closed = False  # END_STREAM or RST_STREAM received (or the connection ended)
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._initial = EMPTY
        self._trailing = EMPTY
        self._cancelled = False
        self._opening = self._loop.create_task(self._open())

    # ------------------------------------------------------------ grpc.aio's call interface

    async def write(self, request: Any) -> None:
        if self._code is not None or self._local_closed:
            raise asyncio.InvalidStateError("RPC already finished" if self._code is not None else "done writing")
        if self._conn is None:
            await self._opened()
            if self._code is not None:  # it never opened (no connection) or was cancelled meanwhile
                raise asyncio.InvalidStateError("RPC already finished")
        data = self._serialize(request)
        if len(data) > self._max_send:
            self._abandon(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Sent message larger than max ({len(data)} vs. {self._max_send})",
            )
            raise self._error()
        conn = self._conn
        assert conn is not None
        if not conn.send_now(self, data):
            await conn.send(self, data, self._writable)
        if conn.write_paused:
            await conn.drained()

    def write_nowait(self, request: Any) -> bool:
        """``write`` when it would not wait: True once ``request`` is queued for this loop turn's
        socket write; False, nothing written, when ``write`` must be awaited instead (the stream
        not open yet, a flow-control window or the frame size too small, the socket's buffer
        full, the call over or the request too large: ``write`` waits, or raises what it does)."""
        conn = self._conn
        if conn is None or self._code is not None or self._local_closed or conn.write_paused:
            return False
        data = self._serialize(request)
        if len(data) > self._max_send:
            return False
        return conn.send_now(self, data)

    async def done_writing(self) -> None:
        if self._code is not None or self._local_closed:
            return
        if self._conn is None:
            await self._opened()
            if self._code is not None:
                return
        conn = self._conn
        assert conn is not None
        self._local_closed = True
        conn.end_stream(self.stream_id)
        if self._remote_closed:
            conn.forget(self.stream_id)

    async def read(self) -> Any:
        while not self._messages:
            await self._arrival()
            if self._code is not None and not self._messages:
                return grpc.aio.EOF
        data = self._messages.pop(0)
        self._give_back(len(data) + _PREFIX)
        return self._deserialize(data)

    async def read_batch(self) -> list:
        """Every response received so far (waiting for one when there is none); [] once the
        call ended OK.  Raises as ``read`` does."""
        if not self._messages:
            await self._arrival()
            if not self._messages:
                return []
        messages, self._messages = self._messages, []
        self._give_back(sum(map(len, messages)) + _PREFIX * len(messages))
        deserialize = self._deserialize
        return [deserialize(data) for data in messages]

    def __aiter__(self):
        return self._iterate()

    async def _iterate(self):
        while True:
            response = await self.read()
            if response is grpc.aio.EOF:
                return
            yield response

    def cancel(self) -> bool:
        if self._code is not None:
            return False
        self._cancelled = True
        self._abandon(_CANCELLED, "Locally cancelled by application!")
        if not self._opening.done():
            self._opening.cancel()
        return True

    def cancelled(self) -> bool:
        return self._cancelled

    def done(self) -> bool:
        return self._code is not None

    async def code(self) -> grpc.StatusCode:
        await self._wait_done()
        assert self._code is not None
        return self._code

    async def details(self) -> str:
        await self._wait_done()
        return self._details

    async def initial_metadata(self) -> grpc.aio.Metadata:
        return self._initial

    async def trailing_metadata(self) -> grpc.aio.Metadata:
        await self._wait_done()
        return self._trailing

    async def wait_for_connection(self) -> None:
        await self._opened()

    # ------------------------------------------------------------ from the connection

    def on_data(self, payload: bytes, flow_length: int, end_stream: int) -> None:
        """A DATA frame's payload (unpadded) and the receive window it took; ``end_stream`` is
        its END_STREAM flag (non-zero when set).  The usual case, whole messages handed to
        ``on_messages``, runs without further calls of this class (one message per read at a
        thousand producers: each call here is a share of a message's cost)."""
        self._recv_window -= flow_length
        if self._recv_window < 0:
            return self._protocol_error(frames.FLOW_CONTROL_ERROR, "the server sent past the stream's receive window")
        if not self._headers_seen:
            return self._protocol_error(frames.PROTOCOL_ERROR, "the server sent DATA before its response headers")
        queued = 0
        if payload:
            try:
                messages = self._reader.feed(payload)
            except frames.MessageTooLarge as exc:
                return self._abandon(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            except frames.CompressedMessage:
                return self._abandon(
                    grpc.StatusCode.INTERNAL, "the server sent a compressed message; none was asked for"
                )
            if messages:
                handler = self.on_messages
                if handler is not None and not self._messages:
                    try:
                        responses = list(map(self._deserialize, messages))
                    except Exception as exc:  # noqa: BLE001 - a response that does not parse ends the call
                        return self._abandon(
                            grpc.StatusCode.INTERNAL, f"a response from the server does not parse: {exc}"
                        )
                    try:
                        handler(responses)
                    except Exception as exc:  # noqa: BLE001 - the reader sees the call end with why
                        log.exception("handling the responses of stream %d failed", self.stream_id)
                        self._abandon(grpc.StatusCode.INTERNAL, f"handling the responses failed: {exc!r}")
                else:
                    self._messages += messages
                    queued = sum(map(len, messages)) + _PREFIX * len(messages)
                    waiter = self._read_waiter
                    if waiter is not None and not waiter.done():
                        waiter.set_result(None)
        # what does not wait for a reader (padding, a message's first part) is given back now
        owed = self._owed + flow_length - queued
        if owed >= self._update_at and not self._remote_closed and self._conn is not None:
            self._recv_window += owed
            self._conn.window_update(self.stream_id, owed)
            owed = 0
        self._owed = owed
        if end_stream:
            self._remote_end(grpc.StatusCode.INTERNAL, "the server ended the stream without a grpc-status")

    def on_headers(self, headers: list, end_stream: bool) -> None:
        if not self._headers_seen:
            self._headers_seen = True
            problem = http_status_problem(headers)
            if end_stream:  # trailers-only
                self._trailing = metadata_of(headers)
                status = status_of(headers) or problem or (grpc.StatusCode.INTERNAL, "a response without grpc-status")
                return self._remote_end(*status)
            if problem is not None:
                return self._abandon(*problem)
            self._initial = metadata_of(headers)
            return
        if not end_stream:
            return self._protocol_error(frames.PROTOCOL_ERROR, "the server sent trailers without END_STREAM")
        self._trailing = metadata_of(headers)
        code, details = status_of(headers) or (grpc.StatusCode.INTERNAL, "the server's trailers carry no grpc-status")
        if code is _OK and self._reader.pending:
            code, details = grpc.StatusCode.INTERNAL, "the stream ended in the middle of a message"
        self._remote_end(code, details)

    def on_reset(self, code: int) -> None:
        self._remote_closed = self._local_closed = True
        self._finish(reset_code(code), f"the server reset the stream (HTTP/2 error code {code})")

    def fail(self, error: grpc.aio.AioRpcError) -> None:
        """The connection is gone (or refused the stream): the call ends with ``error``."""
        self._remote_closed = self._local_closed = True
        self._initial = error.initial_metadata() or self._initial
        self._finish(error.code(), error.details() or "")

    # ------------------------------------------------------------ internals

    async def _open(self) -> None:
        try:
            while True:
                conn = await self._channel.connection()
                while conn.usable and not conn.has_room():
                    await conn.wait()
                if conn.usable:
                    break
            if self._code is None:
                self._conn = conn
                conn.open_stream(self, self._block)
        except grpc.aio.AioRpcError as exc:
            self.fail(exc)
        except asyncio.CancelledError:
            self._finish(_CANCELLED, "Locally cancelled by application!")
            raise

    async def _opened(self) -> None:
        if not self._opening.done():
            try:
                await asyncio.shield(self._opening)
            except asyncio.CancelledError:
                if not self._opening.cancelled():
                    raise  # the waiting task itself is cancelled
                # else the call was cancelled while it opened: the caller sees its status

    def _writable(self) -> bool:
        return self._code is None and not self._local_closed

    async def _arrival(self) -> None:
        """Waits for a message or the end; raises when the call ended other than OK."""
        while not self._messages:
            code = self._code
            if code is not None:
                if self._cancelled:
                    raise asyncio.CancelledError
                if code is _OK:
                    return
                raise self._error()
            waiter = self._read_waiter = self._loop.create_future()
            try:
                await waiter
            finally:
                self._read_waiter = None

    def _give_back(self, size: int) -> None:
        owed = self._owed + size
        if owed >= self._update_at and not self._remote_closed and self._conn is not None:
            self._recv_window += owed
            self._conn.window_update(self.stream_id, owed)
            owed = 0
        self._owed = owed

    def _remote_end(self, code: grpc.StatusCode, details: str) -> None:
        self._remote_closed = True
        self._finish(code, details)
        if self._conn is not None:
            # the stream's slot is free once the server ended it: it resets a stream it ended
            # while the client still had its side open (the gRPC HTTP/2 protocol)
            self._conn.forget(self.stream_id)

    def _protocol_error(self, h2_code: int, why: str) -> None:
        self._reset(h2_code)
        self._finish(grpc.StatusCode.INTERNAL, why)

    def _abandon(self, code: grpc.StatusCode, details: str) -> None:
        """The client ends the call: RST_STREAM CANCEL unless the stream is over already."""
        if not (self._local_closed and self._remote_closed):
            self._reset(frames.CANCEL)
        self._finish(code, details)

    def _reset(self, h2_code: int) -> None:
        self._local_closed = self._remote_closed = True
        if self._conn is not None and self.stream_id:
            self._conn.reset_stream(self.stream_id, h2_code)

    def _finish(self, code: grpc.StatusCode, details: str) -> None:
        if self._code is not None:
            return
        self._code = code
        self._details = details
        self._reader = frames.MessageReader(0)  # what a partial message held goes
        for waiter in (self._read_waiter, self._done_waiter):
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    async def _wait_done(self) -> None:
        if self._code is None:
            if self._done_waiter is None:
                self._done_waiter = self._loop.create_future()
            await self._done_waiter

    def _error(self) -> grpc.aio.AioRpcError:
        assert self._code is not None
        return rpc_error(self._code, self._details, self._initial, self._trailing)
