"""Acks gathered over one turn of the event loop, applied once per consumer at its end.

A consumer stream's acks arrive one small message at a time, and many consumers share a
connection: a read of the connection may carry acks of dozens of streams, and a stream may
have sent several before the broker got to them.  Each ``add`` only notes the ranges; the
first one of a turn schedules ``flush`` (``call_soon``), which applies every consumer's ranges
with one ``apply(consumer_id, ranges)``: one cursor update, one counter bump and at most one
wake-up per subscription and turn instead of per ack message.

Order per consumer is kept: whatever else a stream asks of a consumer (a nack, a detach)
flushes that consumer's pending acks first (``flush_consumer``).  An ack's error (the
consumer is unknown, its topic left) is reported to each stream that sent one of the
ranges, through the callback it gave with them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

log = logging.getLogger(__name__)

Apply = Callable[[int, list[tuple[int, int]]], object]
# (the error, the consumer id, the ranges that were not applied)
OnError = Callable[[BaseException, int, list[tuple[int, int]]], None]


class AckBatcher:
    __slots__ = ("_apply", "_pending", "_scheduled", "flushes", "applied")

    def __init__(self, apply: Apply) -> None:
        self._apply = apply
        # consumer id -> [its ranges this turn, then the error callbacks of the streams that sent
        # them] (one list per consumer and turn: usually one stream, so one callback)
        self._pending: dict[int, list] = {}
        self._scheduled = False
        self.flushes = 0  # turns that applied acks (for tests and stats)
        self.applied = 0  # apply calls made

    def add(self, consumer_id: int, ranges: list[tuple[int, int]], on_error: OnError) -> None:
        """Note ``ranges`` (a list the batcher may extend: the caller hands it over) for this
        turn's flush; ``on_error(exc, consumer_id, ranges)`` hears if applying them fails."""
        entry = self._pending.get(consumer_id)
        if entry is None:
            self._pending[consumer_id] = [ranges, on_error]
        else:
            entry[0].extend(ranges)
            if on_error != entry[1] and on_error not in entry[2:]:
                entry.append(on_error)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush_consumer(self, consumer_id: int) -> None:
        """Apply ``consumer_id``'s pending acks now (before another request about it)."""
        entry = self._pending.pop(consumer_id, None)
        if entry is not None:
            self._run(consumer_id, entry)

    def flush(self) -> None:
        self._scheduled = False
        pending = self._pending
        if not pending:
            return
        self._pending = {}
        self.flushes += 1
        self.applied += len(pending)
        apply = self._apply
        for consumer_id, entry in pending.items():
            try:
                apply(consumer_id, entry[0])
            except Exception as exc:  # noqa: BLE001 - each sender hears it; the others' acks go on
                self._report(exc, consumer_id, entry)

    def _run(self, consumer_id: int, entry: list) -> None:
        self.applied += 1
        try:
            self._apply(consumer_id, entry[0])
        except Exception as exc:  # noqa: BLE001 - each sender hears it; the others' acks go on
            self._report(exc, consumer_id, entry)

    def _report(self, exc: Exception, consumer_id: int, entry: list) -> None:
        ranges = entry[0]
        for on_error in entry[1:]:
            try:
                on_error(exc, consumer_id, ranges)
            except Exception:  # noqa: BLE001 - a broken callback must not stop the flush
                log.exception("reporting an ack error for consumer %d failed", consumer_id)
