"""Reading a stream's responses a batch at a time, whichever transport carries the call."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any


def batch_reader(call: Any) -> Callable[[], Awaitable[list]]:
    """A coroutine function returning the responses that have arrived ([] at the end, OK):
    the call's own ``read_batch`` on the HTTP/2 transport, one response of its async iteration
    per batch on grpc.aio's (as ``async for`` read them)."""
    read_batch = getattr(call, "read_batch", None)
    if read_batch is not None:
        return read_batch
    responses = call.__aiter__()

    async def one() -> list:
        try:
            return [await responses.__anext__()]
        except StopAsyncIteration:
            return []

    return one
