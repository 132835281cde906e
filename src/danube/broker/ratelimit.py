"""Token buckets for the topic policies ``max_publish_rate`` and ``max_subscription_dispatch_rate``.

A bucket holds up to ``burst`` tokens (one per message) and refills at ``rate``
tokens per second; the default burst is one second's worth, so the limit is
"``rate`` messages per second, averaged over a second".

- Publishing *reserves*: the tokens are taken at once, the bucket may go into
  debt, and the publish waits until the debt is paid (``PublishGate``).  A
  batch larger than the burst is therefore accepted and delayed by its size
  over the rate, never refused.  Delayed publishes of a topic are stored in the
  order they arrived.
- Dispatching *takes what is there*: a delivery carries at most the whole tokens
  available, and a receive with none waits until the next token is due.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from danube.errors import InvalidArgumentError


class TokenBucket:
    __slots__ = ("rate", "burst", "_tokens", "_stamp", "_clock")

    def __init__(self, rate: float, burst: float | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        if not rate > 0:
            raise InvalidArgumentError(f"a rate limit must be positive, got {rate!r}")
        burst = float(rate) if burst is None else float(burst)
        if not burst >= 1:
            raise InvalidArgumentError(f"a rate limit's burst must be at least 1, got {burst!r}")
        self.rate = float(rate)
        self.burst = burst
        self._clock = clock
        self._tokens = burst
        self._stamp = clock()

    def _refill(self) -> float:
        now = self._clock()
        tokens = self._tokens + (now - self._stamp) * self.rate
        self._tokens = tokens if tokens < self.burst else self.burst
        self._stamp = now
        return self._tokens

    def available(self) -> int:
        """Whole tokens available now (0 while in debt)."""
        tokens = self._refill() + 1e-9  # (refills are sums of float products)
        return int(tokens) if tokens >= 1 else 0

    def take(self, n: int) -> None:
        """Use ``n`` tokens (after ``available`` said they are there)."""
        self._refill()
        self._tokens -= n

    def reserve(self, n: int) -> float:
        """Take ``n`` tokens, going into debt if needed; seconds until the debt is paid."""
        tokens = self._refill() - n
        self._tokens = tokens
        return 0.0 if tokens >= 0 else -tokens / self.rate

    def wait_time(self, n: int = 1) -> float:
        """Seconds until ``n`` tokens are available."""
        missing = n - self._refill()
        return missing / self.rate if missing > 0 else 0.0


class PublishGate:
    """``max_publish_rate`` of one topic: ``await gate.turn(count)`` before appending ``count`` messages.

    Returns at once while the rate allows it; otherwise waits until the tokens are paid for,
    after every earlier delayed publish of the topic (so appends keep their arrival order).
    """

    __slots__ = ("bucket", "_last", "throttled", "throttled_s")

    def __init__(self, rate: float, burst: float | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.bucket = TokenBucket(rate, burst, clock=clock)
        self._last: asyncio.Future | None = None  # done when the latest delayed publish may append
        self.throttled = 0  # publishes that had to wait (stats, tests)
        self.throttled_s = 0.0  # time they waited in total

    async def turn(self, count: int) -> None:
        delay = self.bucket.reserve(count)
        previous = self._last
        if delay <= 0 and (previous is None or previous.done()):
            return
        loop = asyncio.get_running_loop()
        started = loop.time()
        due = started + delay
        mine = self._last = loop.create_future()
        self.throttled += 1
        try:
            if previous is not None and not previous.done():
                await asyncio.shield(previous)
            pause = due - loop.time()
            if pause > 0:
                await asyncio.sleep(pause)
        finally:
            # Released in the same step as the caller appends: a follower resumes only after.
            if not mine.done():
                mine.set_result(None)
            if self._last is mine:
                self._last = None
            self.throttled_s += loop.time() - started
