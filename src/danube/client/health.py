"""Danube's client health check: how a producer or consumer notices its topic moved.

Every ``interval_s`` the broker that currently serves a producer or consumer is asked
``HealthCheck(client type, id)``.  ``CLOSE`` means the broker dropped it (the topic was unloaded,
moved or deleted), so the owner is told to look the topic up again and re-create itself there.  A
failed check (broker unreachable) is not acted on here: the owner's stream fails too and its own
reconnection handles that.

Every watch of one event loop and interval shares one :class:`HealthChecker`: one task and one timer
that steps a wheel of ``interval_s / tick`` slots, checking one slot's watches per tick.  A new watch
joins the least-filled slot, so the checks of a thousand producers created together are spread over
the interval instead of a thousand calls arriving in one burst every interval (each burst a stall of
the client's loop and the broker's), and a thousand producers cost one timer, not a thousand.  Each
watch is still checked once per interval, within one interval of its start.

Danube's call names one producer or consumer.  Against a broker with the batch lane's ``Health``
(one call naming many ids, answered with the ones it no longer serves) the due watches of one
broker wait up to a quarter interval for each other (so a check may come that much later) and go
out in one call on one of the connections to it: the broker knows its producers and consumers by
id whichever connection asks, so a thousand watches over 25 clients' connections to one broker
cost under one call a second, not 200 (one per watch) or 20 (one per connection).  Connections
share a call only when they reach the broker with the same credentials (``broker_key``), so an
authorization that tells callers apart sees each ask for its own.
A broker without it (answering UNIMPLEMENTED, or PERMISSION_DENIED from an authorization that does
not know it) is asked with Danube's ``HealthCheck`` per watch from then on.
"""

from __future__ import annotations

import asyncio
import logging
import math
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import grpc

from danube._tasks import cancel_and_wait
from danube.proto.danube import DanubeApi_pb2 as danube_pb
from danube.proto.danube_batch import batch_pb2 as batch_pb

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 5.0
TICK_S = 0.05  # the shared checker wakes at most this often
MAX_SLOTS = 200
BATCH_WAIT = 0.25  # of the interval: how long a connection's due watches wait for each other
# The broker refuses a Health call naming more ids than this (INVALID_ARGUMENT).
HEALTH_IDS_PER_CALL = 65_536
_NO_BATCH_CALL = (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.PERMISSION_DENIED)

ClientType = danube_pb.HealthCheckRequest.ClientType
PRODUCER = danube_pb.HealthCheckRequest.Producer
CONSUMER = danube_pb.HealthCheckRequest.Consumer


class HasHealthStub(Protocol):
    """A broker connection: its ``health`` is a ``HealthCheckStub``; with a true ``batch_health``
    its ``batch_lane`` has ``Health`` (set False once the broker answers UNIMPLEMENTED)."""

    health: Any


# (connection to ask, or None while not connected; the id the broker gave, or -1)
Target = Callable[[], tuple[HasHealthStub | None, int]]


class Wheel:
    """Members spread over ``slots`` slots, one slot visited per tick: every member once per turn."""

    def __init__(self, slots: int) -> None:
        self._slots: list[dict[Any, None]] = [{} for _ in range(max(1, slots))]
        self._where: dict[Any, int] = {}
        self.cursor = 0  # the slot the next tick visits

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, member: Any) -> bool:
        return member in self._where

    @property
    def slots(self) -> int:
        return len(self._slots)

    def add(self, member: Any) -> int:
        """Puts ``member`` in a least-filled slot, the one visited last among those (its first
        visit as close to a full turn away as the spreading allows); returns the slot."""
        if member in self._where:
            return self._where[member]
        n = len(self._slots)
        # the slot just visited (cursor - 1) comes last in the turn: search from it backwards
        best = min(range(n), key=lambda k: (len(self._slots[(self.cursor - 1 - k) % n]), k))
        slot = (self.cursor - 1 - best) % n
        self._slots[slot][member] = None
        self._where[member] = slot
        return slot

    def remove(self, member: Any) -> None:
        slot = self._where.pop(member, None)
        if slot is not None:
            del self._slots[slot][member]

    def advance(self) -> list:
        """The members of the slot at the cursor; the cursor moves on."""
        due = list(self._slots[self.cursor])
        self.cursor = (self.cursor + 1) % len(self._slots)
        return due

    def loads(self) -> list[int]:
        return [len(s) for s in self._slots]


