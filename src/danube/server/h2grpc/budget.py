"""The receive side of a connection: flow-control window given back for request bytes, and the
budget of request bytes held in unfinished or unread messages.

A mixin of ``GrpcConnection``.  Window is what lets a peer make the server hold bytes, so it
is granted from the budget: beyond HTTP/2's initial 65,535 bytes per connection, a connection
WINDOW_UPDATE goes out only while the bytes held over all connections plus the windows open
over all connections stay within ``max_buffered_bytes_total``.  As handlers take messages the
bytes go back to the budget and window flows again, to whichever connection needs it.  When the
budget is full of unfinished messages, one call at a time per connection (the favoured one) is
let finish, and the call with the least of its message is shed (RESOURCE_EXHAUSTED), so
several large messages sent at once cannot wait on one another forever.

``RequestBudget`` is the server-wide side (one per ``H2Server``, shared by its connections):
what calls and the server read and change of it goes through its attributes and methods.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from danube.server.h2grpc import frames

if TYPE_CHECKING:
    from danube.server.h2grpc.call import ServerCall
    from danube.server.h2grpc.connection import GrpcConnection
    from danube.server.h2grpc.dispatch import Stream
    from danube.server.h2grpc.limits import H2Limits
    from danube.server.h2grpc.server import H2Server


class RequestBudget:
    """Request bytes held over all connections, the connection windows open over all of them, and
    the connections waiting for room: those whose calls hold window back (``starved``) and those
    owed connection window (``window_starved``)."""

    __slots__ = ("held", "limit", "starved", "window_starved", "windows")

    def __init__(self, limit: int) -> None:
        self.limit = limit  # max_buffered_bytes_total
        self.held = 0
        self.windows = 0
        self.starved: set[GrpcConnection] = set()
        self.window_starved: set[GrpcConnection] = set()

    @property
    def over(self) -> bool:
        return self.held > self.limit

    def room(self) -> int:
        """What more may be granted as window: the limit less what is held and already open."""
        return self.limit - self.held - self.windows

    def starving(self, connection: GrpcConnection) -> None:
        self.starved.add(connection)

    def owed_window(self, connection: GrpcConnection) -> None:
        self.window_starved.add(connection)

    def forget(self, connection: GrpcConnection) -> None:
        """``connection`` is closed: it waits for nothing any more."""
        self.starved.discard(connection)
        self.window_starved.discard(connection)

    def feed_windows(self) -> None:
        """The budget has room again: connections owed window get it, as far as it goes."""
        starved, self.window_starved = self.window_starved, set()
        for connection in starved:
            connection.grant_window()

    def feed_starved(self) -> None:
        """The budget has room again: every connection whose calls held window back gives it back
        (those still over their own budget keep holding)."""
        starved, self.starved = self.starved, set()
        for connection in starved:
            if connection.feed_starved():
                self.starved.add(connection)


class ReceiveBudget:
    # Set by GrpcConnection.__init__ (declared here for the type checker).
    buffered: int
    max_buffered: int
    peer: str
    _server: H2Server
    _budget: RequestBudget
    _limits: H2Limits
    _favoured: ServerCall | None
    _starved: set
    _recv_window: int
    _recv_unacked: int
    _recv_target: int
    _recv_moved: int
    _stream_window_half: int
    _streams: dict
    _lost: bool
    # Defined by SendSide, the connection's other half.
    _queue: Callable[[bytes], None]
    _schedule_flush: Callable[[], None]

    def return_credit(self, stream_id: int, size: int) -> None:
        """Gives ``size`` bytes of flow-control credit back for what a call has taken in.  The
        WINDOW_UPDATEs go out once half a window is used up, not for every frame."""
        if not size or self._lost:
            return
        self._recv_unacked += size
        if self._recv_window <= self._recv_target // 2:
            self.grant_window()
        stream = self._streams.get(stream_id)
        if stream is None or stream.remote_closed:
            return
        stream.recv_unacked += size
        if stream.recv_window <= self._stream_window_half:
            self._stream_credit_due(stream_id, stream)

    def _stream_credit_due(self, stream_id: int, stream: Stream) -> None:
        """Half of ``stream``'s receive window is spent: the credit its call gave back goes to
        the peer (unless the stream has ended meanwhile: no frame on a closed stream)."""
        owed = stream.recv_unacked
        if owed and not stream.remote_closed and self._streams.get(stream_id) is stream:
            self._queue(frames.window_update(stream_id, owed))
            stream.recv_window += owed
            stream.recv_unacked = 0
            self._schedule_flush()

    def grant_window(self) -> None:
        """Opens the connection's window by what it is owed (credit returned by its calls, or the
        rest of ``connection_window``) as far as the server-wide budget has room; always up to
        HTTP/2's initial window, so every connection keeps moving (the held bytes stay within
        the budget + 64 KiB per connection).  What is not granted waits in ``_recv_unacked``
        until the budget frees up (``RequestBudget.feed_windows``)."""
        owed = self._recv_unacked
        if not owed or self._lost:
            return
        budget = self._budget
        target = self._recv_target
        if self._recv_moved >= 4 * target and target < self._limits.connection_window:
            # A connection moving much data gets a larger window (fewer round trips per byte).
            grown = min(target * 2, self._limits.connection_window)
            self._recv_target = grown
            self._recv_moved = 0
            self._recv_unacked = owed = owed + grown - target
        room = budget.room()
        floor = frames.DEFAULT_WINDOW - self._recv_window
        grant = owed if owed <= room or owed <= floor else max(room, floor)
        if grant > 0:
            self._queue(frames.window_update(0, grant))
            self._recv_window += grant
            self._recv_moved += grant
            budget.windows += grant
            self._recv_unacked = owed = owed - grant
            self._schedule_flush()
        if owed:
            budget.owed_window(cast("GrpcConnection", self))  # the mixin's only class

    def over_budget(self) -> bool:
        """Whether the calls hold more request bytes than the connection's or the server's budget
        (then they stop returning flow-control window, see ``ServerCall.on_data``)."""
        return self.buffered > self.max_buffered or self._budget.held > self._budget.limit

    def favours(self, call) -> bool:
        """Over the connection's buffer budget (but not the server's), one call at a time keeps
        getting window until its unfinished message is complete, so several large messages
        sent at once cannot wait on one another forever."""
        if self._budget.over:
            return False
        favoured = self._favoured
        if favoured is None or not favoured.unfinished:
            self._favoured = call
            return True
        return favoured is call

    def _favour_one(self) -> None:
        favoured = self._favoured
        if (favoured is not None and favoured.unfinished) or self._budget.over:
            return
        for call in self._starved:
            if call.unfinished:
                self._favoured = call
                self._starved.discard(call)
                call.release_held()
                return

    def _shed(self) -> None:
        """Over the buffer budget with the connection's window nearly spent by calls holding it
        back: the one that has the least of its message fails RESOURCE_EXHAUSTED (grpc's C core
        does the same when its buffers are full), until the window can flow again -- else the
        call favoured to finish its message could wait forever on the others."""
        quarter = self._recv_target // 4
        while self._starved and self._recv_window < quarter:
            victim = min(self._starved, key=lambda c: c.buffered)
            self._starved.discard(victim)
            self._server.trip(
                "max_buffered_bytes",
                self.peer,
                f"stream {victim.stream_id} answered RESOURCE_EXHAUSTED with {victim.buffered} "
                f"bytes of its request held ({self.buffered} on the connection)",
            )
            victim.shed()

    def starve(self, call: ServerCall) -> None:
        """``call`` holds window back for the budget: it gets it back once under budget."""
        if not self._starved:
            self._budget.starving(cast("GrpcConnection", self))
        self._starved.add(call)

    def hold(self, size: int) -> None:
        """A call holds ``size`` more request bytes (less when negative), against both budgets."""
        self.buffered += size
        self._budget.held += size

    def release(self, call: ServerCall, size: int) -> None:
        """``call`` let go of ``size`` buffered request bytes (read, or the call is over): the
        calls and connections waiting on the budget may go on."""
        self.buffered -= size
        budget = self._budget
        budget.held -= size
        if self._starved or self._favoured is not None or budget.starved or budget.window_starved:
            self._unbuffered(call)

    def _unbuffered(self, call: ServerCall) -> None:
        budget = self._budget
        if budget.window_starved:
            budget.feed_windows()
        self._starved.discard(call)
        if self._favoured is call and not call.unfinished:
            self._favoured = None
        if budget.starved and not budget.over:
            budget.feed_starved()
        if self._starved:
            if not self.over_budget():
                self.feed_starved()
            else:
                self._favour_one()

    def feed_starved(self) -> bool:
        """Under budget again: the calls that held window back for it give it back.  Whether some
        call still holds window back (the connection is over its own budget, or a call is)."""
        if self._starved and self.buffered <= self._limits.max_buffered_bytes:
            starved, self._starved = self._starved, set()
            for call in starved:
                call.release_held()
        return bool(self._starved)
