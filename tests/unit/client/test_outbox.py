"""A partition consumer's outbox: acks merge into runs that linger, everything keeps its order,
a new stream keeps acks and nacks but not old credit, and one ticker serves many outboxes."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.client.consumer_outbox import END, Outbox, _Ticker
from danube.proto.danube_batch import batch_pb2 as pb


def _ranges(request: bytes) -> list[tuple[int, int]]:
    assert type(request) is bytes  # an ack is written as its encoded bytes
    request = pb.ConsumeRequest.FromString(request)
    assert request.WhichOneof("kind") == "ack"
    return [(r.first, r.last) for r in request.ack.ranges]


def _credit(messages: int) -> pb.ConsumeRequest:
    return pb.ConsumeRequest(credit=pb.Credit(messages=messages, bytes=1))


def _nack(offset: int) -> pb.ConsumeRequest:
    return pb.ConsumeRequest(nack=pb.NackRequest(offset=offset))


async def _taken(outbox: Outbox, timeout: float = 5.0):
    return await asyncio.wait_for(outbox.next(), timeout)


async def test_acks_wait_for_the_linger_and_go_out_as_one_merged_request():
    loop = asyncio.get_running_loop()
    outbox = Outbox(0.2, max_messages=1000)
    started = loop.time()
    outbox.ack(0, 1)
    outbox.ack(2, 4)  # touches the first: merged
    outbox.ack(10, 10)
    assert not outbox._ready()
    request = await _taken(outbox)
    assert loop.time() - started >= 0.2 * 3 / 4  # held for the linger (give or take a quarter)
    assert _ranges(request) == [(0, 4), (10, 10)]
    assert len(outbox) == 0


async def test_without_linger_an_ack_is_ready_at_once():
    outbox = Outbox(0.0, max_messages=1000)
    outbox.ack(5, 5)
    assert outbox._ready()
    assert _ranges(await _taken(outbox, 0.5)) == [(5, 5)]


async def test_a_run_covering_max_messages_goes_out_without_waiting():
    outbox = Outbox(60.0, max_messages=10)
    outbox.ack(0, 4)
    assert not outbox._ready()
    outbox.ack(5, 9)
    assert _ranges(await _taken(outbox, 0.5)) == [(0, 9)]


async def test_a_request_behind_a_lingering_run_takes_it_along_in_order():
    outbox = Outbox(60.0, max_messages=1000)
    outbox.ack(0, 0)
    outbox.push(_nack(7))
    outbox.ack(1, 1)  # after the nack: a run of its own, still lingering
    assert _ranges(await _taken(outbox, 0.5)) == [(0, 0)]
    assert (await _taken(outbox, 0.5)).nack.offset == 7
    assert not outbox._ready()
    outbox.push(END)
    assert _ranges(await _taken(outbox, 0.5)) == [(1, 1)]  # close sends what still lingers
    assert await _taken(outbox, 0.5) is None
    assert await _taken(outbox, 0.5) is None  # END stays: every writer after it stops too


async def test_a_new_stream_keeps_acks_and_nacks_and_gets_the_whole_window_after_them():
    outbox = Outbox(60.0, max_messages=1000)
    outbox.push(_credit(3))  # the old stream's grant: void on the new one
    outbox.ack(0, 2)
    outbox.push(_nack(9))
    outbox.restart(_credit(100))
    taken = [await _taken(outbox, 0.5) for _ in range(3)]
    assert _ranges(taken[0]) == [(0, 2)]
    assert taken[1].nack.offset == 9
    assert taken[2].credit.messages == 100
    assert len(outbox) == 0


async def test_a_cancelled_writer_leaves_its_request_queued_for_the_next():
    outbox = Outbox(60.0, max_messages=1000)
    writer = asyncio.ensure_future(outbox.next())
    await asyncio.sleep(0)
    outbox.push(_nack(1))  # wakes the writer, which is cancelled before it runs
    writer.cancel()
    await asyncio.gather(writer, return_exceptions=True)
    assert (await _taken(outbox, 0.5)).nack.offset == 1


class _FakeLoop:
    """A clock the test moves, and the one timer a ticker keeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[tuple[float, object]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback):
        self.timers.append((when, callback))
        return object()

    def run_until(self, t: float) -> None:
        self.now = t
        due = [timer for timer in self.timers if timer[0] <= t]
        self.timers = [timer for timer in self.timers if timer[0] > t]
        for _, callback in due:
            callback()


