"""The load manager: placement of unassigned topics, run by the cluster leader only.

Workflow (Danube's load manager, as its "Load Manager & Rebalancing Architecture" page describes it):

1. a topic that needs a broker has a marker ``/cluster/unassigned/{ns}/{topic}``:
   ``null`` for a new topic, ``{"reason": "unload", "from_broker": id}`` after an
   unload, ``{"reason": "rebalance", "from_broker", "to_broker", ...}`` for a move,
   ``{"reason": "failover", "from_broker": id}`` after a broker died;
2. the leader ranks the active brokers with :mod:`danube.cluster.scoring`
   (``fair`` | ``balanced`` | ``weighted_load``), using each broker's latest
   LoadReport for resources and its *current assignments* for its topics, so the
   ranking already counts topics placed since that report;
3. a ``to_broker`` hint wins when that broker is active; ``from_broker`` is not
   chosen unless it is the only active broker; otherwise the choice rotates round
   robin among the brokers whose score is within 10% of the lowest;
4. the assignment ``/cluster/brokers/{id}/{ns}/{topic}`` is written and the marker
   deleted in one transaction that also checks the marker is unchanged (its
   mod_revision) and that this broker is still the leader (``LeaderElection.guard``);
5. the in-memory usage is updated at once, before the next choice.

Hand-over of a move: a marker with reason ``rebalance`` or ``unload`` is placed only
once its ``from_broker`` has sealed the topic and said so by rewriting the marker
with ``"sealed": true`` (``ClusterNode``; an admin unload seals first and writes it
that way), or once that broker is no longer registered, or after
``handoff_timeout_s``: the new owner must not open the topic before the old one
stopped writing, or the offsets would fork.

Batching: every pending marker is placed in one pass; the writes go out as
transactions of ``batch_size`` topics (2 operations each, under etcd's default
limit of 128 operations per transaction), so 1,000 new topics take ~17 round
trips, not one per topic per broker.  A batch whose comparison fails (a marker
changed meanwhile, or leadership was lost) is retried topic by topic.

Broker death: when a registration disappears, the leader moves each of that
broker's assignments back to unassigned (``reason: failover``) in batched
transactions guarded by "the registration is still absent", and they are placed
again like new topics.  Assignments of brokers that are not registered when a
leader is elected are treated the same after ``orphan_grace_s`` (a broker may
just be starting).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Iterable, Protocol

from danube import movetrace
from danube._tasks import cancel_and_wait
from danube.cluster import scoring
from danube.cluster.load_report import LoadReport, TopicLoad
from danube.cluster.view import ClusterView
from danube.errors import MetadataError
from danube.metadata import keys
from danube.metadata.store import Compare, MetadataStore, Op

log = logging.getLogger(__name__)

ROUND_ROBIN_WITHIN = 0.10
DEFAULT_BATCH = 60
MOVE_REASONS = ("rebalance", "unload")
HANDOFF_TIMEOUT_S = 15.0


class Leadership(Protocol):
    is_leader: bool

    def guard(self) -> list[Compare]: ...


class LoadManager:
    def __init__(
        self,
        store: MetadataStore,
        view: ClusterView,
        leadership: Leadership,
        *,
        strategy: str = "fair",
        batch_size: int = DEFAULT_BATCH,
        orphan_grace_s: float = 10.0,
        handoff_timeout_s: float = HANDOFF_TIMEOUT_S,
        metrics=None,
    ) -> None:
        if strategy not in scoring.STRATEGIES:
            raise ValueError(f"unknown assignment strategy {strategy!r}; expected one of {scoring.STRATEGIES}")
        self.store = store
        self.view = view
        self.leadership = leadership
        self.strategy = strategy
        self.batch_size = max(1, int(batch_size))
        self.orphan_grace_s = orphan_grace_s
        self.handoff_timeout_s = handoff_timeout_s
        # a danube.cluster.rebalancing.RebalancingMetrics: danube_topic_assignments_total{broker_id, action}
        # counts every assignment written here (assign) and every failover (unassign of the dead broker)
        self.metrics = metrics
        self._handoff_since: dict[tuple[str, int], float] = {}  # (topic, marker revision) → first seen
        self._last_selected: str | None = None
        self._task: asyncio.Task | None = None
        self._elected_at = 0.0
        self._dead_seen: set[str] = set()
        self.assigned_total = 0
        self.reassigned_total = 0
        self.transactions = 0

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._elected_at = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="load-manager")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        while True:
            changed = self.view.changed()
            waiter = asyncio.ensure_future(changed)
            try:
                if self.leadership.is_leader:
                    await self.reassign_dead()
                    await self.assign_pending()
            except asyncio.CancelledError:
                waiter.cancel()
                raise
            except Exception as exc:  # noqa: BLE001 - the next change retries
                log.warning("load manager cycle failed: %s", exc)
                await asyncio.sleep(0.2)
            # also re-check orphans periodically.  asyncio.wait, not wait_for: on Python 3.11
            # wait_for can swallow a cancellation that races the waiter, and stop() would hang
            await asyncio.wait({waiter}, timeout=1.0)
            if not waiter.done():
                waiter.cancel()

    # ------------------------------------------------------------ ranking and choice

    def usage_reports(self) -> dict[str, LoadReport]:
        """One report per active broker: its last LoadReport's resources with its current topics."""
        reports = {}
        for broker in self.view.active_brokers():
            base = self.view.loads.get(broker)
            by_name = {t.topic_name: t for t in base.topics} if base is not None else {}
            topics = [by_name.get(t) or TopicLoad(t) for t in sorted(self.view.broker_topics.get(broker, ()))]
            reports[broker] = LoadReport(
                resources_usage=list(base.resources_usage) if base else [],
                topics=topics,
                total_throughput_mbps=base.total_throughput_mbps if base else 0.0,
                broker_id=broker,
            )
        return reports

    def select(
        self, ranked: list[tuple[str, float]], *, exclude: Iterable[str] = (), hint: str | None = None
    ) -> str | None:
        excluded = set(exclude)
        candidates = [(b, s) for b, s in ranked if b not in excluded]
        if hint is not None and hint not in excluded and any(b == hint for b, _ in candidates):
            return hint
        if not candidates:
            return None
        lowest = candidates[0][1]
        limit = lowest + abs(lowest) * ROUND_ROBIN_WITHIN + 1e-9
        within = sorted(b for b, s in candidates if s <= limit)
        last = self._last_selected
        choice = next((b for b in within if last is not None and b > last), within[0])
        self._last_selected = choice
        return choice

    # ------------------------------------------------------------ assignment

    async def assign_pending(self) -> int:
        """Place every pending unassigned topic; returns how many were assigned."""
        pending = sorted(self.view.unassigned.items())
        if not pending:
            return 0
        reports = self.usage_reports()
        if not reports:
            return 0
        writes: list[tuple[str, str | None, int]] = []  # (topic, broker or None = drop marker, marker revision)
        for topic, (marker, revision) in pending:
            marker = marker if isinstance(marker, dict) else {}
            owner = self.view.owner(topic)
            if owner is not None:
                if owner != marker.get("from_broker"):
                    writes.append((topic, None, revision))  # already placed: the marker is stale
                continue  # still owned by the broker it moves from: wait for its assignment to go
            if not self._handed_over(topic, marker, revision):
                continue  # the source has not sealed it yet: placing it now could fork its offsets
            ranked = scoring.rankings(self.strategy, reports.values())
            exclude = [marker["from_broker"]] if marker.get("from_broker") else []
            broker = self.select(ranked, exclude=exclude, hint=marker.get("to_broker"))
            if broker is None and exclude:
                # the broker it moves away from is the only one left (a single-broker cluster, or it
                # left and came back): better there than nowhere
                broker = self.select(ranked, hint=marker.get("to_broker"))
            if broker is None:
                log.warning(
                    "no eligible broker for %s (active: %s, excluded: %s)",
                    topic,
                    ", ".join(reports) or "none",
                    ", ".join(map(str, exclude)) or "none",
                )
                continue
            reports[broker].topics.append(TopicLoad(topic))  # in-memory usage, before the next choice
            if marker.get("from_broker"):
                movetrace.step(topic, "leader.placing")
            writes.append((topic, broker, revision))
        done = 0
        for start in range(0, len(writes), self.batch_size):
            done += await self._write_batch(writes[start : start + self.batch_size])
        return done

    def _handed_over(self, topic: str, marker: dict, revision: int) -> bool:
        """A move (rebalance / unload) is placed once its source acknowledged the hand-over
        (``"sealed": true`` in the marker, written after the seal), or the source is gone, or
        ``handoff_timeout_s`` passed (logged)."""
        if marker.get("reason") not in MOVE_REASONS or marker.get("sealed"):
            return True
        source = marker.get("from_broker")
        if source not in self.view.registered:
            return True
        since = self._handoff_since.setdefault((topic, revision), time.monotonic())
        if len(self._handoff_since) > 100_000:
            self._handoff_since.clear()
        if time.monotonic() - since < self.handoff_timeout_s:
            return False
        log.warning(
            "%s: broker %s did not confirm the hand-over within %.0f s; placing it anyway",
            topic,
            source,
            self.handoff_timeout_s,
        )
        return True

    def _ops(self, topic: str, broker: str | None, revision: int) -> tuple[Compare, list[Op]]:
        marker_key = keys.unassigned(topic)
        ops = [Op.delete(marker_key)]
        if broker is not None:
            ops.insert(0, Op.put(keys.broker_topic(broker, topic), b"null"))
        return Compare.mod_revision(marker_key, "==", revision), ops

    async def _write_batch(self, batch: list[tuple[str, str | None, int]]) -> int:
        if not batch or not self.leadership.is_leader:
            return 0
        compares = list(self.leadership.guard())
        ops: list[Op] = []
        for topic, broker, revision in batch:
            compare, topic_ops = self._ops(topic, broker, revision)
            compares.append(compare)
            ops.extend(topic_ops)
        result = await self.store.txn(compares, ops)
        self.transactions += 1
        if result.succeeded:
            return self._applied(batch)
        # one marker changed (or leadership is gone): topic by topic
        done = 0
        for item in batch:
            if not self.leadership.is_leader:
                break
            compare, topic_ops = self._ops(*item)
            single = await self.store.txn(list(self.leadership.guard()) + [compare], topic_ops)
            self.transactions += 1
            if single.succeeded:
                done += self._applied([item])
        return done

    def _applied(self, batch) -> int:
        placed = 0
        for topic, broker, _revision in batch:
            self.view.unassigned.pop(topic, None)
            if broker is not None:
                self.view.assign_local(topic, broker)
                placed += 1
                movetrace.step(topic, "leader.assigned")
                if self.metrics is not None:
                    self.metrics.assignment(broker, "assign")
                log.debug("assigned %s to %s", topic, broker)
        self.assigned_total += placed
        return placed

    # ------------------------------------------------------------ broker death

    def dead_brokers(self) -> list[str]:
        """Brokers holding assignments without a registration (after the grace period for orphans)."""
        dead = []
        grace_over = time.monotonic() - self._elected_at >= self.orphan_grace_s
        for broker, topics in self.view.broker_topics.items():
            if topics and broker not in self.view.registered:
                if broker in self._dead_seen or grace_over:
                    dead.append(broker)
        return sorted(dead)

    def note_deregistered(self, broker_id: str) -> None:
        """A registration was deleted while this broker watched: no grace needed."""
        self._dead_seen.add(broker_id)

    def note_registered(self, broker_id: str) -> None:
        self._dead_seen.discard(broker_id)

    async def reassign_dead(self) -> int:
        moved = 0
        for broker in self.dead_brokers():
            topics = sorted(self.view.broker_topics.get(broker, ()))
            marker = json.dumps({"reason": "failover", "from_broker": broker}, sort_keys=True).encode()
            register = keys.broker_register(broker)
            for start in range(0, len(topics), self.batch_size):
                if not self.leadership.is_leader:
                    return moved
                chunk = topics[start : start + self.batch_size]
                ops = []
                for topic in chunk:
                    ops += [Op.delete(keys.broker_topic(broker, topic)), Op.put(keys.unassigned(topic), marker)]
                compares = list(self.leadership.guard()) + [Compare.version(register, "==", 0)]
                try:
                    result = await self.store.txn(compares, ops)
                except MetadataError as exc:
                    log.warning("reassigning topics of dead broker %s failed: %s", broker, exc)
                    return moved
                self.transactions += 1
                if not result.succeeded:
                    break  # it registered again, or leadership moved
                if self.metrics is not None:
                    self.metrics.assignment(broker, "unassign", len(chunk))
                for topic in chunk:
                    self.view.broker_topics.get(broker, set()).discard(topic)
                    if self.view.assignments.get(topic) == broker:
                        del self.view.assignments[topic]
                    self.view.unassigned[topic] = (json.loads(marker), result.revision)
                moved += len(chunk)
            if moved:
                log.warning("broker %s is gone: %d topic(s) back to unassigned", broker, moved)
        self.reassigned_total += moved
        return moved
