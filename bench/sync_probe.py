"""Run ``danube broker`` with the WAL's durability waits timed piece by piece (for bench/sync_tail.py).

    python bench/sync_probe.py OUT.json broker --port ... --sync always ...

Wraps, in this process only, the WAL's sync group and durability callbacks so that every
``when_durable`` wait is split into: waiting for the round that covers it to start, the round's
syncs (and each ``syncfs`` on its own), the hand-off back to the event loop (from the round's
``call_soon_threadsafe`` to the callback running), and the event loop's lag in general (a 1 ms
timer's lateness).  Every second the samples so far are written to ``OUT.json``.  Costs a closure
and a few clock reads per wait: a probe, not something the broker ships with.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time

# the tree under test comes from PYTHONPATH (bench/sync_tail.py --tree), else this one's
if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from danube.wal import handoff, sync, sync_group  # noqa: E402

clock = time.perf_counter
samples: dict[str, list[float]] = {
    "total_ms": [],  # when_durable asked -> callback ran on the loop
    "to_round_ms": [],  # asked -> the covering round started (0 when a running round covered it)
    "round_ms": [],  # covering round started -> its waiters handed to the loop
    "handoff_ms": [],  # handed to the loop -> the callback ran
    "syncfs_ms": [],  # each syncfs call
    "round_len_ms": [],  # each round, start -> waiters handed off
    "chores_ms": [],  # a round's waiters handed off -> its end (the logs' after-sync chores)
    "round_gap_ms": [],  # a round's end -> the next round's start (when some log was waiting)
    "round_logs": [],  # logs per round
    "loop_lag_ms": [],  # lateness of a 1 ms timer on the broker's loop
}
_current = threading.local()
_last_round_end = [0.0]


class _Timed:
    __slots__ = ("fn", "asked", "round_start", "handed")

    def __init__(self, fn):
        self.fn = fn
        self.asked = clock()
        self.round_start = 0.0
        self.handed = 0.0

    def __call__(self, exc):
        now = clock()
        if exc is None and self.handed:
            samples["total_ms"].append((now - self.asked) * 1000)
            samples["to_round_ms"].append(max(0.0, self.round_start - self.asked) * 1000)
            samples["round_ms"].append((self.handed - max(self.round_start, self.asked)) * 1000)
            samples["handoff_ms"].append((now - self.handed) * 1000)
        return self.fn(exc)


_orig_when_durable = sync.Syncer.when_durable


def when_durable(self, offset, callback):
    return _orig_when_durable(self, offset, _Timed(callback))


sync.Syncer.when_durable = when_durable

_orig_call_back = handoff.call_back


def call_back(waiters, exc):
    start = getattr(_current, "start", 0.0)
    if start:
        now = _current.handed = clock()
        for _loop, fn in waiters:
            if isinstance(fn, _Timed):
                fn.round_start = start
                fn.handed = now
    return _orig_call_back(waiters, exc)


sync_group.call_back = call_back

_orig_round = sync_group.SyncGroup._round


def _round(self, logs):
    if not samples.setdefault("sync_thread_tid", []):  # for strace -p
        samples["sync_thread_tid"].append(threading.get_native_id())
    start = clock()
    if _last_round_end[0]:
        samples["round_gap_ms"].append((start - _last_round_end[0]) * 1000)
    _current.start = start
    _current.handed = 0.0
    samples["round_logs"].append(len(logs))
    try:
        return _orig_round(self, logs)
    finally:
        _current.start = 0.0
        end = clock()
        _last_round_end[0] = end
        samples["round_len_ms"].append((end - start) * 1000)
        if _current.handed:
            samples["chores_ms"].append((end - _current.handed) * 1000)


sync_group.SyncGroup._round = _round

_orig_syncfs = sync_group._syncfs
if _orig_syncfs is not None:

    def _syncfs(fd):
        started = clock()
        try:
            return _orig_syncfs(fd)
        finally:
            samples["syncfs_ms"].append((clock() - started) * 1000)

    sync_group._syncfs = _syncfs


# the loop's lag: a 1 ms timer re-armed forever, started with the first durability wait's loop
_lag_started = [False]
_orig_request = sync_group.SyncGroup.request


def request(self, syncer):
    if not _lag_started[0]:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None:
            _lag_started[0] = True

            def tick(due):
                samples["loop_lag_ms"].append(max(0.0, loop.time() - due) * 1000)
                nxt = loop.time() + 0.001
                loop.call_at(nxt, tick, nxt)

            first = loop.time() + 0.001
            loop.call_at(first, tick, first)
    return _orig_request(self, syncer)


sync_group.SyncGroup.request = request


def _dump(path: str) -> None:
    while True:
        time.sleep(1.0)
        snap = {k: list(v) for k, v in samples.items()}
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(snap, f)
        os.replace(tmp, path)


def main() -> None:
    out = sys.argv[1]
    if os.environ.get("SYNC_PROBE_SWITCH_S"):  # what the GIL's switch interval does to the tail
        sys.setswitchinterval(float(os.environ["SYNC_PROBE_SWITCH_S"]))
    threading.Thread(target=_dump, args=(out,), daemon=True).start()
    sys.argv = ["danube", *sys.argv[2:]]
    from danube.cli.main import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