async def test_one_ticker_releases_each_run_after_its_linger_with_one_timer_for_many():
    fake = _FakeLoop()
    ticker = _Ticker(fake, 0.4)
    boxes = [Outbox(0.4, max_messages=1000) for _ in range(4)]
    for box in boxes:
        box._ticker = ticker
    for i, start in enumerate((0.0, 0.05, 0.1, 0.3)):
        fake.now = start
        boxes[i].ack(i, i)
    assert len(fake.timers) == 1  # one timer, for the first run
    fake.run_until(0.4)
    # due within a quarter of the linger: the first three go in this firing, the last waits
    assert [box._ready() for box in boxes] == [True, True, True, False]
    assert len(fake.timers) == 1  # re-armed for the last run
    fake.run_until(0.7)
    assert boxes[3]._ready()
    assert not fake.timers


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("ack"), st.integers(0, 50), st.integers(0, 3)),
            st.tuples(st.just("nack"), st.integers(0, 50), st.just(0)),
        ),
        max_size=30,
    )
)
def test_every_ack_goes_out_once_in_the_order_given(ops):
    async def run() -> list:
        outbox = Outbox(60.0, max_messages=10**9)
        for kind, at, length in ops:
            if kind == "ack":
                outbox.ack(at, at + length)
            else:
                outbox.push(_nack(at))
        outbox.push(END)
        out = []
        while (request := await _taken(outbox, 0.5)) is not None:
            out.append(request)
        return out

    requests = asyncio.run(run())
    # expected: consecutive acks form one request (their offsets in order), each nack its own
    expected: list = []
    for kind, at, length in ops:
        if kind == "nack":
            expected.append(("nack", at))
        elif expected and expected[-1][0] == "ack":
            expected[-1][1].extend(range(at, at + length + 1))
        else:
            expected.append(("ack", list(range(at, at + length + 1))))
    got = []
    for request in requests:
        if type(request) is not bytes and request.WhichOneof("kind") == "nack":
            got.append(("nack", request.nack.offset))
        else:
            got.append(("ack", [o for first, last in _ranges(request) for o in range(first, last + 1)]))
    assert got == expected


async def test_a_flush_sends_what_lingers_and_is_done_once_the_writer_is_past_it():
    outbox = Outbox(60.0, max_messages=1000)
    outbox.ack(0, 3)
    flushed = outbox.flush()
    outbox.ack(4, 4)  # after the flush: lingers on its own
    assert not flushed.done()
    assert _ranges(await _taken(outbox, 0.5)) == [(0, 3)]  # released by the flush
    assert not flushed.done()  # the writer has not written it yet: it asks for the next only after
    writer = asyncio.ensure_future(outbox.next())
    await asyncio.sleep(0)
    assert flushed.done()
    assert not writer.done()  # (4, 4) still lingers
    writer.cancel()
    await asyncio.gather(writer, return_exceptions=True)


async def test_a_flush_of_an_empty_outbox_is_done_at_once():
    assert Outbox(60.0, max_messages=1000).flush().done()


