"""`danube admin`: Danube's admin commands over the admin gRPC service.

    danube admin [--endpoint URL] [--output json] topics unload /default/orders
    danube admin topics list default | --broker ID       (cluster-wide, from any broker)
    danube admin topics create /default/orders [--partitions N] [-s reliable] | delete /default/orders
    danube admin topics unsubscribe /default/orders --subscription s1
    danube admin topics describe /default/orders
    danube admin topics repartition /default/orders --partitions 4   (live repartition, docs/repartition.md)
    danube admin topics subscriptions /default/orders
    danube admin brokers list | leader-broker | namespaces | unload ID | activate ID
    danube admin namespaces list | topics NS | policies NS | create NS | delete NS
    danube admin brokers balance | rebalance --dry-run [--max-moves N] | rebalance-history   (admin_rebalancing.py)
    danube admin schemas register | get | versions | check | delete | compatibility   (admin_schemas.py)
    danube admin scalable-topics create | describe | split | merge | subscriptions | delete   (admin_scalable.py)

The endpoint defaults to $DANUBE_ADMIN_ENDPOINT, else http://127.0.0.1:50051.
With --output json each command prints the response message with the proto's field names (every
field present); list responses print the list of their repeated field.
Exit codes: 0 done, 1 the broker refused or could not be reached, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

DEFAULT_ENDPOINT = "http://127.0.0.1:50051"


def _target(endpoint: str) -> str:
    for scheme in ("http://", "https://", "grpc://"):
        if endpoint.startswith(scheme):
            return endpoint[len(scheme):].rstrip("/")
    return endpoint.rstrip("/")


def _describe_partitioning(topics, pb, topic: str, timeout, grpc):
    """The topic's partitioning (live repartition), None when it is not partitioned or the broker
    has no such call."""
    try:
        return topics.DescribePartitioning(pb.TopicRequest(name=topic), timeout=timeout)
    except grpc.RpcError as exc:
        if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNIMPLEMENTED):
            return None
        raise


def _partitioning(resp, to_dict) -> tuple[dict, list[str]]:
    """JSON and text of a PartitioningResponse: version, generation, marker and drain state."""
    import json

    marker = json.loads(resp.marker_json) if resp.marker_json else None
    data = {"name": resp.name, "partitions": resp.partitions, "partitioning_version": resp.partitioning_version,
            "generation": resp.generation, "marker": marker, "drained": resp.drained, "retired": list(resp.retired),
            "global_adoption": resp.global_adoption if resp.HasField("global_adoption") else None,
            "adoption_generation": resp.adoption_generation if resp.HasField("adoption_generation") else None}
    lines = [f"Partitions: {resp.partitions}, partitioning version {resp.partitioning_version}, "
             f"generation {resp.generation}"]
    if marker:
        lines.append(f"Repartition: {marker['kind']} {marker['from_partitions']} -> {marker['to_partitions']} "
                     f"({marker['phase']}), drained: {'yes' if resp.drained else 'no'}, adoption generation "
                     f"{marker.get('adoption_generation')}, fleet adoption "
                     f"{resp.global_adoption if resp.HasField('global_adoption') else '(no signal)'}")
    else:
        lines.append("Repartition: none in progress")
    if resp.retired:
        lines.append(f"Retired (out of routing, still read): {', '.join(map(str, resp.retired))}")
    data["progress"] = json.loads(resp.progress_json) if resp.progress_json else {}
    lines += _progress_lines(data["progress"])
    return data, lines


def _progress_lines(progress: dict) -> list[str]:
    """What a repartition waits for, and its pending holds, one line each."""
    def behind(w: dict) -> str:
        return (f"subscription {w['subscription']} on partition {w['partition']}: consumed below "
                f"{w['consumed']}, waits for {w['old_end'] if w['old_end'] is not None else '(not recorded)'}")

    lines = []
    unrecorded = progress.get("unrecorded")
    if unrecorded:
        lines.append(f"Waiting for offsets: old_end of {unrecorded['old_end'] or '-'}, "
                     f"new_start of {unrecorded['new_start'] or '-'}")
    lines += [f"Cutover waits for {behind(w)}" for w in progress.get("waiting", ())]
    adoption = progress.get("adoption")
    if adoption:
        lines.append(f"Cutover waits for adoption of generation {adoption['wanted']} "
                     f"(fleet: {adoption['fleet'] if adoption['fleet'] is not None else 'no signal'})")
    for hold in progress.get("pending", ()):
        lines.append(f"Pending hold of the grow to {hold['to_partitions']} (version {hold['to_version']}): "
                     f"{', '.join(hold['subscriptions'])}")
        lines += [f"  holds {behind(w)}" for w in hold["waiting"]]
    return lines


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "admin", help="administer a broker (topics, namespaces, brokers)",
        description="Danube admin commands over the admin gRPC service (port 50051 by default).")
    parser.add_argument("--endpoint", default=None,
                        help=f"admin endpoint (default $DANUBE_ADMIN_ENDPOINT or {DEFAULT_ENDPOINT})")
    parser.add_argument("--output", "-o", choices=["text", "json"], default="text", help="output format")
    parser.add_argument("--timeout", type=float, default=60.0, help="RPC deadline in seconds (default 60)")
    from danube.cli import admin_security

    admin_security.add_connection_args(parser)
    groups = parser.add_subparsers(dest="admin_group", metavar="GROUP")

    topics = groups.add_parser("topics", help="topic commands").add_subparsers(dest="admin_cmd", metavar="COMMAND")
    p = topics.add_parser("unload", help="seal the topic here; clients reconnect and it reloads through resume")
    p.add_argument("topic", help="/namespace/topic")
    p = topics.add_parser("list", help="topics of a namespace (or of a broker, --broker), cluster-wide")
    p.add_argument("namespace", nargs="?")
    p.add_argument("--broker", default=None, metavar="ID", help="the topics assigned to broker ID instead")
    p = topics.add_parser("create", help="create a topic (placed on a broker at once in a cluster)")
    p.add_argument("topic", help="/namespace/topic")
    p.add_argument("--partitions", type=int, default=0, help="a partitioned topic of N partitions")
    p.add_argument("--dispatch-strategy", "-s", choices=["reliable", "non_reliable"], default="non_reliable")
    p.add_argument("--schema-subject", default=None)
    p = topics.add_parser("delete", help="delete a topic (its owner closes it, its metadata goes)")
    p.add_argument("topic")
    p = topics.add_parser("unsubscribe", help="delete a subscription of a topic")
    p.add_argument("topic")
    p.add_argument("--subscription", "-s", required=True)
    p = topics.add_parser("describe", help="a topic's subscriptions, delivery and storage")
    p.add_argument("topic")
    p = topics.add_parser("repartition", help="grow or shrink a partitioned topic online (docs/repartition.md)")
    p.add_argument("topic")
    p.add_argument("--partitions", type=int, required=True, help="the new partition count")
    p = topics.add_parser("subscriptions", help="a topic's subscriptions")
    p.add_argument("topic")

    brokers = groups.add_parser("brokers", help="broker commands").add_subparsers(dest="admin_cmd", metavar="COMMAND")
    brokers.add_parser("list", help="brokers of the cluster")
    brokers.add_parser("leader-broker", help="the leader broker")
    brokers.add_parser("namespaces", help="namespaces of the cluster")
    p = brokers.add_parser("unload", help="drain a broker: move all its topics away, assign it nothing new")
    p.add_argument("broker_id")
    p.add_argument("--dry-run", action="store_true", help="only count the topics that would move")
    p.add_argument("--namespaces-include", nargs="*", default=[], metavar="NS")
    p.add_argument("--namespaces-exclude", nargs="*", default=[], metavar="NS")
    p = brokers.add_parser("activate", help="let a drained broker take topics again")
    p.add_argument("broker_id")
    from danube.cli import admin_rebalancing

    admin_rebalancing.add_commands(brokers)  # balance | rebalance | rebalance-history

    namespaces = groups.add_parser("namespaces", help="namespace commands").add_subparsers(
        dest="admin_cmd", metavar="COMMAND")
    namespaces.add_parser("list", help="namespaces of the cluster")
    p = namespaces.add_parser("topics", help="topics of a namespace")
    p.add_argument("namespace")
    for name, what in (("policies", "a namespace's policies"), ("create", "create a namespace"),
                       ("delete", "delete an empty namespace")):
        p = namespaces.add_parser(name, help=what)
        p.add_argument("namespace")
    admin_security.register(groups)
    from danube.cli import admin_schemas

    admin_schemas.add_parser(groups)
    from danube.cli import admin_scalable

    admin_scalable.add_parser(groups)
    parser.set_defaults(func=run, _admin_parser=parser)


def _emit(args, data, text_lines) -> None:
    if args.output == "json":
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        for line in text_lines:
            print(line)


def run(args) -> int:
    if not getattr(args, "admin_cmd", None):
        args._admin_parser.print_help(sys.stderr)
        return 2
    import grpc
    from google.protobuf.json_format import MessageToDict

    from danube.proto.danube_admin import admin_pb2 as pb
    from danube.proto.danube_admin import admin_pb2_grpc as pb_grpc

    endpoint = args.endpoint or os.environ.get("DANUBE_ADMIN_ENDPOINT") or DEFAULT_ENDPOINT
    group, cmd = args.admin_group, args.admin_cmd
    from danube.cli import admin_security

    if group == "security" and cmd == "tokens":
        return admin_security.create_token(args, lambda data, lines: _emit(args, data, lines))
    try:
        with admin_security.open_channel(args, _target(endpoint)) as channel:
            topics = pb_grpc.TopicAdminStub(channel)
            namespaces = pb_grpc.NamespaceAdminStub(channel)

            def _dict(message) -> dict:  # the message with the proto's field names, every field present
                return MessageToDict(message, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)

            brokers = pb_grpc.BrokerAdminStub(channel)
            t = args.timeout
            if group == "schemas":
                from danube.cli import admin_schemas

                return admin_schemas.run(args, channel, _emit)
            if group == "security":
                return admin_security.run(args, channel, lambda data, lines: _emit(args, data, lines))
            if group == "scalable-topics":
                from danube.cli import admin_scalable

                return admin_scalable.run(args, channel, _emit)
            if group == "brokers" and cmd in ("balance", "rebalance", "rebalance-history"):
                from danube.cli import admin_rebalancing

                return admin_rebalancing.run(args, channel, _emit)
            if group == "topics" and cmd == "unload":
                resp = topics.UnloadTopic(pb.TopicRequest(name=args.topic), timeout=t)
                _emit(args, _dict(resp), [f"Topic {args.topic} unloaded"])
            elif group == "topics" and cmd == "list":
                if args.broker is not None:
                    resp = topics.ListBrokerTopics(pb.BrokerRequest(broker_id=args.broker), timeout=t)
                    title = f"Topics of broker {args.broker}:"
                elif args.namespace:
                    resp = topics.ListNamespaceTopics(pb.NamespaceRequest(name=args.namespace), timeout=t)
                    title = f"Topics in namespace '{args.namespace}':"
                else:
                    args._admin_parser.error("topics list: give a namespace or --broker ID")
                data = [_dict(x) for x in resp.topics]
                _emit(args, data, [title] +
                      [f"  {x['name']}  ({x['delivery']}{', broker ' + x['broker_id'] if x['broker_id'] else ''})"
                       for x in data])
            elif group == "namespaces" and cmd == "topics":
                resp = namespaces.GetNamespaceTopics(pb.NamespaceRequest(name=args.namespace), timeout=t)
                _emit(args, list(resp.topics), [f"Topics in namespace '{args.namespace}':"] +
                      [f"  {x}" for x in resp.topics])
            elif group == "namespaces" and cmd == "policies":
                resp = namespaces.GetNamespacePolicies(pb.NamespaceRequest(name=args.namespace), timeout=t)
                policies = json.loads(resp.policies or "{}")
                _emit(args, policies, [f"Policies of namespace '{args.namespace}':",
                                       json.dumps(policies, indent=2, sort_keys=True)])
            elif group == "namespaces" and cmd in ("create", "delete"):
                call = namespaces.CreateNamespace if cmd == "create" else namespaces.DeleteNamespace
                resp = call(pb.NamespaceRequest(name=args.namespace), timeout=t)
                _emit(args, _dict(resp), [f"Namespace {args.namespace} {cmd}d"])
            elif group == "topics" and cmd == "create":
                strategy = pb.Reliable if args.dispatch_strategy == "reliable" else pb.NonReliable
                if args.partitions > 0:
                    request = pb.PartitionedTopicRequest(base_name=args.topic, partitions=args.partitions,
                                                         dispatch_strategy=strategy)
                    if args.schema_subject:
                        request.schema_subject = args.schema_subject
                    resp = topics.CreatePartitionedTopic(request, timeout=t)
                else:
                    request = pb.NewTopicRequest(name=args.topic, dispatch_strategy=strategy)
                    if args.schema_subject:
                        request.schema_subject = args.schema_subject
                    resp = topics.CreateTopic(request, timeout=t)
                _emit(args, _dict(resp), [f"Topic {args.topic} created"
                                          + (f" with {args.partitions} partitions" if args.partitions > 0 else "")])
            elif group == "topics" and cmd == "delete":
                resp = topics.DeleteTopic(pb.TopicRequest(name=args.topic), timeout=t)
                _emit(args, _dict(resp), [f"Topic {args.topic} deleted"])
            elif group == "topics" and cmd == "unsubscribe":
                resp = topics.Unsubscribe(pb.SubscriptionRequest(topic=args.topic, subscription=args.subscription),
                                          timeout=t)
                _emit(args, _dict(resp), [f"Subscription {args.subscription} of {args.topic} deleted"])
            elif group == "topics" and cmd == "repartition":
                resp = topics.RepartitionTopic(pb.RepartitionRequest(name=args.topic, partitions=args.partitions),
                                               timeout=t)
                data, lines = _partitioning(resp, MessageToDict)
                _emit(args, data, [f"Topic {args.topic}: cut over to {resp.partitions} partitions"] + lines)
            elif group == "topics" and cmd == "describe":
                partitioning = _describe_partitioning(topics, pb, args.topic, t, grpc)
                try:
                    resp = topics.DescribeTopic(pb.DescribeTopicRequest(name=args.topic), timeout=t)
                except grpc.RpcError as exc:   # the base name of a partitioned topic is no topic itself
                    if partitioning is None or exc.code() != grpc.StatusCode.NOT_FOUND:
                        raise
                    data, lines = _partitioning(partitioning, MessageToDict)
                    _emit(args, {"name": args.topic, "partitioning": data}, [f"Topic: {args.topic}"] + lines)
                    return 0
                data = MessageToDict(resp, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
                lines = [f"Topic: {resp.name}", f"Broker: {resp.broker_id or '(not loaded)'}",
                         f"Delivery: {resp.delivery}", f"Subscriptions: {', '.join(resp.subscriptions) or '(none)'}"]
                if partitioning is not None:
                    data["partitioning"], more = _partitioning(partitioning, MessageToDict)
                    lines += more
                if resp.HasField("storage"):
                    s = resp.storage
                    lines += [f"Storage: {s.mode} ({s.backend}), recovered from {s.recovered_from}",
                              f"  offsets {s.first_offset}..{s.next_offset - 1} (next {s.next_offset}), "
                              f"hot WAL from {s.hot_start_offset}, durable through {s.durable_end_offset}",
                              f"  {s.segment_count} segments, {s.segment_bytes} bytes"]
                    lines += [f"    {g.segment_id}  {g.start_offset}..{g.end_offset}  {g.size} B" for g in s.segments]
                _emit(args, data, lines)
            elif group == "topics" and cmd == "subscriptions":
                resp = topics.ListSubscriptions(pb.TopicRequest(name=args.topic), timeout=t)
                _emit(args, list(resp.subscriptions), [f"Subscriptions of {args.topic}:"] +
                      [f"  {s}" for s in resp.subscriptions])
            elif group == "brokers" and cmd == "list":
                resp = brokers.ListBrokers(pb.Empty(), timeout=t)
                data = [_dict(b) for b in resp.brokers]
                _emit(args, data, [f"{b.broker_id}  {b.broker_addr}  {b.broker_role}  {b.broker_status}"
                                   for b in resp.brokers])
            elif group == "brokers" and cmd == "leader-broker":
                resp = brokers.GetLeaderBroker(pb.Empty(), timeout=t)
                _emit(args, _dict(resp), [f"Leader broker: {resp.leader}"])
            elif group == "brokers" and cmd == "unload":
                resp = brokers.UnloadBroker(pb.UnloadBrokerRequest(
                    broker_id=args.broker_id, dry_run=args.dry_run, namespaces_include=args.namespaces_include,
                    namespaces_exclude=args.namespaces_exclude, timeout_seconds=int(max(1, t - 5))), timeout=t)
                data = MessageToDict(resp, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
                _emit(args, data, [f"Broker {args.broker_id}: {resp.succeeded}/{resp.total} topics moved"
                                   + (f", failed: {', '.join(resp.failed_topics)}" if resp.failed else "")])
            elif group == "brokers" and cmd == "activate":
                resp = brokers.ActivateBroker(pb.ActivateBrokerRequest(broker_id=args.broker_id), timeout=t)
                _emit(args, _dict(resp),
                      [f"Broker {args.broker_id} is active"])
            elif cmd in ("namespaces", "list"):
                resp = brokers.ListNamespaces(pb.Empty(), timeout=t)
                _emit(args, list(resp.namespaces), [f"  {n}" for n in resp.namespaces])
            else:  # pragma: no cover - argparse restricts the choices
                args._admin_parser.print_help(sys.stderr)
                return 2
    except grpc.RpcError as exc:
        code = exc.code()
        detail = exc.details() or ""
        if code == grpc.StatusCode.UNAVAILABLE and "connect" in detail.lower():
            print(f"danube admin: cannot reach {endpoint}: {detail}", file=sys.stderr)
        else:
            print(f"danube admin: {code.name.lower()}: {detail}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:  # `python -m danube.cli.admin ...`
    parser = argparse.ArgumentParser(prog="danube")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["admin", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
