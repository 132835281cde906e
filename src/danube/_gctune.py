"""Garbage-collector settings for the broker process.

Every call on the broker's hot paths allocates a few container objects (futures, tasks,
protobuf messages, coroutine frames), so with CPython's default gen-0 threshold (700
allocations) a busy broker collects hundreds of times a second, and every tenth of those
also walks generation 1; a full collection walks every object the broker holds (the
protobuf and gRPC modules, hundreds of topics with their WALs and subscriptions): a large
share of a busy broker's time (docs/benchmarks.md, "Many active topics: the per-call path").

``tune`` raises the gen-0 threshold, so the collector runs on batches of 50,000
allocations; ``freeze`` (once the broker has started) moves what exists then -- modules,
configuration, the metadata store -- out of the collector's sight for good, so collections
walk only what was made since.  Reference cycles are still collected, just in larger,
rarer batches.
"""

from __future__ import annotations

import gc
import os

GC_THRESHOLD = (50_000, 20, 20)
OPT_OUT_ENV = "DANUBE_GC_TUNING"  # "0": keep CPython's defaults


def _enabled() -> bool:
    return os.environ.get(OPT_OUT_ENV, "1") != "0"


def tune() -> None:
    """Raise the collection thresholds of this process (the broker's, not a library's host)."""
    if _enabled():
        gc.set_threshold(*GC_THRESHOLD)


def freeze() -> None:
    """Collect once, then keep every object alive now out of later collections."""
    if _enabled():
        gc.collect()
        gc.freeze()
