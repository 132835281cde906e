"""The admin RPCs of rebalancing: GetClusterBalance, TriggerRebalance, GetRebalancingHistory.

``danube.server.admin`` calls these with the broker's ``rebalancer`` (a
:class:`~danube.cluster.rebalancing.Rebalancer`, set by the cluster layer on
every broker; a standalone broker has none).  Balance, dry runs and the history
are answered by any broker (they read the metadata store); a real rebalance
only by the leader (FAILED_PRECONDITION elsewhere).
"""

from __future__ import annotations

from typing import Any

from danube.errors import DanubeError
from danube.proto.danube_admin import admin_pb2 as pb


class NotLeaderError(DanubeError):
    """A rebalance was asked of a broker that is not the cluster leader."""

    retriable = False


async def cluster_balance(rebalancer: Any) -> pb.ClusterBalanceResponse:
    obs = await rebalancer.observe()
    balance = obs.state.balance()
    brokers = [
        pb.BrokerLoad(broker_id=b, load=load, topic_count=len(obs.assignments.get(b, ())))
        for b, load in sorted(balance.loads.items(), key=lambda kv: (-kv[1], kv[0]))
    ]
    cfg = rebalancer.config
    return pb.ClusterBalanceResponse(
        coefficient_of_variation=balance.cv,
        mean_load=balance.mean,
        max_load=balance.max_load,
        min_load=balance.min_load,
        std_deviation=balance.std_dev,
        brokers=brokers,
        active_brokers=balance.active_brokers,
        cv_threshold=cfg.cv_threshold,
        overloaded=list(balance.overloaded),
        underloaded=list(balance.underloaded),
        strategy=cfg.strategy,
    )


def _proposed(plan) -> list:
    return [
        pb.ProposedMove(
            topic_name=m.topic, from_broker=m.from_broker, to_broker=m.to_broker, estimated_load=m.estimated_load
        )
        for m in plan
    ]


async def rebalance(rebalancer: Any, *, dry_run: bool, max_moves: int | None) -> pb.RebalanceResponse:
    if dry_run:
        result = await rebalancer.dry_run(max_moves)
        cv = result.balance.cv if result.balance else 0.0
        after = result.plan[-1].cv_after if result.plan else cv
        if result.plan:
            message = (
                f"{len(result.plan)} proposed moves: CV {cv:.3f} -> {after:.3f} (estimate); "
                f"{result.moves_last_hour} moves in the last hour, limit "
                f"{rebalancer.config.max_moves_per_hour}"
            )
        else:
            message = f"no move proposed: CV {cv:.3f}, threshold {rebalancer.config.cv_threshold:.2f}" + (
                "" if cv < rebalancer.config.cv_threshold else " (no eligible topic or target)"
            )
        return pb.RebalanceResponse(
            success=True,
            moves_executed=0,
            proposed_moves=_proposed(result.plan),
            message=message,
            cv_before=cv,
            cv_after_estimated=after,
        )
    if not rebalancer.is_leader():
        raise NotLeaderError(
            "this broker is not the cluster leader: send the rebalance to the leader "
            "(danube admin brokers leader-broker)"
        )
    results = await rebalancer.trigger(max_moves or 1)
    moved = [r.move for r in results if r.status == "moved" and r.move is not None]
    last = results[-1]
    cv = results[0].balance.cv if results[0].balance else 0.0
    message = f"{len(moved)} moves executed" + (
        "" if last.status == "moved" else f"; then {last.status}" + (f": {last.reason}" if last.reason else "")
    )
    return pb.RebalanceResponse(
        success=last.status not in ("failed",),
        moves_executed=len(moved),
        proposed_moves=[
            pb.ProposedMove(
                topic_name=m.topic, from_broker=m.from_broker, to_broker=m.to_broker, estimated_load=m.estimated_load
            )
            for m in moved
        ],
        message=message,
        cv_before=cv,
        cv_after_estimated=moved[-1].cv_after_estimated if moved else cv,
    )


async def history(rebalancer: Any, *, limit: int | None) -> pb.RebalancingHistoryResponse:
    records = await rebalancer.history_records(limit)
    return pb.RebalancingHistoryResponse(
        moves=[
            pb.RebalancingMove(
                topic_name=r.topic,
                from_broker=r.from_broker,
                to_broker=r.to_broker,
                reason=r.reason,
                estimated_load=r.estimated_load,
                timestamp=r.timestamp,
                planned_to_broker=r.planned_to_broker,
                cv_before=r.cv_before,
                cv_after_estimated=r.cv_after_estimated,
                strategy=r.strategy,
                outcome=r.outcome,
            )
            for r in records
        ]
    )