class HealthChecker:
    """One task checking every watch of one event loop and interval (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, interval_s: float) -> None:
        self.loop = loop
        self.interval_s = interval_s
        slots = max(1, min(MAX_SLOTS, math.ceil(interval_s / TICK_S)))
        self.tick_s = interval_s / slots
        self.wheel = Wheel(slots)
        self._task: asyncio.Task[None] | None = None
        self._checks: set[asyncio.Future] = set()  # the calls of ticks still waiting for answers
        # due watches of connections with the batch call, waiting for each other: broker (its
        # connections' ``broker_key``, else the connection) -> (the tick the first came due, the
        # connection that asks, [(watch, the id it was due with)])
        self._pending: dict[Any, tuple[int, Any, list[tuple[HealthWatch, int]]]] = {}
        self._ticks = 0
        self._batch_ticks = max(1, int(slots * BATCH_WAIT))

    def add(self, watch: HealthWatch) -> None:
        self.wheel.add(watch)
        if self._task is None or self._task.done():
            self._task = self.loop.create_task(self._run(), name="danube-health-checker")

    def remove(self, watch: HealthWatch) -> asyncio.Task[None] | None:
        """Drops ``watch``; with no watch left, cancels the task and returns it (to be awaited)."""
        self.wheel.remove(watch)
        if len(self.wheel) or self._task is None:
            return None
        task, self._task = self._task, None
        task.cancel()
        for check in list(self._checks):
            check.cancel()
        for _, _, waiting in self._pending.values():
            for w, _ in waiting:
                w.checking = False
        self._pending.clear()
        by_interval = _CHECKERS.get(self.loop)
        if by_interval is not None and by_interval.get(self.interval_s) is self:
            del by_interval[self.interval_s]
        return task

    async def _run(self) -> None:
        next_at = self.loop.time()
        while len(self.wheel):
            next_at = max(next_at + self.tick_s, self.loop.time() - self.interval_s)  # after a stall: one turn
            await asyncio.sleep(max(0.0, next_at - self.loop.time()))
            self._ticks += 1
            calls = []
            for w in self.wheel.advance():
                if w.checking:
                    continue
                conn, client_id = w.target()
                if conn is None or client_id < 0:
                    continue  # not connected, or no id yet: nothing to ask
                if getattr(conn, "batch_health", False):
                    w.checking = True
                    # every connection of the loop to one broker (the clients of one process):
                    # the broker knows its producers and consumers by id, whichever connection asks
                    key = getattr(conn, "broker_key", conn)
                    pending = self._pending.get(key)
                    if pending is None:
                        self._pending[key] = (self._ticks, conn, [(w, client_id)])
                    else:
                        pending[2].append((w, client_id))
                else:
                    calls.append(w.check_and_react())
            for key, (since, conn, waiting) in list(self._pending.items()):
                if self._ticks - since >= self._batch_ticks - 1:
                    del self._pending[key]
                    for start in range(0, len(waiting), HEALTH_IDS_PER_CALL):
                        calls.append(self._check_batch(conn, waiting[start : start + HEALTH_IDS_PER_CALL]))
            if calls:
                # not awaited here: a broker slow to answer must not hold back the next slots
                check = asyncio.gather(*calls, return_exceptions=True)
                self._checks.add(check)
                check.add_done_callback(self._checks.discard)

    async def _check_batch(self, conn: Any, waiting: list[tuple[HealthWatch, int]]) -> None:
        """One ``Health`` call for ``waiting`` (watches of ``conn``); Danube's call per watch once
        the broker says it does not know the batch call."""
        request = batch_pb.HealthRequest(
            producer_ids=[i for w, i in waiting if w.client_type == PRODUCER],
            consumer_ids=[i for w, i in waiting if w.client_type != PRODUCER],
        )
        try:
            answer = await conn.batch_lane.Health(request, timeout=max(1.0, min(self.interval_s, 10.0)))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - unreachable broker, closed channel: the streams handle it
            if isinstance(exc, grpc.aio.AioRpcError) and exc.code() in _NO_BATCH_CALL:
                # an older broker (or one whose authorization does not know the call): Danube's
                # call per watch from now on, on every connection these watches use
                conn.batch_health = False
                for w, _ in waiting:
                    w.checking = False
                    other: Any = w.target()[0]
                    if other is not None:
                        other.batch_health = False
                await asyncio.gather(*(w.check_and_react() for w, _ in waiting), return_exceptions=True)
            else:
                log.debug("health check of %d producers/consumers failed: %s", len(waiting), exc)
            return
        finally:
            for w, _ in waiting:
                w.checking = False
        closed = {PRODUCER: set(answer.closed_producer_ids), CONSUMER: set(answer.closed_consumer_ids)}
        for w, client_id in waiting:
            if client_id in closed[PRODUCER if w.client_type == PRODUCER else CONSUMER]:
                w.react_to_close()


_CHECKERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, HealthChecker]] = (
    weakref.WeakKeyDictionary()
)


def checker_for(interval_s: float) -> HealthChecker:
    """The running loop's checker for ``interval_s`` (created on first use, dropped when empty)."""
    loop = asyncio.get_running_loop()
    by_interval = _CHECKERS.get(loop)
    if by_interval is None:
        by_interval = _CHECKERS[loop] = {}
    checker = by_interval.get(interval_s)
    if checker is None:
        checker = by_interval[interval_s] = HealthChecker(loop, interval_s)
    return checker


