"""The WAL's page-cache window: what is dropped, what is kept, and that nothing is lost."""

from __future__ import annotations

import logging
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.errors import InvalidArgumentError
from danube.wal import Wal
from danube.wal.pagecache import MiB, PageCacheWindow, drop_step
from tests.support.pagecache import page_cache_droppable, resident_pages


class FakeSegment:
    """A segment's size and what was dropped of it, kept as the set of dropped byte ranges."""

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.write_pos = 64
        self.dropped: list[tuple[int, int]] = []
        self.fail: OSError | None = None

    def drop_cache(self, start: int, end: int) -> int:
        if self.fail is not None:
            raise self.fail
        self.dropped.append((start, end))
        return end - start

    def dropped_to(self) -> int:
        return max((e for _s, e in self.dropped), default=0)


def newer_bytes(segments, i) -> int:
    return sum(s.write_pos for s in segments[i + 1 :])


def test_step_is_an_eighth_of_the_window_within_1_to_8_mib():
    assert drop_step(0) == MiB
    assert drop_step(16 * MiB) == 2 * MiB
    assert drop_step(1024 * MiB) == 8 * MiB


@settings(max_examples=200, deadline=None)
@given(
    keep=st.integers(0, 6 * MiB),
    moves=st.lists(st.one_of(st.integers(1, 3 * MiB), st.just("rotate")), min_size=1, max_size=40),
)
def test_the_newest_bytes_stay_and_the_rest_goes_behind_them(keep, moves):
    window = PageCacheWindow(keep)
    segments = [FakeSegment(1)]
    for move in moves:
        if move == "rotate":
            segments.append(FakeSegment(segments[-1].seq + 1))
        else:
            segments[-1].write_pos += move
        ran = (
            window._last is None
            or window._last[0] != segments[-1].seq
            or segments[-1].write_pos - window._last[1] >= window.step_bytes
        )
        window.trim(segments)
        for i, seg in enumerate(segments):
            keep_from = seg.write_pos - max(0, keep - newer_bytes(segments, i))
            # never a byte of the window, never a range twice
            assert seg.dropped_to() <= max(keep_from, 0)
            ends = [e for _s, e in seg.dropped]
            assert ends == sorted(ends) and len(set(ends)) == len(ends)
            if ran and seg is not segments[-1]:
                assert seg.dropped_to() == max(keep_from, 0)  # a rotated file: dropped up to the window
        if ran:
            head = segments[-1]
            assert head.write_pos - max(0, keep) - head.dropped_to() < window.step_bytes or keep >= head.write_pos
    assert window.dropped_bytes == sum(e - s for seg in segments for s, e in seg.dropped)


def test_a_refused_drop_stops_trimming_with_one_warning(caplog):
    window = PageCacheWindow(0)
    seg = FakeSegment(1)
    seg.write_pos = 4 * MiB
    seg.fail = OSError(22, "Invalid argument")
    with caplog.at_level(logging.WARNING, logger="danube.wal"):
        assert window.trim([seg]) == 0
        seg.write_pos += 4 * MiB
        assert window.trim([seg]) == 0
    assert window.failed is seg.fail
    assert [r.message for r in caplog.records if "page-cache" in r.message] and len(caplog.records) == 1


@pytest.mark.parametrize("value", [-1, 1.5, "big"])
def test_bad_window_is_refused(tmp_path, value):
    with pytest.raises(InvalidArgumentError, match="page_cache_bytes"):
        Wal.open(tmp_path / "wal", page_cache_bytes=value)


@pytest.mark.parametrize("keep", [2 * MiB, None])
def test_a_wal_keeps_only_its_window_cached_and_reads_back_everything(tmp_path, open_wal, keep):
    if not page_cache_droppable(tmp_path):
        pytest.skip("the temp dir is on tmpfs: its pages are the file")
    wal = open_wal(tmp_path / "wal", sync="always", max_file_bytes=MiB, cache_bytes=256 * 1024, page_cache_bytes=keep)
    payloads = [bytes([i % 251]) * 100 for i in range(1000)]
    batches = 80  # ~8.6 MB over about nine 1 MiB files
    for _ in range(batches):
        wal.append_batch(payloads)  # outside an event loop, sync=always syncs inline
    wal.finish_rotations(10)
    rotated = [f.path for f in wal.rotated_files()]  # oldest first; then the active file
    assert len(rotated) >= 7
    cached = [resident_pages(f) * 4096 for f in rotated + [wal._writer.segment.path]]
    if keep is None:  # control: without a window, everything written stays cached
        assert wal.page_cache is None
        assert sum(cached[:-1]) >= sum(os.path.getsize(f) for f in rotated) * 0.9
    else:
        assert wal.page_cache.dropped_bytes >= sum(os.path.getsize(f) for f in rotated) - keep - 2 * MiB
        # files more than the window behind: gone but for their last, partial page and another
        assert max(cached[:-4]) <= 2 * 4096
        assert sum(cached[-3:]) >= keep * 0.5  # the window: still cached
    records = wal.read(wal.first_offset)
    assert len(records) == batches * len(payloads)
    assert [r.payload for r in records[:1000]] == payloads and [r.payload for r in records[-1000:]] == payloads


@settings(max_examples=200, deadline=None)
@given(
    keep=st.integers(0, 6 * MiB),
    moves=st.lists(st.one_of(st.integers(1, 3 * MiB), st.just("rotate")), min_size=1, max_size=40),
)
def test_due_is_false_only_when_a_trim_would_drop_nothing(keep, moves):
    """The sync path asks ``due`` before calling ``trim`` (a round asks it of every log): a log
    that skips the call whenever it is not due drops exactly what one calling it every time does."""
    always, asked = PageCacheWindow(keep), PageCacheWindow(keep)
    segs_a, segs_b = [FakeSegment(0)], [FakeSegment(0)]
    for move in moves:
        for segs in (segs_a, segs_b):
            if move == "rotate":
                segs.append(FakeSegment(segs[-1].seq + 1))
            else:
                segs[-1].write_pos += move
        dropped_a = always.trim(segs_a)
        due = asked.due(segs_b[-1])
        dropped_b = asked.trim(segs_b) if due else 0
        assert dropped_a == dropped_b
        if not due:
            assert dropped_a == 0
    assert [s.dropped for s in segs_a] == [s.dropped for s in segs_b]
