"""The shared health check: one wheel and one task for every watch of a loop (fake stubs, no servers)."""

from __future__ import annotations

import asyncio
import math

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.client import health
from danube.client.health import CONSUMER, PRODUCER, HealthWatch, Wheel
from danube.proto.danube import DanubeApi_pb2 as danube_pb
from danube.proto.danube_batch import batch_pb2 as batch_pb
from tests.support.waiting import async_wait_until

OK = danube_pb.HealthCheckResponse(status=danube_pb.HealthCheckResponse.OK)
CLOSE = danube_pb.HealthCheckResponse(status=danube_pb.HealthCheckResponse.CLOSE)


class FakeStub:
    """A ``HealthCheckStub``: answers CLOSE for the ids in ``closed``, after ``delay_s`` (per id)."""

    def __init__(self) -> None:
        self.closed: set[int] = set()
        self.delay_s: dict[int, float] = {}
        self.calls: list[tuple[float, int]] = []  # (loop time, id)

    async def HealthCheck(self, request, timeout):  # noqa: N802 - the gRPC method's name
        self.calls.append((asyncio.get_running_loop().time(), request.id))
        await asyncio.sleep(self.delay_s.get(request.id, 0.0))
        return CLOSE if request.id in self.closed else OK


class FakeConn:
    def __init__(self, stub: FakeStub) -> None:
        self.health = stub


def _watches(stub: FakeStub, n: int, interval_s: float, closes: list[int]) -> list[HealthWatch]:
    conn = FakeConn(stub)
    return [
        HealthWatch(PRODUCER, lambda i=i: (conn, i), lambda i=i: closes.append(i), interval_s=interval_s, what=f"p{i}")
        for i in range(n)
    ]


ops = st.lists(st.tuples(st.sampled_from(["add", "remove", "tick"]), st.integers(0, 40)), max_size=300)


@settings(max_examples=200, deadline=None)
@given(slots=st.integers(1, 30), ops=ops)
def test_every_member_is_visited_exactly_once_per_turn(slots, ops):
    wheel = Wheel(slots)
    members: set[int] = set()
    for op, m in ops:
        if op == "add":
            wheel.add(m)
            members.add(m)
        elif op == "remove":
            wheel.remove(m)
            members.discard(m)
        else:
            wheel.advance()
    assert len(wheel) == len(members) and all(m in wheel for m in members)
    seen: list[int] = []
    for _ in range(wheel.slots):
        seen.extend(wheel.advance())
    assert sorted(seen) == sorted(members)


@settings(max_examples=200, deadline=None)
@given(slots=st.integers(1, 30), n=st.integers(0, 200), ticks=st.lists(st.integers(0, 5), max_size=50))
def test_members_added_between_ticks_spread_evenly(slots, n, ticks):
    """However the adds fall between ticks, the slots' loads differ by one at most: no burst."""
    wheel = Wheel(slots)
    added = 0
    for t in ticks or [0]:
        for _ in range(t):
            wheel.advance()
        for _ in range(min(n - added, 7)):
            wheel.add(added)
            added += 1
    while added < n:
        wheel.add(added)
        added += 1
    loads = wheel.loads()
    assert sum(loads) == n and max(loads) - min(loads) <= 1


def test_a_lone_member_is_first_visited_a_full_turn_later():
    wheel = Wheel(10)
    for _ in range(3):
        wheel.advance()
    wheel.add("w")
    visits = [i for i in range(10) if wheel.advance()]
    assert visits == [9]  # the slot just visited: the last of the turn


async def test_a_thousand_watches_share_one_task_and_are_checked_once_per_interval_spread_out():
    stub, closes = FakeStub(), []
    interval = 0.5
    watches = _watches(stub, 1000, interval, closes)
    before = len(asyncio.all_tasks())
    for w in watches:
        w.start()
    checker = health.checker_for(interval)
    batches: list[int] = []  # watches due per tick
    advance = checker.wheel.advance

    def counted() -> list:
        due = advance()
        batches.append(len(due))
        return due

    checker.wheel.advance = counted  # type: ignore[method-assign]
    try:
        assert health.watching() == 1000
        assert len(asyncio.all_tasks()) == before + 1  # one checker task, not one per watch
        await async_wait_until(lambda: len({i for _, i in stub.calls}) == 1000, timeout=10)
        # the first turn asked each once; spread: no tick took more than its share of the watches
        first_turn = stub.calls[:1000]
        assert sorted(i for _, i in first_turn) == list(range(1000))
        assert max(batches) == math.ceil(1000 / checker.wheel.slots) and checker.wheel.slots == 10
        assert closes == []
    finally:
        for w in watches:
            await w.stop()
    assert health.watching() == 0
    assert len(asyncio.all_tasks()) == before


