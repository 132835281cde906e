"""The owner epoch of a topic's WAL: who may append to (and ack from) a WAL on a shared root.

With ``storage.mode: shared_fs`` and ``local_wal_root`` on the shared file system, a topic's
WAL directory is the same for every broker, so the broker that takes a topic over after its
owner died (or was cut off from etcd) continues the dead owner's WAL — its unexported tail
included — instead of starting after the last exported segment.

Two owners must never append to it.  Each opener:

1. bumps the topic's owner epoch in the metadata store (``<prefix>/topics/<ns>/<t>/epoch``) with a
   compare-and-swap on its version, so every opener holds a distinct, increasing epoch;
2. writes ``OWNER_EPOCH`` into the WAL directory (write + fsync + rename: a new inode) *before* it
   opens and recovers the WAL;
3. before acking appends, checks (one ``stat``) that ``OWNER_EPOCH`` is still the file it wrote;
   if another broker replaced it with a higher epoch, this owner is fenced: it refuses the
   ack and every later write.

So an old owner still running (cut off from etcd) acks nothing that the new owner's recovery, which
starts after step 2, may not have read.  The WAL's ``flock`` is a second wall where the file
system honours it (one host, NFSv4): the new owner cannot open the WAL until the old one closed it
or died.  A ``kill -9`` releases both at once.
"""

from __future__ import annotations

import json
import logging
import os

from danube.errors import StorageError, TopicSealedError
from danube.metadata import keys
from danube.metadata.store import Compare, MetadataStore, Op

log = logging.getLogger(__name__)

EPOCH_FILE = "OWNER_EPOCH"


def epoch_key(prefix: str, topic: str) -> str:
    return f"{keys.storage_topic(prefix, topic)}/epoch"


async def bump_owner_epoch(metadata: MetadataStore, prefix: str, topic: str, broker_id: str) -> int:
    """The next owner epoch of ``topic``, taken by compare-and-swap (retried on a race)."""
    key = epoch_key(prefix, topic)
    for _ in range(20):
        kv = await metadata.get(key)
        current = int(json.loads(kv.value)["epoch"]) if kv is not None else 0
        epoch = current + 1
        value = json.dumps({"epoch": epoch, "broker_id": broker_id}, separators=(",", ":")).encode()
        guard = Compare.version(key, "==", kv.version if kv is not None else 0)
        result = await metadata.txn([guard], [Op.put(key, value)])
        if result.succeeded:
            return epoch
    raise StorageError(f"{topic}: could not take the owner epoch (20 races)", retriable=True)


def read_epoch_file(wal_dir: str) -> int:
    try:
        with open(os.path.join(wal_dir, EPOCH_FILE), "rb") as f:
            return int(json.loads(f.read())["epoch"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


class OwnerFence:
    """This broker's claim on a topic's WAL directory (see the module docstring)."""

    def __init__(self, topic: str, wal_dir: str, epoch: int, broker_id: str) -> None:
        self.topic = topic
        self.wal_dir = wal_dir
        self.epoch = epoch
        self.broker_id = broker_id
        self.path = os.path.join(wal_dir, EPOCH_FILE)
        self._identity: tuple[int, int] | None = None
        self.fenced_by: int | None = None

    def claim(self) -> None:
        """Write OWNER_EPOCH (refused if a higher epoch is already there); blocking."""
        os.makedirs(self.wal_dir, exist_ok=True)
        found = read_epoch_file(self.wal_dir)
        if found > self.epoch:
            self.fenced_by = found
            raise TopicSealedError(f"topic {self.topic}: a newer owner (epoch {found}) holds its WAL", retriable=True)
        tmp = f"{self.path}.{self.broker_id}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(json.dumps({"epoch": self.epoch, "broker_id": self.broker_id}).encode())
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, self.path)
        fd = os.open(self.wal_dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        st = os.stat(self.path)
        self._identity = (st.st_ino, st.st_mtime_ns)

    def check(self) -> None:
        """Raise (retriable) if another broker took the WAL over; one ``stat`` when it did not."""
        if self.fenced_by is not None:
            raise self._error()
        try:
            st = os.stat(self.path)
            identity = (st.st_ino, st.st_mtime_ns)
        except FileNotFoundError:
            identity = None
        if identity == self._identity:
            return
        found = read_epoch_file(self.wal_dir)
        if found > self.epoch or identity is None:
            self.fenced_by = found
            log.error(
                "%s: fenced: the WAL now belongs to owner epoch %d (this broker holds %d); no more acks or writes here",
                self.topic,
                found,
                self.epoch,
            )
            raise self._error()
        self._identity = identity  # rewritten by ourselves (same epoch): keep going

    @property
    def fenced(self) -> bool:
        return self.fenced_by is not None

    def _error(self) -> TopicSealedError:
        return TopicSealedError(
            f"topic {self.topic} moved to another broker (owner epoch {self.fenced_by} > "
            f"{self.epoch}); look it up again",
            retriable=True,
        )


async def cursor_floor(metadata: MetadataStore, topic: str) -> int:
    """One past the highest subscription cursor saved for ``topic`` (0 without any): a new owner that
    has neither the previous owner's WAL nor a seal (``local`` / ``object_store`` after a crash) never
    starts below it, so no consumer's saved position points past the topic's next offset and no offset
    a consumer already acked is issued again."""
    floor = 0
    for kv in await metadata.get_prefix(keys.topic_subscriptions(topic)):
        if not kv.key.endswith("/cursor"):
            continue
        try:
            floor = max(floor, int(json.loads(kv.value)) + 1)
        except (TypeError, ValueError):
            continue
    return floor
