"""What the first append after a sync costs the appending thread: N WAL files, each round one
small append per file, then (``--sync``) each file synced; CPU per append and minor page faults.

    python bench/append_after_sync.py [--files 100] [--rounds 300]

Under a sync policy the writeback of a file's tail page write-protects it again, so the next
append into it takes a page fault (and the file system's bookkeeping for a page about to be
dirtied); without syncs the page stays writable.
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


def run(files: int, rounds: int, sync: bool) -> tuple[float, float]:
    payload = message_codec.encode_payloads([b"x" * 100, b"x" * 100])
    with tempfile.TemporaryDirectory() as d:
        wals = [Wal.open(os.path.join(d, f"w{i}"), sync="always" if sync else "never") for i in range(files)]
        try:
            for wal in wals:
                wal.append_frames(bytearray(payload))
            spent = 0.0
            faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            for _ in range(rounds):
                started = time.thread_time()
                for wal in wals:
                    wal.append_frames(bytearray(payload))
                spent += time.thread_time() - started
                if sync:
                    for wal in wals:
                        wal.sync()
            faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - faults
        finally:
            for wal in wals:
                wal.close()
    n = files * rounds
    return spent / n * 1e6, faults / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=300)
    args = ap.parse_args()
    for sync in (False, True):
        us, faults = run(args.files, args.rounds, sync)
        what = "synced after every round" if sync else "never synced"
        print(
            f"{what:26} {us:6.2f} us per append, {faults:.2f} minor faults per append (appends and faults counted on the appending thread)"
        )


if __name__ == "__main__":
    main()
