"""The compiled ring cache against its pure-Python twin."""

from __future__ import annotations

import importlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube._pure import frame as pure_frame
from danube._pure import ring as pure_ring

try:
    core_ring = importlib.import_module("danube._core.ring")
except ImportError:  # pragma: no cover - the suite's conftest reports missing modules
    core_ring = None

IMPLS = [pure_ring] + ([core_ring] if core_ring else [])


def _batch(first, sizes):
    return pure_frame.encode_payloads([b"x" * s for s in sizes], base_offset=first)


@pytest.mark.parametrize("impl", IMPLS, ids=lambda m: m.__name__)
def test_reads_whole_frames_by_offset(impl):
    ring = impl.FrameRing(1 << 20, chunk_bytes=4096, next_offset=10)
    assert ring.append(_batch(10, [10, 20, 30]), 10) == 3
    assert ring.read(9, 100) is None and ring.read(14, 100) is None
    assert len(ring.read(13, 100)) == 0
    view = ring.read(11, 1 << 20)
    assert [r.offset for r in pure_frame.iter_records(view)] == [11, 12]
    one = ring.read(10, 1)  # over budget: still one whole frame
    assert [r.offset for r in pure_frame.iter_records(one)] == [10]


@pytest.mark.parametrize("impl", IMPLS, ids=lambda m: m.__name__)
def test_eviction_keeps_views_valid(impl):
    ring = impl.FrameRing(8192, chunk_bytes=4096)
    ring.append(_batch(0, [1000, 1000, 1000]), 0)
    held = ring.read(0, 1 << 20)
    before = bytes(held)
    for i in range(3, 30, 3):
        ring.append(_batch(i, [1000, 1000, 1000]), i)
    assert ring.size_bytes <= 8192 + 4096 and ring.first_offset > 0
    assert ring.read(0, 100) is None
    assert bytes(held) == before  # the dropped chunk lives on in the reader's view


@pytest.mark.parametrize("impl", IMPLS, ids=lambda m: m.__name__)
def test_disabled_and_reset(impl):
    ring = impl.FrameRing(0)
    assert ring.append(_batch(5, [1, 2]), 5) == 2
    assert ring.next_offset == 7 and ring.read(5, 100) is None
    ring = impl.FrameRing(1 << 16)
    ring.append(_batch(0, [1]), 0)
    ring.append(_batch(100, [1]), 100)  # not continuing: starts over
    assert ring.first_offset == 100 and ring.read(0, 10) is None


@pytest.mark.skipif(core_ring is None, reason="compiled ring not built")
@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(0, 20000),
    chunk=st.integers(64, 6000),
    batches=st.lists(st.lists(st.integers(0, 900), min_size=1, max_size=8), min_size=1, max_size=25),
    budgets=st.lists(st.integers(1, 5000), min_size=1, max_size=4),
)
def test_compiled_matches_pure(capacity, chunk, batches, budgets):
    rings = [impl.FrameRing(capacity, chunk_bytes=chunk) for impl in (pure_ring, core_ring)]
    offset = 0
    for sizes in batches:
        data = _batch(offset, sizes)
        counts = [r.append(data, offset) for r in rings]
        assert counts[0] == counts[1] == len(sizes)
        offset += len(sizes)
        assert rings[0].first_offset == rings[1].first_offset
        assert rings[0].size_bytes == rings[1].size_bytes
        for o in range(max(0, offset - 12), offset + 1):
            for b in budgets:
                got = [r.read(o, b) for r in rings]
                assert (got[0] is None) == (got[1] is None)
                if got[0] is not None:
                    assert bytes(got[0]) == bytes(got[1])
                    counted = [r.read_counted(o, b) for r in rings]
                    assert [bytes(v) for v, _ in counted] == [bytes(got[0])] * 2
                    assert counted[0][1] == counted[1][1] == pure_ring.count_frames(got[0])
    data = _batch(0, [3, 4, 5])
    assert pure_ring.count_frames(data) == core_ring.count_frames(data) == 3


@pytest.mark.parametrize("impl", IMPLS, ids=lambda m: m.__name__)
def test_references_contiguous_appends_without_copying(impl):
    source = bytearray(_batch(0, [10, 20]) + _batch(2, [30]) + _batch(3, [5, 5, 5]))
    n1, n2 = len(_batch(0, [10, 20])), len(_batch(2, [30]))
    ring = impl.FrameRing(1 << 20, chunk_bytes=1 << 16)
    assert ring.append_from(source, 0, n1, 0, 2) == 2
    assert ring.append_from(source, n1, n2, 2) == 1
    assert ring.append_from(source, n1 + n2, -1, 3) == 3
    assert ring.chunk_count == 1 and ring.size_bytes == len(source)  # one span, extended in place
    view, count = ring.read_counted(1, 1 << 20)
    assert count == 5 and bytes(view) == bytes(source[len(_batch(0, [10])) :])
    source[-1] = ord("y")
    assert bytes(view)[-1] == ord("y")  # the very bytes of the source: no copy was made
    with pytest.raises(BufferError):
        source.append(0)  # the referenced buffer cannot move while the ring holds it
    with pytest.raises(ValueError):
        ring.append_from(source, len(source), 10, 6)


