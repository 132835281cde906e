"""`danube admin topics ...`: Danube's topic commands, flags and outputs, with this project's extras.

    danube admin topics list --namespace NS | NS | --broker ID        [--output json]
    danube admin topics create /ns/t | t --namespace NS [--partitions N] [--dispatch-strategy reliable]
                                                  [--schema-subject S]
    danube admin topics delete | unload | describe | subscriptions TOPIC [--namespace NS] [--output json]
    danube admin topics unsubscribe TOPIC --subscription S
    danube admin topics configure-schema TOPIC --subject S [--validation-policy none|warn|enforce]
                                                  [--enable-payload-validation]
    danube admin topics set-validation-policy TOPIC --policy P [--enable-payload-validation]
    danube admin topics get-schema-config TOPIC [--output json]
    danube admin topics set-failure-policy | get-failure-policy TOPIC --subscription S ...
                                                  (admin_failure_policy.py)
    danube admin topics repartition TOPIC --partitions N       (this project's live repartition)

A topic is ``/ns/topic``, ``ns/topic`` or ``topic`` with ``--namespace NS``, as in Danube's CLI.
Texts and JSON are Danube's (``describe --output json`` names the topic ``topic`` and prints unset
schema fields as null); ``describe`` adds this project's ``storage`` and ``partitioning`` fields.
"""

from __future__ import annotations

import argparse
import json

POLICIES = ["none", "warn", "enforce"]


class UsageError(Exception):
    """A command line the broker is never asked about (exit 2)."""


def output_option(p) -> None:
    """``--output json`` after the command, as Danube's CLI takes it; SUPPRESS keeps the group-level
    ``danube admin -o json ...`` working when it is not given here."""
    p.add_argument("--output", "-o", choices=["text", "json"], default=argparse.SUPPRESS, help="output format")


def _topic_args(p, *, output: bool = False) -> None:
    p.add_argument("topic", help="/namespace/topic, namespace/topic, or topic with --namespace")
    p.add_argument("--namespace", default=None, help="the namespace of a topic given without one")
    if output:
        output_option(p)


def normalize_topic(topic: str, namespace: str | None) -> str:
    """``/ns/topic`` from Danube's three accepted spellings.  A name that starts with ``/`` goes to
    the broker as given: the broker judges names (one rule, danube.metadata.keys)."""
    s = topic.strip()
    if s.startswith("/"):
        return s
    parts = s.split("/")
    if len(parts) == 2:
        return f"/{s}"
    if len(parts) == 1:
        if not namespace:
            raise UsageError(f"topic {topic!r} has no namespace: give /namespace/topic or --namespace NS")
        return f"/{namespace.strip('/')}/{s}"
    raise UsageError(f"wrong topic format {topic!r}: expected /namespace/topic")