async def test_a_flush_outlives_a_broken_stream_and_fails_when_no_writer_comes():
    outbox = Outbox(60.0, max_messages=1000)
    outbox.ack(0, 0)
    kept = outbox.flush()
    outbox.restart(_credit(100))  # the next stream writes the ack, then the flush is done
    assert _ranges(await _taken(outbox, 0.5)) == [(0, 0)]
    assert (await _taken(outbox, 0.5)).credit.messages == 100
    assert kept.done() and kept.exception() is None
    outbox.ack(1, 1)
    abandoned = outbox.flush()
    outbox.abandon(RuntimeError("closed"))
    with pytest.raises(RuntimeError, match="closed"):
        await abandoned


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("ack"), st.integers(0, 50), st.integers(0, 3)),
            st.tuples(st.just("nack"), st.integers(0, 50), st.just(0)),
            st.tuples(st.just("flush"), st.just(0), st.just(0)),
            st.tuples(st.just("write"), st.just(0), st.just(0)),
        ),
        max_size=30,
    )
)
def test_a_flush_is_done_exactly_when_everything_queued_before_it_was_taken(ops):
    """Acks, nacks and flushes interleaved with writes: a flush is done once every ack and nack
    queued before it was handed to the writer and the writer came back for more, never before."""

    async def run() -> None:
        outbox = Outbox(60.0, max_messages=10**9)
        queued: list[int] = []  # offsets acked or nacked so far, in order
        written: list[int] = []
        flushes: list[tuple[int, asyncio.Future]] = []  # (how many were queued before it, future)

        def check() -> None:
            for before, future in flushes:
                # done only if all queued before it were written; pending ones must not be done
                if future.done():
                    assert len(written) >= before

        async def write() -> bool:
            """The writer asks for a request and writes what it gets in a few loop turns; False at END."""
            writer = asyncio.ensure_future(outbox.next())
            for _ in range(3):
                await asyncio.sleep(0)
            if not writer.done():  # nothing may go out yet: the writer keeps waiting (cancelled here)
                writer.cancel()
                await asyncio.gather(writer, return_exceptions=True)
                return True
            request = writer.result()
            if request is None:
                return False
            if type(request) is not bytes and request.WhichOneof("kind") == "nack":
                written.append(request.nack.offset)
            else:
                written.extend(o for first, last in _ranges(request) for o in range(first, last + 1))
            return True

        for kind, at, length in ops:
            if kind == "ack":
                outbox.ack(at, at + length)
                queued.extend(range(at, at + length + 1))
            elif kind == "nack":
                outbox.push(_nack(at))
                queued.append(at)
            elif kind == "flush":
                flushes.append((len(queued), outbox.flush()))
            else:
                await write()
            check()
        outbox.push(END)  # close: everything goes out, every flush is passed
        while await write():
            check()
        assert written == queued
        assert all(future.done() for _, future in flushes)

    asyncio.run(run())


async def test_while_the_writer_waits_a_lent_write_nowait_writes_what_is_ready_in_order():
    outbox = Outbox(60.0, max_messages=2)
    written: list = []
    blocked = False

    def write_nowait(request) -> bool:
        if blocked:
            return False
        written.append(request)
        return True

    outbox.direct = write_nowait
    writer = asyncio.ensure_future(outbox.next())
    await asyncio.sleep(0)  # the writer waits
    outbox.ack(0, 1)  # max_messages: ready at once, written by this call
    outbox.push(_nack(5))
    flushed = outbox.flush()  # nothing left before it: done at once
    assert [_ranges(written[0]), written[1].nack.offset] == [[(0, 1)], 5]
    assert flushed.done() and not writer.done() and len(outbox) == 0
    blocked = True  # the stream would have to wait: the writer takes it
    outbox.ack(2, 3)
    assert _ranges(await asyncio.wait_for(writer, 1)) == [(2, 3)]
    blocked = False
    writer = asyncio.ensure_future(outbox.next())
    await asyncio.sleep(0)
    outbox.ack(4, 4)  # lingers
    outbox.push(END)  # makes the run go out (written here); the end is the writer's to see
    assert await asyncio.wait_for(writer, 1) is None
    assert _ranges(written[2]) == [(4, 4)] and len(written) == 3