def watching() -> int:
    """Watches the running loop's checkers hold (what a test asks after closing producers)."""
    return sum(len(c.wheel) for c in _CHECKERS.get(asyncio.get_running_loop(), {}).values())


class HealthWatch:
    """One producer's or consumer's (per partition) place in the shared checker; ``stop()`` ends it."""

    def __init__(
        self, client_type: ClientType, target: Target, on_close: Callable[[], None], *, interval_s: float, what: str
    ) -> None:
        self.client_type = client_type
        self.interval_s = interval_s
        self.what = what
        self.checking = False  # a call of this watch is waiting for its answer
        self.target = target
        self._on_close = on_close
        self._checker: HealthChecker | None = None

    @property
    def running(self) -> bool:
        return self._checker is not None

    def start(self) -> None:
        if self._checker is None and self.interval_s and self.interval_s > 0:
            self._checker = checker_for(self.interval_s)
            self._checker.add(self)

    def cancel(self) -> None:
        """Stops the watch from synchronous code: no check is made and no CLOSE acted on after this."""
        checker, self._checker = self._checker, None
        if checker is not None:
            checker.remove(self)

    async def stop(self) -> None:
        checker, self._checker = self._checker, None
        if checker is not None:
            await cancel_and_wait(checker.remove(self))

    async def check_once(self) -> bool | None:
        """True: OK; False: CLOSE; None: could not ask (not connected, broker unreachable)."""
        conn, client_id = self.target()
        if conn is None or client_id < 0:
            return None
        request = danube_pb.HealthCheckRequest(request_id=0, client=self.client_type, id=client_id)
        try:
            answer = await conn.health.HealthCheck(request, timeout=max(1.0, min(self.interval_s, 10.0)))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - unreachable broker, closed channel: the stream handles it
            log.debug("health check of %s failed: %s", self.what, exc)
            return None
        return answer.status != danube_pb.HealthCheckResponse.CLOSE

    async def check_and_react(self) -> None:
        """One check; on CLOSE (unless stopped meanwhile) the owner is told."""
        self.checking = True
        try:
            ok = await self.check_once()
        finally:
            self.checking = False
        if ok is False:
            self.react_to_close()

    def react_to_close(self) -> None:
        """The broker answered CLOSE: the owner is told, unless the watch was stopped meanwhile."""
        if self._checker is not None:
            log.info("broker answered CLOSE for %s: looking the topic up again", self.what)
            try:
                self._on_close()
            except Exception:  # noqa: BLE001 - keep watching
                log.exception("reacting to CLOSE for %s failed", self.what)
