"""The batch lane's Publish handler over a real BrokerService (local WAL, sqlite metadata) with a
stand-in for the native server's call: request messages fed as the connection reads them (read by
the handler's request iterator, or taken by its message sink, which pauses at the in-flight
limit), answers written from callbacks (``write_nowait``, or ``write_fields_nowait`` given the ack's
fields) or yielded by the handler."""

from __future__ import annotations

import asyncio
import collections
import contextlib

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube import message_codec
from danube.broker import BrokerService, DispatchSettings
from danube.broker.service_publish import check_deliverable
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.proto.danube_batch import batch_pb2 as pb
from danube.server import batch_lane
from danube.server.batch_lane_publish import parse_request
from danube.server.batch_lane_wire import batch_status, encoded_ack
from danube.server.h2grpc.frames import uint_fields
from danube.server.h2grpc.wire import Encoded
from danube.storage.config import StorageConfig
from danube.storage.factory import StorageFactory
from tests.support.frames import raw_frame
from tests.support.waiting import async_wait_until

pytestmark = pytest.mark.timeout(60)
T = "/default/lane-publish"


class FakeCall:
    """What the Publish handler uses of ``h2grpc.ServerCall``: ``read`` (as its request
    iterator), ``write_nowait`` and ``sends_encoded``; ``feed`` is the connection's read."""

    sends_encoded = True

    def __init__(self, *, writable: bool = True) -> None:
        self.messages: collections.deque = collections.deque()
        self.waiter: asyncio.Future | None = None
        self.ended = False
        self.writable = writable
        self.written: list = []  # by write_nowait, then by the handler's yields (in send order)
        self.read_count = 0

    def feed(self, request: pb.PublishRequest) -> None:
        # as the server hands it over: read from its bytes by Publish's deserializer
        self.messages.append(parse_request(request.SerializeToString()))
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def end(self) -> None:
        self.ended = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def __aiter__(self):
        return self

    async def __anext__(self):
        while not self.messages:
            if self.ended:
                raise StopAsyncIteration
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        self.read_count += 1
        return self.messages.popleft()

    def write_nowait(self, message) -> bool:
        if self.writable:
            self.written.append(message)
        return self.writable


class SinkCall(FakeCall):
    """As ``h2grpc.ServerCall`` hands messages to a handler's sink: each at once as it is fed
    unless the sink paused, then in order on ``resume_messages``; the end after the last."""

    def __init__(self, *, writable: bool = True) -> None:
        super().__init__(writable=writable)
        self.call = self  # as the call's own request iterator names its call (a wrapper does not)
        self.sink = None
        self.paused = False
        self.eof_sent = False

    def set_message_sink(self, sink) -> None:
        self.sink = sink
        self._drain()

    def take_by_sink(self, sink) -> None:  # as the call's own request iterator offers it
        self.set_message_sink(sink)

    def pause_messages(self) -> None:
        self.paused = True

    def resume_messages(self) -> None:
        self.paused = False
        self._drain()

    def feed(self, request: pb.PublishRequest) -> None:
        super().feed(request)  # read by iteration while no sink is set
        self._drain()

    def end(self) -> None:
        super().end()
        self._drain()

    def _drain(self) -> None:
        if self.sink is None:
            return
        while self.messages and not self.paused:
            self.read_count += 1
            self.sink(self.messages.popleft())
        if self.ended and not self.messages and not self.paused and not self.eof_sent:
            self.eof_sent = True
            self.sink(grpc.aio.EOF)


class FieldsCall(SinkCall):
    """A sink call that also takes an ack as its fields (``ServerCall.write_fields_nowait``), which
    the codec encodes: what the native server offers."""

    def write_fields_nowait(self, fields: tuple) -> bool:
        return self.write_nowait(Encoded((uint_fields(fields),)))


@pytest.fixture(params=["iterator", "sink", "fields"])
def make_call(request):
    return {"iterator": FakeCall, "sink": SinkCall, "fields": FieldsCall}[request.param]


def decoded(message) -> pb.PublishAck:
    if type(message) is Encoded:
        return pb.PublishAck.FromString(message.tobytes())
    return message


@pytest.fixture(params=["never", "always"])
async def broker(request, tmp_path):
    metadata = EmbeddedMetadataStore(str(tmp_path / "metadata.db"))
    config = StorageConfig.from_dict({"wal": {"sync": request.param}}, data_dir=str(tmp_path))
    b = BrokerService(
        metadata,
        StorageFactory(config, metadata, broker_id="test"),
        dispatch=DispatchSettings(cursor_flush_interval_ms=50),
    )
    await b.start()
    yield b
    with contextlib.suppress(Exception):
        await b.stop()
        await metadata.close()


