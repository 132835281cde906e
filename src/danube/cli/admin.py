"""`danube admin`: Danube's admin commands, flags and outputs over the admin gRPC service.

    danube admin [--endpoint URL] [-o json] GROUP COMMAND ... [--output json] [--endpoint URL]
    danube admin topics list --namespace NS | NS | --broker ID             (admin_topics.py)
    danube admin topics create | delete | describe | subscriptions | unsubscribe | unload | repartition
    danube admin topics configure-schema | set-validation-policy | get-schema-config
    danube admin topics set-failure-policy | get-failure-policy        (admin_failure_policy.py)
    danube admin brokers list | leader-broker | namespaces | unload --broker-id ID | activate --broker-id ID
    danube admin namespaces list | topics NS | policies NS | create NS | delete NS
    danube admin brokers balance | rebalance --dry-run [--max-moves N] | rebalance-history   (admin_rebalancing.py)
    danube admin schemas register | get | versions | check | get-compatibility | set-compatibility | delete
    danube admin scalable-topics create | describe | split | merge | subscriptions | delete   (admin_scalable.py)

The endpoint defaults to $DANUBE_ADMIN_ENDPOINT, else http://127.0.0.1:50051.  Texts and JSON are
Danube's CLI's; a command Danube prints no JSON for prints its response message with the proto's
field names.  Exit codes: 0 done, 1 the broker refused or could not be reached, 2 bad usage.
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
            return endpoint[len(scheme) :].rstrip("/")
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
    data = {
        "name": resp.name,
        "partitions": resp.partitions,
        "partitioning_version": resp.partitioning_version,
        "generation": resp.generation,
        "marker": marker,
        "drained": resp.drained,
        "retired": list(resp.retired),
        "global_adoption": resp.global_adoption if resp.HasField("global_adoption") else None,
        "adoption_generation": resp.adoption_generation if resp.HasField("adoption_generation") else None,
    }
    lines = [
        f"Partitions: {resp.partitions}, partitioning version {resp.partitioning_version}, generation {resp.generation}"
    ]
    if marker:
        lines.append(
            f"Repartition: {marker['kind']} {marker['from_partitions']} -> {marker['to_partitions']} "
            f"({marker['phase']}), drained: {'yes' if resp.drained else 'no'}, adoption generation "
            f"{marker.get('adoption_generation')}, fleet adoption "
            f"{resp.global_adoption if resp.HasField('global_adoption') else '(no signal)'}"
        )
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
        return (
            f"subscription {w['subscription']} on partition {w['partition']}: consumed below "
            f"{w['consumed']}, waits for {w['old_end'] if w['old_end'] is not None else '(not recorded)'}"
        )

    lines = []
    unrecorded = progress.get("unrecorded")
    if unrecorded:
        lines.append(
            f"Waiting for offsets: old_end of {unrecorded['old_end'] or '-'}, "
            f"new_start of {unrecorded['new_start'] or '-'}"
        )
    lines += [f"Cutover waits for {behind(w)}" for w in progress.get("waiting", ())]
    adoption = progress.get("adoption")
    if adoption:
        lines.append(
            f"Cutover waits for adoption of generation {adoption['wanted']} "
            f"(fleet: {adoption['fleet'] if adoption['fleet'] is not None else 'no signal'})"
        )
    for hold in progress.get("pending", ()):
        lines.append(
            f"Pending hold of the grow to {hold['to_partitions']} (version {hold['to_version']}): "
            f"{', '.join(hold['subscriptions'])}"
        )
        lines += [f"  holds {behind(w)}" for w in hold["waiting"]]
    return lines


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "admin",
        help="administer a broker (topics, namespaces, brokers)",
        description="Danube admin commands over the admin gRPC service (port 50051 by default).",
    )
    parser.add_argument(
        "--endpoint", default=None, help=f"admin endpoint (default $DANUBE_ADMIN_ENDPOINT or {DEFAULT_ENDPOINT})"
    )
    parser.add_argument("--output", "-o", choices=["text", "json"], default="text", help="output format")
    parser.add_argument("--timeout", type=float, default=60.0, help="RPC deadline in seconds (default 60)")
    from danube.cli import admin_security

    admin_security.add_connection_args(parser)
    groups = parser.add_subparsers(dest="admin_group", metavar="GROUP")

    from danube.cli import admin_topics

    admin_topics.add_parser(groups)

    brokers = groups.add_parser("brokers", help="broker commands").add_subparsers(dest="admin_cmd", metavar="COMMAND")
    out = admin_topics.output_option
    out(brokers.add_parser("list", help="brokers of the cluster"))
    out(brokers.add_parser("leader-broker", help="the leader broker"))
    out(brokers.add_parser("namespaces", help="namespaces of the cluster"))
    p = brokers.add_parser("unload", help="drain a broker: move all its topics away, assign it nothing new")
    _broker_id_args(p)
    p.add_argument("--dry-run", action="store_true", help="only count the topics that would move")
    p.add_argument("--namespaces-include", nargs="*", action="extend", default=[], metavar="NS")
    p.add_argument("--namespaces-exclude", nargs="*", action="extend", default=[], metavar="NS")
    p.add_argument("--max-parallel", type=int, default=1, help="accepted for Danube's CLI; topics move one by one")
    p.add_argument("--timeout-seconds", type=int, default=None, help="the drain's deadline (default: --timeout)")
    out(p)
    p = brokers.add_parser("activate", help="let a drained broker take topics again")
    _broker_id_args(p)
    p.add_argument("--reason", default="admin_activate", help="why (logged by Danube; accepted here)")
    out(p)
    from danube.cli import admin_rebalancing

    admin_rebalancing.add_commands(brokers)  # balance | rebalance | rebalance-history

    namespaces = groups.add_parser("namespaces", help="namespace commands").add_subparsers(
        dest="admin_cmd", metavar="COMMAND"
    )
    out(namespaces.add_parser("list", help="namespaces of the cluster"))
    for name, what in (
        ("topics", "topics of a namespace"),
        ("policies", "a namespace's policies"),
        ("create", "create a namespace"),
        ("delete", "delete an empty namespace"),
    ):
        p = namespaces.add_parser(name, help=what)
        p.add_argument("namespace")
        out(p)
    admin_security.register(groups)
    from danube.cli import admin_schemas

    admin_schemas.add_parser(groups)
    from danube.cli import admin_scalable

    admin_scalable.add_parser(groups)
    _options_after_command(parser)
    from danube.gateway import cli as gateway_cli

    gateway_cli.add_parser(groups)  # `danube admin serve` (docs/gateway.md)
    parser.set_defaults(func=run, _admin_parser=parser)


def _options_after_command(parser) -> None:
    """Danube's CLI takes --endpoint and --output after the command (clap's global and per-command
    flags); ours also before the group.  Every command accepts both places: SUPPRESS leaves the
    group-level value in force when the flag is not repeated after the command."""
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        if "--output" not in parser._option_string_actions:
            parser.add_argument("--output", choices=["text", "json"], default=argparse.SUPPRESS, help="output format")
        if "--endpoint" not in parser._option_string_actions:
            parser.add_argument("--endpoint", default=argparse.SUPPRESS, help="admin endpoint")
        return
    for action in subparsers:
        for child in set(action.choices.values()):
            _options_after_command(child)


def _broker_id_args(p) -> None:
    p.add_argument("broker_id", nargs="?", default=None, metavar="BROKER_ID")
    p.add_argument("--broker-id", dest="broker_id_flag", default=None, help="the broker (Danube's spelling)")


def _emit(args, data, text_lines) -> None:
    if args.output == "json":
        print(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False))
    else:
        for line in text_lines:
            print(line)


def _policies_lines(policies: dict) -> list[str]:
    """Danube's text rendering of namespace policies."""

    def value(key: str) -> str | None:
        v = policies.get(key)
        return None if v is None else str(v)

    lines = ["Policies Configuration:", "-----------------------"]
    for key, label in (
        ("max_producers_per_topic", "Max Producers per Topic"),
        ("max_subscriptions_per_topic", "Max Subscriptions per Topic"),
        ("max_consumers_per_topic", "Max Consumers per Topic"),
        ("max_consumers_per_subscription", "Max Consumers per Subscription"),
    ):
        lines.append(f"{label}: {value(key) or 'Not Set'}")
    for key, label in (
        ("max_publish_rate", "Max publish rate"),
        ("max_subscription_dispatch_rate", "Dispatch rate for subscription"),
        ("max_message_size", "Max message size"),
    ):
        lines.append(f"{label}: {value(key)}" if value(key) is not None else f"{label} Not Set")
    return lines + ["-----------------------"]


