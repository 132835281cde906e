"""One gRPC call on one HTTP/2 stream: its request messages, its handler task, its answer.

``ServerCall`` is also the handler's ``context``: it offers the part of
``grpc.aio.ServicerContext`` a servicer uses (abort, write, read, codes, metadata,
peer, deadline), so servicers written for grpc.aio run here unchanged.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
from grpc.aio import AbortError

from danube.server.h2grpc import frames, wire
from danube.server.h2grpc.context import RequestIterator, ServicerContextPart

if TYPE_CHECKING:
    from danube.server.h2grpc.connection import GrpcConnection

log = logging.getLogger(__name__)

# Whole request messages a streaming handler may leave unread before the stream's
# flow-control window stops being reopened (the client then waits: backpressure).
UNREAD_MESSAGES_BEFORE_BACKPRESSURE = 4
_OK = grpc.StatusCode.OK
_Encoded = wire.Encoded
# The codec's framers, handed to the connection's ``_send_framed`` straight from a write (no
# ``send_now`` / ``send_fields_now`` frame in between on every streamed message and ack).
_frame_message = frames.frame_message
_frame_fields = frames.frame_fields
# What a finished call's reader becomes: its partial message is dropped with it.
_SPENT_READER = wire.MessageReader(0)


class ServerCall(ServicerContextPart):
    # Handlers may write ``wire.Encoded`` responses (grpc.aio's context has no such attribute).
    sends_encoded = True

    __slots__ = (
        "_connection",
        "stream_id",
        "method",
        "_handler",
        "_headers",
        "_reader",
        "_messages",
        "_waiter",
        "_remote_ended",
        "_held_credit",
        "_task",
        "_headers_sent",
        "_finished",
        "_deadline",
        "_deadline_timer",
        "_deadline_hit",
        "_cancelled",
        "_queued_bytes",
        "_buffered",
        "_sink",
        "_sink_paused",
        "_sink_busy",
        "_sink_ended",
    )

    def __init__(
        self,
        connection: "GrpcConnection",
        stream_id: int,
        method: str,
        handler: Any,
        headers: list,
        *,
        receive_limit: int,
        timeout: float | None,
    ) -> None:
        self._connection = connection
        self.stream_id = stream_id
        self.method = method
        self._handler = handler
        self._headers = headers
        self._metadata: tuple | None = None  # built from the headers if a handler asks
        self._reader = wire.MessageReader(receive_limit)
        self._messages: collections.deque = collections.deque()
        self._waiter: asyncio.Future | None = None
        self._remote_ended = False
        self._held_credit = 0
        # Request bytes held: in unread whole messages, and those plus the unfinished one (what
        # counts against the connection's buffer budget).
        self._queued_bytes = 0
        self._buffered = 0
        self._task: asyncio.Task | None = None
        self._headers_sent = False
        self._finished = False
        self._cancelled = False
        self._code = _OK
        self._details = ""
        self._trailing_metadata: tuple = ()
        self._deadline_hit = False
        self._done_callbacks: list | None = None
        self._sink: Callable[[Any], None] | None = (
            None  # set_message_sink: request messages go to this callback as they arrive
        )
        self._sink_paused = False  # pause_messages: they wait in _messages meanwhile
        self._sink_busy = False  # inside a delivery to the sink (a resume from it only lifts the pause)
        self._sink_ended = False  # the sink got grpc.aio.EOF
        if timeout is None:
            self._deadline = self._deadline_timer = None
        else:
            loop = connection.loop
            self._deadline = deadline = loop.time() + timeout
            self._deadline_timer = loop.call_at(deadline, self._on_deadline)

    # ------------------------------------------------------------ from the connection

    @property
    def streaming_request(self) -> bool:
        return self._handler.request_streaming

    def start(self) -> None:
        self._task = self._connection.loop.create_task(self._run())

    def on_data(self, data: bytes, flow_controlled: int) -> bool:
        """DATA for this stream; whether its flow-control credit goes back now (the connection
        gives it back, True).  It does unless a streaming handler has fallen behind, or the
        connection's calls hold more request bytes than its buffer budget; then the call holds
        it and gives it back as the handler reads (or the budget frees up)."""
        if self._finished:
            return True
        reader = self._reader
        try:
            messages = reader.feed(data)
        except wire.MessageTooLarge as exc:
            self._fail_early(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            return True  # refused, not held
        except wire.CompressedMessage as exc:
            self._fail_early(grpc.StatusCode.UNIMPLEMENTED, str(exc))
            return True
        connection = self._connection
        queue = self._messages
        if messages:
            connection.progress += 1
            sink = self._sink
            if sink is not None and not self._sink_paused and not queue:
                # Taken at once, in the connection's read: nothing queued, nothing to wake (the
                # work of ``_drain_to_sink``, inline on every DATA frame's path).  A sink that
                # pauses leaves the rest of the read queued, in order, as a handler's unread
                # messages are.
                parse = self._handler.request_deserializer
                taken = 0
                self._sink_busy = True
                try:
                    for message in messages:
                        if self._finished or self._sink_paused:
                            break
                        taken += 1
                        if parse is not None:
                            try:
                                message = parse(message)
                            except Exception as exc:  # noqa: BLE001 - bad bytes from the client
                                self._unparsable(exc)
                                break
                        sink(message)
                finally:
                    self._sink_busy = False
                if self._finished:
                    return True
                if taken == len(messages):
                    if not self._buffered and not reader.pending:
                        return True  # taken whole, nothing held: whatever the budget
                    messages = ()
                else:
                    messages = messages[taken:]
            if messages:
                queue.extend(messages)
                self._queued_bytes += sum(map(len, messages)) if len(messages) > 1 else len(messages[0])
                waiter = self._waiter
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
        buffered = self._reader.pending + self._queued_bytes
        delta = buffered - self._buffered
        if delta:
            self._buffered = buffered
            connection.hold(delta)
        give = False
        if len(queue) > UNREAD_MESSAGES_BEFORE_BACKPRESSURE:
            self._held_credit += flow_controlled
        elif connection.over_budget() and not connection.favours(self):
            self._held_credit += flow_controlled
            connection.starve(self)
        else:
            give = True
        if len(queue) > 1 and self._task is None and not self._handler.request_streaming:
            self._fail_early(grpc.StatusCode.INTERNAL, "a unary call got more than one request message")
        return give

    def on_remote_end(self) -> None:
        self._remote_ended = True
        if self._finished:
            return
        if self._reader.pending:
            self._fail_early(grpc.StatusCode.INTERNAL, "the request stream ended inside a message")
            return
        if self._waiter is not None:
            self._wake()
        if self._sink is not None:
            self._drain_to_sink()  # the end, once the messages before it are taken
        if self._task is None and not self._handler.request_streaming:
            if len(self._messages) != 1:
                self._fail_early(
                    grpc.StatusCode.INTERNAL,
                    f"a unary call needs exactly one request message, got {len(self._messages)}",
                )
                return
            self.start()

    def abandon(self) -> None:
        """The server is stopping and the grace period is over: cancel the handler, which answers
        UNAVAILABLE (a call not yet started is just dropped)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        else:
            self.on_reset()

    def on_reset(self) -> None:
        """The client cancelled the call (RST_STREAM) or the connection is gone."""
        if not self._finished:
            observe = self._connection.status_observer
            if observe is not None:
                observe(self.method, grpc.StatusCode.CANCELLED)
        self._cancelled = True
        self._finished = True
        self._wake()
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._close()

    # ------------------------------------------------------------ the handler

    async def _run(self) -> None:
        handler = self._handler
        try:
            if handler.request_streaming:
                request = RequestIterator(self)
            else:
                request = self._deserialize(self._take())
            if not handler.response_streaming:
                behaviour = handler.unary_unary if not handler.request_streaming else handler.stream_unary
                response = await behaviour(request, self)
                if not self._finished:
                    data = self._serialize(response)
                    if (
                        not self._headers_sent
                        and self._code is _OK
                        and not self._details
                        and not self._trailing_metadata
                        and self._connection.send_whole_answer(self.stream_id, data)
                    ):
                        self._answered()
                        return
                    await self._send_message(data)
            else:
                behaviour = handler.unary_stream if not handler.request_streaming else handler.stream_stream
                result = behaviour(request, self)
                if inspect.isasyncgen(result):
                    async for response in result:
                        if not self.write_nowait(response):
                            await self.write(response)
                else:
                    await result
            self._finish(self._code, self._details)
        except AbortError:
            self._finish(self._code, self._details)
        except asyncio.CancelledError:
            if self._deadline_hit:
                self._finish(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            elif not self._cancelled:
                # The server is stopping (its grace period is over).
                self._finish(grpc.StatusCode.UNAVAILABLE, "the server is shutting down")
        except Exception as exc:  # noqa: BLE001 - a handler bug: INTERNAL, logged, connection lives on
            log.exception("unhandled error in %s", self.method)
            self._finish(grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc).__name__}: {exc}")
        finally:
            self._close()

    def _deserialize(self, data: bytes):
        deserializer = self._handler.request_deserializer
        if deserializer is None:
            return data
        try:
            return deserializer(data)
        except Exception as exc:  # noqa: BLE001 - bad bytes from the client
            self._code = grpc.StatusCode.INTERNAL
            self._details = f"cannot parse the request of {self.method}: {exc}"
            raise AbortError() from exc

    def _unparsable(self, exc: Exception) -> None:
        """A request message its deserializer refused, taken outside the handler (by a sink):
        the call ends INTERNAL, as ``_deserialize`` ends it inside."""
        self._code = grpc.StatusCode.INTERNAL
        self._details = f"cannot parse the request of {self.method}: {exc}"
        self._fail_early(self._code, self._details)

    def _serialize(self, response):
        if type(response) is _Encoded:
            return response
        serializer = self._handler.response_serializer
        return response if serializer is None else serializer(response)

    async def _send_message(self, data: bytes) -> None:
        connection = self._connection
        if not self._headers_sent:
            self._headers_sent = True
            connection.send_response_headers(self.stream_id)
        await connection.send_message(self.stream_id, data)

    def _finish(self, code: grpc.StatusCode, details: str) -> None:
        if self._finished:
            return
        self._finished = True
        observe = self._connection.status_observer
        if observe is not None:
            observe(self.method, code)
        self._connection.send_status(
            self.stream_id,
            code,
            details,
            self._trailing_metadata,
            trailers_only=not self._headers_sent,
            reset_after=not self._remote_ended,
        )

    def _answered(self) -> None:
        """``_finish`` for a call whose headers, message and OK trailers went out at once."""
        self._finished = True
        self._headers_sent = True
        observe = self._connection.status_observer
        if observe is not None:
            observe(self.method, _OK)
        if not self._remote_ended:
            self._connection.stop_stream(self.stream_id)

    def _fail_early(self, code: grpc.StatusCode, details: str) -> None:
        """A bad request seen while reading it: answer the status, stop the handler."""
        self._finish(code, details)
        if self._task is not None and not self._task.done():
            self._cancelled = True
            self._task.cancel()
        self._close()

    def _take(self) -> bytes:
        """The next unread request message, its bytes off the buffer budget."""
        data = self._messages.popleft()
        size = len(data)
        self._queued_bytes -= size
        self._buffered -= size
        self._connection.release(self, size)
        return data

    @property
    def unfinished(self) -> bool:
        """Whether part of a request message has arrived and the rest has not."""
        return not self._finished and self._reader.pending > 0

    @property
    def buffered(self) -> int:
        return self._buffered

    @property
    def waits_on_server(self) -> bool:
        """Whether the call's progress is up to its handler, not to the peer: the request is whole
        and the handler runs (a subscription on a quiet topic, a slow unary call)."""
        if self._sink_paused and not self._finished:
            return True  # messages wait for the handler to take them again
        return self._remote_ended and not self._finished and self._task is not None and not self._task.done()

    def shed(self) -> None:
        self._fail_early(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "request buffers full: the server holds too many unfinished messages on this connection",
        )

    def release_held(self) -> None:
        """The buffer budget has room again: give back the window held for it (unless the
        handler is behind on its messages, then its reads give it back)."""
        if self._held_credit and len(self._messages) <= UNREAD_MESSAGES_BEFORE_BACKPRESSURE:
            held, self._held_credit = self._held_credit, 0
            self._connection.return_credit(self.stream_id, held)

    def _close(self) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        if self._held_credit:
            self._connection.return_credit(self.stream_id, self._held_credit)
            self._held_credit = 0
        self._messages.clear()
        self._reader = _SPENT_READER
        if self._buffered:
            size, self._buffered, self._queued_bytes = self._buffered, 0, 0
            self._connection.release(self, size)
        self._connection.forget(self.stream_id)
        if self._done_callbacks:
            callbacks, self._done_callbacks = self._done_callbacks, None
            for callback in callbacks:
                try:
                    callback(self)
                except Exception:  # noqa: BLE001 - a callback's error must not break the call
                    log.exception("done callback of %s failed", self.method)

    def _on_deadline(self) -> None:
        self._deadline_timer = None
        if self._finished:
            return
        self._deadline_hit = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
        else:
            self._finish(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            self._close()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ------------------------------------------------------------ request messages by callback

    def set_message_sink(self, sink) -> None:
        """From now on each request message is handed to ``sink(message)`` as soon as its DATA
        is read (those already waiting first, in order), and ``sink(grpc.aio.EOF)`` once the
        client ends its stream: a streaming handler handles its requests in the connection's
        read, without a task woken per message.  A sink that cannot take more for now calls
        ``pause_messages`` (from inside the sink or anywhere on the loop): later messages wait
        in the call, in order, and past a few of them the stream's flow-control window stops
        being given back, so the client waits as for a handler that does not read; then
        ``resume_messages`` hands them over.  The sink must not raise; ``read`` is not used
        afterwards."""
        self._sink = sink
        self._drain_to_sink()

    def fail_now(self, code: grpc.StatusCode, details: str) -> None:
        """Ends the call with ``code`` from outside its handler (a sink that refuses a request:
        the auth guard's per-message check): the status goes out, no later request reaches the
        sink, and the handler is cancelled."""
        self._fail_early(code, details)

    def pause_messages(self) -> None:
        """Request messages wait in the call until ``resume_messages`` (see ``set_message_sink``)."""
        self._sink_paused = True

    def resume_messages(self) -> None:
        """Hands the messages that waited to the sink at once, in order, until it pauses again,
        then the end of the stream if the client sent it.  Called from inside the sink, it only
        lifts the pause: the delivery under way goes on."""
        self._sink_paused = False
        if not self._sink_busy:
            self._drain_to_sink()

    def _drain_to_sink(self) -> None:
        sink = self._sink
        if sink is None or self._sink_busy or self._finished:
            return
        messages = self._messages
        parse = self._handler.request_deserializer
        self._sink_busy = True
        try:
            while messages and not self._sink_paused:
                data = self._take_queued()
                if parse is not None:
                    try:
                        data = parse(data)
                    except Exception as exc:  # noqa: BLE001 - bad bytes from the client
                        self._unparsable(exc)
                        return
                sink(data)
                if self._finished:
                    return
            if not messages and not self._sink_paused and self._remote_ended and not self._sink_ended:
                self._sink_ended = True
                sink(grpc.aio.EOF)
        finally:
            self._sink_busy = False

    # ------------------------------------------------------------ grpc.aio.ServicerContext

    async def read(self):
        """The next request message, or ``grpc.aio.EOF`` once the client has sent its last."""
        while not self._messages:
            if self._remote_ended or self._finished:
                return grpc.aio.EOF
            self._waiter = self._connection.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._next_message()

    def _next_message(self):
        """The next queued request message (there is one), parsed."""
        return self._deserialize(self._take_queued())

    def _take_queued(self) -> bytes:
        """The next queued request message's bytes (there is one), its credit given back if it
        was held (``_take`` inline: a streamed request's path, by iterator or by sink)."""
        messages = self._messages
        data = messages.popleft()
        size = len(data)
        self._queued_bytes -= size
        self._buffered -= size
        connection = self._connection
        connection.release(self, size)
        if self._held_credit and len(messages) <= UNREAD_MESSAGES_BEFORE_BACKPRESSURE:
            if connection.over_budget():
                connection.starve(self)
            else:
                connection.return_credit(self.stream_id, self._held_credit)
                self._held_credit = 0
        return data

    async def write(self, message) -> None:
        if self._finished:
            raise asyncio.InvalidStateError(f"{self.method}: the call is already over")
        data = self._serialize(message)
        # What fits now is queued without the awaited path's two coroutines (``send_message``
        # tries the same first).
        if self._headers_sent and self._connection.send_now(self.stream_id, data):
            return
        await self._send_message(data)

    def write_nowait(self, message) -> bool:
        """``write`` from a callback: True when the message is queued for this turn's socket
        write; False, nothing sent, when it would have to wait for flow control or the send
        queue (the caller then awaits ``write``, keeping its messages in order)."""
        if self._finished:
            return False
        if type(message) is not _Encoded:
            serializer = self._handler.response_serializer
            if serializer is not None:
                message = serializer(message)
        if not self._headers_sent:
            self._headers_sent = True
            self._connection.send_response_headers(self.stream_id)
        return self._connection._send_framed(_frame_message, self.stream_id, message)

    def write_fields_nowait(self, fields: tuple) -> bool:
        """``write_nowait`` of a response that is a message of unsigned varint fields numbered 1,
        2, ... in order (``frames.uint_fields``; the handler knows its response type has this
        form), encoded and framed in one codec call: no message object, no serializer."""
        if self._finished:
            return False
        if not self._headers_sent:
            self._headers_sent = True
            self._connection.send_response_headers(self.stream_id)
        return self._connection._send_framed(_frame_fields, self.stream_id, fields)

    async def send_initial_metadata(self, initial_metadata) -> None:
        if not self._headers_sent:
            self._headers_sent = True
            self._connection.send_response_headers(self.stream_id, tuple(initial_metadata))

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata=()) -> None:
        if code == grpc.StatusCode.OK:
            raise ValueError("abort needs a status code other than OK")
        self._code = code
        self._details = details
        if trailing_metadata:
            self._trailing_metadata = tuple(trailing_metadata)
        raise AbortError()
