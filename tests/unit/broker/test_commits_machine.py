"""The commit queues of several topics sharing one loop turn (danube.broker.commits), as a state
machine: appends (answered by callback or by a future) on topics whose storage is durable at
once, waits for a sync (``when_durable``) or only has the contract's ``wait_durable``; syncs that
succeed or fail, waits refused at once, and loop iterations in any order (cancellation at stop:
the test after it).

Checked throughout: no batch is answered or made visible before its storage called it durable,
nor inside the publish call that appended it; each topic's batches are answered in offset order;
at the end every batch was answered exactly once (committed or with the error of the wait that
covered it), the count of answers by callback matches, and the publish counters hold every
committed batch."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from danube.broker.commits import CommitTurn
from danube.broker.policies import TopicPolicies
from danube.broker.topic import Topic
from danube.server.metrics import PrometheusMetrics

KINDS = ("instant", "wal", "contract")


class FakeStorage:
    """Offsets only: a batch's first byte is its message count.  ``instant``: durable when
    appended (sync=never, memory); ``wal``: durable when the test syncs (``when_durable``
    callbacks answered on the loop, a refusal at once when asked to); ``contract``: no
    ``when_durable``, ``wait_durable`` awaited by a task."""

    def __init__(self, kind: str, loop: asyncio.AbstractEventLoop) -> None:
        self.kind = kind
        self.loop = loop
        self.next_offset = 0
        self.first_offset = 0
        self.durable = -1  # the highest offset called durable
        self.waiters: list[tuple[int, object]] = []
        self.refuse_next = False
        if kind != "wal":
            self.when_durable = None  # (the commit queue looks it up with getattr)
        self.contract_waits: list[tuple[int, asyncio.Future]] = []

    def append_frames(self, buf) -> tuple[int, int]:
        first = self.next_offset
        self.next_offset += buf[0]
        if self.kind == "instant":
            self.durable = self.next_offset - 1
        return first, self.next_offset - 1

    def durable_now(self, offset: int) -> bool:
        return offset <= self.durable

    def _when_durable(self, offset: int, callback) -> None:
        if self.refuse_next:
            self.refuse_next = False
            raise OSError("the log is closed")
        self.waiters.append((offset, callback))

    async def wait_durable(self, offset: int) -> None:
        if offset <= self.durable:
            return
        fut = self.loop.create_future()
        self.contract_waits.append((offset, fut))
        await fut

    def sync(self) -> None:
        self.durable = self.next_offset - 1
        waiters, self.waiters = self.waiters, []
        for offset, callback in waiters:
            self.loop.call_soon(callback, None)
        waits, self.contract_waits = self.contract_waits, []
        for _offset, fut in waits:
            if not fut.done():
                fut.set_result(None)

    def fail(self) -> None:
        waiters, self.waiters = self.waiters, []
        for _offset, callback in waiters:
            self.loop.call_soon(callback, OSError("sync failed"))
        waits, self.contract_waits = self.contract_waits, []
        for _offset, fut in waits:
            if not fut.done():
                fut.set_exception(OSError("sync failed"))


class CommitMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.counted = 0  # answers by callback the turn reported
        self.turn = CommitTurn(self._answered)
        self.metrics = PrometheusMetrics()
        self.topics: list[Topic] = []
        self.storages: list[FakeStorage] = []
        self.batches: dict[int, tuple[int, int, int]] = {}  # tag -> (topic, first, last)
        self.outcomes: dict[int, tuple[str, object]] = {}  # tag -> ("ok", offsets) | ("error", exc)
        self.answer_order: list[list[int]] = []  # per topic: tags answered by callback, in order
        self.in_call = False  # a publish call is running
        self.tags = 0
        self.committed = [[0, 0] for _ in range(3)]  # per topic: messages, batches answered ok
        self.broken: list[str] = []

    def _answered(self, n: int) -> None:
        self.counted += n

    def _outcome(self, tag: int, ok: bool, value: object) -> None:
        # (an answer's exception is logged by the commit, not raised: broken promises are noted)
        topic_index, first, last = self.batches[tag]
        if self.in_call:
            self.broken.append(f"batch {tag} answered inside the publish call")
        if tag in self.outcomes:
            self.broken.append(f"batch {tag} answered twice")
        if ok:
            if value != (first, last):
                self.broken.append(f"batch {tag} answered {value}, appended at {(first, last)}")
            if self.storages[topic_index].durable < last:
                self.broken.append(f"batch {tag} answered before it was durable")
            self.committed[topic_index][0] += last - first + 1
            self.committed[topic_index][1] += 1
        self.outcomes[tag] = ("ok" if ok else "error", value)

    @rule(kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=3))
    @precondition(lambda self: not self.topics)
    def open_topics(self, kinds) -> None:
        for i, kind in enumerate(kinds):
            storage = FakeStorage(kind, self.loop)
            if kind == "wal":
                storage.when_durable = storage._when_durable
            topic = Topic(
                f"/default/t{i}",
                reliable=True,
                storage=storage,  # type: ignore[arg-type]
                policies=TopicPolicies(),
                metrics=self.metrics,
                commit_turn=self.turn,
            )
            self.topics.append(topic)
            self.storages.append(storage)
            self.answer_order.append([])

    def _publish(self, index: int, count: int, by_answer: bool) -> None:
        topic = self.topics[index]
        tag = self.tags
        self.tags += 1
        buf = bytearray([count]) + bytearray(3)
        first = topic.storage.next_offset
        self.batches[tag] = (index, first, first + count - 1)
        self.in_call = True
        try:
            if by_answer:

                def answer(t, producer_id, first, last, exc) -> None:
                    assert producer_id == 0  # the broker's own records: no producer
                    self.answer_order[self.batches[t][0]].append(t)
                    self._outcome(t, exc is None, (first, last) if exc is None else exc)

                assert topic.publish_nowait(None, buf, answer, tag) is None
            else:
                fut = topic.publish_nowait(None, buf)
                assert fut is not None

                def done(f: asyncio.Future, t=tag) -> None:
                    if f.cancelled():
                        self._outcome(t, False, asyncio.CancelledError())
                    elif f.exception() is not None:
                        self._outcome(t, False, f.exception())
                    else:
                        self._outcome(t, True, f.result())

                fut.add_done_callback(done)
        finally:
            self.in_call = False

    @rule(appends=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 3), st.booleans()), min_size=1, max_size=6))
    @precondition(lambda self: bool(self.topics))
    def appends_in_one_iteration(self, appends) -> None:
        """Publish calls that run in the loop's next iteration (after what is ready before them)."""
        for index, count, by_answer in appends:
            self.loop.call_soon(self._publish, index % len(self.topics), count, by_answer)

    @rule()
    @precondition(lambda self: bool(self.topics))
    def iteration(self) -> None:
        self.loop.stop()
        self.loop.run_forever()  # exactly one iteration: what was ready when it began

    @rule(index=st.integers(0, 2))
    @precondition(lambda self: bool(self.topics))
    def sync(self, index: int) -> None:
        self.storages[index % len(self.topics)].sync()

    @rule(index=st.integers(0, 2))
    @precondition(lambda self: bool(self.topics))
    def sync_fails(self, index: int) -> None:
        self.storages[index % len(self.topics)].fail()

    @rule(index=st.integers(0, 2))
    @precondition(lambda self: bool(self.topics))
    def next_wait_refused(self, index: int) -> None:
        storage = self.storages[index % len(self.topics)]
        if storage.kind == "wal":
            storage.refuse_next = True

    @invariant()
    def every_answer_kept_its_promises(self) -> None:
        assert not self.broken, self.broken

    @invariant()
    def nothing_visible_before_durable(self) -> None:
        for topic, storage in zip(self.topics, self.storages):
            assert topic.readable_next <= storage.durable + 1

    @invariant()
    def answers_by_callback_in_offset_order(self) -> None:
        for order in self.answer_order:
            firsts = [self.batches[t][1] for t in order]
            assert firsts == sorted(firsts)

    def teardown(self) -> None:
        try:
            if self.topics:
                self._finish()
        finally:
            self.loop.close()

    def _finish(self) -> None:
        # the broker stops: every wait still out is cancelled (the contract's waiting tasks) or
        # answered by its log (the WAL's) -- settle, sync and iterate until nothing is left
        for _ in range(200):
            for storage in self.storages:
                storage.refuse_next = False
                storage.sync()
            self.loop.stop()
            self.loop.run_forever()
            if len(self.outcomes) == len(self.batches) and not any(t.commits._pending for t in self.topics):
                break
        assert not self.broken, self.broken
        tasks = asyncio.all_tasks(self.loop)
        assert not tasks, "a durability wait task outlived every sync"
        assert set(self.outcomes) == set(self.batches), "a batch was never answered"
        assert self.counted == sum(len(order) for order in self.answer_order), "the in-flight count is off"
        for i, topic in enumerate(self.topics):
            last_ok = max(
                (
                    self.batches[t][2]
                    for t, (how, _v) in self.outcomes.items()
                    if how == "ok" and self.batches[t][0] == i
                ),
                default=-1,
            )
            assert topic.readable_next >= last_ok + 1  # every committed batch is visible
            row = self.metrics._published.get(topic.name)
            messages, ok_batches = self.committed[i]
            if row is None:
                assert ok_batches == 0
            else:
                assert row[0] == messages
                assert sum(row[3:]) == ok_batches  # one latency observation per batch


