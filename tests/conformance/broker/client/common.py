"""What the ported Danube broker tests share (Danube's ``test_utils.rs`` and the helpers each
test file repeats), for the danube-client venv."""

import asyncio
import itertools
import os

from danube_admin import AdminClient

from danube import DanubeClientBuilder, DispatchStrategy, SubType

_seq = itertools.count()


class Ctx:
    """One broker (or cluster) under test: its URLs, a run id for unique names, the timeout scale."""

    def __init__(self, url: str, admin_url: str, run_id: str, scale: float) -> None:
        self.url = url
        self.admin_url = admin_url
        self.run_id = run_id
        self.scale = scale
        self.admin = AdminClient(admin_url)

    async def client(self):
        """Danube's ``setup_client``: a client of the broker under test."""
        return await DanubeClientBuilder().service_url(self.url).build()

    def unique_topic(self, prefix: str) -> str:
        """Danube's ``unique_topic``: the prefix and a suffix no other test of the run has."""
        return f"{prefix}-{self.run_id}-{next(_seq)}"

    def t(self, seconds: float) -> float:
        """A Danube timeout scaled for a loaded 2-core machine (a wait for something to happen;
        a wait that must see nothing keeps Danube's length)."""
        return seconds * self.scale

    async def close(self) -> None:
        await self.admin.close()


async def recv(queue: asyncio.Queue, seconds: float, what: str = "a message"):
    """The next message, or an AssertionError naming what did not arrive."""
    try:
        return await asyncio.wait_for(queue.get(), seconds)
    except asyncio.TimeoutError:
        raise AssertionError(f"expected {what} within {seconds:.1f}s") from None


async def nothing_within(queue: asyncio.Queue, seconds: float):
    """None if nothing arrives within ``seconds``, else the message that did."""
    try:
        return await asyncio.wait_for(queue.get(), seconds)
    except asyncio.TimeoutError:
        return None


async def producer(
    client,
    topic: str,
    name: str,
    *,
    reliable: bool = False,
    partitions: int = 0,
    subject: str | None = None,
    version: int | None = None,
    min_version: int | None = None,
):
    b = client.new_producer().with_topic(topic).with_name(name)
    if reliable:
        b = b.with_dispatch_strategy(DispatchStrategy.RELIABLE)
    if partitions:
        b = b.with_partitions(partitions)
    if version is not None:
        b = b.with_schema_version(subject, version)
    elif min_version is not None:
        b = b.with_schema_min_version(subject, min_version)
    elif subject is not None:
        b = b.with_schema_subject(subject)
    p = b.build()
    await p.create()
    return p


async def consumer(
    client,
    topic: str,
    name: str,
    subscription: str,
    sub_type: SubType = SubType.EXCLUSIVE,
    key_filters: list[str] | None = None,
):
    b = (
        client.new_consumer()
        .with_topic(topic)
        .with_consumer_name(name)
        .with_subscription(subscription)
        .with_subscription_type(sub_type)
    )
    if key_filters:
        b = b.with_key_filters(key_filters)
    c = b.build()
    await c.subscribe()
    return c


def blob(size: int = 100 * 1024) -> bytes:
    """Stands in for Danube's 100 KiB ``tests/test.blob``: the same size, fixed content."""
    return (bytes(range(256)) * (size // 256 + 1))[:size] if size else os.urandom(0)


def fan_in(named_consumers, sink: asyncio.Queue, ack: bool = True) -> list:
    """Forward every message of each ``(name, consumer, stream)`` to ``sink`` as ``(name, message)``,
    acking it first (Danube's tests spawn one such task per consumer); returns the tasks."""

    async def pump(name, cons, stream):
        while True:
            msg = await stream.get()
            if ack:
                await cons.ack(msg)
            await sink.put((name, msg))

    return [asyncio.ensure_future(pump(*nc)) for nc in named_consumers]


def stop(tasks) -> None:
    for t in tasks:
        t.cancel()


async def recv_n(stream: asyncio.Queue, n: int, seconds: float, cons=None, what: str = "messages") -> list:
    """``n`` messages within ``seconds`` in all (acked through ``cons`` when given)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    got = []
    while len(got) < n:
        msg = await recv(stream, max(0.1, deadline - loop.time()), f"{what}: {len(got) + 1} of {n}")
        got.append(msg)
        if cons is not None:
            await cons.ack(msg)
    return got
