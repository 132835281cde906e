import grpc
import pytest

from danube import errors
from danube.server.status import message_for, status_for

C = grpc.StatusCode


@pytest.mark.parametrize(
    "exc, code",
    [
        (errors.NotFoundError("unknown producer id 1"), C.NOT_FOUND),
        (errors.InvalidArgumentError("bad"), C.INVALID_ARGUMENT),
        (errors.InvalidTopicNameError("bad topic"), C.INVALID_ARGUMENT),
        (errors.MessageTooLargeError("too big"), C.INVALID_ARGUMENT),
        (errors.AlreadyExistsError("exists"), C.ALREADY_EXISTS),
        (errors.PolicyViolationError("limit"), C.RESOURCE_EXHAUSTED),
        (errors.NotServedHereError("moved"), C.UNAVAILABLE),
        (errors.TopicSealedError("sealed"), C.UNAVAILABLE),
        (errors.FencedError("stale version"), C.FAILED_PRECONDITION),
        (errors.FrameFormatError("bad flags"), C.INVALID_ARGUMENT),
        (
            errors.CorruptFrameError("checksum mismatch", position=0, offset=None, expected_crc=1, actual_crc=2),
            C.INVALID_ARGUMENT,
        ),
        (
            errors.CorruptStoredFrameError(
                "checksum mismatch", position=0, offset=3, expected_crc=1, actual_crc=2, path="/data/wal.log"
            ),
            C.DATA_LOSS,
        ),
        (errors.OffsetOutOfRangeError("gone", offset=1, first_offset=5, next_offset=9), C.OUT_OF_RANGE),
        (errors.SegmentCorruptError("etag", segment_id="s"), C.DATA_LOSS),
        (errors.StorageError("disk full"), C.UNAVAILABLE),  # retriable
        (errors.WalError("broken"), C.INTERNAL),  # not retriable
        (RuntimeError("bug"), C.INTERNAL),
    ],
)
def test_status_codes(exc, code):
    assert status_for(exc) == code


def test_messages_are_the_error_sentences():
    assert (
        message_for(errors.NotFoundError("unknown producer id 7: create the producer first"))
        == "unknown producer id 7: create the producer first"
    )
    assert message_for(RuntimeError("boom")) == "internal error: RuntimeError: boom"
    assert "stored crc 0x00000001" in message_for(
        errors.CorruptFrameError("checksum mismatch", position=0, offset=None, expected_crc=1, actual_crc=2)
    )
