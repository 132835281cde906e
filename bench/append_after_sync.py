"""What the first append after a sync costs the appending thread: N WAL files, each round one
small append per file, then (``--sync``) each file synced; CPU per append and minor page faults.

    python bench/append_after_sync.py [--files 100] [--rounds 300]

Under a sync policy the writeback of a file's tail page write-protects it again, so the next
append into it takes a page fault (and the file system dirties the inode: a timestamp update in
its journal); without syncs the page stays writable.  After each sync the WAL faults the tail
back in writable on the syncing thread (``SegmentFile.rearm``); the "not rearmed" row turns
that off to show what the appending thread would pay itself.  The sync + rearm column is the
syncing thread's CPU per append (here the same thread, timed apart).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from danube import message_codec  # noqa: E402
from danube.wal import Wal  # noqa: E402
from danube.wal.log import Wal as _Wal  # noqa: E402


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def run(files: int, rounds: int, sync: bool, rearm: bool) -> tuple[float, float, float]:
    payload = message_codec.encode_payloads([b"x" * 100, b"x" * 100])
    saved = _Wal._after_sync
    if not rearm:
        _Wal._after_sync = lambda self: None  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory() as d:
            wals = [Wal.open(os.path.join(d, f"w{i}"), sync="always" if sync else "never") for i in range(files)]
            try:
                for wal in wals:
                    wal.append_frames(bytearray(payload))
                spent = synced = 0.0
                faults = 0
                for _ in range(rounds):
                    started, f0 = time.thread_time(), _faults()
                    for wal in wals:
                        wal.append_frames(bytearray(payload))
                    spent += time.thread_time() - started
                    faults += _faults() - f0
                    if sync:
                        started = time.thread_time()
                        for wal in wals:
                            wal.sync()
                        synced += time.thread_time() - started
            finally:
                for wal in wals:
                    wal.close()
    finally:
        _Wal._after_sync = saved  # type: ignore[method-assign]
    n = files * rounds
    return spent / n * 1e6, faults / n, synced / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=300)
    args = ap.parse_args()
    for what, sync, rearm in (
        ("never synced", False, True),
        ("synced, not rearmed", True, False),
        ("synced, rearmed", True, True),
    ):
        us, faults, sync_us = run(args.files, args.rounds, sync, rearm)
        print(
            f"{what:20} append {us:6.2f} us, {faults:.2f} minor faults (appending thread); "
            f"sync + rearm {sync_us:7.2f} us per append"
        )


if __name__ == "__main__":
    main()