def _flag(ok: bool) -> str:
    return "true" if ok else "false"


def run(args) -> int:
    if not getattr(args, "admin_cmd", None):
        args._admin_parser.print_help(sys.stderr)
        return 2
    import grpc
    from google.protobuf.json_format import MessageToDict

    from danube.cli import admin_topics
    from danube.proto.danube_admin import admin_pb2 as pb
    from danube.proto.danube_admin import admin_pb2_grpc as pb_grpc

    endpoint = args.endpoint or os.environ.get("DANUBE_ADMIN_ENDPOINT") or DEFAULT_ENDPOINT
    group, cmd = args.admin_group, args.admin_cmd
    from danube.cli import admin_security

    if group == "security" and cmd == "tokens":
        return admin_security.create_token(args, lambda data, lines: _emit(args, data, lines))
    if group == "brokers" and cmd in ("unload", "activate"):
        if args.broker_id and args.broker_id_flag and args.broker_id != args.broker_id_flag:
            print("danube admin: give the broker once (BROKER_ID or --broker-id)", file=sys.stderr)
            return 2
        args.broker_id = args.broker_id or args.broker_id_flag
        if not args.broker_id:
            print(f"danube admin: brokers {cmd} needs the broker: --broker-id ID", file=sys.stderr)
            return 2
    try:
        with admin_security.open_channel(args, _target(endpoint)) as channel:
            namespaces = pb_grpc.NamespaceAdminStub(channel)

            def _dict(message) -> dict:  # the message with the proto's field names, every field present
                return MessageToDict(
                    message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
                )

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
            if group == "topics":
                return admin_topics.run(
                    args,
                    channel,
                    _emit,
                    describe_partitioning=_describe_partitioning,
                    partitioning=lambda resp: _partitioning(resp, MessageToDict),
                )
            if group == "brokers" and cmd in ("balance", "rebalance", "rebalance-history"):
                from danube.cli import admin_rebalancing

                return admin_rebalancing.run(args, channel, _emit)
            if group == "namespaces" and cmd == "topics":
                resp = namespaces.GetNamespaceTopics(pb.NamespaceRequest(name=args.namespace), timeout=t)
                _emit(args, list(resp.topics), [f"Topic: {x}" for x in resp.topics])
            elif group == "namespaces" and cmd == "policies":
                resp = namespaces.GetNamespacePolicies(pb.NamespaceRequest(name=args.namespace), timeout=t)
                policies = json.loads(resp.policies or "{}")
                _emit(args, policies, _policies_lines(policies))
            elif group == "namespaces" and cmd in ("create", "delete"):
                call = namespaces.CreateNamespace if cmd == "create" else namespaces.DeleteNamespace
                resp = call(pb.NamespaceRequest(name=args.namespace), timeout=t)
                _emit(args, _dict(resp), [f"Namespace {cmd.capitalize()}d: {_flag(resp.success)}"])
            elif group == "brokers" and cmd == "list":
                resp = brokers.ListBrokers(pb.Empty(), timeout=t)
                data = [_dict(b) for b in resp.brokers]
                row = "{:<15} {:<15} {:<25} {:<15} {:<25} {:<25}"
                _emit(
                    args,
                    data,
                    [row.format("BROKER ID", "STATUS", "ADDRESS", "ROLE", "ADMIN ADDR", "METRICS ADDR"), "-" * 125]
                    + [
                        row.format(
                            b.broker_id, b.broker_status, b.broker_addr, b.broker_role, b.admin_addr, b.metrics_addr
                        )
                        for b in resp.brokers
                    ],
                )
            elif group == "brokers" and cmd == "leader-broker":
                resp = brokers.GetLeaderBroker(pb.Empty(), timeout=t)
                _emit(args, _dict(resp), [f"Leader Broker: {json.dumps(resp.leader)}"])
            elif group == "brokers" and cmd == "unload":
                timeout_s = args.timeout_seconds if args.timeout_seconds is not None else int(max(1, t - 5))
                resp = brokers.UnloadBroker(
                    pb.UnloadBrokerRequest(
                        broker_id=args.broker_id,
                        dry_run=args.dry_run,
                        namespaces_include=args.namespaces_include,
                        namespaces_exclude=args.namespaces_exclude,
                        timeout_seconds=timeout_s,
                    ),
                    timeout=max(t, timeout_s + 5),
                )
                _emit(
                    args,
                    _dict(resp),
                    [
                        f"UnloadBroker started={_flag(resp.started)} total={resp.total} succeeded={resp.succeeded} "
                        f"failed={resp.failed} pending={resp.pending}"
                    ],
                )
                for name in resp.failed_topics if args.output != "json" else ():
                    print(f"  failed: {name}", file=sys.stderr)
            elif group == "brokers" and cmd == "activate":
                resp = brokers.ActivateBroker(
                    pb.ActivateBrokerRequest(broker_id=args.broker_id, reason=args.reason), timeout=t
                )
                _emit(args, _dict(resp), [f"ActivateBroker success={_flag(resp.success)}"])
            elif cmd in ("namespaces", "list"):
                resp = brokers.ListNamespaces(pb.Empty(), timeout=t)
                _emit(args, list(resp.namespaces), [f"Namespace: {n}" for n in resp.namespaces])
            else:  # pragma: no cover - argparse restricts the choices
                args._admin_parser.print_help(sys.stderr)
                return 2
    except admin_topics.UsageError as exc:
        print(f"danube admin: {exc}", file=sys.stderr)
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