def add_parser(groups) -> None:
    topics = groups.add_parser("topics", help="topic commands").add_subparsers(dest="admin_cmd", metavar="COMMAND")
    p = topics.add_parser("list", help="topics of a namespace (or of a broker, --broker), cluster-wide")
    p.add_argument("namespace_pos", nargs="?", metavar="NAMESPACE")
    p.add_argument("--namespace", default=None, help="the namespace (Danube's spelling; a positional works too)")
    p.add_argument("--broker", default=None, metavar="ID", help="the topics assigned to broker ID instead")
    output_option(p)
    p = topics.add_parser("create", help="create a topic (placed on a broker at once in a cluster)")
    _topic_args(p, output=True)
    p.add_argument("--partitions", type=int, default=None, help="a partitioned topic of N partitions")
    p.add_argument(
        "--dispatch-strategy",
        "-s",
        default="non_reliable",
        choices=["reliable", "non_reliable", "reliable_dispatch", "reliable-dispatch", "non-reliable"],
    )
    p.add_argument("--schema-subject", default=None, help="the schema registry subject the topic uses")
    for name, what in (
        ("delete", "delete a topic (a partitioned topic by its base name: every partition)"),
        ("unload", "seal the topic here; clients reconnect and it reloads through resume"),
        ("describe", "a topic's schema, subscriptions, delivery and storage"),
        ("subscriptions", "a topic's subscriptions"),
    ):
        _topic_args(topics.add_parser(name, help=what), output=True)
    p = topics.add_parser("unsubscribe", help="delete a subscription of a topic")
    _topic_args(p, output=True)
    p.add_argument("--subscription", "-s", required=True)
    p = topics.add_parser("configure-schema", help="a topic's schema subject and validation policy")
    _topic_args(p, output=True)
    p.add_argument("--subject", required=True, help="schema subject")
    p.add_argument("--validation-policy", choices=POLICIES, default="none")
    p.add_argument("--enable-payload-validation", action="store_true", help="validate every payload's content")
    p = topics.add_parser("set-validation-policy", help="change a topic's validation policy, keeping its subject")
    _topic_args(p, output=True)
    p.add_argument("--policy", choices=POLICIES, required=True)
    p.add_argument("--enable-payload-validation", action="store_true", help="validate every payload's content")
    p = topics.add_parser("get-schema-config", help="a topic's schema configuration")
    _topic_args(p, output=True)
    from danube.cli import admin_failure_policy

    admin_failure_policy.add_commands(topics, _topic_args)
    p = topics.add_parser("repartition", help="grow or shrink a partitioned topic online (docs/repartition.md)")
    _topic_args(p, output=True)
    p.add_argument("--partitions", type=int, required=True, help="the new partition count")


def _enabled(flag: bool) -> str:
    return "ENABLED" if flag else "DISABLED"


def describe_json(resp, name: str) -> dict:
    """Danube's describe JSON: every schema field present, null when the topic has none."""

    def opt(field):
        return getattr(resp, field) if resp.HasField(field) else None

    return {
        "topic": resp.name or name,
        "broker_id": resp.broker_id,
        "delivery": resp.delivery,
        "schema_subject": opt("schema_subject"),
        "schema_id": opt("schema_id"),
        "schema_version": opt("schema_version"),
        "schema_type": opt("schema_type"),
        "compatibility_mode": opt("compatibility_mode"),
        "subscriptions": list(resp.subscriptions),
    }


def describe_lines(resp) -> list[str]:
    lines = [f"Topic: {resp.name}"]
    if resp.broker_id:
        lines.append(f"Broker ID: {resp.broker_id}")
    if resp.delivery:
        lines.append(f"Delivery: {resp.delivery}")
    if resp.HasField("schema_subject"):
        lines += ["", "📋 Schema Registry:", f"  Subject: {resp.schema_subject}"]
        for field, label in (
            ("schema_id", "Schema ID"),
            ("schema_version", "Version"),
            ("schema_type", "Type"),
            ("compatibility_mode", "Compatibility"),
        ):
            if resp.HasField(field):
                lines.append(f"  {label}: {getattr(resp, field)}")
    else:
        lines += ["", "📋 Schema: None"]
    lines += ["", f"Subscriptions: {json.dumps(list(resp.subscriptions))}"]
    return lines


