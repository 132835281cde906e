"""check_batch: the publish path's one check of a producer's batch (validate's checks, then
check_fields' for the producer, then a writable copy), compiled against its pure twin and
against the two checks it stands for; only check_batch makes a CheckedFrames."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import danube._pure.frame as pure
from tests.support.frames import raw_frame
from tests.unit._core.test_check_fields import FRAME_SPEC

try:
    import danube._core.frame as compiled
except ImportError:
    pytest.skip("danube._core.frame not built", allow_module_level=True)

TWINS = [pytest.param(pure, id="pure"), pytest.param(compiled, id="compiled")]
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def outcome(codec, buf, producer_id):
    """What check_batch gives, or the error it raises (type and words)."""
    try:
        out = codec.check_batch(buf, producer_id)
    except Exception as exc:  # noqa: BLE001 - compared between the twins and with validate
        return type(exc).__name__, str(exc)
    assert type(out) is codec.CheckedFrames and isinstance(out, bytearray)
    return bytes(out), out.frame_count, out.nbytes, out.producer_id, out.fields_position, out.fields_problem


def expected(codec, buf, producer_id):
    """The same from validate and check_fields, the two checks check_batch stands for."""
    try:
        count = codec.validate(buf)[0]
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__, str(exc)
    position, problem = codec.check_fields(buf, producer_id)
    return bytes(buf), count, len(buf), producer_id, position, problem


@SETTINGS
@given(
    specs=st.lists(FRAME_SPEC, min_size=0, max_size=4),
    producer_id=st.sampled_from([1, 2]),
    cut=st.none() | st.integers(min_value=0, max_value=300),
    flips=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 255)), max_size=3),
)
def test_one_check_answers_as_validate_then_check_fields_in_both_twins(specs, producer_id, cut, flips):
    buf = bytearray(b"".join(raw_frame(key, attrs, producer_id=pid) for key, attrs, pid in specs))
    for at, value in flips:
        if at < len(buf):
            buf[at] = value
    if cut is not None:
        del buf[cut:]
    data = bytes(buf)
    want = expected(pure, data, producer_id)
    assert outcome(pure, data, producer_id) == want
    assert outcome(compiled, data, producer_id) == want
    assert outcome(compiled, memoryview(data), producer_id) == want


@pytest.mark.parametrize("codec", TWINS)
def test_a_big_batch_is_checked_and_copied_whole(codec):
    batch = codec.encode_payloads([b"x" * 1000] * 100, producer_id=3)  # past the no-GIL size
    out = codec.check_batch(batch, 3)
    assert (bytes(out), out.frame_count, out.fields_position) == (batch, 100, -1)
    out[0] = 1  # writable: the broker stamps it in place
    assert batch[0] == 0


@pytest.mark.parametrize("codec", TWINS)
def test_only_check_batch_makes_checked_frames(codec):
    batch = codec.encode_payloads([b"a"], producer_id=3)
    with pytest.raises(TypeError):
        codec.CheckedFrames(batch)
    with pytest.raises(TypeError):
        codec.CheckedFrames()
    with pytest.raises(TypeError):

        class Forged(codec.CheckedFrames):  # type: ignore[misc]
            pass


@pytest.mark.parametrize("codec", TWINS)
def test_a_producer_id_out_of_range_is_refused(codec):
    with pytest.raises(OverflowError):
        codec.check_batch(codec.encode_payloads([b"a"]), 2**64)
