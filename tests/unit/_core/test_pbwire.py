"""The hand-written ``ConsumeResponse`` of a delivery (compiled and pure twin) against
protobuf's own serialization, byte for byte, and against the batch lane's older encoding."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import danube._pure.pbwire as pure
from danube.proto.danube_batch import batch_pb2 as pb
from danube.server.batch_lane_wire import encoded_batch, encoded_delivery
from danube.server.h2grpc.wire import Encoded

try:
    import danube._core.pbwire as compiled
except ImportError:  # (the pure run: the twin is checked alone)
    compiled = None

IMPLS = [pure] if compiled is None else [pure, compiled]
# offsets near every varint length boundary, and anywhere in uint64
U64 = st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 127, 128, 16383, 16384, 2**21, 2**63, 2**64 - 1]))
U32 = st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 127, 128, 2**32 - 1]))
FRAMES = st.one_of(st.binary(max_size=300), st.integers(0, 20_000).map(bytes))


@settings(max_examples=300, deadline=None)
@given(frames=FRAMES, first=U64, last=U64, count=U32)
def test_a_delivery_is_written_as_protobuf_writes_it(frames, first, last, count):
    want = pb.ConsumeResponse(
        batch=pb.ConsumeBatch(frames=frames, first_offset=first, last_offset=last, count=count)
    ).SerializeToString()
    for impl in IMPLS:
        head, shared, rest = impl.consume_batch(memoryview(frames), first, last, count)
        assert bytes(shared) == frames and isinstance(head, bytes) and isinstance(rest, bytes)
        if frames:
            assert head + frames + rest == want
        else:  # (never a delivery: the frames field is written all the same, as the lane always did)
            assert head + rest == b"\x12" + bytes((len(want),)) + b"\x0a\x00" + want[2:]
    # the batch lane's encoding: the same parts as before, the frames' buffer itself in the middle
    view = memoryview(frames)
    new, old = (
        encoded_delivery(view, first, last, count),
        encoded_batch(view, pb.ConsumeBatch(first_offset=first, last_offset=last, count=count).SerializeToString()),
    )
    assert type(new) is Encoded and new[1] is view
    assert [bytes(p) for p in new] == [bytes(p) for p in old]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("args", [(-1, 0, 1), (0, 2**64, 1), (0, 0, 2**32), (0, 0, -1)])
def test_a_number_out_of_its_field_range_is_refused(impl, args):
    with pytest.raises(OverflowError):
        impl.consume_batch(b"x", *args)


@settings(max_examples=200, deadline=None)
@given(frames=FRAMES, first=U64, last=U64, count=U32)
def test_a_delivery_made_as_the_servers_encoded_holds_the_same_parts(frames, first, last, count):
    view = memoryview(frames)
    for impl in IMPLS:
        got = impl.consume_batch_as(Encoded, view, first, last, count)
        assert type(got) is Encoded and len(got) == 3 and got[1] is view
        assert list(got) == list(pure.consume_batch(view, first, last, count))
        assert got.tobytes() == b"".join(pure.consume_batch(view, first, last, count))


@pytest.mark.parametrize("impl", IMPLS)
def test_a_delivery_as_anything_but_a_tuple_subclass_is_refused(impl):
    for cls in (tuple, list, bytes, int):
        with pytest.raises(TypeError):
            impl.consume_batch_as(cls, b"x", 1, 2, 1)
    with pytest.raises(OverflowError):
        impl.consume_batch_as(Encoded, b"x", -1, 2, 1)


@pytest.mark.skipif(compiled is None, reason="the compiled core is not built")
def test_the_compiled_delivery_holds_one_reference_to_the_shared_frames_and_frees_it():
    import gc
    import sys

    frames = bytearray(b"y" * 64)
    before = sys.getrefcount(frames)
    made = [compiled.consume_batch_as(Encoded, frames, 5, 6, 2) for _ in range(1000)]
    assert sys.getrefcount(frames) == before + 1000
    parts = [compiled.consume_batch(frames, 5, 6, 2) for _ in range(1000)]
    assert sys.getrefcount(frames) == before + 2000
    del made, parts
    gc.collect()
    assert sys.getrefcount(frames) == before
