"""Answering durability waiters from the WAL's sync threads: one hand-off per event loop.

A sync round may answer waiters of many logs on one event loop; each ``call_soon_threadsafe``
wakes that loop through its self-pipe, so the answers for one loop go in one call.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

log = logging.getLogger("danube.wal")

# called with None once an offset is durable, or with the error that keeps it from becoming so
DurableCallback = Callable[[BaseException | None], object]


def _set(fut: asyncio.Future, exc: BaseException | None) -> None:
    if not fut.done():
        if exc is None:
            fut.set_result(None)
        else:
            fut.set_exception(exc)


def _set_all(futures: list[asyncio.Future], exc: BaseException | None) -> None:
    for fut in futures:
        _set(fut, exc)


def _call_all(callbacks: list["DurableCallback"], exc: BaseException | None) -> None:
    for fn in callbacks:
        try:
            fn(exc)
        except Exception:  # noqa: BLE001 - one waiter's bug must not keep the others waiting
            log.exception("WAL: a durability callback failed")


def call_back(waiters: list, exc: BaseException | None) -> None:
    """Call ``(loop, callback)`` pairs with ``exc`` from any thread, each on its loop in a later
    turn (never inside the caller's): one hand-off per event loop, not one per callback (each
    ``call_soon_threadsafe`` wakes the loop through its self-pipe)."""
    if not waiters:
        return
    by_loop: dict[asyncio.AbstractEventLoop, list[DurableCallback]] = {}
    for loop, fn in waiters:
        by_loop.setdefault(loop, []).append(fn)
    running = asyncio._get_running_loop()
    for loop, callbacks in by_loop.items():
        try:
            if running is loop:
                loop.call_soon(_call_all, callbacks, exc)
            else:
                loop.call_soon_threadsafe(_call_all, callbacks, exc)
        except RuntimeError:  # the waiters' loop is closed; nobody is left to call
            pass


def resolve_futures(waiters, exc: BaseException | None) -> None:
    """Resolve ``(loop, future)`` pairs from any thread: one hand-off per event loop, not one per
    future (each ``call_soon_threadsafe`` wakes the loop through its self-pipe)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future]] = {}
    for loop, fut in waiters:
        by_loop.setdefault(loop, []).append(fut)
    running = asyncio._get_running_loop()
    for loop, futures in by_loop.items():
        try:
            if running is loop:
                _set_all(futures, exc)
            else:
                loop.call_soon_threadsafe(_set_all, futures, exc)
        except RuntimeError:  # the waiters' loop is closed; nobody is left to wake
            pass
