"""What of a file is in the OS page cache (mincore on a mapping of our own), for the WAL's
page-cache tests."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_MAP_FAILED = ctypes.c_void_p(-1).value


def resident_pages(path: str | os.PathLike, start: int = 0, end: int | None = None) -> int:
    """Pages of ``path`` in ``[start, end)`` (page-aligned outward) held in the page cache now."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        end = size if end is None else min(end, size)
        page = mmap.PAGESIZE
        first = start - start % page
        if end <= first:
            return 0
        length = end - first
        addr = _libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, first)
        if addr in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), "mmap failed")
        try:
            pages = (length + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, length, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
            return sum(v & 1 for v in vec)
        finally:
            _libc.munmap(addr, length)
    finally:
        os.close(fd)


def page_cache_droppable(path: str | os.PathLike) -> bool:
    """False where dropping pages cannot work: tmpfs and ramfs hold files only in memory."""
    real = os.path.realpath(path)
    best, fstype = "", ""
    with open("/proc/mounts") as mounts:
        for line in mounts:
            parts = line.split()
            mount_point = parts[1].replace("\\040", " ")
            if (real == mount_point or real.startswith(mount_point.rstrip("/") + "/")) and len(mount_point) > len(best):
                best, fstype = mount_point, parts[2]
    return fstype not in ("tmpfs", "ramfs")