def frames(n: int, producer_id: int = 0) -> bytes:
    return message_codec.encode_payloads([b"m%d" % i for i in range(n)], publish_time=1, producer_id=producer_id)


async def run_stream(service, call: FakeCall) -> asyncio.Task:
    async def drive():
        async for answer in service.Publish(call, call):
            call.written.append(answer)

    return asyncio.ensure_future(drive())


async def test_acks_follow_the_batches_in_order_with_their_offsets(broker, make_call):
    service = batch_lane.BatchLaneService(broker)
    pid = await broker.create_producer(T, "p", reliable=True)
    call = make_call()
    task = await run_stream(service, call)
    for seq in range(1, 21):
        call.feed(pb.PublishRequest(sequence=seq, producer_id=pid, frames=frames(2)))
        if seq % 7 == 0:
            await asyncio.sleep(0)  # some batches read one by one, some several per turn
    await async_wait_until(lambda: len(call.written) == 20, what="20 acks")
    call.end()
    await asyncio.wait_for(task, 10)
    acks = [decoded(a) for a in call.written]
    assert [a.sequence for a in acks] == list(range(1, 21))
    assert [(a.first_offset, a.last_offset, a.count) for a in acks] == [(2 * i, 2 * i + 1, 2) for i in range(20)]
    assert all(a.producer_id == pid and not a.HasField("status") for a in acks)
    assert broker.topics[T].readable_next == 40


async def test_a_refused_batch_is_answered_with_its_status_and_the_stream_goes_on(broker, make_call):
    service = batch_lane.BatchLaneService(broker)
    pid = await broker.create_producer(T, "p", reliable=True)
    other = await broker.create_producer("/default/other", "q", reliable=True)
    call = make_call()
    task = await run_stream(service, call)
    call.feed(pb.PublishRequest(sequence=1, producer_id=pid, frames=frames(1, producer_id=other)))  # not its id
    call.feed(pb.PublishRequest(sequence=2, producer_id=pid, frames=b""))
    call.feed(pb.PublishRequest(sequence=3, producer_id=pid, frames=frames(3)))
    call.end()
    await asyncio.wait_for(task, 10)
    acks = {a.sequence: a for a in map(decoded, call.written)}
    assert sorted(acks) == [1, 2, 3]
    assert acks[1].status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "frame 0" in acks[1].status.message and acks[1].producer_id == pid
    assert acks[2].status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "empty batch" in acks[2].status.message
    assert not acks[3].HasField("status") and (acks[3].first_offset, acks[3].last_offset) == (0, 2)


async def test_acks_wait_in_the_handler_when_the_stream_cannot_take_them_now(broker, make_call):
    service = batch_lane.BatchLaneService(broker)
    pid = await broker.create_producer(T, "p", reliable=True)
    call = make_call(writable=False)  # write_nowait refuses: every ack is yielded by the handler
    task = await run_stream(service, call)
    for seq in range(1, 6):
        call.feed(pb.PublishRequest(sequence=seq, producer_id=pid, frames=frames(1)))
    call.end()
    await asyncio.wait_for(task, 10)
    assert [decoded(a).sequence for a in call.written] == [1, 2, 3, 4, 5]


async def test_the_reader_stops_at_the_in_flight_limit_until_batches_are_answered(broker, make_call):
    service = batch_lane.BatchLaneService(broker)
    pid = await broker.create_producer(T, "p", reliable=True)
    storage = broker.topics[T].storage
    real_when_durable = storage.when_durable
    held_waits: list = []  # durability waits asked for before the gate opens

    def held(offset, callback):
        if held_waits is None:
            real_when_durable(offset, callback)
        else:
            held_waits.append((offset, callback))

    storage.durable_now = lambda offset: False  # every commit waits for the gate
    storage.when_durable = held
    call = make_call()
    task = await run_stream(service, call)
    limit = batch_lane.MAX_STREAM_IN_FLIGHT
    for seq in range(1, limit + 11):
        call.feed(pb.PublishRequest(sequence=seq, producer_id=pid, frames=frames(1)))
    # the iterator reads one batch past the limit and holds it, the sink pauses at the limit;
    # the rest waits in the stream (backpressure)
    taken = limit + 1 if make_call is FakeCall else limit
    await async_wait_until(lambda: call.read_count == taken, what="the reader to reach the limit")
    for _ in range(5):
        await asyncio.sleep(0)
    assert call.read_count == taken and call.written == []
    assert storage.next_offset == limit
    waits, held_waits = held_waits, None  # the gate opens
    for offset, callback in waits:
        real_when_durable(offset, callback)
    call.end()
    await asyncio.wait_for(task, 10)
    assert [decoded(a).sequence for a in call.written] == list(range(1, limit + 11))


