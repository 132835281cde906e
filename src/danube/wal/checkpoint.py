"""The checkpoint file ``wal.ckpt``: what the log knows about its closed files.

Format: one JSON object ``{"format": "danube-wal-ckpt-v1", "first_offset": int,
"next_seq": int, "rotated": [[seq, first_offset, last_offset, size], ...],
"crc": int}`` where ``crc`` is the CRC32C of the same object without ``crc``,
serialised with sorted keys and no spaces.  It is replaced atomically: written
to ``wal.ckpt.tmp``, fsynced, renamed over ``wal.ckpt``, then the directory is
fsynced.  A missing or damaged checkpoint is not fatal: recovery then scans
every segment file instead of trusting the rotated ones.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from danube import message_codec
from danube.wal.files import CHECKPOINT_NAME, fsync_directory

FORMAT = "danube-wal-ckpt-v1"


@dataclass
class Checkpoint:
    first_offset: int = 0
    next_seq: int = 1
    # seq -> (first_offset, last_offset, size) of each rotated file
    rotated: dict[int, tuple[int, int, int]] = field(default_factory=dict)

    def to_json(self) -> bytes:
        body = {
            "format": FORMAT,
            "first_offset": self.first_offset,
            "next_seq": self.next_seq,
            "rotated": [[seq, *self.rotated[seq]] for seq in sorted(self.rotated)],
        }
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        body["crc"] = message_codec.crc32c(canonical)
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode() + b"\n"

    @classmethod
    def from_json(cls, data: bytes) -> "Checkpoint":
        obj = json.loads(data)
        crc = obj.pop("crc")
        canonical = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
        if obj.get("format") != FORMAT or message_codec.crc32c(canonical) != crc:
            raise ValueError("checkpoint checksum or format mismatch")
        rotated = {int(r[0]): (int(r[1]), int(r[2]), int(r[3])) for r in obj["rotated"]}
        return cls(first_offset=int(obj["first_offset"]), next_seq=int(obj["next_seq"]), rotated=rotated)


def read_checkpoint(directory: str) -> Checkpoint | None:
    """The checkpoint of ``directory``, or None when missing or damaged."""
    try:
        with open(os.path.join(directory, CHECKPOINT_NAME), "rb") as f:
            return Checkpoint.from_json(f.read())
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError, IndexError):
        return None


def write_checkpoint(directory: str, checkpoint: Checkpoint) -> None:
    path = os.path.join(directory, CHECKPOINT_NAME)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, checkpoint.to_json())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_directory(directory)
