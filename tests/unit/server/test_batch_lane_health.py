"""The batch lane's many-ids ``Health``: what it answers, and the bound on the ids one call names."""

from __future__ import annotations

import grpc
import pytest

from danube.proto.danube_batch import batch_pb2 as pb
from danube.server.batch_lane_health import MAX_HEALTH_IDS, HealthLane


class Aborted(Exception):
    pass


class FakeContext:
    def __init__(self) -> None:
        self.code: grpc.StatusCode | None = None
        self.details = ""

    async def abort(self, code, details, trailing_metadata=()):
        self.code, self.details = code, details
        raise Aborted


class FakeBroker:
    def __init__(self, serving: set[tuple[str, int]]) -> None:
        self.serving = serving
        self.asked = 0

    def health(self, kind: str, client_id: int) -> bool:
        self.asked += 1
        return (kind, client_id) in self.serving


def _lane(broker: FakeBroker) -> HealthLane:
    lane = HealthLane()
    lane._broker = broker  # type: ignore[assignment]
    return lane


async def test_answers_the_ids_the_broker_no_longer_serves():
    broker = FakeBroker({("producer", 1), ("consumer", 2)})
    answer = await _lane(broker).Health(pb.HealthRequest(producer_ids=[1, 2], consumer_ids=[2, 3]), FakeContext())
    assert list(answer.closed_producer_ids) == [2]
    assert list(answer.closed_consumer_ids) == [3]


async def test_a_call_naming_too_many_ids_is_refused_before_any_is_looked_up():
    broker = FakeBroker(set())
    context = FakeContext()
    request = pb.HealthRequest(producer_ids=range(MAX_HEALTH_IDS), consumer_ids=[0])
    with pytest.raises(Aborted):
        await _lane(broker).Health(request, context)
    assert context.code == grpc.StatusCode.INVALID_ARGUMENT
    assert str(MAX_HEALTH_IDS + 1) in context.details and "split" in context.details
    assert broker.asked == 0
