"""glibc malloc settings for processes that move large buffers every few milliseconds.

A broker batch, its protobuf message and the client's encoded frames are a few hundred KiB
each, made and freed hundreds of times a second.  With glibc's defaults such blocks are
mmap'd and unmapped, or the heap top is trimmed and grown again, for every one of them: page
faults on the way in, an unmap (and TLB shootdowns across the CPUs) on the way out.  The two
thresholds below keep such blocks on the heap (measurements: docs/benchmarks.md,
"Half-rate point, pacing, interval syncer, glibc malloc").
Both are set: setting either one switches off glibc's dynamic adjustment of the other too, and
one alone did worse than neither.

Applied by the broker and by danube's command-line tools for their own process (``tune``);
a library must not change its host's allocator, so embedders of ``danube.client`` set the
same with ``GLIBC_TUNABLES`` (docs/client.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

MMAP_THRESHOLD = 16 * 1024 * 1024  # blocks below this come from the heap, not from mmap
TRIM_THRESHOLD = 64 * 1024 * 1024  # free memory the heap keeps at its top before giving it back
OPT_OUT_ENV = "DANUBE_MALLOC_TUNING"  # "0": keep glibc's defaults

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_applied: str | None = None


def _libc():
    if not hasattr(ctypes, "CDLL"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None  # not glibc (musl, macOS): nothing to tune here
    return libc


def described() -> str:
    """What ``tune`` did in this process, for the broker's start-up line."""
    return _applied or "glibc malloc defaults (not tuned in this process)"


def tune() -> str:
    """Set the two thresholds for this process (once); say what was done, for the log."""
    global _applied
    if _applied is not None:
        return _applied
    if os.environ.get(OPT_OUT_ENV, "").strip() == "0":
        _applied = f"glibc malloc defaults ({OPT_OUT_ENV}=0)"
    elif "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        _applied = "glibc malloc as set by GLIBC_TUNABLES"
    else:
        libc = _libc()
        if libc is None:
            _applied = "malloc not tuned (not glibc)"
        elif (
            libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
        ):
            _applied = (
                f"glibc malloc: mmap_threshold {MMAP_THRESHOLD >> 20} MiB, trim_threshold {TRIM_THRESHOLD >> 20} MiB"
            )
        else:
            _applied = "malloc not tuned (mallopt refused)"
    return _applied


def trim() -> bool:
    """Give the free memory of every malloc arena back to the system (glibc's ``malloc_trim``):
    after a burst that grew the heap (a hostile peer's buffers), the trim threshold above would
    otherwise keep up to 64 MiB per arena, and fragments of more.  Blocks the calling thread for
    a few milliseconds per GiB of heap (glibc locks each arena in turn); run it off the event loop.
    False where there is no glibc."""
    libc = _libc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    libc.malloc_trim(0)
    return True
