"""`danube admin scalable-topics ...`: scalable topics (docs/scalable-topics.md).

    danube admin scalable-topics create /default/orders [--segments N]
    danube admin scalable-topics list [NAMESPACE]
    danube admin scalable-topics describe /default/orders        (the DAG and per-segment stats)
    danube admin scalable-topics split /default/orders SEGMENT_ID
    danube admin scalable-topics merge /default/orders SEGMENT_ID1 SEGMENT_ID2
    danube admin scalable-topics subscriptions /default/orders
    danube admin scalable-topics create-subscription /default/orders SUB [--type stream|queue]
    danube admin scalable-topics delete-subscription /default/orders SUB
    danube admin scalable-topics delete /default/orders

Any broker answers (split, merge and subscription changes are forwarded to the topic's controller
leader); the broker serves ``danube_scalable.ScalableTopics`` on the admin port and the client
port.  With ``-o json`` every command prints JSON.
"""

from __future__ import annotations

import json


def add_parser(groups) -> None:
    """Adds the ``scalable-topics`` group to ``danube admin``."""
    st = groups.add_parser("scalable-topics", help="scalable topic commands (split / merge segments)").add_subparsers(
        dest="admin_cmd", metavar="COMMAND"
    )
    p = st.add_parser("create", help="create a scalable topic")
    p.add_argument("topic")
    p.add_argument("--segments", type=int, default=1, help="initial segments (default 1)")
    p = st.add_parser("list", help="scalable topics of a namespace")
    p.add_argument("namespace", nargs="?", default="default")
    for name, helptext in (
        ("describe", "the segment DAG with per-segment stats"),
        ("subscriptions", "subscriptions, their consumers and assignments"),
        ("delete", "delete the topic and its segment topics"),
    ):
        st.add_parser(name, help=helptext).add_argument("topic")
    p = st.add_parser("split", help="split an active segment at its midpoint")
    p.add_argument("topic")
    p.add_argument("segment_id", type=int)
    p = st.add_parser("merge", help="merge two adjacent active segments")
    p.add_argument("topic")
    p.add_argument("segment_id1", type=int)
    p.add_argument("segment_id2", type=int)
    p = st.add_parser("create-subscription", help="create a subscription on every active segment")
    p.add_argument("topic")
    p.add_argument("subscription")
    p.add_argument("--type", choices=["stream", "queue"], default="stream")
    p = st.add_parser("delete-subscription", help="delete a subscription from every segment")
    p.add_argument("topic")
    p.add_argument("subscription")


def _layout_lines(doc: dict) -> list[str]:
    lines = [f"epoch {doc['epoch']}, next segment id {doc['nextSegmentId']}"]
    for sid, seg in sorted(doc["segments"].items(), key=lambda kv: int(kv[0])):
        hr = seg["hashRange"]
        rel = []
        if seg["parentIds"]:
            rel.append(f"parents {seg['parentIds']}")
        if seg["childIds"]:
            rel.append(f"children {seg['childIds']}")
        lines.append(
            f"  segment {sid}  {hr['start']:04x}-{hr['end']:04x}  {seg['state']:<6}  "
            f"created@{seg['createdAtEpoch']}"
            + (f" sealed@{seg['sealedAtEpoch']}" if seg["sealedAtEpoch"] else "")
            + (f"  ({', '.join(rel)})" if rel else "")
        )
    return lines


