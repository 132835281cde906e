"""Move selection: the greedy step of Danube's load manager and danube's multi-move planner.

Both work on the linear model of :mod:`.balance`: moving topic t from A to B
takes t's estimated load off A and adds it to B, the mean is unchanged, and the
sum of squared loads changes by −2·x·(gap − x) (x = the estimate, gap =
load(A) − load(B)), so a move improves the CV exactly when 0 < x < gap.

**Greedy (Danube's)**: the most loaded overloaded broker that has a candidate gives
up its lightest candidate to the least loaded other active broker; one move per
cycle.  When several brokers share the top load none is "overloaded" (mean +
std is above them) and Danube's step never moves; :func:`balance.sources` then takes
every broker above the mean.

**Planner**: a short sequence of moves bringing the estimated CV under the
threshold.  Each step picks, over every (source, less loaded active target)
pair, the candidate whose move shrinks the variance most (the topic
whose estimate is nearest half the gap); when one move is enough to get under
the threshold it takes the lightest topic (by topic load score) that is enough.
A topic appears at most once in a plan and never goes back to a broker it left
within the hour.  It stops when the estimate is under the threshold, when no
move improves, or at ``max_moves``.  The loop executes the plan one move per
cycle and plans again when the loads change.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Mapping

from . import candidates as _candidates
from .balance import ClusterState, compute_balance, sources
from .candidates import Eligibility

_SCAN_LIMIT = 64  # topics skipped at most (forbidden for a target) when looking for the nearest


@dataclass(frozen=True)
class PlannedMove:
    topic: str
    from_broker: str
    to_broker: str
    estimated_load: float
    move_score: float
    cv_before: float
    cv_after: float  # estimated

    def to_dict(self) -> dict:
        return {
            "topic": self.topic,
            "from_broker": self.from_broker,
            "to_broker": self.to_broker,
            "estimated_load": self.estimated_load,
            "move_score": self.move_score,
            "cv_before": self.cv_before,
            "cv_after_estimated": self.cv_after,
        }


def _cv(sumsq: float, total: float, n: int) -> float:
    if n == 0 or total <= 0.0:
        return 0.0
    mean = total / n
    var = max(0.0, sumsq / n - mean * mean)
    return math.sqrt(var) / mean


def greedy_move(
    state: ClusterState,
    rules: Eligibility,
    threshold: float,
    *,
    loads: Mapping[str, float] | None = None,
    exclude: frozenset = frozenset(),
    fallback_above_mean: bool = True,
) -> PlannedMove | None:
    """Danube's one move per cycle (None when balanced or nothing can move)."""
    loads = dict(state.loads if loads is None else loads)
    balance = compute_balance(loads)
    if not balance.needs_rebalancing(threshold):
        return None
    for source in sources(balance, fallback_above_mean=fallback_above_mean):
        for topic in _candidates.candidates(state, source, rules):
            if topic.name in exclude:
                continue
            target = _candidates.target_for(loads, source, topic.name, rules)
            if target is None:
                continue
            after = dict(loads)
            after[source] -= topic.estimated_load
            after[target] += topic.estimated_load
            return PlannedMove(
                topic.name,
                source,
                target,
                topic.estimated_load,
                topic.move_score,
                balance.cv,
                compute_balance(after).cv,
            )
        # the lightest candidate of the most loaded source decides; with no candidate try the next source
    return None


def greedy_plan(
    state: ClusterState, rules: Eligibility, threshold: float, max_moves: int, *, fallback_above_mean: bool = True
) -> list[PlannedMove]:
    """Danube's greedy step applied repeatedly on the model (for comparison and dry runs)."""
    loads = dict(state.loads)
    moved: set[str] = set()
    plan: list[PlannedMove] = []
    while len(plan) < max_moves:
        move = greedy_move(
            state, rules, threshold, loads=loads, exclude=frozenset(moved), fallback_above_mean=fallback_above_mean
        )
        if move is None:
            break
        loads[move.from_broker] -= move.estimated_load
        loads[move.to_broker] += move.estimated_load
        moved.add(move.topic)
        plan.append(move)
    return plan


