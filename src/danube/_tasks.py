"""Small asyncio helpers shared by every layer."""

from __future__ import annotations

import asyncio


def wake(waiter: asyncio.Future) -> None:
    """Resolve a waiter future with ``None`` unless it is already done (woken before, or cancelled)."""
    if not waiter.done():
        waiter.set_result(None)


async def cancel_and_wait(task: asyncio.Task | None) -> None:
    """Cancel ``task`` and wait for it to finish.

    The task's own CancelledError is absorbed, but if the caller is itself being
    cancelled while it waits, that cancellation propagates instead of being lost.
    """
    if task is None or task.done():
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
