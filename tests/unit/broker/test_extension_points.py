"""The broker calls the layers above only through the slots of broker/contracts.py.

A repartition runtime (``repartition``) is told of every topic opened and counts the partitions a
consumer reads; a dead letter whose topic another broker owns goes through ``remote_publisher``.
Fakes stand in for the upper layers here: the broker imports neither.
"""

from danube.broker import FailurePolicy
from danube.broker.service import LookupResult
from danube.metadata import keys
from tests.support.waiting import async_wait_until
from tests.unit.broker.conftest import stop
from tests.unit.broker.test_poison_records import good, raw_frame, receive, store_below_the_check, texts

T = "/default/hooks"
DLQ = "/default/hooks-dlq"


class Repartition:
    def __init__(self, extra: int) -> None:
        self.extra = extra
        self.opened: list[str] = []
        self.asked: list[tuple[str, int]] = []

    def topic_opened(self, name: str) -> None:
        self.opened.append(name)

    async def readable_partitions(self, topic: str, count: int) -> int:
        self.asked.append((topic, count))
        return count + self.extra


async def test_partitions_and_opened_topics_go_through_the_repartition_slot(broker):
    await broker.metadata.put_json(keys.topic_partitions(T), 2)
    assert broker.repartition is None
    assert await broker.partitions(T) == [f"{T}-part-0", f"{T}-part-1"]  # no runtime: the count as recorded

    hook = broker.repartition = Repartition(extra=1)  # a shrink still drains a third partition
    assert await broker.partitions(T) == [f"{T}-part-{i}" for i in range(3)]
    assert hook.asked == [(T, 2)]
    await broker.create_producer(f"{T}-part-0", "p", reliable=True)
    assert hook.opened == [f"{T}-part-0"]
    assert (await broker.topic(f"{T}-part-0")).name == f"{T}-part-0"  # served: no second open
    assert hook.opened == [f"{T}-part-0"]


class Cluster:
    """Owns everything here but the dead-letter topic, which another broker serves."""

    async def check_owner(self, topic: str) -> None:
        assert topic != DLQ, "the dead-letter topic must not be opened here"

    async def lookup(self, topic: str) -> LookupResult:
        if topic == DLQ:
            return LookupResult("redirect", "http://other:6650", "http://other:6650")
        return LookupResult("connect", "http://here:6650", "http://here:6650")


class RemotePublisher:
    def __init__(self) -> None:
        self.published: list[tuple[str, str, str, bytes, dict[str, str]]] = []

    async def publish(self, owner_url, topic, producer_name, payload, *, publish_time, routing_key, attributes):
        self.published.append((owner_url, topic, producer_name, payload, attributes))


async def test_a_dead_letter_served_elsewhere_goes_through_the_remote_publisher(make_broker):
    b = await make_broker(failure_policy=FailurePolicy(poison_policy="dead_letter", dead_letter_topic=DLQ))
    b.cluster = Cluster()
    remote = b.remote_publisher = RemotePublisher()
    pid = await b.create_producer(T, "p", reliable=True)
    cid = await b.subscribe(T, "s", "c")
    store_below_the_check(b, T, raw_frame(b"ke\xffy", payload=b"kept"))
    await b.publish(pid, bytearray(good("m1")))
    assert texts(await receive(b, cid)) == ["m1"]
    await async_wait_until(lambda: remote.published, what="the dead letter handed to the remote publisher")
    owner, topic, producer, payload, attributes = remote.published[0]
    assert (owner, topic, producer, payload) == ("http://other:6650", DLQ, "dlq-s", b"kept")
    assert attributes["x-original-topic"] == T and attributes["x-original-topic-offset"] == "0"
    assert DLQ not in b.topics
    b.cluster = None
    await stop(b)
