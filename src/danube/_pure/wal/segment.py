"""Pure-Python twin of ``danube._core.walfile``'s segment file (``_core/wal/segment.pyx``):
``SegmentFile``, the file header codec, the mapping, the sparse index and recovery.

Must stay byte-identical to the compiled part (``tests/unit/_core/test_walfile.py``
writes the same records through both and compares the files).  Pure on its own:
it uses ``danube._pure.frame``, never the compiled codec.

Segment file layout ("danube-wal-v1")
=====================================

A WAL directory holds segment files named ``wal-<seq:020d>.log`` (``seq``
counts up from 1) and the checkpoint ``wal.ckpt`` (see ``danube/wal/checkpoint.py``).
A segment file is created at its full size (``map_size``, the rotation size) and
mapped whole with ``mmap``; it is written through the mapping.  Either all of it is
allocated up front (``posix_fallocate``, else ``ftruncate``), or (``reserve=``) the
file is sparse and only its first ``capacity`` bytes are allocated, grown ahead of
the writer by ``reserve()`` (docs/wal.md "Disk"): the writer never stores beyond ``capacity``,
so a full disk is an error from ``posix_fallocate``, never a SIGBUS.  A hole reads
as zeros like preallocated space.  All integers are little-endian::

    file header (64 bytes)
      0   8 bytes  magic        b"DNBWAL\\x00\\x01"
      8   u32      version      1
      12  u32      header_size  64
      16  u64      seq          the number in the file name
      24  u64      first_offset offset of the first frame this file holds (or will hold)
      32  u64      created_ms   creation time, ms since the Unix epoch (drives age rotation)
      40  20 bytes reserved     zero
      60  u32      header_crc   CRC32C of bytes [0, 60)

    frames (from byte 64)
      whole frames in the "danube-frames-v1" format (``danube/_pure/frame.py``),
      offsets consecutive from first_offset, nothing between them

    end of data
      the first all-zero 16-byte frame header (preallocated space and holes are zero), or
      the end of the file for a rotated (sealed) file, which is truncated to
      exactly header + frames

Writing: frames are copied (or encoded) into the mapping at the write
position, so they are in the page cache, and survive a crash of the process,
as soon as ``append`` returns; ``sync()`` (``fdatasync``) makes them survive a
crash of the machine.  A frame is visible to readers only after it has been
completely written (the writer publishes ``next_offset`` last).

Recovery: ``SegmentFile.open`` scans the frames with the codec's ``scan``,
keeps every whole, valid frame in offset sequence and zeroes everything after
the last one (a torn write, a corrupt frame, garbage), so the next append
continues right after the last good frame.  The sparse offset -> position
index (one entry at the first frame, then one every ``index_every`` bytes) is
rebuilt by the same scan.

Why mmap and not pwrite (``python bench/wal_io.py``, this 2-core box, loaded):
one 138-byte frame per write costs a system call with pwrite (73 MB/s) and a
copy with the mapping (184 MB/s, and far more from C, where the per-record
path runs); at 64 KiB and more the two are within the noise of the machine.
The mapping also lets readers take zero-copy views of stored frames.
"""

from __future__ import annotations

import errno
import mmap
import os
import struct
import sys
import time
from array import array
from bisect import bisect_right

from danube._pure import frame as frames
from danube._pure.frame import HEADER_SIZE
from danube.errors import (
    CorruptFrameError,
    CorruptStoredFrameError,
    FrameFormatError,
    WalClosedError,
    WalError,
)

_PAGE = mmap.PAGESIZE
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23 if sys.platform.startswith("linux") else None)
# cleared when the kernel lacks MADV_POPULATE_WRITE (Linux < 5.14)
_populate_write_ok = _MADV_POPULATE_WRITE is not None and hasattr(mmap.mmap, "madvise")

_BODY_LEN_AT = 12  # a frame's body_len field (danube/_pure/frame.py)
FILE_MAGIC = b"DNBWAL\x00\x01"
FILE_VERSION = 1
FILE_HEADER_SIZE = 64
_FILE_HEADER = struct.Struct("<8sIIQQQ")
_U32 = struct.Struct("<I")