TestCommitMachine = CommitMachine.TestCase
TestCommitMachine.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def test_cancelled_waits_fail_every_pending_batch_of_their_topic() -> None:
    """At stop a contract storage's waiting task is cancelled: every batch still pending on the
    topic hears it (futures cancelled, answers with CancelledError), and is counted."""
    loop = asyncio.new_event_loop()
    try:
        counted: list[int] = []
        turn = CommitTurn(counted.append)
        storage = FakeStorage("contract", loop)
        topic = Topic(
            "/default/c",
            reliable=True,
            storage=storage,  # type: ignore[arg-type]
            policies=TopicPolicies(),
            metrics=PrometheusMetrics(),
            commit_turn=turn,
        )
        answers: list = []

        async def publish() -> asyncio.Future:
            topic.publish_nowait(None, bytearray([2, 0]), lambda *a: answers.append(a), 7)
            return topic.publish_nowait(None, bytearray([1, 0]))  # type: ignore[return-value]

        fut = loop.run_until_complete(publish())
        loop.run_until_complete(asyncio.sleep(0))  # the turn asked for the wait: a task waits
        (task,) = asyncio.all_tasks(loop)
        task.cancel()
        loop.run_until_complete(asyncio.gather(task, return_exceptions=True))
        assert fut.cancelled()
        assert [(tag, first, last, type(exc)) for tag, _p, first, last, exc in answers] == [
            (7, 0, 1, asyncio.CancelledError)
        ]
        assert counted == [1]
        assert topic.readable_next == 0
    finally:
        loop.close()


