"""One round of durability for many files: how to fdatasync N dirty files fastest.

    python bench/fdatasync_many.py [--files 100] [--rounds 200] [--bytes 256] [--dir DIR]

Each round appends ``--bytes`` to every file (preallocated with ``posix_fallocate``, as the WAL's
files are: each fdatasync also converts an unwritten extent, i.e. commits the journal) and then
makes all of them durable, by one of:

- ``sequential``: one thread, one fdatasync after another;
- ``threads-K``: K threads, each a share of the files (concurrent fdatasyncs of different files
  share ext4's journal commit);
- ``syncfs``: one ``syncfs(2)`` of the file system (everything dirty on it, other writers' too).

Prints the round time (p50/p99, ms) and the process CPU per round for each, interleaved.

``--other-syncs N``: meanwhile a thread appends ``--other-bytes`` to another file on the same file
system and fdatasyncs it N times a second, as the broker's embedded metadata store (sqlite,
synchronous=FULL) does under load: what another committer costs each method.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

_libc = ctypes.CDLL(None, use_errno=True)


def syncfs(fd: int) -> None:
    if _libc.syncfs(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _other_committer(path: str, args, stop: threading.Event) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    block = os.urandom(args.other_bytes)
    pos = 0
    while not stop.wait(1.0 / args.other_syncs):
        os.pwrite(fd, block, pos)
        pos = (pos + len(block)) % (64 << 20)  # sqlite's WAL file wraps too
        os.fdatasync(fd)
    os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--bytes", type=int, default=256)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--threads", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--other-syncs", type=float, default=0.0)
    ap.add_argument("--other-bytes", type=int, default=48 << 10)
    args = ap.parse_args()
    stop = threading.Event()
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        if args.other_syncs:
            threading.Thread(target=_other_committer, args=(os.path.join(d, "other"), args, stop), daemon=True).start()
        fds = []
        for i in range(args.files):
            fd = os.open(os.path.join(d, f"f{i}"), os.O_RDWR | os.O_CREAT, 0o644)
            os.posix_fallocate(fd, 0, 16 << 20)
            os.fsync(fd)
            fds.append(fd)
        pos = [0]
        data = b"x" * args.bytes
        pools = {k: ThreadPoolExecutor(k) for k in args.threads}

        def dirty() -> None:
            for fd in fds:
                os.pwrite(fd, data, pos[0])
            pos[0] += args.bytes

        def seq() -> None:
            for fd in fds:
                os.fdatasync(fd)

        def threaded(k: int):
            chunks = [fds[i::k] for i in range(k)]

            def run() -> None:
                list(pools[k].map(lambda c: [os.fdatasync(fd) for fd in c], chunks))

            return run

        methods = {
            "sequential": seq,
            **{f"threads-{k}": threaded(k) for k in args.threads},
            "syncfs": lambda: syncfs(fds[0]),
        }
        times: dict[str, list[float]] = {m: [] for m in methods}
        cpu: dict[str, float] = {m: 0.0 for m in methods}
        for _ in range(args.rounds):
            for name, fn in methods.items():
                dirty()
                c0, t0 = time.process_time(), time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
                cpu[name] += time.process_time() - c0
        for name, ts in times.items():
            ts.sort()
            print(
                f"{name:<12} p50 {statistics.median(ts) * 1000:7.2f} ms  p99 "
                f"{ts[int(len(ts) * 0.99)] * 1000:7.2f} ms  CPU {cpu[name] / args.rounds * 1e6:7.0f} us/round"
            )
        stop.set()
        for fd in fds:
            os.close(fd)
        for pool in pools.values():
            pool.shutdown()


if __name__ == "__main__":
    main()
