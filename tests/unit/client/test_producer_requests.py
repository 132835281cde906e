"""What a partition producer writes on its Publish stream, and how acks settle its batches.

Batches queued behind the one being written share its request (frames joined, one sequence, one
ack), within max_batch_bytes and one partitioning version; the ack's offsets are split among
them in order, and an error status settles (or keeps, for a reconnect) all of them.  The stream
here is a fake call that records the requests and answers the acks the test gives it.
"""

from __future__ import annotations

import asyncio
import types

import pytest

from danube import message_codec
from danube.client.connection import RetryPolicy
from danube.client.producer import Producer
from danube.client.producer_batch import FRAME_OVERHEAD, Batch
from danube.client.producer_queue import SendQueue, Window, coalesce
from danube.client.producer_stream import SMALL_REQUESTS_IN_FLIGHT, PartitionProducer
from danube.errors import DanubeError
from danube.proto.danube_batch import batch_pb2 as pb

PRODUCER_ID = 7


class FakeCall:
    """A Publish call: requests written are kept; acks come from the test."""

    def __init__(self) -> None:
        self.requests: list[pb.PublishRequest] = []
        self.wrote = asyncio.Event()
        self.half_closed = False
        self._acks: asyncio.Queue = asyncio.Queue()
        self.auto_ack = False  # answer every request at once, offsets counted from 0
        self._next_offset = 0

    async def write(self, request: pb.PublishRequest) -> None:
        self.requests.append(request)
        self.wrote.set()
        if self.auto_ack:
            n = len(_payloads(request))
            first, self._next_offset = self._next_offset, self._next_offset + n
            self.answer(pb.PublishAck(sequence=request.sequence, first_offset=first, last_offset=first + n - 1))

    async def done_writing(self) -> None:
        self.half_closed = True
        self._acks.put_nowait(None)

    def answer(self, ack: pb.PublishAck | None) -> None:
        self._acks.put_nowait(ack)

    def cancel(self) -> bool:
        self._acks.put_nowait(None)
        return True

    def __aiter__(self):
        return self

    async def __anext__(self) -> pb.PublishAck:
        ack = await self._acks.get()
        if ack is None:
            raise StopAsyncIteration
        return ack


def _partition(
    max_batch_bytes: int = 256 * 1024, max_in_flight: int = 4
) -> tuple[Producer, PartitionProducer, FakeCall]:
    client = types.SimpleNamespace(retry=RetryPolicy())
    producer = Producer(client, "/ns/t", "p", max_batch_bytes=max_batch_bytes, max_in_flight=max_in_flight)
    part = PartitionProducer(producer, "/ns/t")
    call = FakeCall()
    part.producer_id = PRODUCER_ID
    part._conn = types.SimpleNamespace(batch_lane=types.SimpleNamespace(Publish=lambda: call))
    return producer, part, call


def _payloads(request: pb.PublishRequest) -> list[bytes]:
    return [record.payload for record in message_codec.decode_batch(request.frames)]


async def _written(call: FakeCall, n: int) -> None:
    while len(call.requests) < n:
        call.wrote.clear()
        await asyncio.wait_for(call.wrote.wait(), 5)


def test_batches_queued_behind_the_written_one_share_its_request_and_its_ack_is_split_in_order():
    async def scenario():
        producer, part, call = _partition()
        acked: list[tuple[int, int]] = []
        producer.add_ack_listener(lambda sent_at, first, last: acked.append((first, last)))
        sends = [[f"m{i}-{j}".encode() for j in range(i + 1)] for i in range(5)]  # 1..5 messages each
        futures = [part.add_batch_nowait(payloads, None, None) for payloads in sends]
        stream = asyncio.ensure_future(part._stream())
        await _written(call, 1)
        (request,) = call.requests
        assert request.sequence == 1 and request.producer_id == PRODUCER_ID
        assert _payloads(request) == [p for payloads in sends for p in payloads]
        call.answer(pb.PublishAck(sequence=1, producer_id=PRODUCER_ID, first_offset=100, last_offset=114, count=15))
        offsets = await asyncio.gather(*futures)
        assert offsets == [[100], [101, 102], [103, 104, 105], [106, 107, 108, 109], list(range(110, 115))]
        assert acked == [(100, 100), (101, 102), (103, 105), (106, 109), (110, 114)]
        assert not part._unacked
        await asyncio.wait_for(part.wait_idle(), 1)  # a flush would not wait
        call.answer(None)
        await asyncio.wait_for(stream, 5)

    asyncio.run(scenario())