def _bad_key_frame() -> bytes:
    """A whole frame whose routing key is not UTF-8 (one no subscriber can decode)."""
    from tests.unit._core.test_check_fields import raw_frame

    return raw_frame(b"\xff\xfe", [])


@pytest.mark.parametrize("impl", IMPLS, ids=lambda m: m.__name__)
def test_read_deliverable_cuts_by_messages_and_bytes(impl):
    ring = impl.FrameRing(1 << 20, chunk_bytes=1 << 16, next_offset=10)
    first = bytes(_batch(10, [10, 20, 30]))
    source = first + bytes(_batch(13, [5, 5]))  # (one source: the two batches in one span)
    ring.append_from(source, 0, len(first), 10, 3)
    ring.append_from(source, len(first), -1, 13, 2)
    view, count = ring.read_deliverable(11, 3, 1 << 20)  # across the two batches, by messages
    assert count == 3 and [r.offset for r in pure_frame.iter_records(view)] == [11, 12, 13]
    view, count = ring.read_deliverable(10, 100, 1)  # over budget: still one whole frame
    assert count == 1 and [r.offset for r in pure_frame.iter_records(view)] == [10]
    view, count = ring.read_deliverable(13, 100, 1 << 20)
    assert count == 2 and bytes(view) == bytes(_batch(13, [5, 5]))
    # not at hand: at the end, beyond it, before the ring, no message credit
    assert ring.read_deliverable(15, 5, 100) is None
    assert ring.read_deliverable(16, 5, 100) is None
    assert ring.read_deliverable(9, 5, 100) is None
    assert ring.read_deliverable(10, 0, 100) is None


@pytest.mark.parametrize("impl", IMPLS, ids=lambda m: m.__name__)
def test_read_deliverable_refuses_a_cut_holding_an_undecodable_frame(impl):
    good, bad = bytes(_batch(0, [4])), _bad_key_frame()
    ring = impl.FrameRing(1 << 20)
    ring.append(good + bad + bytes(_batch(2, [4])), 0)  # (one span: a read may cover all three)
    assert ring.read_deliverable(0, 1, 1 << 20) == (ring.read(0, 1), 1)  # the cut ends before it
    assert ring.read_deliverable(0, 2, 1 << 20) is None
    assert ring.read_deliverable(1, 1, 1 << 20) is None
    view, count = ring.read_deliverable(2, 5, 1 << 20)
    assert count == 1 and [r.offset for r in pure_frame.iter_records(view)] == [2]


@pytest.mark.skipif(core_ring is None, reason="compiled ring not built")
@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(0, 20000),
    chunk=st.integers(64, 6000),
    batches=st.lists(st.lists(st.integers(0, 900), min_size=1, max_size=8), min_size=1, max_size=20),
    bad=st.sets(st.integers(0, 60), max_size=3),
    limits=st.lists(st.tuples(st.integers(0, 12), st.integers(1, 5000)), min_size=1, max_size=4),
)
def test_read_deliverable_compiled_matches_pure(capacity, chunk, batches, bad, limits):
    rings = [impl.FrameRing(capacity, chunk_bytes=chunk) for impl in (pure_ring, core_ring)]
    offset = 0
    for sizes in batches:
        frames = b"".join(
            _bad_key_frame() if offset + i in bad else bytes(_batch(offset + i, [s])) for i, s in enumerate(sizes)
        )
        for r in rings:
            r.append(frames, offset, len(sizes))
        offset += len(sizes)
        for o in range(max(0, offset - 12), offset + 2):
            for messages, nbytes in limits:
                got = [r.read_deliverable(o, messages, nbytes) for r in rings]
                assert (got[0] is None) == (got[1] is None), (o, messages, nbytes)
                if got[0] is not None:
                    assert bytes(got[0][0]) == bytes(got[1][0]) and got[0][1] == got[1][1]
                    view, count = got[0]
                    assert 1 <= count <= messages and pure_ring.count_frames(view) == count
                    assert not bad.intersection(range(o, o + count))
                    # the same cut a read and the frame codec's cut make
                    whole = rings[0].read(o, nbytes)
                    assert bytes(view) == bytes(whole[: pure_frame.frames_within(whole, messages, nbytes)[0]])