def test_the_encoded_ack_is_what_protobuf_serializes():
    for sequence, producer_id, first, last in [(0, 0, 0, 0), (1, 7, 0, 1), (2**40, 2**63 - 1, 10**9, 10**9 + 999)]:
        ack = encoded_ack(sequence, producer_id, first, last)
        assert pb.PublishAck.FromString(ack.tobytes()) == pb.PublishAck(
            sequence=sequence, producer_id=producer_id, first_offset=first, last_offset=last, count=last - first + 1
        )


@given(
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**63),
    st.one_of(st.integers(1, 300), st.integers(1, 2**32 - 1)),
)
def test_an_ack_as_fields_is_byte_for_byte_what_protobuf_serializes(sequence, producer_id, first, count):
    # the handler hands write_fields_nowait (sequence, producer_id, first, last, count): PublishAck's
    # fields 1-5 in order (uint64 and, for count, uint32: the same varint), so the codec's
    # encoding must be protobuf's for every value
    last = first + count - 1
    ack = pb.PublishAck(sequence=sequence, producer_id=producer_id, first_offset=first, last_offset=last, count=count)
    assert uint_fields((sequence, producer_id, first, last, count)) == ack.SerializeToString()


async def test_a_wrapped_request_iterator_sees_every_batch_even_when_the_call_offers_a_sink(broker):
    """A wrapper around the call's iterator (the auth guard's per-message permission check) must
    see every request: the handler then reads through it and does not take batches by sink."""
    service = batch_lane.BatchLaneService(broker)
    pid = await broker.create_producer(T, "p", reliable=True)
    call = SinkCall()
    seen: list[int] = []

    async def checked():
        async for request in call:
            seen.append(request.sequence)
            yield request

    async def drive():
        async for answer in service.Publish(checked(), call):
            call.written.append(answer)

    task = asyncio.ensure_future(drive())
    for seq in range(1, 6):
        call.feed(pb.PublishRequest(sequence=seq, producer_id=pid, frames=frames(1)))
    await async_wait_until(lambda: len(call.written) == 5, what="5 acks")
    call.end()
    await asyncio.wait_for(task, 10)
    assert call.sink is None
    assert seen == [1, 2, 3, 4, 5]
    assert [decoded(a).sequence for a in call.written] == [1, 2, 3, 4, 5]


def bad_batches(producer_id: int, other: int) -> dict[str, bytes]:
    """Batches the publish path refuses whole, each kind of check once (checked once, acted
    on where each check was made before: the lane for lengths, checksums and layout, the broker
    for what a subscriber decodes)."""
    good = frames(2, producer_id=producer_id)
    flipped = bytearray(good + frames(1))
    flipped[-1] ^= 0xFF
    bad_flags = bytearray(frames(1))
    bad_flags[16 + 16] = 0x80  # the body's flags: an unknown bit (the checksum made to match)
    bad_flags[8:12] = message_codec.crc32c(bytes(bad_flags[12:])).to_bytes(4, "little")
    return {
        "checksum": bytes(flipped),
        "torn": good[:-3],
        "layout": good + bytes(bad_flags),
        "key not UTF-8": good + raw_frame(b"\xff\xfe", [], producer_id=producer_id),
        "another producer's": good + frames(1, producer_id=other),
    }


def refusal_before(batch: bytes, producer) -> grpc.StatusCode:
    """The ack status the checks gave one after the other (validate, then check_deliverable)."""
    try:
        message_codec.validate(batch)
        check_deliverable(bytearray(batch), producer)
    except Exception as exc:  # noqa: BLE001 - what the lane turns into the ack's status
        return batch_status(exc)
    raise AssertionError("a bad batch passed the checks")


@pytest.mark.parametrize("path", ["per call", "in a task"])
async def test_a_bad_frame_is_refused_as_the_separate_checks_refused_it_and_never_stored(broker, make_call, path):
    service = batch_lane.BatchLaneService(broker)
    spec = pb.ProducerSpec(topic=T, producer_name="p", reliable=True)
    pid = await broker.create_producer(T, "p", reliable=True)
    other = await broker.create_producer("/default/other", "q", reliable=True)
    bad = bad_batches(pid, other)
    call = make_call()
    task = await run_stream(service, call)
    for seq, batch in enumerate(bad.values(), start=1):
        if path == "per call":
            call.feed(pb.PublishRequest(sequence=seq, producer_id=pid, frames=batch))
        else:  # a producer named by its spec: the batch goes through a task (_publish_one)
            call.feed(pb.PublishRequest(sequence=seq, create=spec, frames=batch))
    call.feed(pb.PublishRequest(sequence=99, producer_id=pid, frames=frames(3, producer_id=pid)))
    call.end()
    await asyncio.wait_for(task, 10)
    acks = {a.sequence: a for a in map(decoded, call.written)}
    producer = broker._producers[pid]
    for seq, (kind, batch) in enumerate(bad.items(), start=1):
        assert acks[seq].status == refusal_before(batch, producer), kind
        assert acks[seq].status.code in (
            grpc.StatusCode.INVALID_ARGUMENT.value[0],
            grpc.StatusCode.DATA_LOSS.value[0],
        ), kind
    assert not acks[99].HasField("status") and (acks[99].first_offset, acks[99].last_offset) == (0, 2)
    assert broker.topics[T].storage.next_offset == 3  # none of the bad batches' frames


