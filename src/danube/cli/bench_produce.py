"""`danube bench`: the produce loop of one process, every producer stepped by one pacing task.

With ``--rate`` each producer makes one call every ``interval`` seconds; the calls of all producers
form one evenly spaced schedule (call ``n`` goes to producer ``n % P`` at ``start + n * interval / P``),
so a single task wakes at most every millisecond and makes every call that has come due, instead of a
task and a timer per producer per call.  As fast as possible (no rate), the task gives each producer
with room one call per pass.  A producer whose in-flight window is full skips its turn and makes it up
once an ack frees room, as the per-producer loops did.

``offered`` counts the messages of the calls the schedule places before the deadline and
``lag_max`` says how late the latest call of a pass came, so a run whose loop fell behind (a busy
client) says so.  Calls still due at the deadline are not made: made then, all at once, they would
be a burst the schedule never asked for, and the latency of the run's last messages would be the
burst's.

Each producer's calls are answered in call order (one stream per producer), so the send times of its
calls in flight wait in a FIFO and one bound callback per producer takes them: no closure per call.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from array import array

from danube.cli.bench_config import STAMP

_TICK_S = 0.001  # the pacing task wakes at most this often: calls due within it go out together


class Lane:
    """One producer and its calls in flight."""

    __slots__ = ("producer", "pacer", "stamps", "room", "owed", "failed")

    def __init__(self, producer, pacer: "Pacer", window: int) -> None:
        self.producer = producer
        self.pacer = pacer
        self.stamps: collections.deque[float] = collections.deque()
        self.room = window
        self.owed = 0  # calls that came due while the window was full
        self.failed = False

    def done(self, fut: asyncio.Future) -> None:
        pacer = self.pacer
        t0 = self.stamps.popleft()
        self.room += 1
        pacer.in_flight -= 1
        if fut.cancelled():
            pacer.errors.append("a send_batch call was cancelled")
        elif fut.exception() is not None:
            pacer.errors.append(str(fut.exception()))
        else:
            pacer.ack_latencies.append(time.perf_counter() - t0)
            pacer.acked += pacer.per_call
        if pacer.wake is not None:
            pacer.wake.set()


class Pacer:
    """Makes the calls of ``producers`` until a deadline, then waits until every call is answered."""

    def __init__(self, producers: list, per_call: int, message_size: int, window: int, rate_per_producer: float):
        self.per_call = per_call
        self.rate_per_producer = rate_per_producer
        self.lanes = [Lane(p, self, window) for p in producers]
        self.sent = 0
        self.calls = 0
        self.acked = 0
        self.in_flight = 0
        self.offered = 0  # messages of the calls the schedule placed before the deadline (paced runs)
        self.lag_max = 0.0  # seconds: the most a pass's last call came after its scheduled time
        self.ack_latencies = array("d")
        self.errors: list[str] = []
        self.wake: asyncio.Event | None = None
        self._stamped = message_size >= STAMP.size
        self._pad = b"\x00" * max(0, message_size - STAMP.size)
        self._plain = b"\x00" * message_size

    async def _call(self, lane: Lane) -> None:
        t0 = time.perf_counter()  # the messages are handed to the client now; everything after counts
        payload = STAMP.pack(t0) + self._pad if self._stamped else self._plain
        lane.stamps.append(t0)
        lane.room -= 1
        self.in_flight += 1
        try:
            fut = await lane.producer.send_batch([payload] * self.per_call)
        except Exception as exc:  # noqa: BLE001 - reported in the result; this producer stops
            lane.stamps.pop()
            lane.room += 1
            self.in_flight -= 1
            lane.failed = True
            self.errors.append(f"send_batch: {exc}")
            return
        fut.add_done_callback(lane.done)
        self.sent += self.per_call
        self.calls += 1

    async def produce(self, start: float, deadline: float) -> None:
        """Makes the calls until ``deadline``."""
        if self.rate_per_producer > 0:
            await self._paced(start, deadline)
        else:
            await self._flat_out(deadline)

    async def settle(self) -> None:
        """Seals the producers' open batches and waits until every call is answered."""
        await asyncio.gather(*(lane.producer.flush() for lane in self.lanes if not lane.failed))
        self.wake = asyncio.Event()
        while self.in_flight > 0:
            self.wake.clear()
            await self.wake.wait()

    async def run(self, start: float, deadline: float) -> None:
        await self.produce(start, deadline)
        await self.settle()

    async def _paced(self, start: float, deadline: float) -> None:
        lanes = self.lanes
        count = len(lanes)
        spacing = self.per_call / self.rate_per_producer / count  # seconds between two calls of the schedule
        # call n is due at start + n * spacing; deadline - start comes back from float clock readings a
        # hair over what was added (0.2 s / 1 ms gave 200.00000000000003): that hair is no call
        total = max(0, math.ceil((deadline - start) / spacing - 1e-9))
        self.offered = total * self.per_call
        perf = time.perf_counter
        behind: list[Lane] = []
        n = 0
        while True:
            now = perf()
            if now >= deadline:
                return
            if behind:  # calls owed by producers whose window was full: made up as room frees
                still = []
                for lane in behind:
                    while lane.owed and lane.room > 0 and not lane.failed:
                        lane.owed -= 1
                        await self._call(lane)
                    if lane.owed and not lane.failed:
                        still.append(lane)
                behind = still
            due = min(total, int((now - start) / spacing) + 1)
            made = n < due
            while n < due:
                lane = lanes[n % count]
                n += 1
                if lane.failed:
                    continue
                if lane.room > 0 and not lane.owed:
                    await self._call(lane)
                else:
                    if not lane.owed:
                        behind.append(lane)
                    lane.owed += 1
            if made:
                self.lag_max = max(self.lag_max, perf() - (start + (n - 1) * spacing))
            if n >= total and not behind:
                return
            pause = start + n * spacing - perf()
            await asyncio.sleep(min(max(pause, _TICK_S), max(0.0, deadline - perf())))

    async def _flat_out(self, deadline: float) -> None:
        perf = time.perf_counter
        self.wake = wake = asyncio.Event()
        while perf() < deadline:
            made = False
            for lane in self.lanes:
                if lane.room > 0 and not lane.failed:
                    await self._call(lane)
                    made = True
            if made:
                await asyncio.sleep(0)  # let the writes and the acks run between passes
                continue
            if all(lane.failed for lane in self.lanes):
                return
            wake.clear()
            try:
                await asyncio.wait_for(wake.wait(), max(0.0, deadline - perf()))
            except asyncio.TimeoutError:
                return
