"""Process limits the broker sets for itself at start."""

from __future__ import annotations

import logging

log = logging.getLogger("danube.server")


def raise_nofile_limit(logger: logging.Logger = log) -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (a broker holds a descriptor or two per
    open topic plus one per connection) and log what it is; return ``(soft, hard)``."""
    try:
        import resource
    except ImportError:  # not POSIX
        return (-1, -1)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if target == resource.RLIM_INFINITY:
        target = 1 << 20  # the kernel's default nr_open; "unlimited" is refused for NOFILE
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            logger.info("file descriptor limit raised from %d to %d (the hard limit)", soft, target)
            soft = target
        except (ValueError, OSError) as exc:
            logger.warning("could not raise the file descriptor limit from %d to %d: %s", soft, target, exc)
    else:
        logger.info("file descriptor limit %d (hard %s)", soft, hard)
    return soft, hard