def run(args, channel, emit, *, describe_partitioning, partitioning) -> int:
    """One ``topics`` command; grpc.RpcError propagates to ``danube admin``."""
    import grpc

    from danube.proto.danube_admin import admin_pb2 as pb
    from danube.proto.danube_admin import admin_pb2_grpc as pb_grpc

    stub = pb_grpc.TopicAdminStub(channel)
    t, cmd = args.timeout, args.admin_cmd
    if cmd == "list":
        namespace = args.namespace or args.namespace_pos
        if args.broker is not None and namespace:
            raise UsageError("topics list: give either a namespace or --broker, not both")
        if args.broker is not None:
            resp = stub.ListBrokerTopics(pb.BrokerRequest(broker_id=args.broker), timeout=t)
        elif namespace:
            resp = stub.ListNamespaceTopics(pb.NamespaceRequest(name=namespace), timeout=t)
        else:
            raise UsageError("topics list: provide either --namespace or --broker")
        data = [{"name": x.name, "broker_id": x.broker_id, "delivery": x.delivery} for x in resp.topics]
        emit(
            args,
            data,
            [
                f"Topic: {x.name} (broker_id: {x.broker_id}, delivery: {x.delivery})"
                if x.broker_id
                else f"Topic: {x.name} (delivery: {x.delivery})"
                for x in resp.topics
            ],
        )
        return 0
    topic = normalize_topic(args.topic, args.namespace)
    if cmd == "create":
        reliable = args.dispatch_strategy.replace("-", "_") in ("reliable", "reliable_dispatch")
        strategy = pb.Reliable if reliable else pb.NonReliable
        if args.partitions is not None:
            if args.partitions < 1:
                raise UsageError("--partitions must be at least 1")
            request = pb.PartitionedTopicRequest(
                base_name=topic, partitions=args.partitions, dispatch_strategy=strategy
            )
            if args.schema_subject:
                request.schema_subject = args.schema_subject
            resp = stub.CreatePartitionedTopic(request, timeout=t)
            lines = [f"✅ Partitioned topic created: {topic}"]
        else:
            request = pb.NewTopicRequest(name=topic, dispatch_strategy=strategy)
            if args.schema_subject:
                request.schema_subject = args.schema_subject
            resp = stub.CreateTopic(request, timeout=t)
            lines = [f"✅ Topic created: {topic}"]
        if args.schema_subject:
            lines.append(f"   Schema subject: {args.schema_subject}")
        if args.partitions is not None:
            lines.append(f"   Partitions: {args.partitions}")
        emit(args, {"success": resp.success}, lines)
    elif cmd == "delete":
        resp = stub.DeleteTopic(pb.TopicRequest(name=topic), timeout=t)
        emit(args, {"success": resp.success}, [f"Topic Deleted: {str(resp.success).lower()}"])
    elif cmd == "unload":
        resp = stub.UnloadTopic(pb.TopicRequest(name=topic), timeout=t)
        emit(args, {"success": resp.success}, [f"Topic Unloaded: {str(resp.success).lower()}"])
    elif cmd == "unsubscribe":
        resp = stub.Unsubscribe(pb.SubscriptionRequest(topic=topic, subscription=args.subscription), timeout=t)
        emit(args, {"success": resp.success}, [f"Unsubscribed: {str(resp.success).lower()}"])
    elif cmd == "subscriptions":
        resp = stub.ListSubscriptions(pb.TopicRequest(name=topic), timeout=t)
        emit(args, list(resp.subscriptions), [f"Subscriptions: {json.dumps(list(resp.subscriptions))}"])
    elif cmd == "describe":
        parts = describe_partitioning(stub, pb, topic, t, grpc)
        try:
            resp = stub.DescribeTopic(pb.DescribeTopicRequest(name=topic), timeout=t)
        except grpc.RpcError as exc:  # the base name of a partitioned topic is no topic itself
            if parts is None or exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
            data, lines = partitioning(parts)
            emit(args, {"topic": topic, "partitioning": data}, [f"Topic: {topic}"] + lines)
            return 0
        data, lines = describe_json(resp, topic), describe_lines(resp)
        if parts is not None:
            data["partitioning"], more = partitioning(parts)
            lines += more
        if resp.HasField("storage"):
            from google.protobuf.json_format import MessageToDict

            s = resp.storage
            data["storage"] = MessageToDict(
                s, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
            )
            lines += [
                f"Storage: {s.mode} ({s.backend}), recovered from {s.recovered_from}",
                f"  offsets {s.first_offset}..{s.next_offset - 1} (next {s.next_offset}), "
                f"hot WAL from {s.hot_start_offset}, durable through {s.durable_end_offset}",
                f"  {s.segment_count} segments, {s.segment_bytes} bytes",
            ]
            lines += [f"    {g.segment_id}  {g.start_offset}..{g.end_offset}  {g.size} B" for g in s.segments]
        emit(args, data, lines)
    elif cmd == "repartition":
        resp = stub.RepartitionTopic(pb.RepartitionRequest(name=topic, partitions=args.partitions), timeout=t)
        data, lines = partitioning(resp)
        emit(args, data, [f"Topic {topic}: cut over to {resp.partitions} partitions"] + lines)
    elif cmd in ("configure-schema", "set-validation-policy", "get-schema-config"):
        return schema_config(args, channel, emit, topic)
    elif cmd in ("set-failure-policy", "get-failure-policy"):
        from danube.cli import admin_failure_policy

        return admin_failure_policy.run(args, channel, emit, topic)
    else:  # pragma: no cover - argparse restricts the choices
        raise UsageError(f"unknown topics command {cmd!r}")
    return 0


