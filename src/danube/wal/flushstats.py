"""How long a log's syncs take: a fixed-bucket histogram the sync threads fill and the
broker's metrics page reads (``danube_wal_flush_latency_ms``).

One bucket increment per fdatasync or syncfs, on the thread that made it (never the event
loop, never per record).  A scrape may read a bucket a sync is updating: it then sees the
count before or after that sync, which a histogram of thousands of syncs does not notice.
"""

from __future__ import annotations

from bisect import bisect_left

# Upper bounds in ms: an fdatasync of a hot log on SSD takes 0.1-1 ms, a loaded disk tens.
BUCKETS_MS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0)


class FlushLatency:
    __slots__ = ("_counts", "sum_ms")

    def __init__(self) -> None:
        self._counts = [0] * (len(BUCKETS_MS) + 1)  # the last: above every bound
        self.sum_ms = 0.0

    def record(self, ms: float) -> None:
        self._counts[bisect_left(BUCKETS_MS, ms)] += 1
        self.sum_ms += ms

    @staticmethod
    def bucket(ms: float) -> int:
        return bisect_left(BUCKETS_MS, ms)

    def add(self, bucket: int, ms: float) -> None:
        """:meth:`record` with the bucket of ``ms`` found already (a syncfs round: one sync's
        time, recorded for each log it covered)."""
        self._counts[bucket] += 1
        self.sum_ms += ms

    @property
    def count(self) -> int:
        return sum(self._counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, syncs at or below it)``, the last bound ``inf``."""
        out, total = [], 0
        for bound, n in zip((*BUCKETS_MS, float("inf")), list(self._counts)):
            total += n
            out.append((bound, total))
        return out
