"""Options of :meth:`danube.wal.Wal.open`, validated once."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from danube.errors import InvalidArgumentError

# After a sync (sync=always/interval), the sync thread faults the active file's tail page back in
# writable, and the next page too when the write position is this close to its end: the next
# append stores without a fault (see SegmentFile.rearm).
REARM_AHEAD_BYTES = 1024

MiB = 1024 * 1024


class SyncPolicy(str, Enum):
    """When appended bytes are made durable (fdatasync)."""

    ALWAYS = "always"  # append waits for fdatasync (group commit shares one among waiters)
    INTERVAL = "interval"  # a background thread fdatasyncs every sync_interval_ms
    NEVER = "never"  # the OS writes back when it likes; a process crash loses nothing, a machine crash may


@dataclass(frozen=True)
class WalOptions:
    sync: SyncPolicy = SyncPolicy.ALWAYS
    sync_interval_ms: float = 5.0
    max_file_bytes: int = 64 * MiB
    # Disk reserved for a new file; the reservation doubles ahead of the writer up to
    # max_file_bytes (a spare after a rotation reserves what the rotated file came to).
    initial_file_bytes: int = 256 * 1024
    max_file_age_s: float | None = None
    cache_bytes: int = 64 * MiB
    # The newest bytes of the log kept in the OS page cache; older synced bytes are dropped
    # from it (danube/wal/pagecache.py).  None leaves the page cache to the OS.
    page_cache_bytes: int | None = 128 * MiB
    index_every_bytes: int = 64 * 1024
    initial_offset: int | None = None
    # The danube.wal.sync.SyncGroup whose rounds sync this log (None: the process-wide one).
    sync_group: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def from_kwargs(cls, **kwargs) -> "WalOptions":
        unknown = set(kwargs) - set(cls.__dataclass_fields__)
        if unknown:
            raise InvalidArgumentError(f"unknown WAL option(s): {', '.join(sorted(unknown))}")
        sync = kwargs.pop("sync", SyncPolicy.ALWAYS)
        try:
            sync = SyncPolicy(sync)
        except ValueError:
            raise InvalidArgumentError(f"sync must be 'always', 'interval' or 'never', not {sync!r}") from None
        opts = cls(sync=sync, **kwargs)
        if not opts.sync_interval_ms > 0:
            raise InvalidArgumentError("sync_interval_ms must be > 0")
        if opts.max_file_bytes < 4096:
            raise InvalidArgumentError("max_file_bytes must be at least 4096")
        if opts.initial_file_bytes < 4096:
            raise InvalidArgumentError("initial_file_bytes must be at least 4096")
        if opts.max_file_age_s is not None and not opts.max_file_age_s > 0:
            raise InvalidArgumentError("max_file_age_s must be > 0 or None")
        if opts.cache_bytes < 0:
            raise InvalidArgumentError("cache_bytes must be >= 0")
        if opts.page_cache_bytes is not None and not (
            isinstance(opts.page_cache_bytes, int) and opts.page_cache_bytes >= 0
        ):
            raise InvalidArgumentError(
                "page_cache_bytes must be an integer >= 0, or None to leave the page cache to the OS"
            )
        if opts.index_every_bytes < 0:
            raise InvalidArgumentError("index_every_bytes must be >= 0")
        if opts.initial_offset is not None and not 0 <= opts.initial_offset < (1 << 63):
            raise InvalidArgumentError("initial_offset must be a non-negative 63-bit integer")
        return opts