def test_a_lone_batch_goes_out_alone_and_the_next_one_is_not_held_back():
    async def scenario():
        _, part, call = _partition()
        first = part.add_batch_nowait([b"a"], None, None)
        stream = asyncio.ensure_future(part._stream())
        await _written(call, 1)
        second = part.add_batch_nowait([b"b", b"c"], None, None)
        await _written(call, 2)  # written while the first is unacked (the window has room)
        assert [_payloads(r) for r in call.requests] == [[b"a"], [b"b", b"c"]]
        assert [r.sequence for r in call.requests] == [1, 2]
        call.answer(pb.PublishAck(sequence=2, first_offset=8, last_offset=9, count=2))
        call.answer(pb.PublishAck(sequence=1, first_offset=7, last_offset=7, count=1))
        assert await asyncio.gather(first, second) == [[7], [8, 9]]
        call.answer(None)
        await asyncio.wait_for(stream, 5)

    asyncio.run(scenario())


def test_small_requests_in_flight_are_few_and_the_batches_behind_them_merge_into_the_next():
    async def scenario():
        _, part, call = _partition(max_in_flight=100)
        stream = asyncio.ensure_future(part._stream())
        futures = []
        for i in range(SMALL_REQUESTS_IN_FLIGHT):
            futures.append(part.add_batch_nowait([b"s%d" % i], None, None))
            await _written(call, i + 1)  # each written alone: the window has room
        held = [part.add_batch_nowait([b"h%d" % i], None, None) for i in range(5)]
        for _ in range(3):
            await asyncio.sleep(0)
        assert len(call.requests) == SMALL_REQUESTS_IN_FLIGHT  # max_in_flight would allow more
        call.answer(pb.PublishAck(sequence=1, first_offset=0, last_offset=0, count=1))
        await _written(call, SMALL_REQUESTS_IN_FLIGHT + 1)
        merged = call.requests[-1]
        assert _payloads(merged) == [b"h%d" % i for i in range(5)]  # one request, one ack for all five
        offset = 1
        for request in call.requests[1:]:
            n = len(_payloads(request))
            call.answer(pb.PublishAck(sequence=request.sequence, first_offset=offset, last_offset=offset + n - 1))
            offset += n
        assert await asyncio.gather(*futures, *held) == [[i] for i in range(SMALL_REQUESTS_IN_FLIGHT + 5)]
        call.answer(None)
        await asyncio.wait_for(stream, 5)

    asyncio.run(scenario())


def test_large_requests_fill_the_whole_window():
    async def scenario():
        payload = b"x" * 600
        _, part, call = _partition(max_batch_bytes=1000, max_in_flight=6)  # over a quarter: large; two don't fit
        futures = [part.add_batch_nowait([payload], None, None) for _ in range(6)]
        stream = asyncio.ensure_future(part._stream())
        await _written(call, 6)
        assert [len(_payloads(r)) for r in call.requests] == [1] * 6
        for i, request in enumerate(call.requests):
            call.answer(pb.PublishAck(sequence=request.sequence, first_offset=i, last_offset=i))
        assert await asyncio.gather(*futures) == [[i] for i in range(6)]
        call.answer(None)
        await asyncio.wait_for(stream, 5)

    asyncio.run(scenario())


