"""A subscription's acks, nacks, ack timeouts and failure policy (redelivery backoff, poison
messages: dead letter, drop or block).

A base class of :class:`~danube.broker.subscription.Subscription`, which holds the state.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable, Iterable

from danube.broker.cursor import to_ranges
from danube.broker.subscription_state import SubscriptionState
from danube.errors import NotServedHereError

if TYPE_CHECKING:
    pass

log = logging.getLogger("danube.broker.subscription")

_monotonic = time.monotonic

# Early acks kept per subscription at most (beyond: not recorded; those messages are delivered again).
_MAX_EARLY_ACKS = 65_536


class AckHandling(SubscriptionState):
    if TYPE_CHECKING:  # what else this part uses of Subscription
        _dead_letter: Callable | None
        _reasons: dict[int, str]
        _counts: list[int] | None

    def _check_served(self) -> None:
        # Once the topic is closed (unload, shutdown) its cursors are being persisted for the
        # last time: an ack answered OK now would move a cursor that is never saved.
        if self.topic.closed:
            raise NotServedHereError(
                f"topic {self.topic.name} is no longer served here; the ack was not applied, look it up again"
            )

    def ack(self, offsets: Iterable[int]) -> int:
        return self.ack_ranges(to_ranges(offsets))

    def ack_ranges(self, ranges: list[tuple[int, int]]) -> int:
        """Ack inclusive ``(first, last)`` ranges (any order, overlaps allowed): no work per offset."""
        if not self.reliable:
            return 0
        if self.topic.closed:
            self._check_served()
        tracker = self.tracker
        order = tracker.order
        if order:
            now = _monotonic()
            if order[0].deadline <= now:
                self._expire_due(now)
        unacked = tracker.unacked
        next_read = self.next_read
        cursor = tracker.cursor
        fast = 0
        if len(ranges) == 1 and not self._reasons:
            # (the usual ack: one range, the oldest deliveries in flight; ``_acked`` inline)
            lo, hi = ranges[0]
            firsts = tracker._firsts
            if (
                len(firsts) == 1
                and firsts[0] == lo
                and not (tracker._waiting or tracker.blocked or tracker.parked)
                and (run := tracker._runs[lo]).last == hi
                and run.settled is None
            ):
                # (``tracker.ack_oldest`` inline in its commonest case: the one delivery in flight,
                # acked whole; the tracker is then empty and the cursor goes up to next_read)
                fast = run.remaining
                run.remaining = 0
                del tracker._runs[lo]
                firsts.clear()
                order.clear()  # (its runs: this one and dead ones behind it)
                tracker.unacked = unacked - fast
                if next_read - 1 > cursor:
                    tracker.cursor = next_read - 1
                    if tracker.attempts:
                        tracker.drop_attempts(next_read - 1)
            else:
                fast = tracker.ack_oldest(lo, hi, next_read)
            if fast > 0:
                counts = self._counts
                if counts is None:
                    self.metrics.acked(self.topic.name, self.name, fast)
                else:
                    counts[2] += fast
                if tracker.cursor != cursor:
                    self.dirty = True
                if unacked >= self.settings.max_unacked_messages or self.dispatcher.acks_release:
                    self.notify()
                return fast
            if fast == 0:
                return 0
            fast = 0
        elif not self._reasons:
            # the usual acks, of the oldest deliveries in flight in turn: each range acked and the
            # cursor moved in one call; the first range that is not that case, and those after it,
            # go the general way
            taken = 0
            for lo, hi in ranges:
                n = tracker.ack_oldest(lo, hi, next_read)
                if n < 0:
                    break
                fast += n
                taken += 1
            if taken == len(ranges):
                if fast:
                    self._acked(fast, tracker.cursor != cursor, unacked >= self.settings.max_unacked_messages)
                return fast
            if taken:
                ranges = ranges[taken:]
        n = self._ack_general(ranges, next_read) + fast
        if n:
            self._acked(n, tracker.cursor != cursor, unacked >= self.settings.max_unacked_messages)
        return n

    def _acked(self, n: int, moved: bool, was_full: bool) -> None:
        counts = self._counts
        if counts is None:
            self.metrics.acked(self.topic.name, self.name, n)
        else:
            counts[2] += n
        if moved:
            self.dirty = True
        # Receivers wait on an ack only when the unacked window was full, or when the
        # dispatcher holds messages back until earlier ones are acked (key_shared): a wake
        # for every ack would cost each consumer's stream a futile fetch per ack otherwise.
        if was_full or self.dispatcher.acks_release:
            self.notify()

    def _ack_general(self, ranges: list[tuple[int, int]], next_read: int) -> int:
        """Ranges in any order, overlaps allowed, early acks noted; the cursor advanced."""
        tracker = self.tracker
        n = tracker.ack_ranges(ranges)
        for _lo, hi in ranges:
            if hi >= next_read:  # (acks of what was delivered here end below next_read)
                n += self._note_early(ranges)
                break
        if self._reasons:
            for lo, hi in ranges:
                for o in [o for o in self._reasons if lo <= o <= hi]:
                    del self._reasons[o]
        if n:
            tracker.advance(next_read)
        return n

    def _note_early(self, ranges: list[tuple[int, int]]) -> int:
        """Record acks of stored offsets at or after next_read (see ``early_acks``); the next read
        skips them (not here: a read may be awaiting storage from next_read).  Returns how many."""
        end = self.topic.readable_next
        early = self.early_acks
        noted = 0
        for lo, hi in ranges:
            lo, hi = max(lo, self.next_read), min(hi, end - 1)
            if lo <= hi and len(early) + hi - lo < _MAX_EARLY_ACKS:
                before = len(early)
                early.update(range(lo, hi + 1))
                noted += len(early) - before
        return noted

    def _skip_early(self) -> int:
        early = self.early_acks
        skipped = 0
        while self.next_read in early:
            early.discard(self.next_read)
            self.next_read += 1
            skipped += 1
        if skipped and self.tracker.advance(self.next_read):
            self.dirty = True
        return skipped

    def _settle_early(self, first: int, last: int) -> None:
        """Early acks inside a run just delivered: acked now (the consumer has them already)."""
        hits = [o for o in self.early_acks if first <= o <= last]
        if hits:
            self.early_acks.difference_update(hits)
            self.tracker.ack_ranges(to_ranges(hits))

    def nack(self, offset: int, delay_ms: int | None = None, reason: str | None = None) -> bool:
        if not self.reliable:
            return False
        self._check_served()
        if self.tracker.take_back(offset) is None:
            return False
        self.dispatcher.forget((offset,))
        if reason:
            log.info("message %d of %s nacked on %s: %s", offset, self.topic.name, self.name, reason)
            self._reasons[offset] = reason
        else:
            self._reasons.pop(offset, None)  # as Danube: the last failure's reason, or none
        self._retry(offset, time.monotonic(), requested_ms=delay_ms, nack=True)
        self.notify()
        return True

    def _retry(self, offset: int, now: float, *, requested_ms: int | None = None, nack: bool = False) -> None:
        attempt = self.tracker.attempts.get(offset, 0) + 1
        policy = self.failure_policy
        if attempt > policy.max_redelivery_count:  # Danube's rule: 0 = never delivered again
            self._poison(offset, attempt=attempt)
            return
        self.tracker.attempts[offset] = attempt
        delay = policy.nack_delay_ms(attempt, requested_ms) if nack else policy.backoff_ms(attempt)
        self.tracker.schedule(offset, now + delay / 1000)

    def _poison(self, offset: int, problem: str | None = None, attempt: int | None = None) -> None:
        """Apply the poison policy to ``offset``; ``attempt`` is how many deliveries it had."""
        policy = self.failure_policy.poison_policy
        self.metrics.dropped(self.topic.name, self.name, 1, policy)
        reason = problem if problem is not None else self._reasons.pop(offset, None)
        if policy == "block":
            self.tracker.blocked.add(offset)
            self.dispatcher.blocked(offset)
            return
        self.tracker.attempts.pop(offset, None)
        if policy == "dead_letter" and self._dead_letter is not None:
            self._dead_letter(self, offset, attempt=attempt or 1, reason=reason)
        elif problem is not None:
            log.warning(
                "message %d of %s dropped on %s: %s (poison policy drop)", offset, self.topic.name, self.name, problem
            )
        else:
            log.warning(
                "message %d of %s dropped on %s after %d redeliveries (poison policy drop)",
                offset,
                self.topic.name,
                self.name,
                self.failure_policy.max_redelivery_count,
            )
        if self.tracker.advance(self.next_read):
            self.dirty = True

    def _expire(self, now: float) -> None:
        """Take back what passed its ack deadline by ``now`` and schedule it for redelivery."""
        order = self.tracker.order
        if order and order[0].deadline <= now:
            self._expire_due(now)

    def _expire_due(self, now: float) -> None:
        offsets = self.tracker.expired(now)
        if offsets:
            self.dispatcher.forget(set(offsets))
            for offset in offsets:
                self._retry(offset, now)

    def unblock(self) -> int:
        """Release poison messages held under the block policy (admin 'skip'); they count as acked."""
        held = sorted(self.tracker.blocked)
        self.tracker.blocked.clear()
        if self.tracker.advance(self.next_read):
            self.dirty = True
        self.notify()
        return len(held)