def schema_config(args, channel, emit, topic: str) -> int:
    from danube.proto.danube_schema import SchemaRegistry_pb2 as spb
    from danube.proto.danube_schema import SchemaRegistry_pb2_grpc as spb_grpc

    stub = spb_grpc.SchemaRegistryStub(channel)
    t, cmd = args.timeout, args.admin_cmd
    if cmd == "get-schema-config":
        r = stub.GetTopicSchemaConfig(spb.GetTopicSchemaConfigRequest(topic_name=topic), timeout=t)
        data = {
            "topic": topic,
            "schema_subject": r.schema_subject,
            "validation_policy": r.validation_policy.upper(),
            "enable_payload_validation": r.enable_payload_validation,
            "schema_id": r.schema_id,
        }
        lines = [f"Topic: {topic}"]
        if r.schema_subject:
            lines += [
                f"Schema Subject: {r.schema_subject}",
                f"Validation Policy: {r.validation_policy.upper()}",
                f"Payload Validation: {_enabled(r.enable_payload_validation)}",
            ]
            if r.schema_id > 0:
                lines.append(f"Cached Schema ID: {r.schema_id}")
        else:
            lines.append("No schema configured for this topic")
        emit(args, data, lines)
        return 0
    if cmd == "configure-schema":
        policy = args.validation_policy.upper()
        r = stub.ConfigureTopicSchema(
            spb.ConfigureTopicSchemaRequest(
                topic_name=topic,
                schema_subject=args.subject,
                validation_policy=policy,
                enable_payload_validation=args.enable_payload_validation,
            ),
            timeout=t,
        )
        ok = [
            f"✅ Schema configuration set for topic '{topic}'",
            f"   Schema Subject: {args.subject}",
            f"   Validation Policy: {policy}",
            f"   Payload Validation: {_enabled(args.enable_payload_validation)}",
        ]
        failed = f"❌ Failed to configure schema for topic '{topic}'"
    else:
        policy = args.policy.upper()
        r = stub.UpdateTopicValidationPolicy(
            spb.UpdateTopicValidationPolicyRequest(
                topic_name=topic, validation_policy=policy, enable_payload_validation=args.enable_payload_validation
            ),
            timeout=t,
        )
        ok = [
            f"✅ Validation policy updated for topic '{topic}'",
            f"   Policy: {policy}",
            f"   Payload Validation: {_enabled(args.enable_payload_validation)}",
        ]
        failed = f"❌ Failed to update validation policy for topic '{topic}'"
    # Danube prints a refusal and exits 0; a script here needs to see it failed: exit 1
    emit(
        args,
        {"success": r.success, "message": r.message},
        ok if r.success else [failed] + ([f"Error: {r.message}"] if r.message else []),
    )
    return 0 if r.success else 1
