"""Directories built from topic names: the second wall behind the name rule.

Topic names are checked by ``danube.metadata.keys`` before anything is stored; this
module checks again, on the path itself, right before a directory is opened, created,
renamed or removed: the path must lie exactly ``<root>/<namespace>/<topic>``, each part
one plain directory entry.  So a name that slipped past the rule (a bug, an old record)
can never make the broker write into, rename or delete a parent or a sibling.

The root is resolved (``realpath``), the rest is checked lexically: a directory an
operator symlinked inside the root (a namespace on another disk) stays usable.
"""

from __future__ import annotations

import os
import shutil
import time

from danube.errors import UnsafePathError, quote
from danube.metadata.keys import is_valid_name, split_topic

# A set-aside WAL directory starts with "." so it can never be the directory of a topic
# (names never start with "."), whatever the topic is called.
STALE_PREFIX = ".stale-"


def resolved_root(root: str) -> str:
    return os.path.realpath(root)


def topic_dir(root: str, topic: str) -> str:
    """``<root>/<ns>/<topic>`` for a valid topic name, checked to lie inside ``root``."""
    ns, name = split_topic(topic)
    path = os.path.join(resolved_root(root), ns, name)
    check_topic_dir(root, path)
    return path


def check_topic_dir(root: str, path: str) -> str:
    """``path`` if it is exactly two plain entries below ``root`` (``<ns>/<topic>``);
    UnsafePathError otherwise.  Called before every mkdir, open, rename and rmtree."""
    base = resolved_root(root)
    full = os.path.abspath(path)
    rel = os.path.relpath(full, base)
    parts = rel.split(os.sep)
    if len(parts) != 2 or not all(is_valid_name(p) for p in parts) or os.path.join(base, *parts) != full:
        raise UnsafePathError(
            f"topic directory {quote(path)} is not a directory of a topic inside "
            f"the storage root {quote(base, 256)}; refused"
        )
    return full


def remove_topic_dir(root: str, path: str) -> None:
    """Delete one topic's WAL directory (and nothing else: checked first)."""
    shutil.rmtree(check_topic_dir(root, path), ignore_errors=True)


def stale_dirs(root: str, topic: str) -> list[str]:
    """The set-aside copies of ``topic``'s WAL directory (:func:`set_aside`), oldest first: entries
    ``<ns>/.stale-<topic>-<ms>`` exactly (a topic ``a`` never matches ``a-1``'s copies)."""
    ns_dir, name = os.path.split(topic_dir(root, topic))
    try:
        entries = os.listdir(ns_dir)
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for entry in entries:
        stem, _, ms = entry[len(STALE_PREFIX) :].rpartition("-")
        if entry.startswith(STALE_PREFIX) and stem == name and ms.isdigit():
            out.append(os.path.join(ns_dir, entry))
    return sorted(out, key=lambda p: int(p.rpartition("-")[2]))


def remove_topic_data(root: str, topic: str) -> list[str]:
    """Delete ``topic``'s directory under ``root`` and its set-aside copies; the paths removed.

    Each path is built from the checked name and checked again right before it is removed, so a
    name that breaks the rule raises (InvalidTopicNameError, UnsafePathError) before anything goes."""
    path = topic_dir(root, topic)
    removed = []
    for target in (path, *stale_dirs(root, topic)):
        if target != path:
            _check_stale_dir(root, topic, target)
        if os.path.islink(target):
            os.unlink(target)  # the link, never what it points to
        elif os.path.isdir(target):
            shutil.rmtree(target)
        else:
            continue
        removed.append(target)
    return removed


def _check_stale_dir(root: str, topic: str, path: str) -> None:
    """``path`` must be ``<root>/<ns>/.stale-<topic>-<ms>`` for this very topic."""
    ns_dir, name = os.path.split(topic_dir(root, topic))
    parent, entry = os.path.split(os.path.abspath(path))
    stem, _, ms = entry[len(STALE_PREFIX) :].rpartition("-")
    if parent != ns_dir or not entry.startswith(STALE_PREFIX) or stem != name or not ms.isdigit():
        raise UnsafePathError(f"{quote(path)} is not a set-aside WAL directory of topic {quote(topic)}; refused")


def set_aside(root: str, path: str) -> str:
    """Rename a topic's stale WAL directory beside itself (kept for inspection); return the new
    name, ``<ns>/.stale-<topic>-<ms>``: a hidden name no topic can ever have."""
    full = check_topic_dir(root, path)
    parent, name = os.path.split(full)
    target = os.path.join(parent, f"{STALE_PREFIX}{name}-{int(time.time() * 1000)}")
    os.rename(full, target)
    return target
