"""Consumer sessions of a scalable topic's ordered subscriptions, on the controller leader (the
``SubscriptionCoordinator`` of Pulsar PIP-468 scalable topics).  Who reads which segment is
:func:`danube.model.segment_assignment.assign`; this module keeps it current and pushes it.

Sessions: a registration is persisted (``ConsumerRegistration`` under the subscription's key);
liveness is in memory on the controller leader.  A disconnected consumer keeps its assignment
for ``grace_seconds``; when the timer fires its registration is deleted and the others are
rebalanced.  A new leader starts a fresh grace period for every restored consumer.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Iterable

from danube.model.segment_assignment import ConsumerAssignment, assign
from danube.model.segment_layout import SegmentLayout

log = logging.getLogger(__name__)


Listener = Callable[[ConsumerAssignment], None]


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("evicting a consumer: %s", task.exception())


@dataclass
class ConsumerSession:
    name: str
    consumer_id: int = 0
    assignment: ConsumerAssignment | None = None
    connected: bool = False
    listener: Listener | None = None
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class SubscriptionCoordinator:
    """One subscription's ordered consumers on the controller leader.

    ``persist(name, assignment | None)`` writes (or, with None, deletes) the consumer's persisted
    registration; it is awaited on every membership or assignment change, never on liveness."""

    def __init__(
        self,
        topic: str,
        subscription: str,
        layout: SegmentLayout,
        *,
        persist: Callable[[str, ConsumerSession | None], Awaitable[None]],
        grace_seconds: float,
        drained: Iterable[int] = (),
    ) -> None:
        self.topic = topic
        self.subscription = subscription
        self.layout = layout
        self.grace_seconds = grace_seconds
        self.drained: set[int] = set(drained)
        self.sessions: dict[str, ConsumerSession] = {}
        self._persist = persist
        self._lock = asyncio.Lock()
        self._closed = False

    # ------------------------------------------------------------ restore (a new leader)

    def restore(self, name: str, consumer_id: int, assignment: ConsumerAssignment | None) -> None:
        """A persisted registration found by a new leader: disconnected, with a fresh grace period."""
        session = ConsumerSession(name, consumer_id, assignment)
        self.sessions[name] = session
        self._start_timer(session)

    # ------------------------------------------------------------ membership

    async def add_consumer(
        self, name: str, consumer_id: int = 0, listener: Listener | None = None
    ) -> ConsumerAssignment:
        """Register (or reconnect) ``name``; returns its assignment.  A reconnect within the grace
        period keeps the assignment and disturbs nobody."""
        async with self._lock:
            session = self.sessions.get(name)
            if session is not None:
                self._cancel_timer(session)
                session.connected, session.listener = True, listener
                session.consumer_id = consumer_id or session.consumer_id
                if session.assignment is None or session.assignment.layout_epoch != self.layout.epoch:
                    await self._rebalance()
                assert session.assignment is not None
                return session.assignment
            session = ConsumerSession(name, consumer_id, None, True, listener)
            self.sessions[name] = session
            await self._rebalance()
            assert session.assignment is not None
            return session.assignment

    def disconnected(self, name: str) -> None:
        """The consumer's connection dropped: keep its session for the grace period."""
        session = self.sessions.get(name)
        if session is None or not session.connected:
            return
        session.connected, session.listener = False, None
        self._start_timer(session)

    async def remove_consumer(self, name: str) -> None:
        async with self._lock:
            session = self.sessions.pop(name, None)
            if session is None:
                return
            self._cancel_timer(session)
            await self._persist(name, None)
            await self._rebalance()

    # ------------------------------------------------------------ layout and drain

    async def on_layout_change(self, layout: SegmentLayout) -> None:
        async with self._lock:
            if layout.epoch <= self.layout.epoch and layout == self.layout:
                return
            self.layout = layout
            self.drained &= set(layout.segments)
            await self._rebalance()

    async def segment_drained(self, segment_id: int) -> bool:
        """Record that the subscription consumed the sealed ``segment_id`` whole; True if new."""
        async with self._lock:
            if segment_id in self.drained:
                return False
            self.drained.add(segment_id)
            await self._rebalance()
            return True

    # ------------------------------------------------------------ internals

    async def _rebalance(self) -> None:
        result = assign(self.topic, self.layout, self.sessions, self.drained)
        for name, assignment in result.items():
            session = self.sessions[name]
            if session.assignment == assignment:
                continue
            session.assignment = assignment
            await self._persist(name, session)
            if session.connected and session.listener is not None:
                try:
                    session.listener(assignment)
                except Exception:  # noqa: BLE001 - a broken listener must not stop the others
                    log.exception("assignment listener of %s failed", name)

    def _start_timer(self, session: ConsumerSession) -> None:
        self._cancel_timer(session)
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        session.timer = loop.call_later(self.grace_seconds, self._expire, session.name)

    @staticmethod
    def _cancel_timer(session: ConsumerSession) -> None:
        if session.timer is not None:
            session.timer.cancel()
            session.timer = None

    def _expire(self, name: str) -> None:
        session = self.sessions.get(name)
        if session is None or session.connected or self._closed:
            return
        session.timer = None
        log.info(
            "consumer %s of %s/%s did not come back within %.1fs: its segments are redistributed",
            name,
            self.topic,
            self.subscription,
            self.grace_seconds,
        )
        task = asyncio.get_running_loop().create_task(self.remove_consumer(name))
        task.add_done_callback(_log_failure)

    def close(self) -> None:
        """Stop every timer (leadership lost): the next leader restores the sessions."""
        self._closed = True
        for session in self.sessions.values():
            self._cancel_timer(session)
