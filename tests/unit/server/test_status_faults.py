"""The statuses of the fault errors: a full WAL file system is RESOURCE_EXHAUSTED (retriable), a WAL
still locked by its previous owner is UNAVAILABLE (the clients retry), both with their own sentence."""

import errno

import grpc

from danube.errors import StorageFullError, WalBusyError
from danube.server.status import message_for, status_for
from danube.storage.topic_storage import TopicStorage


def test_a_full_disk_is_resource_exhausted_and_retriable():
    exc = StorageFullError("topic /default/t: publish refused: the file system of its WAL is full")
    assert status_for(exc) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert exc.retriable
    assert "/default/t" in message_for(exc)


def test_a_busy_wal_is_unavailable():
    assert status_for(WalBusyError("WAL /x is open elsewhere")) == grpc.StatusCode.UNAVAILABLE


def test_only_a_full_file_system_becomes_storage_full():
    storage = TopicStorage.__new__(TopicStorage)
    storage.topic, storage.wal_dir = "/default/t", "/wal/default/t"
    full = storage._disk_error(OSError(errno.ENOSPC, "No space left on device"), "publish refused")
    assert isinstance(full, StorageFullError)
    assert "/default/t" in str(full) and "/wal/default/t" in str(full) and "No space left" in str(full)
    assert isinstance(storage._disk_error(OSError(errno.EDQUOT, "Disk quota exceeded"), "x"), StorageFullError)
    other = OSError(errno.EIO, "I/O error")
    assert storage._disk_error(other, "x") is other
