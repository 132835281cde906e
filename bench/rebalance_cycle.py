"""Rebalancing benchmark: cycle duration at scale, and convergence of the planner vs Danube's greedy loop.

Part 1 — one leader cycle with 10,000 topics on 10 simulated brokers (target <= 100 ms): the real
Rebalancer on an in-memory EmbeddedMetadataStore (10,000 assignment keys, registrations, history),
synthetic LoadReports (balanced strategy), skewed placement so every cycle plans and moves.  Timed (wall clock, and the process's CPU time,
which a busy shared machine inflates less): ``run_cycle`` end to end (read the cluster from the store, reconcile, balance, history, plan, guarded
move transaction, wait for the reassignment, history record); reports are refreshed between cycles (not
timed), so every cycle re-plans (the worst case).  Also timed: the same cycle reading the cluster from
an in-memory ClusterView (the leader's wiring) instead of the store, ``dry_run`` (plan only) and a cycle
on a balanced cluster.

Part 2 — the add-brokers scenario (3 brokers × 100 topics, 2 join) against Danube's rate limits
(aggressive: 20 moves/h, check every 120 s), planner vs Danube's greedy step, same run: moves and
virtual time until the CV is first under the threshold.

    python bench/rebalance_cycle.py [--cycles 30] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time

from danube.cluster.rebalancing import MetadataMoveExecutor, Rebalancer, RebalancingConfig
from danube.cluster.simulator import (
    SimCluster,
    SimMoveExecutor,
    SimTopic,
    VirtualClock,
    max_moves_in_window,
    run_scenario,
)
from danube.metadata import keys
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.metadata.store import Op


async def build(topics: int, brokers: int, seed: int = 3):
    clock = VirtualClock()
    store = EmbeddedMetadataStore(":memory:", clock=clock.now)
    cluster = SimCluster(store, clock, seed=seed)
    rng = random.Random(seed)
    for b in range(1, brokers + 1):
        await cluster.add_broker(f"broker-{b}")
    # skewed placement: broker i gets a share proportional to i
    weights = [b for b in range(1, brokers + 1)]
    born = clock.now() - 86400
    ops = []
    for i in range(topics):
        broker = f"broker-{rng.choices(range(1, brokers + 1), weights)[0]}"
        name = f"/bench/t{i:05d}"
        cluster.topics[name] = SimTopic(
            name, born, rng.lognormvariate(-1.5, 1.0), 1, rng.choice((1, 2, 3)), rng.randrange(0, 5000)
        )
        cluster.assigned[broker].add(name)
        ops.append(Op.put(keys.broker_topic(broker, name), b"null"))
        if len(ops) == 500:
            await store.txn([], ops)
            ops = []
    if ops:
        await store.txn([], ops)
    return clock, store, cluster


def _stats(samples: list[float]) -> dict:
    ms = sorted(1000 * s for s in samples)
    return {
        "n": len(ms),
        "median_ms": statistics.median(ms),
        "p90_ms": ms[int(0.9 * (len(ms) - 1))],
        "max_ms": ms[-1],
        "mean_ms": statistics.fmean(ms),
    }


async def cycle_benchmark(topics: int, brokers: int, cycles: int) -> dict:
    clock, store, cluster = await build(topics, brokers)
    try:
        # the aggressive preset (20 moves/h): one cycle every 180 virtual s, so every cycle may move
        cfg = RebalancingConfig.from_dict({"enabled": True, "aggressiveness": "aggressive", "min_topic_age_seconds": 0})
        reb = Rebalancer(store, cfg, clock=clock, reports=cluster, reassignment_timeout_s=0.0)
        reb.executor = SimMoveExecutor(cluster, MetadataMoveExecutor(store, clock))
        cluster.refresh_reports()
        await reb.run_cycle()  # warm-up (first history prune, caches)
        moving, moving_cpu, dry, statuses = [], [], [], {}
        for _ in range(cycles):
            clock.advance(180.0)
            cluster.refresh_reports()
            t, c = time.perf_counter(), time.process_time()
            result = await reb.run_cycle()
            moving.append(time.perf_counter() - t)
            moving_cpu.append(time.process_time() - c)
            statuses[result.status] = statuses.get(result.status, 0) + 1
        for _ in range(max(5, cycles // 3)):
            t = time.perf_counter()
            plan = await reb.dry_run()
            dry.append(time.perf_counter() - t)
        # the leader's wiring: the in-memory ClusterView instead of reading the store every cycle
        from danube.cluster.view import ClusterView

        view = ClusterView(store)
        await view.start()
        try:
            fast = Rebalancer(store, cfg, clock=clock, reports=cluster, view=view, reassignment_timeout_s=5.0)
            fast.executor = SimMoveExecutor(cluster, MetadataMoveExecutor(store, clock))
            with_view, view_statuses = [], {}
            for _ in range(cycles):
                clock.advance(180.0)
                cluster.refresh_reports()
                t = time.perf_counter()
                result = await fast.run_cycle()
                with_view.append(time.perf_counter() - t)
                view_statuses[result.status] = view_statuses.get(result.status, 0) + 1
        finally:
            await view.stop()
        balance = await reb.cluster_balance()
        # a balanced cluster: the same size, placement by the simulator's round-robin
        relaxed = RebalancingConfig.from_dict({"enabled": True, "cv_threshold": 10.0})
        calm = Rebalancer(store, relaxed, clock=clock, reports=cluster)
        idle = []
        for _ in range(max(5, cycles // 3)):
            t = time.perf_counter()
            await calm.run_cycle()
            idle.append(time.perf_counter() - t)
        return {
            "topics": topics,
            "brokers": brokers,
            "cycle_with_move": _stats(moving),
            "cycle_with_move_cpu": _stats(moving_cpu),
            "cycle_with_move_view": _stats(with_view),
            "view_statuses": view_statuses,
            "dry_run_plan": _stats(dry),
            "cycle_balanced": _stats(idle),
            "statuses": statuses,
            "plan_length": len(plan.plan),
            "cv_after": balance.cv,
        }
    finally:
        await store.close()


async def convergence() -> dict:
    out = {}
    for planner in ("plan", "greedy"):
        t = time.perf_counter()
        r = await run_scenario("add-brokers", planner=planner)
        out[planner] = {
            "moves_to_threshold": r.moves_to_threshold,
            "hours_to_threshold": r.reached_at_h,
            "moves_total": len(r.moves),
            "hours_stayed_under_from": r.converged_at_h,
            "final_cv": r.final_cv,
            "violations": r.violations,
            "max_moves_in_any_hour": max_moves_in_window(r.moves),
            "wall_s": time.perf_counter() - t,
        }
    out["threshold"] = 0.20
    out["rate_limit"] = "aggressive: 20 moves/h, check every 120 s, cooldown 30 s"
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--topics", type=int, default=10_000)
    p.add_argument("--brokers", type=int, default=10)
    p.add_argument("--cycles", type=int, default=30)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    result = {
        "cycle": asyncio.run(cycle_benchmark(args.topics, args.brokers, args.cycles)),
        "convergence": asyncio.run(convergence()),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    c = result["cycle"]
    print(f"cycle, {c['topics']} topics on {c['brokers']} brokers (target <= 100 ms):")
    for name in ("cycle_with_move", "cycle_with_move_cpu", "cycle_with_move_view", "dry_run_plan", "cycle_balanced"):
        s = c[name]
        print(
            f"  {name:19s} median {s['median_ms']:6.1f} ms  p90 {s['p90_ms']:6.1f} ms  max {s['max_ms']:6.1f} ms"
            f"  (n={s['n']})"
        )
    print(f"  statuses {c['statuses']} (with the view: {c['view_statuses']}), dry-run plan of {c['plan_length']} moves")
    v = result["convergence"]
    print(f"add-brokers convergence ({v['rate_limit']}, CV threshold {v['threshold']}):")
    for planner in ("plan", "greedy"):
        r = v[planner]
        print(
            f"  {planner:6s} threshold reached after {r['moves_to_threshold']} moves at "
            f"{r['hours_to_threshold']:.2f} virtual h; {r['moves_total']} moves in total; max "
            f"{r['max_moves_in_any_hour']} in any hour; violations {r['violations'] or 'none'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