def test_a_request_never_grows_past_max_batch_bytes():
    async def scenario():
        payload = b"x" * 100
        frame = len(message_codec.encode_payloads([payload], publish_time=0, producer_id=PRODUCER_ID))
        _, part, call = _partition(max_batch_bytes=3 * frame + 10)
        futures = [part.add_batch_nowait([payload], None, None) for _ in range(8)]
        stream = asyncio.ensure_future(part._stream())
        await _written(call, 3)
        assert [len(_payloads(r)) for r in call.requests] == [3, 3, 2]
        assert all(len(r.frames) <= 3 * frame + 10 for r in call.requests)
        offset = 0
        for request in call.requests:
            n = len(_payloads(request))
            call.answer(pb.PublishAck(sequence=request.sequence, first_offset=offset, last_offset=offset + n - 1))
            offset += n
        assert await asyncio.gather(*futures) == [[i] for i in range(8)]
        call.answer(None)
        await asyncio.wait_for(stream, 5)

    asyncio.run(scenario())


def test_an_error_status_fails_every_batch_of_the_request():
    async def scenario():
        _, part, call = _partition()
        futures = [part.add_batch_nowait([b"a", b"b"], None, None) for _ in range(3)]
        stream = asyncio.ensure_future(part._stream())
        await _written(call, 1)
        status = pb.BatchStatus(code=3, message="frames are corrupt", retriable=False)  # INVALID_ARGUMENT
        call.answer(pb.PublishAck(sequence=1, status=status))
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert all(isinstance(r, Exception) and "frames are corrupt" in str(r) for r in results)
        assert not part._unacked
        call.answer(None)
        await asyncio.wait_for(stream, 5)

    asyncio.run(scenario())


def test_a_retriable_status_keeps_every_batch_of_the_request_for_the_reconnect():
    async def scenario():
        _, part, call = _partition()
        futures = [part.add_batch_nowait([b"a"], None, None) for _ in range(3)]
        stream = asyncio.ensure_future(part._stream())
        await _written(call, 1)
        status = pb.BatchStatus(code=14, message="topic moved", retriable=True)  # UNAVAILABLE
        call.answer(pb.PublishAck(sequence=1, status=status))
        with pytest.raises(DanubeError, match="topic moved"):
            await asyncio.wait_for(stream, 5)  # drained: the writer half-closed the call
        assert call.half_closed
        assert not any(f.done() for f in futures)
        assert sorted(part._unacked) == [1, 2, 3]
        part._requeue_unacked()  # the reconnect sends them again, in order
        assert [part._to_send.get_nowait()[0] for _ in range(3)] == [1, 2, 3]

    asyncio.run(scenario())


def test_coalesce_stops_at_a_marker_and_at_another_partitioning_version():
    def batch(version: int | None) -> Batch:
        b = Batch([b"p"], done=None)
        b.version = version
        return b

    queue = SendQueue()
    first, same, other = batch(1), batch(1), batch(2)
    unacked = {1: first, 2: same, 3: other}
    queue.put_nowait((2, same))
    queue.put_nowait((3, other))
    encode = lambda b: b.encode(PRODUCER_ID)  # noqa: E731
    frames, members = coalesce(1, first, queue, unacked, encode, 1 << 20)
    assert members == [(1, 1), (2, 1)]
    assert frames == first.frames + same.frames
    assert queue.peek() == (3, other)  # the next request leads with it
    marker = object()
    queue = SendQueue()
    queue.put_nowait(marker)
    queue.put_nowait((2, same))
    assert coalesce(1, first, queue, unacked, encode, 1 << 20) == (first.frames, None)
    assert queue.peek() is marker


def test_coalesce_drops_batches_acked_by_an_earlier_stream():
    first, gone, kept = (Batch([b"p"] * n) for n in (1, 2, 3))
    queue = SendQueue()
    queue.put_nowait((2, gone))
    queue.put_nowait((3, kept))
    frames, members = coalesce(1, first, queue, {1: first, 3: kept}, lambda b: b.encode(PRODUCER_ID), 1 << 20)
    assert members == [(1, 1), (3, 3)]
    assert queue.empty()
    assert len(message_codec.decode_batch(frames)) == 4


