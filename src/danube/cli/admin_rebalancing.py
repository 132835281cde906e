"""`danube admin brokers balance | rebalance | rebalance-history` (docs/rebalancing.md).

danube admin brokers balance [-o json]                           GetClusterBalance
danube admin brokers rebalance --dry-run [--max-moves N] [-o json]   TriggerRebalance: the proposed moves
danube admin brokers rebalance [--max-moves N]                   TriggerRebalance on the leader: move now
danube admin brokers rebalance-history [--limit N] [-o json]     the leader's history, newest last
"""

from __future__ import annotations

import argparse
import time

COMMANDS = ("balance", "rebalance", "rebalance-history")


def _output_option(p) -> None:
    # also accepted after the command; SUPPRESS keeps `danube admin -o json brokers ...` working
    p.add_argument("--output", "-o", choices=["text", "json"], default=argparse.SUPPRESS, help="output format")


def add_commands(brokers) -> None:
    p = brokers.add_parser("balance", help="the cluster's balance: CV, mean / std / max / min load, per broker")
    _output_option(p)
    p = brokers.add_parser(
        "rebalance",
        help="rebalance: --dry-run shows the planner's moves; without it the "
        "leader moves now (rate limit and cooldown still apply)",
    )
    p.add_argument("--dry-run", action="store_true", help="only show the proposed moves")
    p.add_argument(
        "--max-moves",
        type=int,
        default=None,
        metavar="N",
        help="at most N moves (dry run: default the hourly limit; otherwise default 1)",
    )
    _output_option(p)
    p = brokers.add_parser("rebalance-history", help="the moves the rebalancer made, newest last")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="only the newest N")
    _output_option(p)


def run(args, channel, emit) -> int:
    from google.protobuf.json_format import MessageToDict

    from danube.proto.danube_admin import admin_pb2 as pb
    from danube.proto.danube_admin import admin_pb2_grpc as pb_grpc

    stub = pb_grpc.BrokerAdminStub(channel)
    t = args.timeout

    def as_dict(msg) -> dict:
        return MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)

    if args.admin_cmd == "balance":
        r = stub.GetClusterBalance(pb.ClusterBalanceRequest(), timeout=t)
        state = (
            "needs rebalancing"
            if r.coefficient_of_variation >= r.cv_threshold and r.active_brokers >= 2
            else "balanced"
        )
        lines = [
            f"Cluster balance ({r.strategy or 'balanced'} load, {r.active_brokers} active brokers): "
            f"CV {100 * r.coefficient_of_variation:.1f}% (threshold {100 * r.cv_threshold:.0f}%, {state})",
            f"  mean {r.mean_load:.2f}  std {r.std_deviation:.2f}  max {r.max_load:.2f}  min {r.min_load:.2f}",
        ]
        over, under = set(r.overloaded), set(r.underloaded)
        for b in r.brokers:
            mark = "  overloaded" if b.broker_id in over else ("  underloaded" if b.broker_id in under else "")
            lines.append(f"  {b.broker_id:20s} load {b.load:10.2f}  topics {b.topic_count:6d}{mark}")
        emit(args, as_dict(r), lines)
    elif args.admin_cmd == "rebalance":
        req = pb.RebalanceRequest(dry_run=args.dry_run)
        if args.max_moves is not None:
            req.max_moves = args.max_moves
        r = stub.TriggerRebalance(req, timeout=t)
        title = "Proposed moves" if args.dry_run else "Moves executed"
        lines = [r.message, f"{title}:" if r.proposed_moves else ""] + [
            f"  {m.topic_name}: {m.from_broker} -> {m.to_broker}  (estimated load {m.estimated_load:.3f})"
            for m in r.proposed_moves
        ]
        emit(args, as_dict(r), [line for line in lines if line])
        return 0 if r.success else 1
    else:
        req = pb.RebalancingHistoryRequest()
        if args.limit is not None:
            req.limit = args.limit
        r = stub.GetRebalancingHistory(req, timeout=t)
        lines = [f"{len(r.moves)} moves"] + [
            f"  {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(m.timestamp))}Z  {m.topic_name}: {m.from_broker}"
            f" -> {m.to_broker or '(not reassigned)'}  load {m.estimated_load:.3f}  CV {m.cv_before:.3f}"
            f" -> {m.cv_after_estimated:.3f} (est.)  {m.outcome}"
            for m in r.moves
        ]
        emit(args, [as_dict(m) for m in r.moves], lines)
    return 0
