"""The leader-only rebalancing loop: :class:`Rebalancer`.

One cycle (:meth:`Rebalancer.run_cycle`), every ``check_interval_seconds``:

1. skip unless this broker is the leader and rebalancing is enabled;
2. read the cluster from the metadata store: registrations, broker states
   (``active`` when absent), assignments; and the latest load report of each
   broker (a :class:`LoadReportSource`); skip below ``min_brokers_for_rebalance``
   active brokers that have reported;
3. balance over the active brokers (strategy score; mean, std, CV; gauges);
   balanced when CV < threshold;
4. rate limit (moves in the last hour, from the history) and the cooldown since
   the last move; both read from ``/cluster/rebalancing_history/`` so they
   survive a leader change;
5. the next move of the plan (re-planned whenever the reports changed or the
   planned move is no longer valid), or Danube's greedy move with
   ``planner: greedy``; none → skip with a warning;
6. execute it through the :class:`MoveExecutor` (unassigned marker with the
   ``to_broker`` hint + delete the source assignment, one guarded transaction),
   wait until a broker holds the topic again, write the history record, count.

At most one move per cycle.  The loop runs in the broker's event loop
(:meth:`start` / :meth:`stop`); the cluster's leader wiring calls ``start`` on
every broker and passes ``is_leader`` and ``guard`` from its LeaderElection.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from danube._tasks import cancel_and_wait
from danube.cluster.load_report import LoadReport
from danube.errors import DanubeError
from danube.metadata import keys
from danube.metadata.store import Compare, MetadataStore, Op

from . import history as _history
from .balance import ClusterBalance, ClusterState, build_state
from .candidates import Eligibility, eligibility
from .config import OSCILLATION_WINDOW_SECONDS, RATE_WINDOW_SECONDS, RebalancingConfig
from .history import MoveRecord, RebalancingHistory
from .metrics import RebalancingMetrics
from .planner import PlannedMove, greedy_move, greedy_plan, plan_moves

log = logging.getLogger(__name__)


class Clock(Protocol):
    def now(self) -> float:
        """Unix time in seconds."""


class SystemClock:
    def now(self) -> float:
        return time.time()


class LoadReportSource(Protocol):
    async def latest_reports(self) -> Mapping[str, Any]:
        """broker id → its latest LoadReport (anything :mod:`danube.cluster.scoring` accepts)."""


class StoreLoadReports:
    """Latest reports from the metadata store: ``/cluster/load/{broker_id}`` (Danube's layout), JSON."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    async def latest_reports(self) -> dict[str, LoadReport]:
        prefix = keys.load_report("")
        out = {}
        for kv in await self.store.get_prefix(prefix):
            broker = kv.key[len(prefix) :]
            if not broker or "/" in broker:
                continue
            try:
                out[broker] = LoadReport.from_json(kv.value)
            except DanubeError as exc:
                log.warning("ignoring the load report of broker %s: %s", broker, exc)
        return out


class MoveExecutor(Protocol):
    async def move(self, topic: str, from_broker: str, to_broker: str) -> int | None:
        """Start moving ``topic``: unassigned marker with the ``to_broker`` hint, source assignment deleted.
        Raises when nothing was changed; may return the store revision of the change."""


class ClusterSource(Protocol):
    """An in-memory view of ``/cluster/`` (``danube.cluster.view.ClusterView`` fits): what a cycle reads
    instead of the store when given."""

    registered: Mapping[str, Any]  # broker id → registration
    broker_states: Mapping[str, str]  # broker id → active | draining | drained
    broker_topics: Mapping[str, set]  # broker id → topics assigned
    assignments: Mapping[str, str]  # topic → broker id
    unassigned: Mapping[str, Any]  # topic → marker
    loads: Mapping[str, Any]  # broker id → latest LoadReport
    revision: int

    async def wait_for(self, predicate: Callable[[], Any], timeout: float) -> Any: ...


class ViewLoadReports:
    """The latest reports as a :class:`ClusterSource` holds them."""

    def __init__(self, view: ClusterSource) -> None:
        self.view = view

    async def latest_reports(self) -> dict[str, Any]:
        return dict(self.view.loads)


class MoveRejectedError(DanubeError):
    """The move's transaction did not apply (no longer leader, or the source no longer owns the topic)."""

    retriable = True


class MetadataMoveExecutor:
    """The graceful move through the metadata store, as one transaction guarded by the leader's key.

    ``/cluster/unassigned/{ns}/{topic}`` ← ``{"reason": "rebalance", "from_broker", "to_broker",
    "timestamp"}`` and ``DELETE /cluster/brokers/{from}/{ns}/{topic}``: the source broker's watcher
    seals and unloads the topic (clients are redirected), the load manager assigns it to
    ``to_broker`` when that broker is active (else to the best other one).
    """

    def __init__(
        self, store: MetadataStore, clock: Clock | None = None, guard: Callable[[], Sequence[Compare]] | None = None
    ) -> None:
        self.store = store
        self.clock = clock or SystemClock()
        self.guard = guard

    async def move(self, topic: str, from_broker: str, to_broker: str) -> int:
        marker = {
            "reason": "rebalance",
            "from_broker": from_broker,
            "to_broker": to_broker,
            "timestamp": int(self.clock.now()),
        }
        source = keys.broker_topic(from_broker, topic)
        compare = [*(self.guard() if self.guard else ()), Compare.version(source, "!=", 0)]
        result = await self.store.txn(compare, [Op.put_json(keys.unassigned(topic), marker), Op.delete(source)])
        if not result.succeeded:
            raise MoveRejectedError(
                f"move of {topic} from {from_broker} rejected: not the leader any more, "
                f"or {from_broker} no longer owns it"
            )
        return result.revision


@dataclass
class CycleResult:
    status: str  # skipped | balanced | rate_limited | cooldown | no_move | moved | failed | planned
    reason: str = ""
    balance: ClusterBalance | None = None
    move: MoveRecord | None = None
    plan: list[PlannedMove] = field(default_factory=list)
    duration_s: float = 0.0
    moves_last_hour: int = 0

    def to_dict(self) -> dict:
        return {
            "status": self.status,
            "reason": self.reason,
            "balance": self.balance.to_dict() if self.balance else None,
            "move": self.move.to_dict() if self.move else None,
            "plan": [m.to_dict() for m in self.plan],
            "duration_s": self.duration_s,
            "moves_last_hour": self.moves_last_hour,
        }


@dataclass
class Observation:
    active: list[str]
    reports: dict[str, Any]  # active brokers that reported
    assignments: dict[str, set[str]]  # active broker → topics
    state: ClusterState
    fingerprint: tuple


def _state_name(raw: bytes) -> str:
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw.decode(errors="replace")
    if isinstance(value, Mapping):
        value = value.get("state", value.get("mode", value.get("status", "")))
    return str(value or "active").strip().lower()


class Rebalancer:
    def __init__(
        self,
        store: MetadataStore,
        config: RebalancingConfig,
        *,
        clock: Clock | None = None,
        reports: LoadReportSource | None = None,
        executor: MoveExecutor | None = None,
        is_leader: Callable[[], bool] = lambda: True,
        guard: Callable[[], Sequence[Compare]] | None = None,
        metrics: RebalancingMetrics | None = None,
        created_at: Callable[[str], float | None] | None = None,
        reassignment_timeout_s: float = 30.0,
        view: ClusterSource | None = None,
        count_assign: bool = True,
    ) -> None:
        self.store = store
        self.config = config
        self.clock = clock or SystemClock()
        self.view = view
        self.reports = reports or (ViewLoadReports(view) if view is not None else StoreLoadReports(store))
        self.guard = guard
        self.executor = executor or MetadataMoveExecutor(store, self.clock, guard)
        self.is_leader = is_leader
        self.metrics = metrics
        # danube_topic_assignments_total{action="assign"} of a move's target: False when the load manager
        # that places the moved topic counts its own assignments in the same metrics (danube.cluster.node)
        self.count_assign = count_assign
        self.history = RebalancingHistory(store)
        self.reassignment_timeout_s = reassignment_timeout_s
        self._created_at = created_at
        self._first_seen: dict[str, float] = {}
        self._plan: list[PlannedMove] = []
        self._plan_fingerprint: tuple | None = None
        self._episode = False
        self._last_prune = float("-inf")
        self._task: asyncio.Task | None = None
        self.last_result: CycleResult | None = None

    # ------------------------------------------------------------ reading the cluster

    def topic_created_at(self, topic: str) -> float | None:
        if self._created_at is not None:
            born = self._created_at(topic)
            if born is not None:
                return born
        return self._first_seen.get(topic)

    async def observe(self) -> Observation:
        now = self.clock.now()
        states: dict[str, str] = {}
        assignments: dict[str, set[str]] = {}
        if self.view is not None:
            registered = set(self.view.registered)
            states = {b: str(v).strip().lower() for b, v in self.view.broker_states.items()}
            assignments = {b: set(ts) for b, ts in self.view.broker_topics.items()}
        else:
            registered = {
                kv.key[len(keys.cluster_register_prefix()) :]
                for kv in await self.store.get_prefix(keys.cluster_register_prefix())
            }
            prefix = keys.cluster_brokers_prefix()
            for kv in await self.store.get_prefix(prefix):
                parts = kv.key[len(prefix) :].split("/")
                if len(parts) == 2 and parts[1] == "state":
                    states[parts[0]] = _state_name(kv.value)
                elif len(parts) == 3:
                    assignments.setdefault(parts[0], set()).add(f"/{parts[1]}/{parts[2]}")
        active = sorted(b for b in registered if b and states.get(b, "active") == "active")
        for topics in assignments.values():
            for topic in topics:
                self._first_seen.setdefault(topic, now)
        latest = await self.reports.latest_reports()
        reports = {b: latest[b] for b in active if b in latest}
        active_assign = {b: assignments.get(b, set()) for b in active}
        state = build_state(self.config.strategy, reports, active, active_assign)
        fingerprint = tuple(sorted((b, float(getattr(r, "timestamp", 0) or 0)) for b, r in reports.items()))
        return Observation(active, reports, active_assign, state, fingerprint)

    async def cluster_balance(self) -> ClusterBalance:
        """GetClusterBalance: the balance now (no leadership needed)."""
        return (await self.observe()).state.balance()

    async def history_records(self, limit: int | None = None) -> list[MoveRecord]:
        records = await self.history.records()
        return records[-limit:] if limit else records

    async def _recent_records(self, now: float) -> list[MoveRecord]:
        """The history a cycle's rules read: the rate window, the oscillation window, the cooldown."""
        return await self.history.records(
            since=now - max(RATE_WINDOW_SECONDS, OSCILLATION_WINDOW_SECONDS, self.config.cooldown_seconds)
        )

    def _rules(self, obs: Observation, records: Sequence[MoveRecord], now: float) -> Eligibility:
        topics = [t for ts in obs.state.topics.values() for t in ts]
        return eligibility(self.config, records, now, topics, self.topic_created_at)

    def _make_plan(self, state: ClusterState, rules: Eligibility, max_moves: int) -> list[PlannedMove]:
        if self.config.planner == "greedy":
            return greedy_plan(state, rules, self.config.cv_threshold, max_moves)
        return plan_moves(state, rules, self.config.target_cv, max_moves)

    # ------------------------------------------------------------ one cycle

    async def dry_run(self, max_moves: int | None = None) -> CycleResult:
        """TriggerRebalance --dry-run: the moves the planner proposes now (nothing is written)."""
        started = time.perf_counter()
        now = self.clock.now()
        obs = await self.observe()
        balance = obs.state.balance()
        records = await self._recent_records(now)
        rules = self._rules(obs, records, now)
        limit = self.config.max_moves_per_hour if max_moves is None else max_moves
        plan = self._make_plan(obs.state, rules, limit) if balance.needs_rebalancing(self.config.cv_threshold) else []
        return CycleResult(
            "planned",
            "balanced" if not plan and balance.cv < self.config.cv_threshold else "",
            balance,
            None,
            plan,
            time.perf_counter() - started,
            _history.moves_in_window(records, now),
        )

    async def trigger(self, max_moves: int = 1) -> list[CycleResult]:
        """TriggerRebalance without ``--dry-run``: up to ``max_moves`` cycles now, whether or not automated
        rebalancing is enabled, each under the same rules (leader only, rate limit, cooldown); stops at
        the first cycle that does not move."""
        results = []
        for _ in range(max(1, max_moves)):
            started = time.perf_counter()
            result = await self._cycle(manual=True)
            result.duration_s = time.perf_counter() - started
            results.append(result)
            if result.status != "moved":
                break
        return results

    async def run_cycle(self) -> CycleResult:
        started = time.perf_counter()
        result = await self._cycle()
        result.duration_s = time.perf_counter() - started
        if self.metrics is not None and result.reason not in ("not leader", "disabled"):
            self.metrics.cycle_duration.observe(result.duration_s)
        self.last_result = result
        return result

    async def _cycle(self, *, manual: bool = False) -> CycleResult:
        cfg = self.config
        if not self.is_leader():
            self._plan = []
            self._episode = False
            if self.metrics is not None:
                self.metrics.forget_brokers()  # another broker leads: its gauges are the current ones
            return CycleResult("skipped", "not leader")
        if not cfg.enabled and not manual:
            return CycleResult("skipped", "disabled")
        if self.metrics is not None:
            self.metrics.checks.inc()
        now = self.clock.now()
        obs = await self.observe()
        balance = obs.state.balance()
        if self.metrics is not None:
            self.metrics.balance(balance)
            self.metrics.brokers(obs.reports, {b: len(t) for b, t in obs.assignments.items() if b in obs.reports})
        if now - self._last_prune > 3600.0:
            self._last_prune = now
            try:
                await self.history.prune(now)
            except DanubeError as exc:
                log.warning("pruning the rebalancing history failed: %s", exc)
        if balance.active_brokers < max(cfg.min_brokers_for_rebalance, 2):
            self._plan = []
            return CycleResult("skipped", "too few brokers", balance)
        # hysteresis: a rebalancing episode starts at the threshold and ends under target_cv
        floor = cfg.target_cv if (self._episode and cfg.planner != "greedy") else cfg.cv_threshold
        if not balance.needs_rebalancing(floor):
            self._plan = []
            self._episode = False
            log.debug("cluster is balanced: CV %.3f < %.3f", balance.cv, floor)
            return CycleResult("balanced", f"CV {balance.cv:.3f} < {floor:.3f}", balance)
        self._episode = True
        records = await self._recent_records(now)
        done = _history.moves_in_window(records, now)
        if done >= cfg.max_moves_per_hour:
            return CycleResult(
                "rate_limited",
                f"{done} moves in the last hour (max {cfg.max_moves_per_hour})",
                balance,
                moves_last_hour=done,
            )
        if _history.in_cooldown(records, now, cfg.cooldown_seconds):
            return CycleResult(
                "cooldown", f"last move less than {cfg.cooldown_seconds:g} s ago", balance, moves_last_hour=done
            )
        rules = self._rules(obs, records, now)
        move = self._next_move(obs, rules)
        if move is None:
            log.warning(
                "rebalancing: CV %.3f >= %.3f but no topic can move (no candidate or no target)", balance.cv, floor
            )
            return CycleResult("no_move", "no eligible topic or target", balance, moves_last_hour=done)
        return await self._execute(move, obs, balance, now, done)

    def _next_move(self, obs: Observation, rules: Eligibility) -> PlannedMove | None:
        if self.config.planner == "greedy":
            self._plan = []
            return greedy_move(obs.state, rules, self.config.cv_threshold)
        if self._plan and self._plan_fingerprint == obs.fingerprint:
            head = self._plan[0]
            if (
                head.topic in obs.state.topics.get(head.from_broker, {})
                and head.to_broker in obs.state.loads
                and rules.topic_ok(head.topic)
                and rules.move_ok(head.topic, head.to_broker)
            ):
                return head
        self._plan = self._make_plan(obs.state, rules, max(1, self.config.max_moves_per_hour))
        self._plan_fingerprint = obs.fingerprint
        return self._plan[0] if self._plan else None

    async def _execute(
        self, move: PlannedMove, obs: Observation, balance: ClusterBalance, now: float, done: int
    ) -> CycleResult:
        cfg = self.config
        log.info(
            "rebalancing: moving %s from %s to %s (estimated load %.3f, CV %.3f → %.3f)",
            move.topic,
            move.from_broker,
            move.to_broker,
            move.estimated_load,
            move.cv_before,
            move.cv_after,
        )
        try:
            revision = await self.executor.move(move.topic, move.from_broker, move.to_broker)
        except Exception as exc:  # a failed move is counted and retried at a later cycle
            log.warning(
                "rebalancing: move of %s from %s to %s failed: %s", move.topic, move.from_broker, move.to_broker, exc
            )
            if self.metrics is not None:
                self.metrics.failures.inc()
            self._plan = []
            return CycleResult("failed", str(exc), balance, moves_last_hour=done)
        if self.metrics is not None:
            self.metrics.assignment(move.from_broker, "unassign")
        if self._plan and self._plan[0] is move:
            self._plan.pop(0)
        if self.view is not None:
            landed = await self._wait_in_view(move.topic, move.from_broker, revision)
        else:
            landed = await self._wait_assigned(
                move.topic, [move.to_broker, *(b for b in obs.active if b != move.to_broker)]
            )
        outcome = "moved"
        if landed is None:
            outcome = "timeout"
            log.warning("rebalancing: %s was not reassigned within %.0f s", move.topic, self.reassignment_timeout_s)
            if self.metrics is not None:
                self.metrics.failures.inc()
        elif landed != move.to_broker:
            self._plan = []  # the load manager chose another broker: plan again next cycle
        record = MoveRecord(
            topic=move.topic,
            from_broker=move.from_broker,
            to_broker=landed or "",
            timestamp=now,
            estimated_load=move.estimated_load,
            planned_to_broker=move.to_broker,
            cv_before=move.cv_before,
            cv_after_estimated=move.cv_after,
            strategy=cfg.strategy,
            outcome=outcome,
        )
        guard = self.guard() if self.guard else ()
        key = await self.history.append(record, guard=guard)
        if key is None:
            log.warning("rebalancing: history record of %s not written (no longer the leader)", move.topic)
        if self.metrics is not None:
            if landed is not None:
                if self.count_assign:
                    self.metrics.assignment(landed, "assign")
                self.metrics.moves.inc()
        return CycleResult(
            "moved" if landed is not None else "failed",
            "" if landed is not None else "reassignment timed out",
            balance,
            record,
            list(self._plan),
            moves_last_hour=done + 1,
        )

    async def _wait_in_view(self, topic: str, source: str, revision: int | None) -> str | None:
        """With a ClusterSource: once the view has seen the move (its revision), the new owner."""
        view = self.view
        assert view is not None

        def landed() -> str | None:
            if isinstance(revision, int) and view.revision < revision:
                return None
            owner = view.assignments.get(topic)
            if owner is None or topic in view.unassigned:
                return None
            if not isinstance(revision, int) and owner == source:
                return None  # the view may not have seen the source's deletion yet
            return owner

        try:
            return await view.wait_for(landed, max(self.reassignment_timeout_s, 0.0))
        except (TimeoutError, asyncio.TimeoutError):
            return None

    async def _wait_assigned(self, topic: str, brokers: Sequence[str]) -> str | None:
        """The broker that holds ``topic`` again (None after ``reassignment_timeout_s``)."""
        revision = await self.store.revision()
        for broker in brokers:
            if await self.store.get(keys.broker_topic(broker, topic)) is not None:
                return broker
        if self.reassignment_timeout_s <= 0:
            return None
        prefix = keys.cluster_brokers_prefix()
        suffix = topic  # "/ns/name"

        async def watch() -> str | None:
            events = self.store.watch(prefix, start_revision=revision + 1)
            try:
                async for event in events:
                    if event.kind == "put" and event.key.endswith(suffix):
                        broker = event.key[len(prefix) : -len(suffix)]
                        if broker and "/" not in broker:
                            return broker
            finally:
                await events.aclose()
            return None

        try:
            return await asyncio.wait_for(watch(), self.reassignment_timeout_s)
        except asyncio.TimeoutError:
            return None

    # ------------------------------------------------------------ the loop

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="danube-rebalancer")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.config.check_interval_seconds)
            try:
                await self.run_cycle()
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad cycle must not end the loop
                log.exception("rebalancing cycle failed")
                if self.metrics is not None:
                    self.metrics.failures.inc()
