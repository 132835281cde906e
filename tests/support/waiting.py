"""Polling waits for tests: one synchronous and one asynchronous ``wait_until``.

Both return the predicate's first truthy result and fail with an AssertionError naming ``what`` when
``timeout`` seconds pass first, so a failed wait reads as a failed assertion, not a crash. Prefer an
event or an injected clock where the code under test offers one; poll where it does not.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any


def wait_until(
    predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition", interval: float = 0.05
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(interval)


async def async_wait_until(
    predicate: Callable[[], Any | Awaitable[Any]],
    timeout: float = 10.0,
    what: str = "condition",
    interval: float = 0.05,
    in_thread: bool = False,
) -> Any:
    """``predicate`` may be a plain function, a coroutine function, or (``in_thread=True``) a blocking
    function that is run off the event loop."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = await asyncio.to_thread(predicate) if in_thread else predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        await asyncio.sleep(interval)
