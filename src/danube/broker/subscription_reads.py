"""What a subscription's dispatcher reads with: fresh frames from the read position (within the
unacked window), redeliveries, and records no consumer can take (handed to the failure policy).

A base class of :class:`~danube.broker.subscription.Subscription`, which holds the state.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from danube import message_codec
from danube.broker.cursor import to_ranges
from danube.broker.delivery import MUST_AWAIT, Delivery, MustAwait, cut_frames, frame_offset
from danube.broker.subscription_state import SubscriptionState

if TYPE_CHECKING:
    from danube.broker.subscription import Consumer

log = logging.getLogger("danube.broker.subscription")

_UNLIMITED = 1 << 62  # the window of a non-reliable subscription

_check_fields = message_codec.check_fields


class FreshReads(SubscriptionState):
    if TYPE_CHECKING:  # what else this part uses of Subscription
        read_lock: asyncio.Lock
        _blocked_logged: bool

        def _visible(self) -> int: ...
        def _settle_early(self, first: int, last: int) -> None: ...
        def _poison(self, offset: int, problem: str | None = None, attempt: int | None = None) -> None: ...

    def window(self) -> int:
        """How many more messages may go out now: the room under max_unacked_messages, 0 while
        poison messages block the subscription."""
        if not self.reliable:
            return _UNLIMITED
        if self._report_block() and not self.dispatcher.blocks_per_key:
            return 0
        return self.settings.max_unacked_messages - self.tracker.unacked

    def _report_block(self) -> bool:
        """Whether poison messages block the subscription (poison policy block); logs each block
        once, when it is first seen."""
        if not self.tracker.blocked:
            self._blocked_logged = False
            return False
        if not self._blocked_logged:
            log.error(
                "subscription %s on %s is blocked by poison message(s) %s (poison policy block)",
                self.name,
                self.topic.name,
                sorted(self.tracker.blocked)[:5],
            )
            self._blocked_logged = True
        return True

    async def read_fresh(self, max_messages: int, max_bytes: int) -> tuple[memoryview, int] | tuple[None, int]:
        """Fresh frames from next_read: (view, count) or (None, 0); next_read is left to the caller."""
        visible = self._visible()
        if visible <= 0:
            return None, 0
        data = await self.topic.read_frames(self.next_read, max_bytes)
        return self._cut_fresh(data, min(max_messages, visible), max_bytes)

    def read_fresh_now(
        self, max_messages: int, max_bytes: int
    ) -> tuple[memoryview, int] | tuple[None, int] | MustAwait:
        """:meth:`read_fresh` without an await: ``MUST_AWAIT`` when the storage cannot answer at
        once (history on disk, a sealed storage); the caller then takes the awaited path."""
        visible = self._visible()
        if visible <= 0:
            return None, 0
        read_now = getattr(self.topic.storage, "read_frames_now", None)
        data = None if read_now is None else read_now(self.next_read, max_bytes)
        if data is None:
            return MUST_AWAIT
        return self._cut_fresh(data, min(max_messages, visible), max_bytes)

    def _cut_fresh(self, data, max_messages: int, max_bytes: int) -> tuple[memoryview, int] | tuple[None, int]:
        if not data:
            return None, 0
        view, count = cut_frames(data, max_messages, max_bytes)
        if count == 0:
            return None, 0
        first = frame_offset(view)
        if first != self.next_read:
            raise RuntimeError(f"storage of {self.topic.name} returned offset {first} for {self.next_read}")
        # Records stored before publish checked them (or by a broker that did not) may hold a
        # routing key or attribute no subscriber can decode: deliver up to such a record and
        # hand it to the failure policy, so the subscription never stalls on it.
        bad, problem = _check_fields(view)
        if bad > 0:
            view = view[:bad]
            count = len(message_codec.frame_positions(view))
        elif bad == 0:
            self.reject_fresh(message_codec.FIELDS_PROBLEMS.get(problem, "it is malformed"))
            return None, 0
        return view, count

    def reject_fresh(self, problem: str) -> None:
        """The record at ``next_read`` cannot be delivered: it goes to the failure policy at once
        (dead letter, drop or block) without reaching a consumer."""
        offset = self.next_read
        self.next_read = offset + 1
        self.reject(offset, problem)

    def reject(self, offset: int, problem: str) -> None:
        """``offset`` cannot be delivered (``problem`` says why): no redelivery would help, so the
        poison policy applies now.  Under ``block`` the subscription holds there until an admin skip."""
        log.error(
            "message %d of %s cannot be delivered on subscription %s: %s; poison policy %s",
            offset,
            self.topic.name,
            self.name,
            problem,
            self.failure_policy.poison_policy if self.reliable else "drop (non-reliable)",
        )
        if not self.reliable:
            self.metrics.dropped(self.topic.name, self.name, 1, "undeliverable")
            self.tracker.cursor = max(self.tracker.cursor, offset)
        else:
            self.tracker.take_back(offset)
            self.tracker.attempts.pop(offset, None)
            self._poison(offset, problem)
        self.notify()  # the receive that met it reads on (or sees the block)

    async def deliver_fresh(self, consumer: Consumer, max_messages: int, max_bytes: int, now: float) -> Delivery | None:
        """Fresh frames from next_read for ``consumer`` (within the unacked window), tracked as
        delivered to it; None when there are none."""
        window = self.window()
        if window <= 0:
            return None
        view, count = await self.read_fresh(min(max_messages, window), max_bytes)
        if view is None:
            return None
        return self._track_fresh(consumer, view, count, now)

    def deliver_fresh_now(
        self, consumer: Consumer, max_messages: int, max_bytes: int, now: float
    ) -> Delivery | None | MustAwait:
        """:meth:`deliver_fresh` without an await: a Delivery, None, or ``MUST_AWAIT`` when the
        storage cannot answer at once.  (The push path of every ordered subscription: the
        window and what is visible are looked at inline, the rare cases in their methods.)"""
        if not self.reliable:
            window = _UNLIMITED
        elif self.tracker.blocked:
            window = self.window()
            if window <= 0:
                return None
        else:
            self._blocked_logged = False
            window = self.settings.max_unacked_messages - self.tracker.unacked
            if window <= 0:
                return None
        topic = self.topic
        if self.early_acks or topic.delivery_gate is not None:
            visible = self._visible()
        else:
            visible = topic.readable_next - self.next_read
        if visible <= 0:
            return None
        read_now = getattr(topic.storage, "read_frames_now", None)
        next_read = self.next_read
        data = None if read_now is None else read_now(next_read, max_bytes)
        if data is None:
            return MUST_AWAIT
        if not data:
            return None
        if frame_offset(data) != next_read:
            # The topic no longer holds next_read (its storage read on from the oldest it holds):
            # the awaited fetch skips what was lost, and says so (``_visible``).
            return MUST_AWAIT
        if window < max_messages:
            max_messages = window
        if visible < max_messages:
            max_messages = visible
        view, count = self._cut_fresh(data, max_messages, max_bytes)
        if view is None:
            return None
        return self._track_fresh(consumer, view, count, now)

    def _track_fresh(self, consumer: Consumer, view: memoryview, count: int, now: float) -> Delivery:
        first = self.next_read
        last = first + count - 1
        self.next_read = last + 1
        if self.reliable:
            self.tracker.delivered(first, last, consumer.id, now + self.failure_policy.ack_timeout_ms / 1000)
            if self.early_acks:
                self._settle_early(first, last)
        else:
            self.tracker.cursor = last
        return Delivery(view, first, last, count)

    async def frame_at(self, offset: int) -> memoryview | None:
        """The stored frame of ``offset`` (a redelivery), None when it is no longer held."""
        data = await self.topic.read_frames(offset, 1)
        if not data:
            return None
        view, count = cut_frames(data, 1, 1)
        if count != 1 or frame_offset(view) != offset:
            return None
        return view

    async def redeliver(self, consumer: Consumer, max_messages: int, max_bytes: int, now: float) -> Delivery | None:
        """Messages due for redelivery, to ``consumer``; None when none could be read."""
        offsets = self.tracker.pop_ready(now, max_messages)
        if not offsets:
            return None
        parts: list[memoryview] = []
        counts: dict[int, int] = {}
        size = 0
        for i, offset in enumerate(offsets):
            view = await self.frame_at(offset)
            if view is None:
                log.warning("message %d of %s is no longer stored; cannot redeliver it", offset, self.topic.name)
                continue
            if parts and size + len(view) > max_bytes:
                self.tracker.push_back(offsets[i:])
                break
            parts.append(view)
            size += len(view)
            counts[offset] = self.tracker.attempts.get(offset, 0)
        if not parts:
            if self.tracker.advance(self.next_read):
                self.dirty = True
            return None
        deadline = now + self.failure_policy.ack_timeout_ms / 1000
        delivered = sorted(counts)
        for lo, hi in to_ranges(delivered):
            self.tracker.delivered(lo, hi, consumer.id, deadline)
        self.metrics.redelivered(self.topic.name, self.name, len(parts))
        buf = parts[0] if len(parts) == 1 else b"".join(parts)
        return Delivery(buf, min(counts), max(counts), len(parts), counts)
