"""The client's status → error mapping is the inverse of the server's (danube.server.status)."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import pkgutil

import grpc
import pytest

import danube
from danube import errors
from danube.client.errors import error_class, from_batch_status
from danube.server.status import error_class_for, status_for

C = grpc.StatusCode

# Keyword arguments for the classes whose constructor needs more than a message.
_KWARGS = {
    "position": 0,
    "offset": 7,
    "expected_crc": 1,
    "actual_crc": 2,
    "path": "/data/wal",
    "segment_id": "seg",
    "first_offset": 0,
    "next_offset": 9,
}


def all_error_classes() -> list[type[errors.DanubeError]]:
    # every module first: the classes found must not depend on what other test files imported
    for module in pkgutil.walk_packages(danube.__path__, "danube."):
        with contextlib.suppress(ImportError):  # an optional dependency that is not installed
            importlib.import_module(module.name)
    found, todo = [], [errors.DanubeError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return sorted(set(found), key=lambda c: c.__qualname__)


def make(cls: type[errors.DanubeError]) -> errors.DanubeError:
    params = inspect.signature(cls.__init__).parameters
    kwargs = {name: _KWARGS[name] for name, p in params.items() if p.kind is p.KEYWORD_ONLY and p.default is p.empty}
    return cls("boom", **kwargs)


@pytest.mark.parametrize("cls", all_error_classes(), ids=lambda c: c.__name__)
def test_every_error_survives_the_round_trip(cls):
    original = make(cls)
    code = status_for(original)
    back = from_batch_status(code.value[0], str(original), original.retriable)
    assert status_for(back) == code  # the client's error means what the server's did
    assert back.retriable == original.retriable
    assert back.grpc_code == code
    assert str(original) in str(back)


def test_codes_become_the_first_class_the_server_maps_to_them():
    assert error_class(C.INVALID_ARGUMENT) is errors.InvalidArgumentError
    assert error_class(C.NOT_FOUND) is errors.NotFoundError
    assert error_class(C.UNAVAILABLE) is errors.NotServedHereError
    assert error_class(C.DATA_LOSS) is errors.DataLossError
    assert error_class(C.OUT_OF_RANGE) is errors.OffsetOutOfRangeError
    assert error_class(C.FAILED_PRECONDITION) is errors.FencedError
    assert error_class(C.ABORTED) is errors.FencedError  # other peers' word for it
    assert error_class(C.INTERNAL) is errors.ClientError
    assert error_class(C.DEADLINE_EXCEEDED) is errors.ClientError


def test_every_code_the_server_sends_comes_back_to_itself():
    for code in C:
        cls = error_class_for(code)
        if cls is not None:
            assert status_for(cls("x")) == code


@pytest.mark.parametrize("codec", ["danube._pure.walfile", "danube._core.walfile"])
def test_a_damaged_wal_file_is_lost_data_on_both_sides(codec):
    walfile = pytest.importorskip(codec)
    with pytest.raises(errors.CorruptStoredFrameError) as info:
        walfile.decode_file_header(b"NOTAWAL!" + bytes(120), "/data/wal-1.log")
    code = status_for(info.value)
    assert code == C.DATA_LOSS  # a client's bad frame, a plain CorruptFrameError, is INVALID_ARGUMENT
    assert isinstance(from_batch_status(code.value[0], str(info.value), False), errors.DataLossError)
