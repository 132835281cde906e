"""`danube admin`: Danube's admin commands over the admin gRPC service.

    danube admin [--endpoint URL] [--output json] topics unload /default/orders
    danube admin topics list default
    danube admin topics describe /default/orders
    danube admin topics subscriptions /default/orders
    danube admin brokers list | namespaces list
    danube admin brokers balance | rebalance --dry-run [--max-moves N] | rebalance-history   (admin_rebalancing.py)
    danube admin schemas register | get | versions | check | delete | compatibility   (admin_schemas.py)
    danube admin scalable-topics create | describe | split | merge | subscriptions | delete   (admin_scalable.py)

The endpoint defaults to $DANUBE_ADMIN_ENDPOINT, else http://127.0.0.1:50051.
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
    p = topics.add_parser("list", help="topics of a namespace")
    p.add_argument("namespace")
    p = topics.add_parser("describe", help="a topic's subscriptions, delivery and storage")
    p.add_argument("topic")
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
                topics.UnloadTopic(pb.TopicRequest(name=args.topic), timeout=t)
                _emit(args, {"topic": args.topic, "unloaded": True}, [f"Topic {args.topic} unloaded"])
            elif (group == "topics" and cmd == "list") or (group == "namespaces" and cmd == "topics"):
                resp = topics.ListNamespaceTopics(pb.NamespaceRequest(name=args.namespace), timeout=t)
                data = [{"name": x.name, "broker_id": x.broker_id, "delivery": x.delivery} for x in resp.topics]
                _emit(args, data, [f"Topics in namespace '{args.namespace}':"] +
                      [f"  {x['name']}  ({x['delivery']}{', broker ' + x['broker_id'] if x['broker_id'] else ''})"
                       for x in data])
            elif group == "topics" and cmd == "describe":
                resp = topics.DescribeTopic(pb.DescribeTopicRequest(name=args.topic), timeout=t)
                data = MessageToDict(resp, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
                lines = [f"Topic: {resp.name}", f"Broker: {resp.broker_id or '(not loaded)'}",
                         f"Delivery: {resp.delivery}", f"Subscriptions: {', '.join(resp.subscriptions) or '(none)'}"]
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
                data = [MessageToDict(b, preserving_proto_field_name=True) for b in resp.brokers]
                _emit(args, data, [f"{b.broker_id}  {b.broker_addr}  {b.broker_role}  {b.broker_status}"
                                   for b in resp.brokers])
            elif group == "brokers" and cmd == "leader-broker":
                resp = brokers.GetLeaderBroker(pb.Empty(), timeout=t)
                _emit(args, {"leader": resp.leader}, [f"Leader broker: {resp.leader}"])
            elif group == "brokers" and cmd == "unload":
                resp = brokers.UnloadBroker(pb.UnloadBrokerRequest(
                    broker_id=args.broker_id, dry_run=args.dry_run, namespaces_include=args.namespaces_include,
                    namespaces_exclude=args.namespaces_exclude, timeout_seconds=int(max(1, t - 5))), timeout=t)
                data = MessageToDict(resp, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
                _emit(args, data, [f"Broker {args.broker_id}: {resp.succeeded}/{resp.total} topics moved"
                                   + (f", failed: {', '.join(resp.failed_topics)}" if resp.failed else "")])
            elif group == "brokers" and cmd == "activate":
                brokers.ActivateBroker(pb.ActivateBrokerRequest(broker_id=args.broker_id), timeout=t)
                _emit(args, {"broker_id": args.broker_id, "activated": True},
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