def plan_moves(state: ClusterState, rules: Eligibility, threshold: float, max_moves: int) -> list[PlannedMove]:
    """A short sequence of moves bringing the estimated CV under ``threshold`` (see the module docstring)."""
    loads = dict(state.loads)
    n = len(loads)
    if n < 2 or max_moves <= 0:
        return []
    total = math.fsum(loads.values())
    if total <= 0.0:
        return []
    sumsq = math.fsum(v * v for v in loads.values())
    mean = total / n
    # per broker: eligible topics sorted by estimate (estimates, infos) for bisection
    pools: dict[str, tuple[list[float], list]] = {}
    for broker in loads:
        infos = sorted(
            (t for t in state.topics.get(broker, {}).values() if rules.topic_ok(t.name) and t.estimated_load > 0.0),
            key=lambda t: (t.estimated_load, t.move_score, t.name),
        )
        pools[broker] = ([t.estimated_load for t in infos], infos)

    plan: list[PlannedMove] = []
    while len(plan) < max_moves:
        cv = _cv(sumsq, total, n)
        if cv < threshold:
            break
        # the variance reduction (in Σ load²) needed to get strictly under the threshold
        target_sumsq = n * (threshold * mean) ** 2 + n * mean * mean
        need = sumsq - target_sumsq
        best = None  # (gain, -move_score, topic, source, target)
        sufficient = None  # (move_score, topic, source, target, gain)
        ranked = sorted(loads.items(), key=lambda kv: (-kv[1], kv[0]))
        for source, src_load in ranked:
            estimates, infos = pools[source]
            if not estimates:
                continue
            for target, dst_load in reversed(ranked):
                gap = src_load - dst_load
                if target == source or gap <= 0.0:
                    continue
                # nearest half the gap on either side, skipping topics that may not go to this target
                i = bisect.bisect_left(estimates, gap / 2.0)
                for step in (-1, 1):
                    j = i - 1 if step < 0 else i
                    for _ in range(_SCAN_LIMIT):
                        if not 0 <= j < len(estimates) or estimates[j] >= gap:
                            break
                        info = infos[j]
                        if rules.move_ok(info.name, target):
                            x = estimates[j]
                            key = (2.0 * x * (gap - x), -info.move_score, info.name)
                            if best is None or key > best[0]:
                                best = (key, info, source, target)
                            break
                        j += step
                if need > 0.0:
                    # the interval of estimates whose move alone is enough: 2x(gap − x) > need
                    disc = gap * gap - 2.0 * need
                    if disc >= 0.0:
                        root = math.sqrt(disc)
                        x1, x2 = (gap - root) / 2.0, (gap + root) / 2.0
                        a = bisect.bisect_left(estimates, x1)
                        b = bisect.bisect_right(estimates, x2)
                        for j in range(a, b):
                            info = infos[j]
                            x = estimates[j]
                            if 2.0 * x * (gap - x) > need and rules.move_ok(info.name, target):
                                order = (info.move_score, info.name)
                                if sufficient is None or order < sufficient[0]:
                                    sufficient = (order, info, source, target)
        if best is None:
            break
        chosen = sufficient if sufficient is not None else best
        _key, info, source, target = chosen
        x = info.estimated_load
        before = cv
        sumsq += -2.0 * x * (loads[source] - loads[target]) + 2.0 * x * x
        loads[source] -= x
        loads[target] += x
        estimates, infos = pools[source]
        k = bisect.bisect_left(estimates, x)
        while infos[k] is not info:
            k += 1
        del estimates[k]
        del infos[k]
        plan.append(PlannedMove(info.name, source, target, x, info.move_score, before, _cv(sumsq, total, n)))
    return plan
