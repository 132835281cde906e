"""`danube admin topics set-failure-policy | get-failure-policy`: a subscription's failure policy.

    danube admin topics set-failure-policy TOPIC --subscription S --max-redelivery-count N
        --ack-timeout-ms MS --base-redelivery-delay-ms MS --max-redelivery-delay-ms MS
        --poison-policy dead_letter|block|drop [--dead-letter-topic T] [--backoff-strategy fixed|exponential]
    danube admin topics get-failure-policy TOPIC --subscription S [--output json]

Danube's flags (every number required, as its CLI has no defaults for them; the backoff strategy
defaults to fixed), its confirmation text and its get output: JSON with lowercase enum labels and
``dead_letter_topic`` null when unset.  In a cluster the broker forwards both calls to the topic's
owner, so a live subscription follows the new policy at once (docs/broker.md).
"""

from __future__ import annotations

import argparse
import sys

BACKOFF_STRATEGIES = ("fixed", "exponential")
POISON_POLICIES = ("dead_letter", "dead-letter", "block", "drop")
_U32_MAX, _U64_MAX = 2**32 - 1, 2**64 - 1


def _whole(limit: int):
    """An argparse type: a whole number 0..limit (the proto's uint32/uint64), else a sentence."""

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if not 0 <= value <= limit:
            raise argparse.ArgumentTypeError(f"expected a whole number from 0 to {limit}, got {text}")
        return value

    return parse


def add_commands(topics, topic_args) -> None:
    """The two commands under ``danube admin topics``; ``topic_args`` adds TOPIC, --namespace, --output."""
    p = topics.add_parser("set-failure-policy", help="set a subscription's failure policy (redelivery, poison policy)")
    topic_args(p, output=True)
    p.add_argument("--subscription", "-s", required=True, help="the subscription")
    p.add_argument(
        "--max-redelivery-count",
        type=_whole(_U32_MAX),
        required=True,
        help="redeliveries after the first failed delivery (0: the poison policy applies at once)",
    )
    p.add_argument(
        "--ack-timeout-ms",
        type=_whole(_U64_MAX),
        required=True,
        help="an unacked delivery counts as failed after this long",
    )
    p.add_argument("--base-redelivery-delay-ms", type=_whole(_U64_MAX), required=True)
    p.add_argument("--max-redelivery-delay-ms", type=_whole(_U64_MAX), required=True)
    p.add_argument("--backoff-strategy", choices=BACKOFF_STRATEGIES, default="fixed")
    p.add_argument("--dead-letter-topic", default=None, help="where dead_letter sends a poisoned message")
    p.add_argument(
        "--poison-policy", choices=POISON_POLICIES, required=True, help="what happens once the redeliveries are used up"
    )
    p = topics.add_parser("get-failure-policy", help="a subscription's failure policy")
    topic_args(p, output=True)
    p.add_argument("--subscription", "-s", required=True, help="the subscription")


def run(args, channel, emit, topic: str) -> int:
    """One of the two commands; grpc.RpcError propagates to ``danube admin``."""
    from danube.proto.danube_admin import admin_pb2 as pb
    from danube.proto.danube_admin import admin_pb2_grpc as pb_grpc

    stub = pb_grpc.TopicAdminStub(channel)
    sub = args.subscription
    if args.admin_cmd == "set-failure-policy":
        policy = pb.SubscriptionFailurePolicy(
            max_redelivery_count=args.max_redelivery_count,
            ack_timeout_ms=args.ack_timeout_ms,
            base_redelivery_delay_ms=args.base_redelivery_delay_ms,
            max_redelivery_delay_ms=args.max_redelivery_delay_ms,
            backoff_strategy=pb.Exponential if args.backoff_strategy == "exponential" else pb.Fixed,
            poison_policy={"block": pb.Block, "drop": pb.Drop}.get(args.poison_policy, pb.DeadLetter),
        )
        if args.dead_letter_topic is not None:
            policy.dead_letter_topic = args.dead_letter_topic
        resp = stub.SetSubscriptionFailurePolicy(
            pb.SetSubscriptionFailurePolicyRequest(topic=topic, subscription=sub, failure_policy=policy),
            timeout=args.timeout,
        )
        # Danube prints nothing when the broker answers success=false; a script here must see it failed
        emit(
            args,
            {"success": resp.success},
            [
                f"✅ Failure policy updated for topic '{topic}' subscription '{sub}'"
                if resp.success
                else f"❌ Failed to update the failure policy of topic '{topic}' subscription '{sub}'"
            ],
        )
        return 0 if resp.success else 1
    resp = stub.GetSubscriptionFailurePolicy(
        pb.GetSubscriptionFailurePolicyRequest(topic=topic, subscription=sub), timeout=args.timeout
    )
    if not resp.HasField("failure_policy"):
        print(
            f"danube admin: subscription failure policy not found (topic {topic}, subscription {sub})", file=sys.stderr
        )
        return 1
    from danube.server import failure_policy_wire

    fp = failure_policy_wire.to_json(resp.failure_policy)
    data = {"topic": topic, "subscription": sub, **fp}
    lines = [
        f"Topic: {topic}",
        f"Subscription: {sub}",
        f"Max Redelivery Count: {fp['max_redelivery_count']}",
        f"Ack Timeout Ms: {fp['ack_timeout_ms']}",
        f"Base Redelivery Delay Ms: {fp['base_redelivery_delay_ms']}",
        f"Max Redelivery Delay Ms: {fp['max_redelivery_delay_ms']}",
        f"Backoff Strategy: {fp['backoff_strategy']}",
    ]
    if fp["dead_letter_topic"] is not None:
        lines.append(f"Dead Letter Topic: {fp['dead_letter_topic']}")
    emit(args, data, lines + [f"Poison Policy: {fp['poison_policy']}"])
    return 0