def segment_file_name(seq: int) -> str:
    return f"wal-{seq:020d}.log"


def parse_segment_file_name(name: str) -> int | None:
    """The sequence number of a segment file name, or None for any other name."""
    if len(name) == 28 and name.startswith("wal-") and name.endswith(".log") and name[4:24].isdigit():
        return int(name[4:24])
    return None


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def encode_file_header(seq: int, first_offset: int, created_ms: int) -> bytes:
    head = _FILE_HEADER.pack(FILE_MAGIC, FILE_VERSION, FILE_HEADER_SIZE, seq, first_offset, created_ms)
    head += bytes(60 - len(head))
    return head + _U32.pack(frames.crc32c(head))


def decode_file_header(buf, path: str | None = None) -> tuple[int, int, int]:
    """``(seq, first_offset, created_ms)`` of a segment file header; raises on a bad header."""
    mv = memoryview(buf).cast("B")
    if len(mv) < FILE_HEADER_SIZE:
        raise CorruptStoredFrameError(
            "WAL file header truncated", position=0, offset=None, expected_crc=None, actual_crc=None, path=path
        )
    magic, version, header_size, seq, first_offset, created_ms = _FILE_HEADER.unpack_from(mv, 0)
    (stored,) = _U32.unpack_from(mv, 60)
    actual = frames.crc32c(mv[:60])
    if magic != FILE_MAGIC:
        raise CorruptStoredFrameError(
            "not a danube WAL file (bad magic)", position=0, offset=None, expected_crc=None, actual_crc=None, path=path
        )
    if stored != actual:
        raise CorruptStoredFrameError(
            "WAL file header checksum mismatch",
            position=0,
            offset=None,
            expected_crc=stored,
            actual_crc=actual,
            path=path,
        )
    if version != FILE_VERSION or header_size != FILE_HEADER_SIZE:
        raise CorruptStoredFrameError(
            f"unsupported WAL file version {version}",
            position=0,
            offset=None,
            expected_crc=None,
            actual_crc=None,
            path=path,
        )
    return seq, first_offset, created_ms


def preallocate(fd: int, size: int) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.ftruncate(fd, size)


def _release(mm) -> None:
    """Close a mapping unless readers still hold views of it (then it dies with the last view)."""
    if mm is not None:
        try:
            mm.close()
        except BufferError:
            pass