@pytest.mark.parametrize("path", ["per call", "in a task"])
async def test_the_topic_checks_refuse_the_same_on_both_paths(tmp_path, make_call, path):
    """The per-call path appends a batch without the topic's own publish call when nothing needs
    it (no rate gate, within max_message_size's bytes, not terminated); what needs it is refused
    with the status and message the topic gives, and a batch above the bytes whose messages are
    each within the limit is stored."""
    from danube.broker.policies import TopicPolicies
    from danube.errors import MessageTooLargeError, TopicTerminatedError

    metadata = EmbeddedMetadataStore(str(tmp_path / "metadata.db"))
    config = StorageConfig.from_dict({"wal": {"sync": "never"}}, data_dir=str(tmp_path))
    broker = BrokerService(
        metadata,
        StorageFactory(config, metadata, broker_id="test"),
        policies=TopicPolicies(max_message_size=64),
    )
    await broker.start()
    try:
        service = batch_lane.BatchLaneService(broker)
        spec = pb.ProducerSpec(topic=T, producer_name="p", reliable=True)
        pid = await broker.create_producer(T, "p", reliable=True)
        topic = broker.topics[T]
        call = make_call()
        task = await run_stream(service, call)

        def feed(seq: int, batch: bytes) -> None:
            if path == "per call":
                call.feed(pb.PublishRequest(sequence=seq, producer_id=pid, frames=batch))
            else:  # named by its spec: through a task (_publish_one)
                call.feed(pb.PublishRequest(sequence=seq, create=spec, frames=batch))

        small = [b"s" * 40, b"t" * 40]  # each within 64 bytes, together above 64 + a header
        feed(1, message_codec.encode_payloads(small, publish_time=1, producer_id=pid))
        too_large = message_codec.encode_payloads([b"x" * 65], publish_time=1, producer_id=pid)
        feed(2, too_large)
        await async_wait_until(lambda: len(call.written) == 2, what="2 acks")
        topic.terminated = True
        feed(3, frames(1, producer_id=pid))
        call.end()
        await asyncio.wait_for(task, 10)
        acks = {a.sequence: a for a in map(decoded, call.written)}
        assert not acks[1].HasField("status") and (acks[1].first_offset, acks[1].last_offset) == (0, 1)
        with pytest.raises(MessageTooLargeError) as refused:
            topic.check_sizes(too_large)  # what the topic's own publish call refuses it with
        assert acks[2].status == batch_status(refused.value)
        assert acks[3].status == batch_status(TopicTerminatedError.of(T))
        assert topic.storage.next_offset == 2  # the refused batches stored nothing
    finally:
        await broker.stop()
        await metadata.close()


async def test_a_batch_checked_at_the_read_is_not_checked_again(broker, make_call, monkeypatch):
    """``parse_request`` checks a batch naming its producer by id; the per-call path appends that
    copy (no second check_batch), while a batch the read could not check is checked and refused
    by the lane as before."""
    from danube.server import batch_lane_publish

    checked: list = []
    real = batch_lane_publish.check_batch

    def counting(frames, producer_id):
        checked.append(bytes(frames))
        return real(frames, producer_id)

    monkeypatch.setattr(batch_lane_publish, "check_batch", counting)
    service = batch_lane.BatchLaneService(broker)
    pid = await broker.create_producer(T, "p", reliable=True)
    call = make_call()
    task = await run_stream(service, call)
    good = frames(2, producer_id=pid)
    call.feed(pb.PublishRequest(sequence=1, producer_id=pid, frames=good))
    call.feed(pb.PublishRequest(sequence=2, producer_id=pid, frames=good[:-1]))  # torn
    call.feed(pb.PublishRequest(sequence=3, producer_id=pid, frames=good))
    call.end()
    await asyncio.wait_for(task, 10)
    acks = {a.sequence: a for a in map(decoded, call.written)}
    assert checked == [good[:-1]]  # only the batch the read left unchecked
    assert (acks[1].first_offset, acks[1].last_offset, acks[3].first_offset, acks[3].last_offset) == (0, 1, 2, 3)
    with pytest.raises(Exception) as refused:
        message_codec.validate(good[:-1])
    assert acks[2].status == batch_status(refused.value)
    assert broker.topics[T].storage.next_offset == 4