async def test_close_tells_the_owner_and_a_stopped_watch_is_not_told():
    stub, closes = FakeStub(), []
    watches = _watches(stub, 3, 0.1, closes)
    stub.closed = {0, 1}
    stub.delay_s[1] = 0.3  # CLOSE arrives after the watch was stopped
    for w in watches:
        w.start()
    try:
        await async_wait_until(lambda: any(i == 1 for _, i in stub.calls))
        watches[1].cancel()  # its call is in flight
        await async_wait_until(lambda: 0 in closes)
        await asyncio.sleep(0.4)  # the stopped watch's CLOSE has come back by now
        assert 1 not in closes and 2 not in closes
        assert watches[0].running and not watches[1].running
    finally:
        for w in watches:
            await w.stop()


async def test_a_broker_slow_to_answer_does_not_hold_back_the_other_checks():
    stub, closes = FakeStub(), []
    watches = _watches(stub, 4, 0.2, closes)
    stub.delay_s[0] = 10.0  # never answers within the test
    for w in watches:
        w.start()

    def counts() -> dict[int, int]:
        return {i: sum(1 for _, j in stub.calls if j == i) for i in range(4)}

    try:
        await async_wait_until(lambda: all(counts()[i] >= 3 for i in (1, 2, 3)))
        assert counts()[0] == 1  # not asked again while its call waits
    finally:
        for w in watches:
            await w.stop()
    assert health.watching() == 0


async def test_not_connected_or_no_id_yet_is_not_asked_and_interval_zero_never_starts():
    stub = FakeStub()
    conn = FakeConn(stub)
    idle = HealthWatch(PRODUCER, lambda: (None, 3), lambda: None, interval_s=0.05, what="idle")
    unsubscribed = HealthWatch(PRODUCER, lambda: (conn, -1), lambda: None, interval_s=0.05, what="unsubscribed")
    off = HealthWatch(PRODUCER, lambda: (conn, 1), lambda: None, interval_s=0.0, what="off")
    for w in (idle, unsubscribed, off):
        w.start()
    assert idle.running and unsubscribed.running and not off.running
    await asyncio.sleep(0.15)
    assert stub.calls == []
    assert await idle.check_once() is None
    await idle.stop()
    await unsubscribed.stop()
    assert health.watching() == 0


class FakeBatchLane:
    """The batch lane's ``Health``: the ids in ``closed`` come back closed; or UNIMPLEMENTED."""

    def __init__(self, closed: set[int], refusal: grpc.StatusCode | None = None) -> None:
        self.closed = closed
        self.refusal = refusal
        self.calls: list[tuple[list[int], list[int]]] = []  # (producer ids, consumer ids)

    async def Health(self, request, timeout):  # noqa: N802 - the gRPC method's name
        if self.refusal is not None:
            from danube.client.h2.status import rpc_error

            raise rpc_error(self.refusal, "not this call")
        self.calls.append((list(request.producer_ids), list(request.consumer_ids)))
        return batch_pb.HealthResponse(
            closed_producer_ids=[i for i in request.producer_ids if i in self.closed],
            closed_consumer_ids=[i for i in request.consumer_ids if i in self.closed],
        )


class FakeBatchConn(FakeConn):
    def __init__(self, stub: FakeStub, lane: FakeBatchLane) -> None:
        super().__init__(stub)
        self.batch_lane = lane
        self.batch_health = True


async def test_watches_of_one_connection_are_checked_together_by_the_batch_call():
    stub, closes = FakeStub(), []
    interval = 0.5  # 10 slots: a connection's due watches wait 2 ticks for each other
    lanes = [FakeBatchLane({3, 500}) for _ in range(4)]
    conns = [FakeBatchConn(stub, lane) for lane in lanes]
    watches = [
        HealthWatch(
            PRODUCER if i % 2 else CONSUMER,
            lambda i=i: (conns[i % 4], i),
            lambda i=i: closes.append(i),
            interval_s=interval,
            what=f"w{i}",
        )
        for i in range(1000)
    ]
    for w in watches:
        w.start()
    try:

        def asked() -> list[int]:
            return [i for lane in lanes for p, c in lane.calls for i in p + c]

        await async_wait_until(lambda: len(set(asked())) == 1000, timeout=10)
        assert sorted(asked()[:1000]) == list(range(1000))  # each once in the first turn
        assert stub.calls == []  # no call per watch
        # one call per connection every other tick at most, instead of one per watch
        assert sum(len(lane.calls) for lane in lanes) <= 4 * 6
        for lane, conn_index in zip(lanes, range(4), strict=True):
            for producers, consumers in lane.calls:
                assert all(i % 4 == conn_index and i % 2 for i in producers)
                assert all(i % 4 == conn_index and not i % 2 for i in consumers)
        await async_wait_until(lambda: sorted(set(closes)) == [3, 500])
    finally:
        for w in watches:
            await w.stop()
    assert health.watching() == 0


