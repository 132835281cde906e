"""danube.wal: an embeddable, crash-safe write-ahead log.

    from danube.wal import Wal

    with Wal.open("data/wal", sync="always") as wal:
        first = wal.append(b"hello", key="k1")
        wal.append_batch([b"a", b"b", b"c"])
        for record in wal.read(first):
            print(record.offset, bytes(record.payload))

One writer thread, any number of concurrent readers.  See ``docs/wal.md``.
"""

from danube.errors import CorruptFrameError, OffsetOutOfRangeError, WalClosedError, WalError
from danube.message_codec import Record
from danube.wal.checkpoint import Checkpoint
from danube.wal.files import WalFileInfo
from danube.wal.log import Wal
from danube.wal.options import SyncPolicy, WalOptions
from danube.wal.recovery import RecoveryReport

WalRecord = Record

__all__ = [
    "Wal",
    "WalRecord",
    "Record",
    "SyncPolicy",
    "WalOptions",
    "WalFileInfo",
    "Checkpoint",
    "RecoveryReport",
    "WalError",
    "WalClosedError",
    "OffsetOutOfRangeError",
    "CorruptFrameError",
]