def test_send_queue_and_window_wake_their_one_waiter():
    async def scenario():
        queue = SendQueue()
        getter = asyncio.ensure_future(queue.get())
        await asyncio.sleep(0)
        assert not getter.done()
        queue.put_nowait("a")
        queue.put_nowait("b")
        assert await asyncio.wait_for(getter, 5) == "a"
        assert queue.get_nowait() == "b" and queue.empty() and queue.peek() is None

        window = Window(1)
        await window.acquire()
        blocked = asyncio.ensure_future(window.acquire())
        await asyncio.sleep(0)
        assert not blocked.done()
        window.release()
        await asyncio.wait_for(blocked, 5)
        assert window.free == 0

    asyncio.run(scenario())


def test_send_batch_too_big_for_one_batch_still_resolves_all_offsets_in_order():
    async def scenario():
        _, part, call = _partition(max_batch_bytes=4 * (10 + FRAME_OVERHEAD))
        call.auto_ack = True
        payloads = [bytes([i]) * 10 for i in range(10)]
        assert part.add_batch_nowait(payloads, None, None) is None  # chunked by add_batch instead
        chunks = await part.add_batch(payloads, None, None)
        assert len(chunks) > 1
        stream = asyncio.ensure_future(part._stream())
        pairs = await asyncio.wait_for(asyncio.gather(*chunks), 5)
        assert [o for first, last in pairs for o in range(first, last + 1)] == list(range(10))
        assert [p for r in call.requests for p in _payloads(r)] == payloads
        call.answer(None)
        await asyncio.wait_for(stream, 5)

    asyncio.run(scenario())


class NowaitCall(FakeCall):
    """A call that can also write without waiting (as the h2 transport's), unless ``blocked``."""

    def __init__(self) -> None:
        super().__init__()
        self.blocked = False
        self.nowait: list[int] = []  # sequences written by write_nowait

    def write_nowait(self, request: pb.PublishRequest) -> bool:
        if self.blocked:
            return False
        self.nowait.append(request.sequence)
        self.requests.append(request)
        self.wrote.set()
        return True


def test_a_batch_the_window_has_room_for_is_written_by_the_call_that_queued_it():
    async def scenario():
        _, part, _ = _partition(max_in_flight=100)
        call = NowaitCall()
        part._conn.batch_lane.Publish = lambda: call
        stream = asyncio.ensure_future(part._stream())
        for _ in range(3):
            await asyncio.sleep(0)  # the writer waits for the queue
        first = part.add_batch_nowait([b"a"], None, None)
        assert [r.sequence for r in call.requests] == [1] and call.nowait == [1]  # no loop turn needed
        second = part.add_batch_nowait([b"b"], None, None)
        held = [part.add_batch_nowait([b"h%d" % i], None, None) for i in range(2)]  # the small window is full
        assert call.nowait == [1, 2] and len(call.requests) == 2
        call.answer(pb.PublishAck(sequence=1, first_offset=0, last_offset=0))
        await _written(call, 3)  # the writer took the queued two, merged
        assert _payloads(call.requests[2]) == [b"h0", b"h1"] and call.nowait == [1, 2]
        call.answer(pb.PublishAck(sequence=2, first_offset=1, last_offset=1))
        call.answer(pb.PublishAck(sequence=3, first_offset=2, last_offset=3))
        assert await asyncio.gather(first, second, *held) == [[0], [1], [2], [3]]
        call.blocked = True  # a window or the socket would make it wait: the writer writes it
        for _ in range(3):
            await asyncio.sleep(0)
        last = part.add_batch_nowait([b"z"], None, None)
        await _written(call, 4)
        assert call.requests[3].sequence == 5 and call.nowait == [1, 2]
        call.answer(pb.PublishAck(sequence=5, first_offset=4, last_offset=4))
        assert await last == [4]
        call.answer(None)
        await asyncio.wait_for(stream, 5)

    asyncio.run(scenario())