def run(args, channel, emit) -> int:
    from danube.proto.danube_scalable import scalable_pb2 as pb
    from danube.proto.danube_scalable import scalable_pb2_grpc as pb_grpc

    stub = pb_grpc.ScalableTopicsStub(channel)
    t = args.timeout
    cmd = args.admin_cmd
    if cmd == "create":
        r = stub.CreateScalableTopic(
            pb.CreateScalableTopicRequest(topic=args.topic, num_segments=args.segments), timeout=t
        )
        doc = json.loads(r.metadata_json)
        emit(
            args,
            {"topic": args.topic, "layout": doc, "controller": r.controller_broker_url},
            [f"Scalable topic {args.topic} created ({args.segments} segment(s))"] + _layout_lines(doc),
        )
    elif cmd == "list":
        r = stub.ListScalableTopics(pb.ListScalableTopicsRequest(namespace=args.namespace), timeout=t)
        emit(args, list(r.topics), [f"Scalable topics in namespace '{args.namespace}':"] + [f"  {x}" for x in r.topics])
    elif cmd == "describe":
        doc = json.loads(stub.DescribeScalableTopic(pb.ScalableTopicRequest(topic=args.topic), timeout=t).json)
        lines = [
            f"Scalable topic {doc['topic']}: epoch {doc['epoch']}, controller {doc['controller'] or '(none)'}",
            f"Active segments: {doc['activeSegments']}",
        ]
        for seg in doc["segments"]:
            hr, st = seg["hashRange"], seg.get("stats", {})
            lines.append(
                f"  segment {seg['segmentId']}  {hr['start']:04x}-{hr['end']:04x}  {seg['state']:<6}  "
                f"{seg['topic']}  in={st.get('messages_in', '-')} producers={st.get('producers', '-')} "
                f"consumers={st.get('consumers', '-')}" + ("  terminated" if st.get("terminated") else "")
            )
            for sub, s in sorted(st.get("subscriptions", {}).items()):
                lines.append(f"      {sub}: backlog {s['backlog']}, cursor {s['cursor']}, consumers {s['consumers']}")
        for sub, s in sorted(doc["subscriptions"].items()):
            lines.append(f"Subscription {sub} ({s['type']}): consumers {s['consumers'] or '{}'}")
        emit(args, doc, lines)
    elif cmd == "split":
        r = stub.SplitSegment(pb.SplitSegmentRequest(topic=args.topic, segment_id=args.segment_id), timeout=t)
        doc = json.loads(r.metadata_json)
        emit(args, doc, [f"Segment {args.segment_id} of {args.topic} split"] + _layout_lines(doc))
    elif cmd == "merge":
        r = stub.MergeSegments(
            pb.MergeSegmentsRequest(topic=args.topic, segment_id1=args.segment_id1, segment_id2=args.segment_id2),
            timeout=t,
        )
        doc = json.loads(r.metadata_json)
        emit(
            args,
            doc,
            [f"Segments {args.segment_id1} and {args.segment_id2} of {args.topic} merged"] + _layout_lines(doc),
        )
    elif cmd == "subscriptions":
        doc = json.loads(stub.ListSubscriptions(pb.ScalableTopicRequest(topic=args.topic), timeout=t).json)
        lines = [f"Subscriptions of {args.topic}:"]
        for sub, s in sorted(doc.items()):
            lines.append(f"  {sub} ({s['type']}), drained segments {s['drainedSegments']}")
            for name, segs in sorted(s["consumers"].items()):
                lines.append(f"    consumer {name}: segments {segs}")
        emit(args, doc, lines)
    elif cmd == "create-subscription":
        r = stub.CreateSubscription(
            pb.ScalableSubscriptionRequest(topic=args.topic, subscription=args.subscription, type=args.type), timeout=t
        )
        emit(
            args,
            {"subscription": args.subscription, "created": r.deleted},
            [f"Subscription {args.subscription} " + ("created" if r.deleted else "already exists")],
        )
    elif cmd == "delete-subscription":
        r = stub.DeleteSubscription(
            pb.ScalableSubscriptionRequest(topic=args.topic, subscription=args.subscription), timeout=t
        )
        emit(
            args,
            {"subscription": args.subscription, "deleted": r.deleted},
            [f"Subscription {args.subscription} " + ("deleted" if r.deleted else "did not exist")],
        )
    elif cmd == "delete":
        r = stub.DeleteScalableTopic(pb.ScalableTopicRequest(topic=args.topic), timeout=t)
        emit(
            args,
            {"topic": args.topic, "deleted": r.deleted},
            [f"Scalable topic {args.topic} " + ("deleted" if r.deleted else "did not exist")],
        )
    else:
        args._admin_parser.print_help()
        return 2
    return 0
