"""The consumer's inbox: waiters are woken in order, timed out or cancelled ones leave no trace, and a
wake-up never formats a future's repr (the old code paid for one on every delivery)."""

from __future__ import annotations

import asyncio

from danube.client.consumer_inbox import TIMEOUT, Inbox


class _NoReprFuture(asyncio.Future):
    def __repr__(self) -> str:  # a failed deque.remove(waiter) would call this for its ValueError
        raise AssertionError("the inbox formatted a waiter's repr")


def _no_repr_futures(loop: asyncio.AbstractEventLoop) -> None:
    loop.create_future = lambda: _NoReprFuture(loop=loop)


async def test_a_woken_getter_takes_the_item_and_leaves_no_waiter():
    _no_repr_futures(asyncio.get_running_loop())
    inbox = Inbox()
    getter = asyncio.ensure_future(inbox.get(timeout=5))
    await asyncio.sleep(0)
    assert len(inbox._waiters) == 1
    inbox.put_nowait("a")
    assert await getter == "a"
    assert not inbox._waiters


async def test_a_timed_out_getter_leaves_no_waiter():
    _no_repr_futures(asyncio.get_running_loop())
    inbox = Inbox()
    assert await inbox.get(timeout=0.01) is TIMEOUT
    assert not inbox._waiters
    inbox.put_nowait("b")
    assert await inbox.get(timeout=0.01) == "b"


async def test_a_cancelled_getter_leaves_the_item_for_the_next():
    _no_repr_futures(asyncio.get_running_loop())
    inbox = Inbox()
    first = asyncio.ensure_future(inbox.get())
    second = asyncio.ensure_future(inbox.get())
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.sleep(0)
    inbox.put_nowait("c")
    assert await asyncio.wait_for(second, 1) == "c"
    assert first.cancelled()
    assert not inbox._waiters
