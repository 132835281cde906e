"""errors.quote and the status-message cap: client input travels back only as a short prefix."""

from __future__ import annotations

import grpc

from danube.errors import InvalidArgumentError, quote
from danube.server.status import MAX_MESSAGE_CHARS, message_for, status_for


def test_short_values_are_quoted_whole():
    assert quote("orders") == "'orders'"
    assert quote(b"\xff") == "b'\\xff'"


def test_long_values_keep_a_prefix_and_their_size():
    text = quote("é" * 1000)
    assert text == repr("é" * 64) + "…(2000 bytes)"
    assert quote(b"x" * 100, limit=4) == "b'xxxx'…(100 bytes)"


def test_a_status_message_is_capped_whatever_the_error_says():
    exc = InvalidArgumentError("bad name " + "x" * 100_000)
    message = message_for(exc)
    assert status_for(exc) == grpc.StatusCode.INVALID_ARGUMENT
    assert len(message) < MAX_MESSAGE_CHARS + 64 and message.endswith("(message cut, 100009 bytes)")
    assert message_for(InvalidArgumentError("short")) == "short"
    assert len(message_for(ValueError("v" * 50_000))) < MAX_MESSAGE_CHARS + 64