@pytest.mark.parametrize("refusal", [grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.PERMISSION_DENIED])
async def test_a_broker_without_the_batch_call_is_asked_per_watch_from_then_on(refusal):
    stub, closes = FakeStub(), []
    stub.closed = {1}
    lane = FakeBatchLane(set(), refusal)
    conn = FakeBatchConn(stub, lane)
    watches = [
        HealthWatch(PRODUCER, lambda i=i: (conn, i), lambda i=i: closes.append(i), interval_s=0.1, what=f"p{i}")
        for i in range(3)
    ]
    for w in watches:
        w.start()
    try:
        await async_wait_until(lambda: closes == [1] or len(closes) > 1)
        assert closes[:1] == [1] and set(closes) == {1}
        assert conn.batch_health is False
        await async_wait_until(lambda: len(stub.calls) >= 9)  # every watch, turn after turn
        assert {i for _, i in stub.calls} == {0, 1, 2}
    finally:
        for w in watches:
            await w.stop()


async def test_a_connection_with_more_due_watches_than_one_call_may_name_is_asked_in_several_calls(monkeypatch):
    monkeypatch.setattr(health, "HEALTH_IDS_PER_CALL", 7)
    stub, closes = FakeStub(), []
    lane = FakeBatchLane({12})
    conn = FakeBatchConn(stub, lane)
    watches = [
        HealthWatch(PRODUCER, lambda i=i: (conn, i), lambda i=i: closes.append(i), interval_s=0.1, what=f"p{i}")
        for i in range(40)
    ]
    for w in watches:
        w.start()
    try:
        await async_wait_until(lambda: {i for p, _ in lane.calls for i in p} == set(range(40)), timeout=10)
        assert all(len(p) + len(c) <= 7 for p, c in lane.calls)
        await async_wait_until(lambda: closes[:1] == [12])
    finally:
        for w in watches:
            await w.stop()


class KeyedBatchConn(FakeBatchConn):
    """A connection to the broker named by ``broker_key`` (as ``BrokerConnection`` has one)."""

    def __init__(self, stub: FakeStub, lane: FakeBatchLane, broker_key) -> None:
        super().__init__(stub, lane)
        self.broker_key = broker_key


async def test_watches_on_several_connections_to_one_broker_are_asked_in_one_call():
    stub, closes = FakeStub(), []
    interval = 0.5
    lanes = [FakeBatchLane({7, 20}) for _ in range(5)]
    # four clients' connections to broker A (plain text), one to broker B
    conns = [KeyedBatchConn(stub, lanes[i], ("a:1", None)) for i in range(4)]
    conns.append(KeyedBatchConn(stub, lanes[4], ("b:1", None)))
    watches = [
        HealthWatch(
            PRODUCER, lambda i=i: (conns[i % 5], i), lambda i=i: closes.append(i), interval_s=interval, what=f"p{i}"
        )
        for i in range(200)
    ]
    for w in watches:
        w.start()
    try:
        await async_wait_until(lambda: sorted(set(closes)) == [7, 20], timeout=10)
        await async_wait_until(
            lambda: {i for lane in lanes for p, _ in lane.calls for i in p} == set(range(200)), timeout=10
        )
        calls_a = [p for lane in lanes[:4] for p, _ in lane.calls]
        calls_b = lanes[4].calls
        # broker A's ids travel together (never one call per connection), B's on B's connection
        assert all(i % 5 != 4 for p in calls_a for i in p)
        assert all(i % 5 == 4 for p, _ in calls_b for i in p)
        assert any(len({i % 5 for i in p}) > 1 for p in calls_a)
        assert stub.calls == []
    finally:
        for w in watches:
            await w.stop()
    assert health.watching() == 0


async def test_a_broker_without_the_batch_call_turns_it_off_on_every_connection_that_asked():
    stub, closes = FakeStub(), []
    conns = [KeyedBatchConn(stub, FakeBatchLane(set(), grpc.StatusCode.UNIMPLEMENTED), ("a:1", None)) for _ in range(3)]
    stub.closed = {4}
    watches = [
        HealthWatch(PRODUCER, lambda i=i: (conns[i % 3], i), lambda i=i: closes.append(i), interval_s=0.1, what=f"p{i}")
        for i in range(6)
    ]
    for w in watches:
        w.start()
    try:
        await async_wait_until(lambda: 4 in closes)
        assert all(conn.batch_health is False for conn in conns)
        assert sum(len(conn.batch_lane.calls) for conn in conns) == 0  # every batch call was refused
    finally:
        for w in watches:
            await w.stop()