def test_a_failing_durability_check_fails_only_its_topics_batches_in_the_shared_turn() -> None:
    loop = asyncio.new_event_loop()
    try:
        counted: list[int] = []
        turn = CommitTurn(counted.append)
        topics = []
        for name in ("/default/broken", "/default/fine"):
            storage = FakeStorage("instant", loop)
            topics.append(
                Topic(
                    name,
                    reliable=True,
                    storage=storage,  # type: ignore[arg-type]
                    policies=TopicPolicies(),
                    metrics=PrometheusMetrics(),
                    commit_turn=turn,
                )
            )

        def broken(offset: int) -> bool:
            raise RuntimeError("a bug in the storage")

        topics[0].storage.durable_now = broken  # type: ignore[method-assign]
        answers: list = []

        async def publish() -> None:
            for topic in topics:
                topic.publish_nowait(None, bytearray([1, 0]), lambda *a: answers.append(a), len(answers))

        loop.run_until_complete(publish())
        loop.run_until_complete(asyncio.sleep(0))  # the one turn callback settles both topics
        assert [(first, last, type(exc)) for _tag, _p, first, last, exc in answers] == [
            (0, 0, RuntimeError),
            (0, 0, type(None)),
        ]
        assert counted == [1, 1]
        assert topics[0].readable_next == 0 and topics[1].readable_next == 1
    finally:
        loop.close()