class SegmentFile:
    """One segment file: header, frames, sparse index; written through a shared mapping."""

    def __init__(
        self,
        path: str,
        fd: int,
        mm,
        *,
        seq: int,
        first_offset: int,
        created_ms: int,
        write_pos: int,
        count: int,
        writable: bool,
        index_every: int,
        index: list | None,
    ) -> None:
        self.path = path
        self._fd = fd
        self._mm = mm
        self.seq = seq
        self.first_offset = first_offset
        self.created_ms = created_ms
        self.write_pos = write_pos
        self.count = count
        self.writable = writable
        self.index_every = index_every
        self.capacity = len(mm)  # bytes the writer may fill: reserved on disk (<= map_size)
        self.map_size = len(mm)  # bytes mapped (the file's size; beyond capacity a hole)
        self._index_offsets = array("q")
        self._index_positions = array("q")
        self._last_indexed = -(1 << 62)
        self._indexed = index is not None
        self._valid_end = write_pos  # bytes known to hold valid frames (a lazy scan may lower it)
        self._trimmed = False  # trim() cut the preallocated tail already
        self.spare = False  # created by create_spare: header still zero until activate()
        if index is not None:
            self._load_index(index)

    # ------------------------------------------------------------ open / create

    @classmethod
    def create(
        cls,
        path: str,
        seq: int,
        first_offset: int,
        capacity: int,
        *,
        created_ms: int | None = None,
        index_every: int = 65536,
        reserve: int | None = None,
        read_around: bool = True,
    ) -> "SegmentFile":
        """A new file of ``capacity`` bytes: reserved whole (``reserve`` None), or sparse with
        only ``[0, reserve)`` allocated, which is then all the writer may fill until
        :meth:`reserve` grows it.  ``read_around`` False: compiled, the header's page is
        faulted in without the kernel's read-around (for the sync=never writer's prefault);
        a no-op here."""
        capacity = max(capacity, FILE_HEADER_SIZE + HEADER_SIZE)
        created_ms = now_ms() if created_ms is None else created_ms
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            mm, reserved = _create_space(fd, capacity, reserve)
            mm[0:FILE_HEADER_SIZE] = encode_file_header(seq, first_offset, created_ms)
        except BaseException:
            os.close(fd)
            raise
        seg = cls(
            path,
            fd,
            mm,
            seq=seq,
            first_offset=first_offset,
            created_ms=created_ms,
            write_pos=FILE_HEADER_SIZE,
            count=0,
            writable=True,
            index_every=index_every,
            index=[],
        )
        seg.capacity = reserved
        return seg

    def reserve(self, capacity: int) -> int:
        """Reserve disk up to ``capacity`` bytes (at most the mapped size) for the writer;
        returns the new capacity.  A full disk raises ``WalError`` here, before any store
        could touch an unallocated page (which would be a SIGBUS)."""
        if self._mm is None or not self.writable:
            raise WalClosedError(f"segment {self.path} is not writable")
        capacity = min(capacity, self.map_size)
        if capacity > self.capacity:
            try:
                _reserve_range(self._fd, self.capacity, capacity - self.capacity)
            except OSError as exc:
                raise WalError(
                    f"segment {self.path}: reserving disk up to {capacity} bytes failed: {exc.strerror}"
                ) from exc
            self.capacity = capacity
        return self.capacity

    @classmethod
    def create_spare(
        cls, path: str, seq: int, capacity: int, *, index_every: int = 65536, reserve: int | None = None
    ) -> "SegmentFile":
        """A preallocated file with an all-zero header, to become the active file later
        (:meth:`activate`); recovery deletes it while its header is still zero.  ``reserve``:
        as :meth:`create`."""
        capacity = max(capacity, FILE_HEADER_SIZE + HEADER_SIZE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            mm, reserved = _create_space(fd, capacity, reserve)
        except BaseException:
            os.close(fd)
            raise
        seg = cls(
            path,
            fd,
            mm,
            seq=seq,
            first_offset=0,
            created_ms=0,
            write_pos=FILE_HEADER_SIZE,
            count=0,
            writable=True,
            index_every=index_every,
            index=[],
        )
        seg.capacity = reserved
        seg.spare = True
        return seg

    def populate(self, end: int) -> None:
        """Take the write faults of ``[0, end)`` now (a spare, on a background thread), so the
        writer's first stores into the file do not.  The pages hold zeros, as before."""
        if self._mm is None or not self.spare:
            return
        for off in range(0, min(end, self.capacity), mmap.PAGESIZE):
            self._mm[off] = 0

    def rearm(self, ahead: int = 0) -> bool:
        """After a sync: take the write fault of the page holding the last frame's end (and of
        those up to ``ahead`` bytes past the write position) now, so the writer's next store there
        does not (the compiled docstring says why); True when done.  No byte changes."""
        global _populate_write_ok
        pos = self.write_pos
        mm = self._mm
        if mm is None or not self.writable or not _populate_write_ok:
            return False
        if pos % _PAGE == 0 and ahead <= 0:
            return False  # the write position starts a fresh page: nothing there was written back
        start = pos - pos % _PAGE
        stop = min(max(pos + ahead, start + 1), self.capacity)
        stop = (stop + _PAGE - 1) // _PAGE * _PAGE
        if stop <= start:
            return False
        try:
            mm.madvise(_MADV_POPULATE_WRITE, start, stop - start)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                _populate_write_ok = False
            return False
        except ValueError:  # closed meanwhile
            return False
        return True

    def activate(self, first_offset: int, created_ms: int | None = None) -> None:
        """Make a spare the next active file: write its header (into the mapping, no system call)."""
        if not self.spare or self._mm is None:
            raise WalError(f"segment {self.path} is not an unused spare")
        created_ms = now_ms() if created_ms is None else created_ms
        self._mm[0:FILE_HEADER_SIZE] = encode_file_header(self.seq, first_offset, created_ms)
        self.first_offset = first_offset
        self.created_ms = created_ms
        self.spare = False

    @classmethod
    def open(cls, path: str, *, index_every: int = 65536, writable: bool = False, trusted_count: int | None = None):
        """Open an existing file.

        With ``trusted_count`` (a rotated file the checkpoint describes) nothing is
        scanned now; the index is built on first read.  Otherwise the frames are
        scanned and a bad tail is zeroed.  Returns ``(segment, report)`` where the
        report is ``(scan_reason, trimmed_bytes)``; a file whose header is all zero
        (created, never written) gives ``(None, report)``.
        """
        fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, FILE_HEADER_SIZE, 0)
            if len(head) < FILE_HEADER_SIZE or not any(head):
                os.close(fd)
                return None, (frames.SCAN_ZERO, 0)
            seq, first_offset, created_ms = decode_file_header(head, path)
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
        except BaseException:
            try:
                os.close(fd)
            except OSError:
                pass
            raise
        if trusted_count is not None:
            seg = cls(
                path,
                fd,
                mm,
                seq=seq,
                first_offset=first_offset,
                created_ms=created_ms,
                write_pos=size,
                count=trusted_count,
                writable=False,
                index_every=index_every,
                index=None,
            )
            return seg, (frames.SCAN_END, 0)
        count, end, _first, _last, reason, index = frames.scan(mm, FILE_HEADER_SIZE, first_offset, index_every)
        trimmed = 0
        if reason != frames.SCAN_END:
            # after a zero header there may still be a body that reached the disk
            # without its header: clear it so no stale byte can ever follow new frames
            trimmed = _zero_tail(fd, mm, end, writable)
        seg = cls(
            path,
            fd,
            mm,
            seq=seq,
            first_offset=first_offset,
            created_ms=created_ms,
            write_pos=end,
            count=count,
            writable=writable,
            index_every=index_every,
            index=index,
        )
        if writable:
            # what is allocated beyond the data is unknown (a hole after a suspend or a growth in
            # steps): the writer gets the page after its data and reserves more before storing
            seg.capacity = min(size, -(-end // mmap.PAGESIZE) * mmap.PAGESIZE)
        return seg, (reason, trimmed)

    # ------------------------------------------------------------ state

    @property
    def next_offset(self) -> int:
        return self.first_offset + self.count

    @property
    def last_offset(self) -> int:
        return self.first_offset + self.count - 1

    @property
    def room(self) -> int:
        return self.capacity - self.write_pos

    @property
    def closed(self) -> bool:
        return self._mm is None

    def fileno(self) -> int:
        return self._fd

    def index_entries(self) -> list[tuple[int, int]]:
        self._ensure_index()
        return list(zip(self._index_offsets, self._index_positions))

    def _load_index(self, index) -> None:
        for off, pos in index:
            self._index_offsets.append(off)
            self._index_positions.append(pos)
            self._last_indexed = pos
        self._indexed = True

    # ------------------------------------------------------------ writing

    def write_frames(self, data, count: int) -> int:
        """Copy ``count`` whole stamped frames at the write position; return their position."""
        mv = memoryview(data).cast("B")
        n = len(mv)
        pos = self.write_pos
        if n > self.capacity - pos:
            raise WalError(f"segment {self.path} has {self.capacity - pos} bytes free, {n} needed")
        self._mm[pos : pos + n] = mv
        self._index_batch(pos, n)
        self.write_pos = pos + n
        self._valid_end = pos + n
        self.count += count
        return pos

    def _index_batch(self, pos: int, n: int) -> None:
        every = self.index_every
        if self.count == 0 or (every and pos + n - self._last_indexed > every):
            mm = self._mm
            p, end = pos, pos + n
            off = self.first_offset + self.count
            while p < end:
                if self._last_indexed < 0 or (every and p - self._last_indexed >= every):
                    self._index_offsets.append(off)
                    self._index_positions.append(p)
                    self._last_indexed = p
                (body_len,) = _U32.unpack_from(mm, p + _BODY_LEN_AT)
                p += HEADER_SIZE + body_len
                off += 1

    def drop_cache(self, start: int, end: int) -> int:
        """Drop the file's pages in ``[start, end)`` (whole pages inside it) from this process's
        mapping and from the OS page cache; return the bytes covered.  The bytes stay what
        they were (see the compiled twin)."""
        page = mmap.PAGESIZE
        first = (max(start, 0) + page - 1) // page * page
        stop = min(end, self.capacity)
        stop -= stop % page
        mm = self._mm
        if stop <= first or mm is None or self._fd < 0:
            return 0
        try:
            mm.madvise(mmap.MADV_DONTNEED, first, stop - first)
        except ValueError:  # closed meanwhile (pruned or sealed): nothing left to drop here
            return 0
        except OSError as exc:
            raise OSError(
                exc.errno, f"madvise(MADV_DONTNEED) of {self.path} [{first}, {stop}): {os.strerror(exc.errno)}"
            ) from None
        try:
            os.posix_fadvise(self._fd, first, stop - first, os.POSIX_FADV_DONTNEED)
        except OSError as exc:
            if exc.errno == errno.EBADF:
                return 0
            raise OSError(
                exc.errno, f"posix_fadvise(DONTNEED) of {self.path} [{first}, {stop}): {os.strerror(exc.errno)}"
            ) from None
        return stop - first

    def view(self, start: int, end: int) -> memoryview:
        if self._mm is None:
            raise WalClosedError(f"segment {self.path} is closed")
        return memoryview(self._mm)[start:end]

    def sync(self) -> None:
        if self._fd >= 0:
            os.fdatasync(self._fd)

    def trim(self, *, sync: bool) -> None:
        """Cut the preallocated tail (the file ends at the last frame), then fdatasync if
        ``sync``: the first half of :meth:`seal`, which a background thread runs apart."""
        if self._fd < 0:
            raise WalClosedError(f"segment {self.path} is closed")
        os.ftruncate(self._fd, self.write_pos)
        if sync:
            os.fdatasync(self._fd)
        self._trimmed = True

    def seal(self, *, sync: bool) -> None:
        """Trim the preallocated tail (unless :meth:`trim` did) and reopen read-only (rotation)."""
        if self._mm is None:
            return
        if not self._trimmed:
            self.trim(sync=sync)
        old = self._mm
        self._mm = mmap.mmap(self._fd, self.write_pos, mmap.MAP_SHARED, mmap.PROT_READ)
        _release(old)
        self.capacity = self.map_size = self.write_pos
        self.writable = False

    def close(self) -> None:
        mm, self._mm = self._mm, None
        _release(mm)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    # ------------------------------------------------------------ reading

    def _ensure_index(self) -> None:
        if self._indexed:
            return
        count, end, _f, _l, reason, index = frames.scan(self._mm, FILE_HEADER_SIZE, self.first_offset, self.index_every)
        self._load_index(index)
        self._valid_end = end
        self._scan_reason = reason

    def position_of(self, offset: int) -> int:
        """Byte position of the frame holding ``offset`` (which this file must hold)."""
        self._ensure_index()
        i = bisect_right(self._index_offsets, offset) - 1
        if i < 0:
            return -1
        mm = self._mm
        pos = self._index_positions[i]
        off = self._index_offsets[i]
        end = self._valid_end
        while off < offset:
            if pos + HEADER_SIZE > end:
                return -1
            (body_len,) = _U32.unpack_from(mm, pos + _BODY_LEN_AT)
            pos += HEADER_SIZE + body_len
            off += 1
        return pos if pos + HEADER_SIZE <= end else -1

    def read_frames(self, offset: int, max_bytes: int, limit_offset: int) -> memoryview:
        """Whole, validated frames from ``offset`` (at least one, then up to ``max_bytes``),
        stopping before ``limit_offset``; a zero-copy view of the mapping."""
        mm = self._mm
        if mm is None:
            raise WalClosedError(f"segment {self.path} is closed")
        pos = self.position_of(offset)
        if pos < 0:
            self._raise_corrupt(offset)
        end_limit = self._valid_end
        stop = min(limit_offset, self.next_offset)
        p, off = pos, offset
        while off < stop and p + HEADER_SIZE <= end_limit:
            (body_len,) = _U32.unpack_from(mm, p + _BODY_LEN_AT)
            nxt = p + HEADER_SIZE + body_len
            if nxt > end_limit or (nxt - pos > max_bytes and off > offset):
                break
            p = nxt
            off += 1
        if p == pos:
            self._raise_corrupt(offset)
        view = memoryview(mm)[pos:p]
        try:
            frames.validate(view, offset, True)
        except (CorruptFrameError, FrameFormatError) as exc:
            raise CorruptStoredFrameError(
                f"corrupt WAL data: {exc}",
                position=pos + (getattr(exc, "position", None) or 0),
                offset=getattr(exc, "offset", offset),
                expected_crc=getattr(exc, "expected_crc", None),
                actual_crc=getattr(exc, "actual_crc", None),
                path=self.path,
            ) from exc
        return view

    def _raise_corrupt(self, offset: int):
        raise CorruptStoredFrameError(
            "WAL file is corrupt before the requested offset",
            position=self._valid_end,
            offset=offset,
            expected_crc=None,
            actual_crc=None,
            path=self.path,
        )


def _reserve_range(fd: int, start: int, length: int) -> None:
    """Allocate ``[start, start + length)`` of a file already that long (a hole: zeros); a
    file system without ``posix_fallocate`` leaves it to writeback (as :func:`preallocate`)."""
    if length <= 0:
        return
    try:
        os.posix_fallocate(fd, start, length)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise


def _create_space(fd: int, size: int, reserve: int | None):
    """Size a new file and map it: ``(mapping, reserved bytes)``."""
    if reserve is None or reserve >= size:
        preallocate(fd, size)
        reserved = size
    else:
        reserved = max(reserve, FILE_HEADER_SIZE + HEADER_SIZE)
        os.ftruncate(fd, size)
        _reserve_range(fd, 0, reserved)
    return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE), reserved


def _data_end(fd: int, start: int, size: int) -> int:
    """End of the last data region in ``[start, size)`` (holes read as zeros and cannot hold
    a torn tail), ``start`` when there is none; ``size`` when the file system cannot tell."""
    pos = last = start
    try:
        while pos < size:
            d = os.lseek(fd, pos, os.SEEK_DATA)
            if d >= size:
                break
            h = os.lseek(fd, d, os.SEEK_HOLE)
            last = min(h, size)
            pos = h
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # ENXIO: no data after pos
            return size
    except AttributeError:  # no SEEK_DATA on this platform
        return size
    return last


def _zero_tail(fd: int, mm, end: int, writable: bool) -> int:
    """Zero every non-zero byte after ``end``; return how many bytes were cleared."""
    tail = mm[end : _data_end(fd, end, len(mm))]  # not the holes: a sparse 64 MiB tail is not read
    last = len(tail.rstrip(b"\x00"))
    if last == 0:
        return 0
    if writable:
        mm[end : end + last] = bytes(last)
        mm.flush(end - end % mmap.PAGESIZE, last + end % mmap.PAGESIZE)
    else:
        os.pwrite(fd, bytes(last), end)
        os.fdatasync(fd)
    return last


def rearm_many(files, ahead: int = 0) -> int:
    """:meth:`SegmentFile.rearm` of several files; how many were done (the compiled one releases
    the GIL once for all of them)."""
    return sum(1 for f in files if f.rearm(ahead))
