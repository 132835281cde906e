from __future__ import annotations

import pytest

from danube.wal import Wal


@pytest.fixture
def open_wal(tmp_path):
    """Open WALs in a temp dir; every one is closed after the test."""
    opened: list[Wal] = []

    def _open(path=None, **options):
        options.setdefault("sync", "never")
        wal = Wal.open(path or tmp_path / "wal", **options)
        opened.append(wal)
        return wal

    yield _open
    for wal in opened:
        wal.close()
